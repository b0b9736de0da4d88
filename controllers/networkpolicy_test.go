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
