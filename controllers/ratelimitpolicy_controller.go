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
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// FieldOwner is the server-side apply field manager of everything the
// controller writes.
const FieldOwner = "slidegate-controller"

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
	// RedisCredentials is the Secret to mirror into namespaces with policies
	// (--redis-secret-name in the manager's namespace); empty Name: none.
	RedisCredentials types.NamespacedName
	// CredentialsGrace is how long missing credentials are progress before
	// the policies report Stalled (0: one minute).
	CredentialsGrace time.Duration

	// credentials reads RedisCredentials: a cache of that one Secret, set
	// up by SetupWithManager.
	credentials client.Reader
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

// Reconcile brings one namespace (req.Name) to its desired state: get the
// policies (none: remove the children) → render → apply the children → write
// each policy's status if it changed.
func (r *RateLimitPolicyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ns := req.Name
	log := logf.FromContext(ctx)

	var list v1alpha1.RateLimitPolicyList
	if err := r.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the policies of namespace %s: %w", ns, err)
	}
	// Policies for the rate limit service are the RateLimitServiceReconciler's.
	policies := slices.DeleteFunc(list.Items, func(p v1alpha1.RateLimitPolicy) bool {
		return !p.DeletionTimestamp.IsZero() || p.Spec.RateLimitService != nil
	})
	if len(policies) == 0 {
		return ctrl.Result{}, r.cleanup(ctx, ns)
	}
	slices.SortFunc(policies, func(a, b v1alpha1.RateLimitPolicy) int { return strings.Compare(a.Name, b.Name) })

	// Compute the desired state. A policy the renderer rejects, or one that
	// does not fit in the ConfigMap, is left out (and reported in its
	// status) so that it does not block the others.
	notAccepted := map[string]error{}
	var valid []v1alpha1.RateLimitPolicy
	for i := range policies {
		if _, err := render.Policy(&policies[i]); err != nil {
			notAccepted[policies[i].Name] = err
			continue
		}
		valid = append(valid, policies[i])
	}
	// Count the pods for the status (matched and enforced pods).
	pods, err := r.livePods(ctx, ns)
	if err != nil {
		return ctrl.Result{}, err
	}
	unprotected := map[types.UID]bool{}
	matched, enforced := map[string]int32{}, map[string]int32{}
	for i := range policies {
		matched[policies[i].Name], enforced[policies[i].Name] = countPods(&policies[i], pods, unprotected)
	}
	// No replica counts in the config: the sidecars count themselves
	// through Redis, so pod churn rewrites nothing here.
	opts := render.Options{Namespace: ns, TrustedProxies: r.TrustedProxies}
	accepted, tooLarge, err := render.Fit(valid, opts)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("fitting the policies of namespace %s: %w", ns, err)
	}
	for _, e := range tooLarge {
		notAccepted[e.Name] = e
	}
	cfg, err := render.Render(accepted, opts)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("rendering namespace %s: %w", ns, err)
	}
	data, revision, err := render.Encode(cfg)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("encoding the configuration of namespace %s: %w", ns, err)
	}
	// Each policy's status names its own revision, not the document's, so
	// that a policy coming or going rewrites no other policy's status.
	revisions, err := render.PolicyRevisions(cfg)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("encoding the configuration of namespace %s: %w", ns, err)
	}
	owners := ownerReferences(policies)

	// Apply the children.
	if err := r.applyConfigMap(ctx, ns, data, revision, owners); err != nil {
		return ctrl.Result{}, err
	}
	credentialsProblem, err := r.mirrorCredentials(ctx, ns, owners)
	if err != nil {
		return ctrl.Result{}, err
	}

	// Status.
	var services corev1.ServiceList
	if err := r.Client.List(ctx, &services, client.InNamespace(ns)); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the services of namespace %s: %w", ns, err)
	}
	// Whether the namespace opted in, for the Enforced message; unknown
	// (an error) reads as opted in, the case that blames no label.
	var namespace corev1.Namespace
	nsOptedIn, terminating := true, false
	if err := r.Client.Get(ctx, types.NamespacedName{Name: ns}, &namespace); err == nil {
		nsOptedIn = namespace.Labels[v1alpha1.InjectionLabel] == v1alpha1.InjectionEnabled
		terminating = namespace.DeletionTimestamp != nil
	}
	var result ctrl.Result
	for i := range policies {
		p := &policies[i]
		in := statusInput{
			notAccepted:        notAccepted[p.Name],
			revision:           revisions[p.Name],
			credentialsProblem: credentialsProblem,
			now:                time.Now(),
			grace:              r.credentialsGrace(),
			quiet:              terminating,
		}
		in.matched, in.enforced = matched[p.Name], enforced[p.Name]
		in.bypass = bypassingServices(p, pods, services.Items)
		if in.enforced < in.matched {
			in.unprotected = unprotectedWhy(p, pods, nsOptedIn)
		}
		if err := r.writeStatus(ctx, p, in); err != nil {
			if apierrors.IsNotFound(err) {
				continue // deleted meanwhile; its delete event brings us back
			}
			if apierrors.IsConflict(err) {
				// Our cache is behind the policy (typically our own last
				// status write): try again once it has caught up. Not an
				// error worth a log line.
				log.V(1).Info("status conflict, retrying", "policy", klog.KObj(p))
				result.RequeueAfter = conflictRetryDelay
				continue
			}
			return ctrl.Result{}, err
		}
	}
	if g := r.credentialsGrace(); credentialsProblem != "" && (result.RequeueAfter == 0 || result.RequeueAfter > g) {
		// Come back when the grace has passed, to report Stalled.
		result.RequeueAfter = g
	}
	policiesGauge.WithLabelValues(ns).Set(float64(len(policies)))
	rejectedPoliciesGauge.WithLabelValues(ns).Set(float64(len(notAccepted)))
	unprotectedPodsGauge.WithLabelValues(ns).Set(float64(len(unprotected)))
	recordEnforcement(ns, policies) // their statuses as just written
	log.V(1).Info("reconciled", "policies", len(policies), "rejected", len(notAccepted), "tooLarge", len(tooLarge), "revision", revision)
	return result, nil
}

// credentialsReader reads the credentials Secret: its own cache once
// SetupWithManager ran, else (a reconciler driven by hand) the client.
func (r *RateLimitPolicyReconciler) credentialsReader() client.Reader {
	if r.credentials != nil {
		return r.credentials
	}
	return r.Client
}

// cleanup removes the children of a namespace that has no policy left. Only
// objects labelled as slidegate's are removed, never the manager's own
// credentials Secret.
func (r *RateLimitPolicyReconciler) cleanup(ctx context.Context, ns string) error {
	forgetNamespaceMetrics(ns)
	cm := &corev1.ConfigMap{}
	if err := r.deleteManaged(ctx, types.NamespacedName{Namespace: ns, Name: sidecarconfig.ConfigMapName}, cm, "configmap"); err != nil {
		return err
	}
	secret := types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}
	if secret == r.RedisCredentials {
		return nil
	}
	return r.deleteManaged(ctx, secret, &corev1.Secret{}, "secret")
}

func (r *RateLimitPolicyReconciler) deleteManaged(ctx context.Context, key types.NamespacedName, obj client.Object, resource string) error {
	return deleteManaged(ctx, r.Client, r.Client, key, obj, resource, "the namespace has no policy left")
}

// deleteManaged deletes the object at key if it is slidegate's (labelled so)
// and not already going; why is for the log.
func deleteManaged(ctx context.Context, c client.Client, reader client.Reader, key types.NamespacedName, obj client.Object, resource, why string) error {
	if err := reader.Get(ctx, key, obj); err != nil {
		return client.IgnoreNotFound(err)
	}
	if obj.GetLabels()[v1alpha1.ManagedByLabel] != v1alpha1.ManagedByValue || !obj.GetDeletionTimestamp().IsZero() {
		return nil
	}
	uid := obj.GetUID()
	if err := c.Delete(ctx, obj, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting %s %s: %w", resource, key, err)
	}
	writesCounter.WithLabelValues(resource, "delete").Inc()
	logf.FromContext(ctx).Info("deleted: "+why, resource, klog.KRef(key.Namespace, key.Name))
	return nil
}

// livePods lists the metadata of the namespace's pods that are not being
// deleted.
func (r *RateLimitPolicyReconciler) livePods(ctx context.Context, ns string) ([]metav1.PartialObjectMetadata, error) {
	pods := &metav1.PartialObjectMetadataList{}
	pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	if err := r.Client.List(ctx, pods, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("listing the pods of namespace %s: %w", ns, err)
	}
	return slices.DeleteFunc(pods.Items, func(p metav1.PartialObjectMetadata) bool { return !p.DeletionTimestamp.IsZero() }), nil
}

// countPods counts the pods the policy selects and those of them whose
// sidecar guards the policy's targetPort; selected pods without it are
// added to unprotected. A pod injected for another policy's port is not
// protected by this one: traffic to this policy's port bypasses the sidecar.
func countPods(p *v1alpha1.RateLimitPolicy, pods []metav1.PartialObjectMetadata, unprotected map[types.UID]bool) (matched, enforced int32) {
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.TargetSelector.AsMeta())
	if err != nil {
		return 0, 0
	}
	for i := range pods {
		if !sel.Matches(labels.Set(pods[i].Labels)) {
			continue
		}
		matched++
		if st, ok := injection(&pods[i]); ok && (st.TargetPort == "" || st.TargetPort == targetPort(p)) {
			enforced++
		} else {
			unprotected[pods[i].UID] = true
		}
	}
	return matched, enforced
}

// targetPort is the port name the policy's sidecar takes over.
func targetPort(p *v1alpha1.RateLimitPolicy) string {
	if p.Spec.TargetPort == "" {
		return inject.DefaultTargetPort
	}
	return p.Spec.TargetPort
}

// injection reads a pod's injection status. ok is false for a pod without
// the sidecar; an unreadable status counts as a sidecar on any port.
func injection(pod metav1.Object) (st v1alpha1.InjectionStatus, ok bool) {
	raw, ok := pod.GetAnnotations()[v1alpha1.InjectedAnnotation]
	if !ok {
		return st, false
	}
	_ = json.Unmarshal([]byte(raw), &st)
	return st, true
}

// bypassingServices describes the Services that select a protected pod of
// the policy and send TCP traffic straight to the app's port number, which
// the sidecar took the name of: that traffic is not limited. Other numeric
// ports (metrics, a side port) are none of our business.
func bypassingServices(p *v1alpha1.RateLimitPolicy, pods []metav1.PartialObjectMetadata, services []corev1.Service) string {
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.TargetSelector.AsMeta())
	if err != nil {
		return ""
	}
	var found []string
	for i := range services {
		svc := &services[i]
		if len(svc.Spec.Selector) == 0 {
			continue
		}
		svcSel := labels.SelectorFromSet(svc.Spec.Selector)
		appPorts := map[int32]bool{}
		for j := range pods {
			set := labels.Set(pods[j].Labels)
			if st, ok := injection(&pods[j]); ok && st.AppPort > 0 && svcSel.Matches(set) && sel.Matches(set) {
				appPorts[st.AppPort] = true
			}
		}
		for _, port := range svc.Spec.Ports {
			target := port.TargetPort
			if port.Protocol != "" && port.Protocol != corev1.ProtocolTCP || target.Type == intstr.String && target.StrVal != "" {
				continue
			}
			num := target.IntVal
			if num == 0 { // unset: the port number itself
				num = port.Port
			}
			if appPorts[num] {
				found = append(found, fmt.Sprintf("Service %s port %d targets the app's port number %d", svc.Name, port.Port, num))
			}
		}
	}
	slices.Sort(found)
	return strings.Join(found, "; ")
}

func carriesSidecar(pod metav1.Object) bool {
	_, ok := injection(pod)
	return ok
}

// ownerReferences points at every policy of the namespace, none as
// controller: they all contribute to the children.
func ownerReferences(policies []v1alpha1.RateLimitPolicy) []metav1.OwnerReference {
	refs := make([]metav1.OwnerReference, 0, len(policies))
	for i := range policies {
		refs = append(refs, metav1.OwnerReference{
			APIVersion: v1alpha1.GroupVersion.String(),
			Kind:       "RateLimitPolicy",
			Name:       policies[i].Name,
			UID:        policies[i].UID,
		})
	}
	return refs
}

// writeStatus writes the policy's status if it differs, then emits events
// for the conditions that changed.
func (r *RateLimitPolicyReconciler) writeStatus(ctx context.Context, p *v1alpha1.RateLimitPolicy, in statusInput) error {
	return writeStatus(ctx, r.Client, r.Recorder, p, desiredStatus(p, in), in.quiet)
}

// writeStatus writes want as p's status if it differs, then emits one
// event for the conditions that changed (none when quiet).
func writeStatus(ctx context.Context, c client.Client, rec events.EventRecorder, p *v1alpha1.RateLimitPolicy, want v1alpha1.RateLimitPolicyStatus, quiet bool) error {
	if equality.Semantic.DeepEqual(p.Status, want) {
		return nil
	}
	orig := p.DeepCopy()
	p.Status = want
	// Under our own field manager, like the applied children: managedFields
	// then name slidegate, not the binary ("manager").
	patch := client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})
	if err := c.Status().Patch(ctx, p, patch, client.FieldOwner(FieldOwner)); err != nil {
		return fmt.Errorf("writing the status of %s: %w", klog.KObj(p), err)
	}
	writesCounter.WithLabelValues("ratelimitpolicies/status", "patch").Inc()
	if !quiet {
		emitTransitions(rec, orig, p)
	}
	return nil
}

func (r *RateLimitPolicyReconciler) credentialsGrace() time.Duration {
	if r.CredentialsGrace > 0 {
		return r.CredentialsGrace
	}
	return defaultCredentialsGrace
}
