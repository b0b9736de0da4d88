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
package render

import (
	"errors"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// TestFootprintBound: with the manager's --max-client-bytes, a policy whose
// every client could make the shared Redis hold more is left out of its
// namespace's document (Namespace) and of the rate limit service's
// (Service) with a *FootprintTooLargeError; the others are published.
// Without the bound (the naive case), a tenant's limit of 1,000,000 would
// let each client of its API fill ~104 MB of the Redis every namespace
// shares.
func TestFootprintBound(t *testing.T) {
	const bound = 1 << 20 // 1 MiB: a SlidingLog limit of 10,082
	policy := func(ns, name string, limit int32, mutate func(*v1alpha1.RateLimitPolicySpec)) v1alpha1.RateLimitPolicy {
		p := v1alpha1.RateLimitPolicy{}
		p.Namespace, p.Name = ns, name
		p.Spec = v1alpha1.RateLimitPolicySpec{
			TargetSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "checkout"}},
			Window:         "10s",
			Limit:          limit,
			Key:            v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User-ID"},
		}
		if mutate != nil {
			mutate(&p.Spec)
		}
		return p
	}
	policies := []v1alpha1.RateLimitPolicy{
		policy("shop", "small", 1000, nil),
		policy("shop", "huge", 1_000_000, nil),
		policy("shop", "counter", 1_000_000, func(s *v1alpha1.RateLimitPolicySpec) { s.Algorithm = v1alpha1.AlgorithmSlidingWindowCounter }),
	}
	refusedAsTooLarge := func(err error) bool {
		footprint, ok := errors.AsType[*FootprintTooLargeError](err)
		return ok && strings.Contains(footprint.Error(), "104,000,000 bytes")
	}

	for _, tc := range []struct {
		name      string
		max       int64
		wantHuge  bool // the huge policy is refused
		published int
	}{
		{"bounded", bound, true, 2},
		{"naive: no bound", 0, false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Namespace(policies, Options{Namespace: "shop", MaxClientBytes: tc.max})
			if err != nil {
				t.Fatal(err)
			}
			why, refused := out.NotAccepted["huge"]
			if refused != tc.wantHuge {
				t.Fatalf("huge refused %v (%v), want %v", refused, why, tc.wantHuge)
			}
			if refused && !refusedAsTooLarge(why) {
				t.Errorf("huge refused with %v, want a *FootprintTooLargeError of 104,000,000 bytes", why)
			}
			if got := len(policies) - len(out.NotAccepted); got != tc.published || len(out.Revisions) != tc.published {
				t.Errorf("%d published (%d revisions), want %d (%v)", got, len(out.Revisions), tc.published, out.NotAccepted)
			}
		})
	}

	rls := func(name string, limit int32) v1alpha1.RateLimitPolicy {
		return policy("edge", name, limit, func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector, s.Key = nil, v1alpha1.ClientKey{}
			s.RateLimitService = &v1alpha1.RateLimitServiceTarget{Domain: "edge", Descriptor: []v1alpha1.DescriptorEntry{{Key: "remote_address"}}}
		})
	}
	out, err := Service([]v1alpha1.RateLimitPolicy{rls("small", 100), rls("huge", 1_000_000)}, ServiceOptions{MaxClientBytes: bound})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.NotAccepted) != 1 || len(out.Revisions) != 1 {
		t.Fatalf("rate limit service: not accepted %v, %d revisions; want huge only left out", out.NotAccepted, len(out.Revisions))
	}
	for k, why := range out.NotAccepted {
		if k.Name != "huge" || !refusedAsTooLarge(why) {
			t.Errorf("rate limit service: %s: %v", k, why)
		}
	}
}
