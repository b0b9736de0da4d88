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
	"fmt"
	"net/http"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/attachment"
	"github.com/slidegate/slidegate/internal/policystatus"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// RateLimitServiceControllerName names the controller of the policies for
// the rate limit service.
const RateLimitServiceControllerName = "ratelimitservice"

// Defaults of the rate limit service as config/components/rls installs it.
const (
	// DefaultRLSServiceName is the Service in front of the RLS servers.
	DefaultRLSServiceName = "slidegate-rls"
	// RLSAdminPortName is the name of the Service port (and so of the
	// EndpointSlice port) of the servers' admin endpoint, which reports
	// what they loaded (rlsconfig.LoadedPath).
	RLSAdminPortName = "admin"
)

// defaultRLSRecheck is how often a policy not yet loaded by every RLS
// server is checked again: the kubelet refreshes a mounted ConfigMap within
// about a minute, and nothing the controller watches says when it did.
const defaultRLSRecheck = 10 * time.Second

// RateLimitServiceReconciler renders every policy that sets
// spec.rateLimitService, in all namespaces, into the one ConfigMap the RLS
// servers load (rlsconfig.ConfigMapName in Namespace), asks the ready
// servers what they loaded, and reports each policy's status: Enforced when
// every ready server loaded the policy at its revision. It is a controller of
// its own, beside the namespace's one, because its document is one for the
// cluster; each policy's status is written by exactly one of the two.
type RateLimitServiceReconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// Recorder emits events on condition transitions.
	Recorder events.EventRecorder
	// Namespace is where the ConfigMap is written and the RLS Service runs:
	// the manager's namespace.
	Namespace string
	// ServiceName is the RLS servers' Service (DefaultRLSServiceName if
	// empty).
	ServiceName string
	// HTTPClient asks the servers what they loaded (a client with a short
	// timeout if nil).
	HTTPClient *http.Client
	// Recheck is how often servers that have not loaded every policy are
	// asked again (0: 10 s).
	Recheck time.Duration

	// Local reads the objects of Namespace this controller owns or watches
	// (the ConfigMap, the EndpointSlices), Domains the platform team's
	// ConfigMap of domain owners (render.RLSDomainsConfigMapName): caches
	// of only them (CacheObjects), built by internal/manager.
	Local, Domains cache.Cache
	// MaxClientBytes: as RateLimitPolicyReconciler's.
	MaxClientBytes int64

	// maxBytes is the budget of the document (0: render.DefaultMaxBytes);
	// tests make it small.
	maxBytes int
	// recorded are the namespaces whose not-enforced counts were last
	// recorded (one reconcile at a time: no lock).
	recorded map[string]bool
	// IstioGateways makes the controller keep, for each Istio Gateway that
	// serves policies with targetRefs, the EnvoyFilter that calls the
	// rate limit service (applyGateways). It needs write access to
	// EnvoyFilters, which config/components/istio-gateways grants.
	IstioGateways bool
	// EnvoyGateways does the same for Envoy Gateway's Gateways, with an
	// EnvoyPatchPolicy (config/components/envoy-gateways).
	EnvoyGateways bool

	// watchingTargets: the Gateway API was installed when the controller
	// started, so its objects are watched (SetupWithManager).
	watchingTargets bool
}

// +kubebuilder:rbac:groups="",namespace=system,resources=configmaps,verbs=list;watch;patch;delete,resourceNames=slidegate-rls-config
// +kubebuilder:rbac:groups="",namespace=system,resources=configmaps,verbs=list;watch,resourceNames=slidegate-rls-domains
// +kubebuilder:rbac:groups=discovery.k8s.io,namespace=system,resources=endpointslices,verbs=list;watch

// rlsRequest is the one request of this controller: its document is one.
var rlsRequest = reconcile.Request{NamespacedName: types.NamespacedName{Name: "rate-limit-service"}}

// Reconcile brings the rate limit service's ConfigMap and the status of the
// cluster's policies for it to their desired state in phases: gather the
// policies (none: remove the ConfigMap) and the domain owners → render the
// document → apply the ConfigMap → ask the servers what they loaded →
// compute each policy's status → write the statuses that changed → record
// metrics.
func (r *RateLimitServiceReconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	policies, err := livePolicies(ctx, r.Client, true)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the policies: %w", err)
	}
	key := types.NamespacedName{Namespace: r.Namespace, Name: rlsconfig.ConfigMapName}
	if len(policies) == 0 {
		recordRLSEnforcement(nil, r.recorded)
		r.recorded = nil
		unclaimedDomainPoliciesGauge.Set(0)
		if err := r.applyGateways(ctx, nil); err != nil { // the gateways' last objects go too
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, deleteManaged(ctx, r.Client, r.reader(), key, &corev1.ConfigMap{}, "configmap", "no policy for the rate limit service is left")
	}
	owners, err := r.domainOwners(ctx)
	if err != nil {
		// Nothing changes until the platform team fixes its list: a
		// document rendered without it would either open every domain or
		// drop every policy.
		return ctrl.Result{}, err
	}

	// Policies whose targets do not exist stay out of the document until
	// one does (their status says which are missing).
	attached, targets, noAPI, err := attachments(ctx, r.Client, policies)
	if err != nil {
		return ctrl.Result{}, err
	}
	renderable := slices.DeleteFunc(slices.Clone(policies), func(p v1alpha1.RateLimitPolicy) bool {
		a, ok := attached[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}]
		return ok && a.Problem() != ""
	})

	desired, err := render.Service(renderable, render.ServiceOptions{Owners: owners, MaxBytes: r.maxBytes, MaxClientBytes: r.MaxClientBytes})
	if err != nil {
		return ctrl.Result{}, err
	}

	// No owner references: they cannot cross namespaces. The ConfigMap is
	// deleted when the last such policy goes (above).
	if err := applyConfigMap(ctx, r.Client, r.reader(), key, rlsconfig.FileName, "rls-config", desired.Data, desired.Revision, nil); err != nil {
		return ctrl.Result{}, err
	}

	servers, err := r.loaded(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	// What the configured gateways serve of the accepted policies (their
	// ancestors say what they cannot).
	accepted := func(k types.NamespacedName) bool {
		_, refused := desired.NotAccepted[k]
		return !refused && attached[k].Problem() == ""
	}
	var plans map[attachment.Gateway]*gatewayPlan
	if r.IstioGateways || r.EnvoyGateways {
		if plans, err = r.gatewayPlans(ctx, policies, accepted, targets, attached); err != nil {
			return ctrl.Result{}, err
		}
	}
	want := policystatus.ServiceStatuses(policies, desired, attached, servers, r.Namespace, r.serviceName(), RLSAdminPortName)
	conflicted, err := writeStatuses(ctx, r.Client, r.Recorder, policies, want, false)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.applyGateways(ctx, plans); err != nil {
		return ctrl.Result{}, err
	}

	r.recordEnforcement(policies)
	unclaimedDomainPoliciesGauge.Set(float64(len(desired.Unclaimed)))
	logf.FromContext(ctx).V(1).Info("reconciled", "policies", len(policies), "rejected", len(desired.NotAccepted),
		"unclaimedDomainPolicies", len(desired.Unclaimed), "revision", desired.Revision, "servers", len(servers))
	res := r.requeue(conflicted, want)
	if (noAPI || (len(attached) > 0 && !r.watchingTargets)) && (res.RequeueAfter == 0 || res.RequeueAfter > gatewayAPIRecheck) {
		res.RequeueAfter = gatewayAPIRecheck // nothing watched says when targets appear
	}
	return res, nil
}

// requeue is when to come back after writing the statuses: soon after a
// conflict, else after Recheck while a server has not loaded every accepted
// policy (nothing the controller watches says when it has). A policy not
// accepted is in no server's document: only an event (its spec changing,
// another policy going) can change that, so it asks for no recheck.
func (r *RateLimitServiceReconciler) requeue(conflicted bool, want []v1alpha1.RateLimitPolicyStatus) ctrl.Result {
	switch {
	case conflicted:
		return ctrl.Result{RequeueAfter: conflictRetryDelay}
	case slices.ContainsFunc(want, policystatus.ServersBehind):
		return ctrl.Result{RequeueAfter: r.recheck()}
	}
	return ctrl.Result{}
}

// recordEnforcement records the not-enforced counts of the namespaces with
// policies for the rate limit service, and forgets those of namespaces that
// had some at the last reconcile and have none now.
func (r *RateLimitServiceReconciler) recordEnforcement(policies []v1alpha1.RateLimitPolicy) {
	byNamespace := map[string][]v1alpha1.RateLimitPolicy{}
	for i := range policies {
		byNamespace[policies[i].Namespace] = append(byNamespace[policies[i].Namespace], policies[i])
	}
	recordRLSEnforcement(byNamespace, r.recorded)
	r.recorded = map[string]bool{}
	for ns := range byNamespace {
		r.recorded[ns] = true
	}
}

// recheck is Recheck, or its default when unset.
func (r *RateLimitServiceReconciler) recheck() time.Duration {
	if r.Recheck > 0 {
		return r.Recheck
	}
	return defaultRLSRecheck
}

// serviceName is ServiceName, or its default when unset.
func (r *RateLimitServiceReconciler) serviceName() string {
	if r.ServiceName != "" {
		return r.ServiceName
	}
	return DefaultRLSServiceName
}

// domainOwners reads the platform team's list of domain owners: nil (every
// domain open) without the ConfigMap. An invalid list is an error that no
// retry fixes (the ConfigMap's change brings the next reconcile), reported
// as a Warning event on the ConfigMap.
func (r *RateLimitServiceReconciler) domainOwners(ctx context.Context) (*render.DomainOwners, error) {
	var rd client.Reader = r.Client
	if r.Domains != nil {
		rd = r.Domains
	}
	var cm corev1.ConfigMap
	err := rd.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: render.RLSDomainsConfigMapName}, &cm)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading ConfigMap %s/%s: %w", r.Namespace, render.RLSDomainsConfigMapName, err)
	}
	data, ok := cm.Data[render.RLSDomainsKey]
	if !ok {
		err = fmt.Errorf("no key %s", render.RLSDomainsKey)
	} else {
		var owners *render.DomainOwners
		if owners, err = render.ParseDomainOwners([]byte(data)); err == nil {
			return owners, nil
		}
	}
	err = fmt.Errorf("ConfigMap %s/%s: %w; the rate limit service's configuration and the policies' statuses stay as they are until it is fixed",
		r.Namespace, render.RLSDomainsConfigMapName, err)
	if r.Recorder != nil {
		r.Recorder.Eventf(&cm, nil, corev1.EventTypeWarning, "InvalidDomainOwners", "Reconcile", "%s", truncateNote(err.Error()))
	}
	return nil, reconcile.TerminalError(err)
}

// reader reads the objects of Namespace: the controller's own cache, or
// (a reconciler driven by hand) the client.
func (r *RateLimitServiceReconciler) reader() client.Reader {
	if r.Local != nil {
		return r.Local
	}
	return r.Client
}
