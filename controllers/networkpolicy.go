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

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	networkingv1ac "k8s.io/client-go/applyconfigurations/networking/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/owned"
	"github.com/slidegate/slidegate/internal/render"
)

// networkPolicyComponent is the app.kubernetes.io/component label of the
// NetworkPolicies the controller keeps.
const networkPolicyComponent = "network-policy"

// The NetworkPolicies of policies with spec.networkPolicy: their names vary
// with the policies', so RBAC cannot name them. The cache holds every
// NetworkPolicy, since others that admit the app's port undo ours
// (policystatus.Guards.ReopeningPolicies); only ours (labelled) are patched or deleted.
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=create;list;watch;patch;delete

// networkPolicyOptions are the sidecar's ports, as the injector gives them.
func (r *RateLimitPolicyReconciler) networkPolicyOptions() render.NetworkPolicyOptions {
	o := render.NetworkPolicyOptions{ListenPort: r.SidecarListenPort, AdminPort: r.SidecarAdminPort}
	if o.ListenPort == 0 {
		o.ListenPort = inject.DefaultListenPort
	}
	if o.AdminPort == 0 {
		o.AdminPort = inject.DefaultAdminPort
	}
	return o
}

// applyNetworkPolicies keeps, for each policy of the namespace that asks
// for one (spec.networkPolicy), the NetworkPolicy render.NetworkPolicy
// renders, controlled by that policy (the garbage collector removes it with
// the policy), and deletes the namespace's other NetworkPolicies of ours.
// An unchanged one is not written.
func (r *RateLimitPolicyReconciler) applyNetworkPolicies(ctx context.Context, ns string, policies []v1alpha1.RateLimitPolicy) error {
	var cur networkingv1.NetworkPolicyList
	if err := r.Client.List(ctx, &cur, client.InNamespace(ns), client.MatchingLabels(owned.Labels(networkPolicyComponent))); err != nil {
		return fmt.Errorf("listing the NetworkPolicies of namespace %s: %w", ns, err)
	}
	have := map[string]*networkingv1.NetworkPolicy{}
	for i := range cur.Items {
		have[cur.Items[i].Name] = &cur.Items[i]
	}
	opts := r.networkPolicyOptions()
	for i := range policies {
		want := render.NetworkPolicy(&policies[i], opts)
		if want == nil {
			continue
		}
		want.Labels = owned.Labels(networkPolicyComponent)
		want.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: v1alpha1.GroupVersion.String(), Kind: "RateLimitPolicy",
			Name: policies[i].Name, UID: policies[i].UID, Controller: ptr.To(true),
		}}
		existing := have[want.Name]
		delete(have, want.Name)
		if existing != nil && networkPolicyUpToDate(existing, want) {
			continue
		}
		if err := r.applyNetworkPolicy(ctx, want); err != nil {
			return err
		}
	}
	for _, stale := range have {
		uid := stale.UID
		if err := r.Client.Delete(ctx, stale, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting NetworkPolicy %s: %w", klog.KObj(stale), err)
		}
		owned.Wrote("networkpolicy", "delete")
		logf.FromContext(ctx).Info("deleted: no policy asks for it", "networkPolicy", klog.KObj(stale))
	}
	return nil
}

// networkPolicyUpToDate reports whether the cached cur already is want:
// our labels, want's owner, want's spec.
func networkPolicyUpToDate(cur, want *networkingv1.NetworkPolicy) bool {
	for k, v := range want.Labels {
		if cur.Labels[k] != v {
			return false
		}
	}
	return equality.Semantic.DeepEqual(cur.OwnerReferences, want.OwnerReferences) && equality.Semantic.DeepEqual(cur.Spec, want.Spec)
}

// applyNetworkPolicy writes np with server-side apply, as the controller's
// field owner.
func (r *RateLimitPolicyReconciler) applyNetworkPolicy(ctx context.Context, np *networkingv1.NetworkPolicy) error {
	// The rendered object as an apply configuration: the same JSON.
	raw, err := json.Marshal(np)
	if err != nil {
		return err
	}
	ac := &networkingv1ac.NetworkPolicyApplyConfiguration{}
	if err := json.Unmarshal(raw, ac); err != nil {
		return err
	}
	if err := r.Client.Apply(ctx, ac, client.FieldOwner(owned.FieldOwner), client.ForceOwnership); err != nil {
		if namespaceTerminating(err) {
			return nil
		}
		return fmt.Errorf("applying NetworkPolicy %s: %w", klog.KObj(np), err)
	}
	owned.Wrote("networkpolicy", "apply")
	logf.FromContext(ctx).Info("applied the NetworkPolicy", "networkPolicy", klog.KObj(np))
	return nil
}
