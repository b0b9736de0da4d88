/*
Copyright 2026 The slidegate Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package manager

import (
	"context"
	"fmt"
	"net/netip"
	"os"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/slidegate/slidegate/controllers"
	"github.com/slidegate/slidegate/internal/clienthash"
	"github.com/slidegate/slidegate/internal/jwksfetch"
	"github.com/slidegate/slidegate/internal/kubecache"
	"github.com/slidegate/slidegate/internal/redisidentity"
)

// addControllers builds the RateLimitPolicy and the rate limit service
// controllers with their dependencies, and adds them to mgr.
func addControllers(ctx context.Context, mgr ctrl.Manager, o options, proxies []netip.Prefix, namespace string) error {
	allowed, err := parseCIDRs(o.jwksAllowedCIDRs) // checked by setup
	if err != nil {
		return fmt.Errorf("--jwks-allowed-cidrs: %w", err)
	}
	identities, err := o.redis.Identities(namespace, types.NamespacedName{Namespace: namespace, Name: os.Getenv("POD_NAME")})
	if err != nil {
		return err
	}
	r := &controllers.RateLimitPolicyReconciler{
		Client:         mgr.GetClient(),
		Recorder:       mgr.GetEventRecorder("slidegate-controller"),
		TrustedProxies: proxies,
		MaxClientBytes: o.maxClientBytes,
		// The NetworkPolicies of spec.networkPolicy admit the ports the
		// injector gives the sidecar.
		SidecarListenPort: o.webhook.Inject.ListenPort,
		SidecarAdminPort:  o.webhook.Inject.AdminPort,
		SidecarImage:      o.webhook.Inject.Image,
		Identities:        identities,
	}
	fetch := jwksfetch.Options{Refresh: o.jwksRefresh, AllowedPrefixes: allowed, MaxURLsPerNamespace: o.jwksPerNamespace}
	if err := PolicyDependencies(ctx, mgr, r, namespace, fetch); err != nil {
		return err
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the RateLimitPolicy controller: %w", err)
	}
	rls := &controllers.RateLimitServiceReconciler{
		Client:      mgr.GetClient(),
		Recorder:    mgr.GetEventRecorder("slidegate-controller"),
		Namespace:   namespace,
		ServiceName: o.rlsService,
		// EnvoyFilters of Istio gateways: opt in (config/components/istio-gateways).
		IstioGateways: o.istioGateways,
		// EnvoyPatchPolicies of Envoy Gateway's: opt in (config/components/envoy-gateways).
		EnvoyGateways: o.envoyGateways,
		// The same bound: one Redis holds both.
		MaxClientBytes: o.maxClientBytes,
	}
	local, domains := rls.CacheObjects()
	if rls.Local, err = kubecache.Scoped(ctx, mgr, local); err != nil {
		return fmt.Errorf("creating the cache of the rate limit service's objects: %w", err)
	}
	if rls.Domains, err = kubecache.Scoped(ctx, mgr, domains); err != nil {
		return fmt.Errorf("creating the cache of the domain owners' ConfigMap: %w", err)
	}
	if err := rls.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the rate limit service controller: %w", err)
	}
	return nil
}

// PolicyDependencies builds what the RateLimitPolicy controller r reads
// through besides the manager's cache, and what runs beside it, from
// r.Identities (set) and the manager of the namespace namespace: the
// identities' client, events and install key (in namespace, read from the
// API server, which the manager's cache does not hold; none with an empty
// namespace); the cache of the manager's
// credentials Secret alone; the cache of the slidegate-jwks ConfigMaps;
// the key set fetcher (fetch); the channel that wakes a namespace; and,
// when it administers Redis, the identities' periodic pass (leader only).
func PolicyDependencies(ctx context.Context, mgr ctrl.Manager, r *controllers.RateLimitPolicyReconciler, namespace string, fetch jwksfetch.Options) error {
	ri := r.Identities
	ri.Client, ri.Recorder = mgr.GetClient(), r.Recorder
	if namespace != "" {
		ri.Key = &redisidentity.InstallKey{Secret: types.NamespacedName{Namespace: namespace, Name: clienthash.InstallSecretName},
			Reader: mgr.GetAPIReader(), Writer: mgr.GetClient()}
	}
	wake := make(chan event.TypedGenericEvent[client.Object], 1024)
	r.Wake, ri.Wake = wake, wake
	ri.RecordMode()
	if ri.SharedSecret.Name != "" {
		// One Secret: the manager needs no right on the other Secrets of
		// its namespace.
		c, err := kubecache.Scoped(ctx, mgr, map[client.Object]cache.ByObject{&corev1.Secret{}: kubecache.NamedIn(ri.SharedSecret)})
		if err != nil {
			return fmt.Errorf("creating the cache of the Redis credentials Secret: %w", err)
		}
		ri.SharedReader, r.SharedSecretCache = c, c
	}
	if ri.Administered() {
		if err := mgr.Add(ri); err != nil {
			return err
		}
	}
	keySets, err := kubecache.Scoped(ctx, mgr, controllers.KeySetObjects())
	if err != nil {
		return fmt.Errorf("creating the cache of the key set ConfigMaps: %w", err)
	}
	r.KeySets = keySets
	fetch.Log = mgr.GetLogger().WithName("jwks")
	r.Fetcher = controllers.NewKeySetFetcher(fetch, mgr.GetClient(), wake)
	return mgr.Add(r.Fetcher)
}
