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

package rbac_test

import (
	"context"
	"errors"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// TestManagerKeepsNetworkPolicies: with the install's RBAC, the manager
// creates the NetworkPolicy a policy asks for (spec.networkPolicy, issue
// 23), and deletes it when the policy stops asking; the API server refuses
// none of its requests. It can change no NetworkPolicy but by patch and
// delete, and cannot update or get one by name.
func TestManagerKeepsNetworkPolicies(t *testing.T) {
	ctx := context.Background()
	defer forbidden.check(t)
	ns := "netpol"
	mustCreate(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	p := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "web"}},
			Window:         "10s",
			Limit:          5,
			Key:            v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal},
			NetworkPolicy:  &v1alpha1.PodNetworkPolicy{},
		},
	}
	mustCreate(t, p)
	key := types.NamespacedName{Namespace: ns, Name: "slidegate-p"}
	eventually(t, "NetworkPolicy created", func() error { return admin.Get(ctx, key, &networkingv1.NetworkPolicy{}) })

	// A merge patch, not an update: the controller writes the policy's
	// status meanwhile, and an update of the object read before that is
	// refused as a conflict (seen in make test).
	if err := admin.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"networkPolicy":null}}`))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "NetworkPolicy deleted", func() error {
		err := admin.Get(ctx, key, &networkingv1.NetworkPolicy{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return errors.Join(err, errors.New("still there"))
	})

	user := serviceAccountUser(managerSA)
	for verb, want := range map[string]bool{"get": false, "update": false, "deletecollection": false, "patch": true, "delete": true, "create": true} {
		if got := canNetworkPolicies(t, user, verb, ns); got != want {
			t.Errorf("the manager may %s NetworkPolicies: %v, want %v (it needs create, list, watch, patch and delete only)", verb, got, want)
		}
	}
}

// canNetworkPolicies asks the API server whether user may verb the
// NetworkPolicy slidegate-p of namespace ns.
func canNetworkPolicies(t *testing.T, user, verb, ns string) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + systemNS, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Group: networkingv1.GroupName, Verb: verb, Resource: "networkpolicies", Namespace: ns, Name: "slidegate-p",
		},
	}}
	if verb == "deletecollection" || verb == "create" {
		sar.Spec.ResourceAttributes.Name = ""
	}
	if err := admin.Create(context.Background(), sar); err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	return sar.Status.Allowed
}
