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

package selection

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// TestSelects is the table of "does this policy select this pod". New
// selector shapes go here; that the webhook and the controller agree on
// them is checked in controllers/selection_test.go.
func TestSelects(t *testing.T) {
	web := map[string]string{"app": "web", "tier": "front"}
	for _, tc := range []struct {
		name string
		sel  *v1alpha1.LabelSelector
		pod  map[string]string
		want bool
	}{
		{"no targetSelector (rate limit service) selects nothing", nil, web, false},
		{"empty selector selects every pod", &v1alpha1.LabelSelector{}, web, true},
		{"empty selector selects an unlabelled pod", &v1alpha1.LabelSelector{}, nil, true},
		{"matchLabels equal", &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "web"}}, web, true},
		{"matchLabels differ", &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "db"}}, web, false},
		{"matchLabels key missing", &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"team": "x"}}, web, false},
		{"In", &v1alpha1.LabelSelector{MatchExpressions: []v1alpha1.LabelSelectorRequirement{
			{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"front", "back"}}}}, web, true},
		{"NotIn", &v1alpha1.LabelSelector{MatchExpressions: []v1alpha1.LabelSelectorRequirement{
			{Key: "tier", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"front"}}}}, web, false},
		{"DoesNotExist on a pod without the key", &v1alpha1.LabelSelector{MatchExpressions: []v1alpha1.LabelSelectorRequirement{
			{Key: "canary", Operator: metav1.LabelSelectorOpDoesNotExist}}}, web, true},
		{"invalid selector (In without values) selects nothing", &v1alpha1.LabelSelector{MatchExpressions: []v1alpha1.LabelSelectorRequirement{
			{Key: "tier", Operator: metav1.LabelSelectorOpIn}}}, web, false},
		{"invalid operator selects nothing, even with an empty pod", &v1alpha1.LabelSelector{MatchExpressions: []v1alpha1.LabelSelectorRequirement{
			{Key: "tier", Operator: "Near"}}}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &v1alpha1.RateLimitPolicy{Spec: v1alpha1.RateLimitPolicySpec{TargetSelector: tc.sel}}
			if got := Selects(p, tc.pod); got != tc.want {
				t.Errorf("Selects = %t, want %t", got, tc.want)
			}
		})
	}
}

// TestMatchingSortsByName: the webhook takes the first match's targetPort,
// so the order must not depend on the order the cache lists policies in.
func TestMatchingSortsByName(t *testing.T) {
	all := &v1alpha1.LabelSelector{}
	policy := func(name string, sel *v1alpha1.LabelSelector) v1alpha1.RateLimitPolicy {
		return v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.RateLimitPolicySpec{TargetSelector: sel}}
	}
	policies := []v1alpha1.RateLimitPolicy{policy("c", all), policy("rls", nil), policy("a", all), policy("b", all)}
	var names []string
	for _, p := range Matching(map[string]string{"app": "web"}, policies) {
		names = append(names, p.Name)
	}
	if want := []string{"a", "b", "c"}; !slices.Equal(names, want) {
		t.Errorf("Matching = %v, want %v", names, want)
	}
}
