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

// Package selection is the one answer to "does this policy select this
// pod". The webhook injects the pods it selects and the controller counts
// and watches the same pods; if the two answered differently, a policy's
// status would report pods the webhook never protected, or miss pods it did.
package selection

import (
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// Selector returns the policy's targetSelector as a label selector. A policy
// without one (a policy for the rate limit service) or with an invalid one
// selects nothing: the API server's validation keeps invalid selectors out,
// and this is the last guard. Build it once per policy when testing many
// pods.
func Selector(p *v1alpha1.RateLimitPolicy) labels.Selector {
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.TargetSelector.AsMeta())
	if err != nil {
		return labels.Nothing()
	}
	return sel
}

// Selects reports whether the policy selects a pod with these labels.
func Selects(p *v1alpha1.RateLimitPolicy, podLabels map[string]string) bool {
	return Selector(p).Matches(labels.Set(podLabels))
}

// Matching returns the policies that select a pod with these labels, sorted
// by name: the webhook's sidecar takes over the first one's targetPort.
func Matching(podLabels map[string]string, policies []v1alpha1.RateLimitPolicy) []v1alpha1.RateLimitPolicy {
	var out []v1alpha1.RateLimitPolicy
	for i := range policies {
		if Selects(&policies[i], podLabels) {
			out = append(out, policies[i])
		}
	}
	slices.SortFunc(out, func(a, b v1alpha1.RateLimitPolicy) int { return strings.Compare(a.Name, b.Name) })
	return out
}
