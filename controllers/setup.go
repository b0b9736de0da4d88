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
	"slices"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/selection"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// ControllerName names the controller (logs, metrics).
const ControllerName = "ratelimitpolicy"

// policySelectorKeysIndex indexes RateLimitPolicies by the label keys their
// targetSelector requires a pod to have (matchLabels, and matchExpressions
// with In or Exists), or by anyLabelKey when the selector can match a pod
// without any particular label. The pod map function asks it which policies
// could select a pod, instead of listing and testing every policy of the
// namespace on each pod event.
const policySelectorKeysIndex = "spec.targetSelector.requiredLabelKeys"

// anyLabelKey is the index value of selectors that require no label key.
const anyLabelKey = "*"

// selectorKeys is the IndexerFunc of policySelectorKeysIndex.
func selectorKeys(obj client.Object) []string {
	p, ok := obj.(*v1alpha1.RateLimitPolicy)
	if !ok {
		return nil
	}
	sel := p.Spec.TargetSelector
	if sel == nil {
		return nil // a policy for the rate limit service selects no pod
	}
	// Any one required key is enough: a pod without it cannot match. Take
	// the smallest, for a stable index.
	var keys []string
	for k := range sel.MatchLabels {
		keys = append(keys, k)
	}
	for _, e := range sel.MatchExpressions {
		if e.Operator == metav1.LabelSelectorOpIn || e.Operator == metav1.LabelSelectorOpExists {
			keys = append(keys, e.Key)
		}
	}
	if len(keys) == 0 {
		return []string{anyLabelKey}
	}
	return []string{slices.Min(keys)}
}

// SetupWithManager declares the controller's watches, and the field
// indexes of the policies the pod handler and the key set fetcher ask.
// The manager's cache must be built with CacheOptions; what the controller
// reads besides it (SharedSecretCache, KeySets, Fetcher, Wake) is built by
// internal/manager, which also runs Identities and Fetcher.
func (r *RateLimitPolicyReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if r.Identities == nil {
		return fmt.Errorf("the RateLimitPolicy controller needs its Redis identities (redisidentity.Identities)")
	}
	for name, index := range map[string]client.IndexerFunc{policySelectorKeysIndex: selectorKeys, jwksURLIndex: jwksURL} {
		if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.RateLimitPolicy{}, name, index); err != nil {
			return err
		}
	}
	byNamespace := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{namespaceRequest(o.GetNamespace())}
	})
	b := ctrl.NewControllerManagedBy(mgr)
	for _, src := range r.rawSources(byNamespace) {
		b = b.WatchesRawSource(src)
	}
	return b.
		Named(ControllerName).
		// Policies: spec changes (generation) and deletion; not our own
		// status writes.
		Watches(&v1alpha1.RateLimitPolicy{}, byNamespace,
			builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, deletionStarted))).
		// Our children: any change is drift to repair or our own write to
		// confirm.
		Watches(&corev1.ConfigMap{}, byNamespace, builder.WithPredicates(predicate.NewPredicateFuncs(isOurConfigMap))).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.secretToNamespaces)).
		// NetworkPolicies: ours, to repair; others, in namespaces with
		// policies, since they can admit the app's port again.
		Watches(&networkingv1.NetworkPolicy{}, handler.EnqueueRequestsFromMapFunc(r.networkPolicyToNamespace)).
		// Namespaces: the injection label decides who gets credentials.
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return []reconcile.Request{namespaceRequest(o.GetName())}
		}), builder.WithPredicates(injectionLabelChanged)).
		// Services: a numeric targetPort in front of protected pods is a
		// bypass to report; only namespaces with policies care.
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(r.serviceToNamespace)).
		// Pods: creation, label and deletion changes of pods that a policy
		// selects (trimmed, see policystatus.TrimPod; a pod that finishes arrives as
		// deleted, see unfinishedPods).
		Watches(&corev1.Pod{}, &podHandler{c: mgr.GetClient()}).
		// The request names a namespace: log it as one.
		WithLogConstructor(func(req *reconcile.Request) logr.Logger {
			log := mgr.GetLogger().WithValues("controller", ControllerName)
			if req != nil {
				log = log.WithValues("namespace", req.Name)
			}
			return log
		}).
		Complete(r)
}

// rawSources are the watches on what the controller reads besides the
// manager's cache: the manager's credentials Secret (re-mirrored into
// every namespace with policies), the slidegate-jwks ConfigMaps, and Wake
// (key set changes, memory switches).
func (r *RateLimitPolicyReconciler) rawSources(byNamespace handler.EventHandler) []source.Source {
	var sources []source.Source
	if r.SharedSecretCache != nil {
		sources = append(sources, source.Kind[client.Object](r.SharedSecretCache, &corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.credentialsToNamespaces)))
	}
	if r.KeySets != nil {
		sources = append(sources, source.Kind[client.Object](r.KeySets, &corev1.ConfigMap{}, byNamespace))
	}
	if r.Wake != nil {
		sources = append(sources, source.Channel(r.Wake, byNamespace))
	}
	return sources
}

// namespaceRequest is the request of the policy controller for namespace ns.
func namespaceRequest(ns string) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Name: ns}}
}

// deletionStarted passes updates that set the deletion timestamp.
var deletionStarted = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
	},
	CreateFunc:  func(event.CreateEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// injectionLabelChanged passes updates of a Namespace's injection label.
var injectionLabelChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return inject.NamespaceOptedIn(e.ObjectOld.GetLabels()) != inject.NamespaceOptedIn(e.ObjectNew.GetLabels())
	},
	CreateFunc:  func(event.CreateEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// isOurConfigMap reports whether o is a namespace's sidecar ConfigMap that
// slidegate manages.
func isOurConfigMap(o client.Object) bool {
	return o.GetName() == sidecarconfig.ConfigMapName && o.GetLabels()[v1alpha1.ManagedByLabel] == v1alpha1.ManagedByValue
}

// secretToNamespaces maps a mirrored Secret to its namespace.
func (r *RateLimitPolicyReconciler) secretToNamespaces(_ context.Context, o client.Object) []reconcile.Request {
	if o.GetName() == v1alpha1.RedisCredentialsSecretName && o.GetLabels()[v1alpha1.ManagedByLabel] == v1alpha1.ManagedByValue {
		return []reconcile.Request{namespaceRequest(o.GetNamespace())}
	}
	return nil
}

// credentialsToNamespaces maps the manager's credentials Secret to every
// namespace that has policies.
func (r *RateLimitPolicyReconciler) credentialsToNamespaces(ctx context.Context, o client.Object) []reconcile.Request {
	if client.ObjectKeyFromObject(o) != r.Identities.SharedSecret {
		return nil
	}
	var list v1alpha1.RateLimitPolicyList
	if err := r.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		req := namespaceRequest(list.Items[i].Namespace)
		if !slices.Contains(out, req) {
			out = append(out, req)
		}
	}
	return out
}

// serviceToNamespace enqueues a Service's namespace if it has policies.
func (r *RateLimitPolicyReconciler) serviceToNamespace(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.RateLimitPolicyList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.Limit(1), client.UnsafeDisableDeepCopy); err != nil || len(list.Items) == 0 {
		return nil
	}
	return []reconcile.Request{namespaceRequest(o.GetNamespace())}
}

// networkPolicyToNamespace enqueues the namespace of one of our
// NetworkPolicies, and of any other where the namespace has policies.
func (r *RateLimitPolicyReconciler) networkPolicyToNamespace(ctx context.Context, o client.Object) []reconcile.Request {
	if o.GetLabels()["app.kubernetes.io/component"] == networkPolicyComponent && o.GetLabels()[v1alpha1.ManagedByLabel] == v1alpha1.ManagedByValue {
		return []reconcile.Request{namespaceRequest(o.GetNamespace())}
	}
	return r.serviceToNamespace(ctx, o)
}

// dropAnnotations is the cache's transform for objects whose annotations
// the controller never reads; it drops the managed fields too, as
// DefaultTransform, which a transform of its own replaces, would.
func dropAnnotations(obj any) (any, error) {
	if o, ok := obj.(client.Object); ok {
		o.SetAnnotations(nil)
		o.SetManagedFields(nil)
	}
	return obj, nil
}

// podHandler enqueues a pod's namespace when a policy selects the pod (before
// or after the change) and the change matters for the counts: creation,
// deletion, labels, the opt-out annotation (the message), the start of
// deletion. A pod's containers and ports cannot change once it exists, and
// its other annotations count for nothing.
type podHandler struct{ c client.Reader }

var _ handler.EventHandler = &podHandler{}

func (h *podHandler) Create(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	h.enqueueIfSelected(ctx, q, e.Object)
}

func (h *podHandler) Delete(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	h.enqueueIfSelected(ctx, q, e.Object)
}

func (h *podHandler) Update(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	o, n := e.ObjectOld, e.ObjectNew
	if labels.Equals(o.GetLabels(), n.GetLabels()) &&
		o.GetAnnotations()[inject.OptOutAnnotation] == n.GetAnnotations()[inject.OptOutAnnotation] &&
		o.GetDeletionTimestamp().IsZero() == n.GetDeletionTimestamp().IsZero() {
		return
	}
	h.enqueueIfSelected(ctx, q, o, n)
}

func (h *podHandler) Generic(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	h.enqueueIfSelected(ctx, q, e.Object)
}

// enqueueIfSelected enqueues the namespace of the first of pods (old and new
// versions of one pod) that a policy selects.
func (h *podHandler) enqueueIfSelected(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request], pods ...client.Object) {
	for _, pod := range pods {
		if h.selected(ctx, pod) {
			q.Add(namespaceRequest(pod.GetNamespace()))
			return
		}
	}
}

// selected reports whether any policy of the pod's namespace selects it. The
// index narrows the candidates to policies whose required label key the pod
// has, plus those that require none.
func (h *podHandler) selected(ctx context.Context, pod client.Object) bool {
	keys := []string{anyLabelKey}
	for k := range pod.GetLabels() {
		keys = append(keys, k)
	}
	for _, k := range keys {
		var list v1alpha1.RateLimitPolicyList
		if err := h.c.List(ctx, &list, client.InNamespace(pod.GetNamespace()),
			client.MatchingFields{policySelectorKeysIndex: k}, client.UnsafeDisableDeepCopy); err != nil {
			// Cannot tell: count again, a reconcile is cheap and exact.
			return true
		}
		for i := range list.Items {
			if selection.Selects(&list.Items[i], pod.GetLabels()) {
				return true
			}
		}
	}
	return false
}
