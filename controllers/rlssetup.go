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

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/kubecache"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/rlsconfig"
)

// CacheObjects are the objects of Namespace the controller reads through
// caches of its own (Local and Domains, built by internal/manager), so
// that RBAC can stay scoped to them: the ConfigMap (by name) and the
// EndpointSlices of the RLS Service (by label); and the domain owners'
// ConfigMap, a second cache since one cache selects a type's objects in a
// namespace by one field selector.
func (r *RateLimitServiceReconciler) CacheObjects() (local, domains map[client.Object]cache.ByObject) {
	local = map[client.Object]cache.ByObject{
		&corev1.ConfigMap{}: kubecache.NamedIn(types.NamespacedName{Namespace: r.Namespace, Name: rlsconfig.ConfigMapName}),
		&discoveryv1.EndpointSlice{}: {Namespaces: map[string]cache.Config{r.Namespace: {
			LabelSelector: labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: r.serviceName()}),
		}}},
	}
	domains = map[client.Object]cache.ByObject{
		&corev1.ConfigMap{}: kubecache.NamedIn(types.NamespacedName{Namespace: r.Namespace, Name: render.RLSDomainsConfigMapName}),
	}
	return local, domains
}

// SetupWithManager declares the controller's watches: the policies, and
// through Local and Domains (CacheObjects) its own objects.
func (r *RateLimitServiceReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Namespace == "" || r.Local == nil || r.Domains == nil {
		return fmt.Errorf("the rate limit service controller needs the manager's namespace and its caches (CacheObjects)")
	}
	always := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{rlsRequest}
	})
	b := ctrl.NewControllerManagedBy(mgr).
		Named(RateLimitServiceControllerName).
		// Policies for the rate limit service (before or after a change):
		// spec changes and deletion, not our own status writes.
		Watches(&v1alpha1.RateLimitPolicy{}, always, builder.WithPredicates(rlsPolicyChanged)).
		// The ConfigMap: drift to repair, or our own write to confirm. The
		// EndpointSlices: servers coming, going, turning ready.
		WatchesRawSource(source.Kind[client.Object](r.Local, &corev1.ConfigMap{}, always)).
		WatchesRawSource(source.Kind[client.Object](r.Local, &discoveryv1.EndpointSlice{}, always)).
		// The platform team's list of domain owners.
		WatchesRawSource(source.Kind[client.Object](r.Domains, &corev1.ConfigMap{}, always))
	// The Gateways and HTTPRoutes policies attach to, where the Gateway
	// API is installed.
	watching, err := watchTargets(b, mgr.GetRESTMapper(), always)
	if err != nil {
		return err
	}
	r.watchingTargets = watching
	return b.Complete(r)
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
	return ok && p.Spec.ServedByRLS()
}
