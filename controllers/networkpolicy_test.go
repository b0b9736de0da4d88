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
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// TestNetworkPolicyRendered: a policy with spec.networkPolicy gets a
// NetworkPolicy, as the API server stores it, that admits its pods' traffic
// only on the sidecar's two ports and the ports it lists (issue 23: traffic
// to the pods' IPs), owned by the policy and labelled as ours; an edit is
// repaired; dropping the field deletes it, and the namespace's own
// NetworkPolicies are left alone. A policy without the field (the paired
// case) gets none.
func TestNetworkPolicyRendered(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	plain := newPolicy(ns, "plain")
	p := newPolicy(ns, "p", func(s *v1alpha1.RateLimitPolicySpec) {
		s.NetworkPolicy = &v1alpha1.PodNetworkPolicy{Ports: []v1alpha1.NetworkPolicyPort{{Port: 9100}}}
	})
	theirs := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-all", Namespace: ns},
		Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	}
	createReady(t, plain, p)
	create(t, theirs)
	p = get(t, p)

	tcp := func(n int32) networkingv1.NetworkPolicyPort {
		return networkingv1.NetworkPolicyPort{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(n))}
	}
	wantSpec := networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "checkout"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(15280), tcp(15290), tcp(9100)}}},
	}
	key := types.NamespacedName{Namespace: ns, Name: "slidegate-p"}
	rendered := func() error {
		var np networkingv1.NetworkPolicy
		if err := k.Get(ctx, key, &np); err != nil {
			return err
		}
		if d := cmp.Diff(wantSpec, np.Spec); d != "" {
			return fmt.Errorf("spec (-want +got):\n%s", d)
		}
		if np.Labels[v1alpha1.ManagedByLabel] != v1alpha1.ManagedByValue {
			return fmt.Errorf("labels %v", np.Labels)
		}
		if c := metav1.GetControllerOf(&np); c == nil || c.UID != p.UID || c.Kind != "RateLimitPolicy" {
			return fmt.Errorf("controller %+v, want policy p", c)
		}
		return nil
	}
	eventually(t, "NetworkPolicy rendered", rendered)

	var all networkingv1.NetworkPolicyList
	if err := k.List(ctx, &all, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(all.Items) != 2 {
		t.Errorf("%d NetworkPolicies, want 2 (ours for p, and theirs): the policy without networkPolicy got one?", len(all.Items))
	}

	// An edit that opens the app's port is repaired.
	var np networkingv1.NetworkPolicy
	if err := k.Get(ctx, key, &np); err != nil {
		t.Fatal(err)
	}
	np.Spec.Ingress[0].Ports = append(np.Spec.Ingress[0].Ports, tcp(8080))
	if err := k.Update(ctx, &np); err != nil {
		t.Fatal(err)
	}
	eventually(t, "edit repaired", rendered)

	// Dropping the field deletes it; theirs stays.
	p = get(t, p)
	p.Spec.NetworkPolicy = nil
	if err := k.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "NetworkPolicy deleted", func() error {
		err := k.Get(ctx, key, &networkingv1.NetworkPolicy{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return errors.Join(err, errors.New("still there"))
	})
	if err := k.Get(ctx, client.ObjectKeyFromObject(theirs), &networkingv1.NetworkPolicy{}); err != nil {
		t.Errorf("the namespace's own NetworkPolicy: %v", err)
	}
}

// TestNetworkPolicyReopened: NetworkPolicies add up, so one of the
// namespace's own that admits the app's port undoes the policy's, and a
// client dialing a pod's address reaches the app around the sidecar
// (issue 36, item 8). Before, Enforced stayed True; now it names the
// NetworkPolicy, and clears once it goes. The paired cases keep Enforced
// True: a deny-all, and one admitting port name http, which the sidecar
// holds after injection.
func TestNetworkPolicyReopened(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	p := newPolicy(ns, "p", func(s *v1alpha1.RateLimitPolicySpec) { s.NetworkPolicy = &v1alpha1.PodNetworkPolicy{} })
	ingress := func(name string, ports ...networkingv1.NetworkPolicyPort) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: checkoutLabels()},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: ports}},
			},
		}
	}
	denyAll := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-all", Namespace: ns},
		Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	}
	byName := ingress("by-name", networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromString("http"))})
	create(t, p, newPod(ns, "pod", checkoutLabels(), true), denyAll, byName)
	eventually(t, "enforced", podCounts(t, p, 1, 1, metav1.ConditionTrue, v1alpha1.ReasonEnforced))

	open := ingress("allow-app", networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromInt32(8000)), EndPort: ptr.To[int32](8100)})
	create(t, open)
	eventually(t, "reopened", enforcedIs(t, p, metav1.ConditionFalse, v1alpha1.ReasonNetworkPolicyAdmitsApp,
		"NetworkPolicy allow-app admits the app's port 8080"))

	if err := k.Delete(ctx, open); err != nil {
		t.Fatal(err)
	}
	eventually(t, "enforced again", podCounts(t, p, 1, 1, metav1.ConditionTrue, v1alpha1.ReasonEnforced))
}

// TestUnreadableNamespaceNotOptedIn: a namespace the manager cannot read is
// not taken as opted in (issue 36, item 8): before, any error reading it
// left optedIn true, and the reconcile went on to hand the namespace
// credentials. Now a namespace that is gone is not opted in, and an error
// stops the reconcile, to be retried.
func TestUnreadableNamespaceNotOptedIn(t *testing.T) {
	enabled := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a",
		Labels: map[string]string{v1alpha1.InjectionLabel: v1alpha1.InjectionEnabled}}}
	forbidden := apierrors.NewForbidden(corev1.Resource("namespaces"), "team-a", errors.New("no"))
	for _, tc := range []struct {
		name, ns    string
		getErr      error
		wantOptedIn bool
		wantErr     bool
	}{
		{"labelled", "team-a", nil, true, false},
		{"gone", "team-b", nil, false, false},
		{"unreadable", "team-a", forbidden, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(scheme).WithObjects(enabled).Build(), interceptor.Funcs{
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					if _, ok := obj.(*corev1.Namespace); ok && tc.getErr != nil {
						return tc.getErr
					}
					return c.Get(ctx, key, obj, opts...)
				},
			})
			facts, err := (&RateLimitPolicyReconciler{Client: c}).namespaceFacts(context.Background(), tc.ns, nil)
			if (err != nil) != tc.wantErr || facts.OptedIn != tc.wantOptedIn {
				t.Errorf("optedIn %t, error %v; want %t, an error: %t", facts.OptedIn, err, tc.wantOptedIn, tc.wantErr)
			}
		})
	}
}
