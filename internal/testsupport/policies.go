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

package testsupport

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// NewPolicy is a valid policy of namespace ns for the sidecars: 5 per 10 s
// by X-User-ID on the pods labelled app=checkout, changed by mutate.
func NewPolicy(ns, name string, mutate ...func(*v1alpha1.RateLimitPolicySpec)) *v1alpha1.RateLimitPolicy {
	p := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "checkout"}},
			Window:         "10s",
			Limit:          5,
			Key:            v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User-ID"},
		},
	}
	for _, m := range mutate {
		m(&p.Spec)
	}
	return p
}

// NewRLSPolicy is a valid policy for the rate limit service: 100 per minute
// on domain edge, by remote address under generic_key name.
func NewRLSPolicy(ns, name string) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.RateLimitPolicySpec{
			RateLimitService: &v1alpha1.RateLimitServiceTarget{
				Domain:     "edge",
				Descriptor: []v1alpha1.DescriptorEntry{{Key: "generic_key", Value: name}, {Key: "remote_address"}},
			},
			Window: "1m",
			Limit:  100,
		},
	}
}
