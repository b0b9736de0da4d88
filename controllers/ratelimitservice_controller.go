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
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/rlsconfig"
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

	// local reads the objects of Namespace this controller owns or watches
	// (the ConfigMap, the EndpointSlices): a cache of its own, scoped to
	// them, set up by SetupWithManager; nil: Client.
	local client.Reader
	// domains reads the platform team's ConfigMap of domain owners
	// (render.RLSDomainsConfigMapName): a cache of that one object; nil:
	// Client.
	domains client.Reader
	// MaxClientBytes: as RateLimitPolicyReconciler's.
	MaxClientBytes int64

	// maxBytes is the budget of the document (0: render.DefaultMaxBytes);
	// tests make it small.
	maxBytes int
	// recorded are the namespaces whose not-enforced counts were last
	// recorded (one reconcile at a time: no lock).
	recorded map[string]bool
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
		return ctrl.Result{}, deleteManaged(ctx, r.Client, r.reader(), key, &corev1.ConfigMap{}, "configmap", "no policy for the rate limit service is left")
	}
	owners, err := r.domainOwners(ctx)
	if err != nil {
		// Nothing changes until the platform team fixes its list: a
		// document rendered without it would either open every domain or
		// drop every policy.
		return ctrl.Result{}, err
	}

	desired, err := renderRLS(policies, owners, r.maxBytes, r.MaxClientBytes)
	if err != nil {
		return ctrl.Result{}, err
	}

	// No owner references: they cannot cross namespaces. The ConfigMap is
	// deleted when the last such policy goes (above).
	if err := applyConfigMap(ctx, r.Client, r.reader(), key, rlsconfig.FileName, "rls-config", desired.data, desired.revision, nil); err != nil {
		return ctrl.Result{}, err
	}

	servers, err := r.loaded(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	want := make([]v1alpha1.RateLimitPolicyStatus, len(policies))
	for i := range policies {
		p := &policies[i]
		want[i] = rlsDesiredStatus(p, rlsStatusInput{
			notAccepted: desired.notAccepted[client.ObjectKeyFromObject(p)],
			unclaimed:   desired.unclaimed[client.ObjectKeyFromObject(p)],
			revision:    desired.revisions[rlsconfig.PolicyID(p.Namespace, p.Name)],
			servers:     servers,
			namespace:   r.Namespace,
			service:     r.serviceName(),
		})
	}
	conflicted, err := writeStatuses(ctx, r.Client, r.Recorder, policies, want, false)
	if err != nil {
		return ctrl.Result{}, err
	}

	r.recordEnforcement(policies)
	unclaimedDomainPoliciesGauge.Set(float64(len(desired.unclaimed)))
	logf.FromContext(ctx).V(1).Info("reconciled", "policies", len(policies), "rejected", len(desired.notAccepted),
		"unclaimedDomainPolicies", len(desired.unclaimed), "revision", desired.revision, "servers", len(servers))
	return r.requeue(conflicted, want), nil
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
	case slices.ContainsFunc(want, serversBehind):
		return ctrl.Result{RequeueAfter: r.recheck()}
	}
	return ctrl.Result{}
}

// serversBehind reports whether st is the status of an accepted policy
// that a ready RLS server has not loaded (yet).
func serversBehind(st v1alpha1.RateLimitPolicyStatus) bool {
	return meta.IsStatusConditionTrue(st.Conditions, string(v1alpha1.ConditionAccepted)) && st.EnforcedPods < st.MatchedPods
}

// rlsRender is the desired document of the rate limit service.
type rlsRender struct {
	// data is the ConfigMap's document and revision its hash.
	data     []byte
	revision string
	// revisions holds each accepted policy's own revision, by
	// rlsconfig.PolicyID.
	revisions map[string]string
	// notAccepted holds why each policy left out of data is.
	notAccepted map[types.NamespacedName]*problem
	// unclaimed holds the accepted policies on a domain that no namespace
	// claimed (open to all).
	unclaimed map[types.NamespacedName]bool
}

// renderRLS renders the cluster's policies for the rate limit service: the
// valid policies on domains their namespace may use (owners; nil: all)
// that fit within maxBytes (0: the default); the others are left out and
// reported.
func renderRLS(policies []v1alpha1.RateLimitPolicy, owners *render.DomainOwners, maxBytes int, maxClientBytes int64) (rlsRender, error) {
	out := rlsRender{notAccepted: map[types.NamespacedName]*problem{}, unclaimed: map[types.NamespacedName]bool{}}
	var valid []v1alpha1.RateLimitPolicy
	for i := range policies {
		p := &policies[i]
		if _, err := render.RLSPolicy(p); err != nil {
			out.notAccepted[client.ObjectKeyFromObject(p)] = notAcceptedProblem(err)
			continue
		}
		if err := render.CheckFootprint(p, maxClientBytes); err != nil {
			out.notAccepted[client.ObjectKeyFromObject(p)] = notAcceptedProblem(err)
			continue
		}
		unclaimed, err := owners.Check(p.Namespace, p.Name, p.Spec.RateLimitService.Domain)
		if err != nil {
			out.notAccepted[client.ObjectKeyFromObject(p)] = notAcceptedProblem(err)
			continue
		}
		if unclaimed {
			out.unclaimed[client.ObjectKeyFromObject(p)] = true
		}
		valid = append(valid, *p)
	}
	fit, tooLarge, err := render.FitRLS(valid, maxBytes)
	if err != nil {
		return out, err
	}
	for _, e := range tooLarge {
		k := types.NamespacedName{Namespace: e.Namespace, Name: e.Name}
		out.notAccepted[k] = notAcceptedProblem(e)
		delete(out.unclaimed, k)
	}
	cfg, err := render.RLS(fit)
	if err != nil {
		return out, err
	}
	if out.data, out.revision, err = render.EncodeRLS(cfg); err != nil {
		return out, err
	}
	out.revisions = rlsconfig.PolicyRevisions(cfg)
	return out, nil
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

// serverState is what one ready RLS server reported: the policy revisions
// it loaded, or why it could not be asked.
type serverState struct {
	addr   string
	loaded map[string]bool
	err    error
}

// loaded asks every ready endpoint of the RLS Service what it loaded,
// concurrently, each within the HTTP client's timeout.
func (r *RateLimitServiceReconciler) loaded(ctx context.Context) ([]serverState, error) {
	var eps discoveryv1.EndpointSliceList
	if err := r.reader().List(ctx, &eps, client.InNamespace(r.Namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: r.serviceName()}); err != nil {
		return nil, fmt.Errorf("listing the endpoints of Service %s/%s: %w", r.Namespace, r.serviceName(), err)
	}
	var addrs []string
	for _, s := range eps.Items {
		var port int32
		for _, p := range s.Ports {
			if p.Name != nil && *p.Name == RLSAdminPortName && p.Port != nil {
				port = *p.Port
			}
		}
		if port == 0 {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, a := range e.Addresses {
				addrs = append(addrs, net.JoinHostPort(a, strconv.Itoa(int(port))))
			}
		}
	}
	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	out := make([]serverState, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Go(func() {
			out[i] = serverState{addr: a}
			out[i].loaded, out[i].err = r.ask(ctx, a)
		})
	}
	wg.Wait()
	return out, nil
}

// ask gets the policy revisions one server loaded (rlsconfig.Loaded).
func (r *RateLimitServiceReconciler) ask(ctx context.Context, addr string) (map[string]bool, error) {
	c := r.HTTPClient
	if c == nil {
		c = &http.Client{Timeout: 2 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+rlsconfig.LoadedPath, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", rlsconfig.LoadedPath, resp.Status)
	}
	var l rlsconfig.Loaded
	// A server's answer is bounded by its document (1 MiB at most).
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&l); err != nil {
		return nil, fmt.Errorf("reading %s: %w", rlsconfig.LoadedPath, err)
	}
	return l.Revisions(), nil
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
	rd := r.domains
	if rd == nil {
		rd = r.Client
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

// reader reads the objects of Namespace: the controller's own cache once
// SetupWithManager ran, else (a reconciler driven by hand) the client.
func (r *RateLimitServiceReconciler) reader() client.Reader {
	if r.local != nil {
		return r.local
	}
	return r.Client
}

// rlsStatusInput is what the reconcile learned about one policy for the
// rate limit service.
type rlsStatusInput struct {
	notAccepted *problem // as statusInput's
	// unclaimed: its domain is claimed by no namespace (open to all).
	unclaimed bool
	revision  string // the policy's revision in the document
	servers   []serverState
	// namespace and service locate the RLS servers, for the messages.
	namespace, service string
}

// rlsDesiredStatus is the policy's status after this reconcile: Accepted and
// Ready as for the sidecars' policies; matchedPods counts the ready RLS
// servers and enforcedPods those that loaded the policy at its revision. A
// policy not accepted is in effect on no server: both are 0.
func rlsDesiredStatus(p *v1alpha1.RateLimitPolicy, in rlsStatusInput) v1alpha1.RateLimitPolicyStatus {
	st, c := newStatus(p)
	st.MatchedPods, st.EnforcedPods = 0, 0
	if in.notAccepted != nil {
		c.notAccepted(in.notAccepted, "not enforced: the policy is not accepted")
		return *st
	}
	st.MatchedPods = int32(len(in.servers))
	cm := in.namespace + "/" + rlsconfig.ConfigMapName
	c.accepted(in.revision, cm)
	if in.unclaimed {
		c.set(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted, fmt.Sprintf(
			"rendered into ConfigMap %s; its domain %q is claimed by no namespace, so policies of any namespace may limit it too (ConfigMap %s/%s lists who may use which domain)",
			cm, p.Spec.RateLimitService.Domain, in.namespace, render.RLSDomainsConfigMapName))
	}
	c.set(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonPublished,
		"the configuration is published in ConfigMap "+cm+" for the rate limit service")
	loaded := serversLoaded(in)
	st.EnforcedPods = loaded.enforced
	if prob := loaded.problem(in); prob != nil {
		c.failed(v1alpha1.ConditionEnforced, prob)
	} else {
		c.set(v1alpha1.ConditionEnforced, metav1.ConditionTrue, v1alpha1.ReasonEnforced,
			fmt.Sprintf("all %d rate limit service servers loaded revision %s", st.MatchedPods, in.revision))
	}
	return *st
}

// rlsLoaded sorts the ready RLS servers by what they did with one policy.
type rlsLoaded struct {
	enforced int32 // loaded it at its revision
	// behind serve an older revision; unreachable could not be asked (with
	// why).
	behind, unreachable []string
}

// serversLoaded sorts in.servers by whether they loaded the policy's
// revision, in.revision.
func serversLoaded(in rlsStatusInput) rlsLoaded {
	var out rlsLoaded
	for _, s := range in.servers {
		switch {
		case s.err != nil:
			out.unreachable = append(out.unreachable, s.addr+" ("+s.err.Error()+")")
		case s.loaded[in.revision]:
			out.enforced++
		default:
			out.behind = append(out.behind, s.addr)
		}
	}
	return out
}

// problem is why an accepted policy is not enforced by every ready RLS
// server; nil when it is.
func (l rlsLoaded) problem(in rlsStatusInput) *problem {
	switch {
	case len(in.servers) == 0:
		return &problem{v1alpha1.ReasonNoRateLimitService,
			fmt.Sprintf("no ready endpoint of Service %s/%s with a port named %q: install the rate limit service (config/components/rls, docs/rls.md)",
				in.namespace, in.service, RLSAdminPortName)}
	case l.enforced < int32(len(in.servers)):
		var why []string
		if len(l.behind) > 0 {
			why = append(why, fmt.Sprintf("%s serve an older configuration (the kubelet refreshes the mounted ConfigMap within about a minute)", listOf(l.behind)))
		}
		if len(l.unreachable) > 0 {
			why = append(why, fmt.Sprintf("%s could not be asked", listOf(l.unreachable)))
		}
		return &problem{v1alpha1.ReasonPartiallyEnforced,
			fmt.Sprintf("%d of %d rate limit service servers loaded revision %s; %s", l.enforced, len(in.servers), in.revision, strings.Join(why, "; "))}
	}
	return nil
}

// SetupWithManager registers the controller and its cache of the objects
// of Namespace it reads: the ConfigMap (by name) and the EndpointSlices of
// the RLS Service (by label), so RBAC can stay scoped to them.
func (r *RateLimitServiceReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if r.Namespace == "" {
		return fmt.Errorf("the rate limit service controller needs the manager's namespace")
	}
	local, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme:           mgr.GetScheme(),
		Mapper:           mgr.GetRESTMapper(),
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{r.Namespace: {FieldSelector: nameSelector(rlsconfig.ConfigMapName)}}},
			&discoveryv1.EndpointSlice{}: {Namespaces: map[string]cache.Config{r.Namespace: {
				LabelSelector: labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: r.serviceName()}),
			}}},
		},
	})
	if err != nil {
		return fmt.Errorf("creating the cache of the rate limit service's objects: %w", err)
	}
	for _, obj := range []client.Object{&corev1.ConfigMap{}, &discoveryv1.EndpointSlice{}} {
		if _, err := local.GetInformer(ctx, obj); err != nil {
			return err
		}
	}
	if err := mgr.Add(managerCache{local}); err != nil {
		return err
	}
	r.local = local
	// The domain owners are a second ConfigMap, so a second cache: one
	// cache selects a type's objects in a namespace by one field selector.
	domains, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme:           mgr.GetScheme(),
		Mapper:           mgr.GetRESTMapper(),
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{r.Namespace: {FieldSelector: nameSelector(render.RLSDomainsConfigMapName)}}},
		},
	})
	if err != nil {
		return fmt.Errorf("creating the cache of the domain owners' ConfigMap: %w", err)
	}
	if _, err := domains.GetInformer(ctx, &corev1.ConfigMap{}); err != nil {
		return err
	}
	if err := mgr.Add(managerCache{domains}); err != nil {
		return err
	}
	r.domains = domains
	always := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{rlsRequest}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named(RateLimitServiceControllerName).
		// Policies for the rate limit service (before or after a change):
		// spec changes and deletion, not our own status writes.
		Watches(&v1alpha1.RateLimitPolicy{}, always, builder.WithPredicates(rlsPolicyChanged)).
		// The ConfigMap: drift to repair, or our own write to confirm. The
		// EndpointSlices: servers coming, going, turning ready.
		WatchesRawSource(source.Kind[client.Object](local, &corev1.ConfigMap{}, always)).
		WatchesRawSource(source.Kind[client.Object](local, &discoveryv1.EndpointSlice{}, always)).
		// The platform team's list of domain owners.
		WatchesRawSource(source.Kind[client.Object](domains, &corev1.ConfigMap{}, always)).
		Complete(r)
}

// rlsPolicyChanged passes the creation, spec change or deletion of a policy
// that is, or was, for the rate limit service.
var rlsPolicyChanged = predicate.Funcs{
	CreateFunc: func(e event.CreateEvent) bool { return forRLS(e.Object) },
	UpdateFunc: func(e event.UpdateEvent) bool {
		if !forRLS(e.ObjectOld) && !forRLS(e.ObjectNew) {
			return false
		}
		return e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() ||
			e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
	},
	DeleteFunc:  func(e event.DeleteEvent) bool { return forRLS(e.Object) },
	GenericFunc: func(e event.GenericEvent) bool { return forRLS(e.Object) },
}

// forRLS reports whether o is a policy for the rate limit service.
func forRLS(o client.Object) bool {
	p, ok := o.(*v1alpha1.RateLimitPolicy)
	return ok && p.Spec.RateLimitService != nil
}
