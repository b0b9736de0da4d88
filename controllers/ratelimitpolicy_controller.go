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

package controllers

import (
	"context"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/jwksfetch"
	"github.com/slidegate/slidegate/internal/policystatus"
	"github.com/slidegate/slidegate/internal/redisadmin"
	"github.com/slidegate/slidegate/internal/redisidentity"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// conflictRetryDelay is how long to wait before retrying a status write that
// conflicted: enough for the cache to catch up with the policy.
const conflictRetryDelay = 250 * time.Millisecond

// RateLimitPolicyReconciler renders the RateLimitPolicies of a namespace into
// the namespace's sidecar ConfigMap, mirrors the Redis credentials next to
// it, and reports each policy's status. See the package documentation.
type RateLimitPolicyReconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// Recorder emits events on condition transitions.
	Recorder events.EventRecorder
	// TrustedProxies are rendered into every namespace's configuration
	// (--trusted-proxies).
	TrustedProxies []netip.Prefix
	// MaxClientBytes bounds what one client of a policy can make the shared
	// Redis hold (render.CheckFootprint; the manager's --max-client-bytes);
	// a policy over it is not accepted. 0: no bound.
	MaxClientBytes int64
	// CredentialsGrace is how long missing credentials are progress before
	// the policies report Stalled (0: one minute).
	CredentialsGrace time.Duration
	// SidecarListenPort and SidecarAdminPort are the injected sidecar's
	// ports (--sidecar-listen-port, --sidecar-admin-port; 0: the
	// defaults), which the NetworkPolicies of spec.networkPolicy admit.
	SidecarListenPort, SidecarAdminPort int32
	// SidecarImage is the image the webhook injects (--sidecar-image): a
	// selected pod whose sidecar runs an image of another repository is
	// not enforced (policystatus.Guards). Empty: any image.
	SidecarImage string

	// Identities decides what each namespace's slidegate-redis-credentials
	// Secret holds, and sets up the namespaces' own Redis identities
	// (internal/redisidentity); required.
	Identities *redisidentity.Identities

	// What the controller reads besides the manager's cache, built by
	// internal/manager (SetupWithManager declares the watches on them):
	//
	// SharedSecretCache holds the manager's credentials Secret
	// (Identities.SharedSecret) alone: a change re-mirrors it into every
	// namespace with policies. nil: not watched.
	SharedSecretCache cache.Cache
	// KeySets holds the namespaces' slidegate-jwks ConfigMaps alone
	// (KeySetObjects); nil: none is read.
	KeySets cache.Cache
	// Fetcher fetches the key sets that policies name by URL
	// (NewKeySetFetcher); nil: none is fetched.
	Fetcher *jwksfetch.Fetcher
	// Wake reconciles the namespace a generic event names: the fetcher's
	// key set changes and the memory checks' switches. nil: none.
	Wake <-chan event.TypedGenericEvent[client.Object]
}

// RBAC (docs/operations.md, "Permissions", explains each verb). The
// children are listed, watched, patched (server-side apply) and deleted by
// name only; create cannot be restricted by name. The credentials Secret is
// read in the manager's namespace only, by the name the install sets with
// --redis-secret-name (change the Role with the flag).
// +kubebuilder:rbac:groups=ratelimit.slidegate.dev,resources=ratelimitpolicies,verbs=list;watch
// +kubebuilder:rbac:groups=ratelimit.slidegate.dev,resources=ratelimitpolicies/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=configmaps;secrets,verbs=create
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=list;watch;patch;delete,resourceNames=slidegate-sidecar-config
// +kubebuilder:rbac:groups="",resources=secrets,verbs=list;watch;patch;delete,resourceNames=slidegate-redis-credentials
// +kubebuilder:rbac:groups="",namespace=system,resources=secrets,verbs=list;watch,resourceNames=slidegate-redis
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=services,verbs=list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings one namespace (req.Name) to its desired state in
// phases, once each: gather what the namespace holds (no policies: remove
// the children) → render its configuration → apply the children, the
// credentials first → compute each policy's status → write the statuses
// that changed → record metrics.
func (r *RateLimitPolicyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ns := req.Name
	in, err := r.gather(ctx, ns)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(in.policies) == 0 {
		return ctrl.Result{}, r.cleanup(ctx, ns)
	}
	desired, err := render.Namespace(in.policies, render.Options{Namespace: ns, TrustedProxies: r.TrustedProxies,
		LegacySidecars: len(in.facts.LegacySidecars) > 0, KeySets: in.keySets, MaxClientBytes: r.MaxClientBytes})
	if err != nil {
		return ctrl.Result{}, err
	}

	owners := ownerReferences(in.policies)
	// The credentials first: the namespace's Redis user exists before its
	// sidecars are handed a configuration that a policy's long name may
	// need a key pattern of that user's for.
	credentials, err := r.mirrorCredentials(ctx, ns, in.policies, in.running, in.facts.OptedIn, owners)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.applyConfigMap(ctx, ns, desired.Data, desired.Revision, owners); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.applyNetworkPolicies(ctx, ns, in.policies); err != nil {
		return ctrl.Result{}, err
	}

	want, unprotected := policystatus.Statuses(in.policies, desired, in.facts, credentials, time.Now(), r.credentialsGrace())
	conflicted, err := writeStatuses(ctx, r.Client, r.Recorder, in.policies, want, in.facts.Terminating)
	if err != nil {
		return ctrl.Result{}, err
	}

	recordNamespace(ns, in.policies, desired, unprotected)
	logf.FromContext(ctx).V(1).Info("reconciled", "policies", len(in.policies), "rejected", len(desired.NotAccepted),
		"tooLarge", desired.TooLarge, "revision", desired.Revision)
	return r.requeue(conflicted, credentials != nil), nil
}

// requeue is when to come back after writing the statuses: soon after a
// conflict, when the credentials grace has passed while they are missing
// (to report Stalled, and to try the namespace's identity again), and at
// the next password rotation.
func (r *RateLimitPolicyReconciler) requeue(conflicted, credentialsMissing bool) ctrl.Result {
	var result ctrl.Result
	sooner := func(d time.Duration) {
		if d > 0 && (result.RequeueAfter == 0 || result.RequeueAfter > d) {
			result.RequeueAfter = d
		}
	}
	if conflicted {
		sooner(conflictRetryDelay)
	}
	if credentialsMissing {
		sooner(r.credentialsGrace())
	}
	if r.Identities.Administered() {
		if next := redisadmin.NextRotation(r.Identities.Rotation, time.Now()); !next.IsZero() {
			sooner(time.Until(next) + time.Second)
		}
	}
	return result
}

// recordNamespace records the namespace's metrics from its policies, their
// statuses as just written, and their render.
func recordNamespace(ns string, policies []v1alpha1.RateLimitPolicy, desired render.NamespaceResult, unprotected map[types.UID]bool) {
	policiesGauge.WithLabelValues(ns).Set(float64(len(policies)))
	rejectedPoliciesGauge.WithLabelValues(ns).Set(float64(len(desired.NotAccepted)))
	unprotectedPodsGauge.WithLabelValues(ns).Set(float64(len(unprotected)))
	recordEnforcement(ns, policies)
}

// cleanup removes the children of a namespace that has no policy left. Only
// objects labelled as slidegate's are removed, never the manager's own
// credentials Secret.
func (r *RateLimitPolicyReconciler) cleanup(ctx context.Context, ns string) error {
	forgetNamespaceMetrics(ns)
	// The garbage collector removes them with their policies too; this
	// does not wait for it.
	if err := r.applyNetworkPolicies(ctx, ns, nil); err != nil {
		return err
	}
	cm := &corev1.ConfigMap{}
	if err := r.deleteManaged(ctx, types.NamespacedName{Namespace: ns, Name: sidecarconfig.ConfigMapName}, cm, "configmap"); err != nil {
		return err
	}
	r.Identities.Remove(ctx, ns)
	secret := types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}
	if secret == r.Identities.SharedSecret {
		return nil
	}
	return r.deleteManaged(ctx, secret, &corev1.Secret{}, "secret")
}

// credentialsGrace is CredentialsGrace, or its default when unset.
func (r *RateLimitPolicyReconciler) credentialsGrace() time.Duration {
	if r.CredentialsGrace > 0 {
		return r.CredentialsGrace
	}
	return policystatus.DefaultCredentialsGrace
}
