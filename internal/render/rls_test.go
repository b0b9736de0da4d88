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

package render_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/rlsconfig"
)

func rlsPolicy(ns, name string, mutate ...func(*v1alpha1.RateLimitPolicySpec)) v1alpha1.RateLimitPolicy {
	p := v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.RateLimitPolicySpec{
			RateLimitService: &v1alpha1.RateLimitServiceTarget{
				Domain:     "edge",
				Descriptor: []v1alpha1.DescriptorEntry{{Key: "generic_key", Value: "checkout"}, {Key: "remote_address"}},
			},
			Window: "1m",
			Limit:  100,
		},
	}
	for _, m := range mutate {
		m(&p.Spec)
	}
	return p
}

// TestRLSPolicy: table of what a policy for the rate limit service renders
// to, or why it cannot. New cases go at the end.
func TestRLSPolicy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mutate  func(*v1alpha1.RateLimitPolicySpec)
		want    rlsconfig.Policy
		wantErr string
	}{
		{name: "defaults", mutate: func(*v1alpha1.RateLimitPolicySpec) {}, want: rlsconfig.Policy{
			Namespace: "shop", Name: "p", ID: "rls/shop/p", Domain: "edge",
			Descriptor:   []rlsconfig.Entry{{Key: "generic_key", Value: "checkout"}, {Key: "remote_address"}},
			WindowMillis: 60_000, Limit: 100, Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce",
		}},
		{name: "closed, dry run, counter", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.FailMode, s.Mode, s.Algorithm = v1alpha1.FailClosed, v1alpha1.ModeDryRun, v1alpha1.AlgorithmSlidingWindowCounter
		}, want: rlsconfig.Policy{
			Namespace: "shop", Name: "p", ID: "rls/shop/p", Domain: "edge",
			Descriptor:   []rlsconfig.Entry{{Key: "generic_key", Value: "checkout"}, {Key: "remote_address"}},
			WindowMillis: 60_000, Limit: 100, Algorithm: "SlidingWindowCounter", FailMode: "Closed", Mode: "DryRun",
		}},
		{name: "durability Replicated", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Durability = v1alpha1.DurabilityReplicated }, want: rlsconfig.Policy{
			Namespace: "shop", Name: "p", ID: "rls/shop/p", Domain: "edge",
			Descriptor:   []rlsconfig.Entry{{Key: "generic_key", Value: "checkout"}, {Key: "remote_address"}},
			WindowMillis: 60_000, Limit: 100, Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce", Durability: "Replicated",
		}},
		{name: "durability Primary is not rendered", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Durability = v1alpha1.DurabilityPrimary }, want: rlsconfig.Policy{
			Namespace: "shop", Name: "p", ID: "rls/shop/p", Domain: "edge",
			Descriptor:   []rlsconfig.Entry{{Key: "generic_key", Value: "checkout"}, {Key: "remote_address"}},
			WindowMillis: 60_000, Limit: 100, Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce",
		}},
		{name: "a sidecar policy", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.RateLimitService = nil
			s.TargetSelector = &v1alpha1.LabelSelector{}
		}, wantErr: "has neither rateLimitService nor targetRefs"},
		{name: "the reserved domain (an object stored before the schema's rule)", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.RateLimitService.Domain = v1alpha1.TargetRefsDomain
		}, wantErr: "the domain ratelimit.slidegate.dev is reserved for policies with targetRefs"},
		// Attached to Gateway API objects: the descriptor names the policy.
		{name: "targetRefs, header", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s, v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User", OnMissing: v1alpha1.MissingKeyAllow})
		}, want: rlsconfig.Policy{
			Namespace: "shop", Name: "p", ID: "rls/shop/p", Domain: v1alpha1.TargetRefsDomain,
			Descriptor:   []rlsconfig.Entry{{Key: v1alpha1.TargetRefsPolicyKey, Value: "shop/p"}, {Key: v1alpha1.TargetRefsClientKey}},
			WindowMillis: 60_000, Limit: 100, Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce",
		}},
		{name: "targetRefs, address", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s, v1alpha1.ClientKey{Source: v1alpha1.KeySourceRemoteAddress})
		}, want: rlsconfig.Policy{
			Namespace: "shop", Name: "p", ID: "rls/shop/p", Domain: v1alpha1.TargetRefsDomain,
			Descriptor:   []rlsconfig.Entry{{Key: v1alpha1.TargetRefsPolicyKey, Value: "shop/p"}, {Key: "remote_address"}},
			WindowMillis: 60_000, Limit: 100, Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce",
		}},
		{name: "targetRefs, global", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s, v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal})
		}, want: rlsconfig.Policy{
			Namespace: "shop", Name: "p", ID: "rls/shop/p", Domain: v1alpha1.TargetRefsDomain,
			Descriptor:   []rlsconfig.Entry{{Key: v1alpha1.TargetRefsPolicyKey, Value: "shop/p"}},
			WindowMillis: 60_000, Limit: 100, Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce",
		}},
		{name: "targetRefs, a header counted by address when missing (refused by the schema)", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s, v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User"})
		}, wantErr: "key.onMissing must be Allow with targetRefs"},
		{name: "targetRefs, JWT claim (refused by the schema)", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s, v1alpha1.ClientKey{Source: v1alpha1.KeySourceJWTClaim, Name: "sub"})
		}, wantErr: `key source "JWTClaim" does not apply with targetRefs`},
		{name: "targetRefs and rateLimitService (refused by the schema)", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s, v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal})
			s.RateLimitService = &v1alpha1.RateLimitServiceTarget{Domain: "edge", Descriptor: []v1alpha1.DescriptorEntry{{Key: "k"}}}
		}, wantErr: "set rateLimitService or targetRefs, not both"},
		{name: "both targets (an object stored before the schema's rule)", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector = &v1alpha1.LabelSelector{}
		}, wantErr: "do not apply with rateLimitService"},
		{name: "bad window", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Window = "1 minute" }, wantErr: "window"},
		{name: "additionalLimits with cost (refused by the schema)", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.AdditionalLimits = []v1alpha1.AdditionalLimit{{Window: "1h", Limit: 5}}
			s.Cost = &v1alpha1.Cost{Request: &v1alpha1.RequestCost{}}
		}, wantErr: "additionalLimits and cost cannot be used together"},
		{name: "a quota in a zone no database knows", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Quotas = []v1alpha1.Quota{{Period: v1alpha1.QuotaPeriodDay, Limit: 5, TimeZone: "Mars/Olympus_Mons"}}
		}, wantErr: "unknown time zone"},
		{name: "value over the server's bound", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.RateLimitService.Descriptor[0].Value = strings.Repeat("é", 200)
		}, wantErr: "descriptor[0].value longer than 256 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := rlsPolicy("shop", "p", tc.mutate)
			got, err := render.RLSPolicy(&p)
			if tc.wantErr != "" {
				var invalid *render.InvalidPolicyError
				if !errors.As(err, &invalid) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want an InvalidPolicyError containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// attach turns a policy for the rate limit service into one attached to an
// HTTPRoute, with key.
func attach(s *v1alpha1.RateLimitPolicySpec, key v1alpha1.ClientKey) {
	s.RateLimitService = nil
	s.Key = key
	s.TargetRefs = []v1alpha1.PolicyTargetReference{{Group: v1alpha1.GatewayAPIGroup, Kind: "HTTPRoute", Name: "checkout"}}
}

// TestRLSDeterministic: the same policies in any order give the same
// bytes; each policy's revision ignores its neighbours.
func TestRLSDeterministic(t *testing.T) {
	a, b, c := rlsPolicy("shop", "a"), rlsPolicy("shop", "b"), rlsPolicy("bank", "a")
	encode := func(ps ...v1alpha1.RateLimitPolicy) ([]byte, map[string]string) {
		t.Helper()
		cfg, err := render.RLS(ps)
		if err != nil {
			t.Fatal(err)
		}
		data, _, err := render.EncodeRLS(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rlsconfig.Parse(data); err != nil {
			t.Fatalf("the server refuses the rendered document: %v", err)
		}
		return data, rlsconfig.PolicyRevisions(cfg)
	}
	one, revs := encode(a, b, c)
	two, _ := encode(c, b, a)
	if string(one) != string(two) {
		t.Errorf("the order of the input changed the document:\n%s\n%s", one, two)
	}
	_, alone := encode(a)
	if revs["rls/shop/a"] == "" || revs["rls/shop/a"] != alone["rls/shop/a"] {
		t.Errorf("a's revision %q with neighbours, %q alone", revs["rls/shop/a"], alone["rls/shop/a"])
	}
}

// TestFitRLS: the cluster-wide document keeps the oldest policies within the
// budget; a newer one left out names the rate limit service's ConfigMap.
func TestFitRLS(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var ps []v1alpha1.RateLimitPolicy
	for i := range 10 {
		p := rlsPolicy(fmt.Sprintf("ns%d", i%3), fmt.Sprintf("p%d", i))
		p.CreationTimestamp = metav1.NewTime(now.Add(time.Duration(i) * time.Second))
		ps = append(ps, p)
	}
	all, err := render.RLS(ps)
	if err != nil {
		t.Fatal(err)
	}
	full, _, err := render.EncodeRLS(all)
	if err != nil {
		t.Fatal(err)
	}
	// A budget one byte short of all ten leaves out the newest only.
	fit, tooLarge, err := render.FitRLS(ps, len(full)-1)
	if err != nil {
		t.Fatal(err)
	}
	if len(fit) != 9 || len(tooLarge) != 1 || tooLarge[0].Name != "p9" {
		t.Fatalf("fit %d, left out %+v; want 9 and p9", len(fit), tooLarge)
	}
	if msg := tooLarge[0].Error(); !strings.Contains(msg, rlsconfig.ConfigMapName) || !strings.Contains(msg, "rate limit service") {
		t.Errorf("message %q does not name the rate limit service's ConfigMap", msg)
	}
	cfg, err := render.RLS(fit)
	if err != nil {
		t.Fatal(err)
	}
	data, _, err := render.EncodeRLS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > len(full)-1 {
		t.Errorf("the nine that fit encode to %d bytes, over the budget %d", len(data), len(full)-1)
	}
	// The exact budget keeps all ten.
	if fit, tooLarge, _ := render.FitRLS(ps, len(full)); len(fit) != 10 || len(tooLarge) != 0 {
		t.Errorf("at the exact size: fit %d, left out %d", len(fit), len(tooLarge))
	}
}

// rlsSize is the encoded size of the rate limit service's document with
// the policies ps.
func rlsSize(t *testing.T, ps ...v1alpha1.RateLimitPolicy) int {
	t.Helper()
	cfg, err := render.RLS(ps)
	if err != nil {
		t.Fatal(err)
	}
	data, _, err := render.EncodeRLS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return len(data)
}

// TestFitRLSShares (issue 22): the cluster-wide document is shared, each
// namespace with policies guaranteed an equal share of its budget, the
// room left over going by precedence as before. One namespace that floods
// the document pushes out no other namespace's policy that fits in its
// share, however new; alone, a namespace has the whole budget. Before, the
// flood's older policies took the budget and every later policy of other
// namespaces got ConfigTooLarge.
func TestFitRLSShares(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	at := func(ns, name string, second int) v1alpha1.RateLimitPolicy {
		p := rlsPolicy(ns, name)
		p.CreationTimestamp = metav1.NewTime(now.Add(time.Duration(second) * time.Second))
		return p
	}
	many := func(ns string, n, from int) []v1alpha1.RateLimitPolicy {
		var ps []v1alpha1.RateLimitPolicy
		for i := range n {
			ps = append(ps, at(ns, fmt.Sprintf("p%02d", i), from+i))
		}
		return ps
	}
	// Every policy below has the same size: namespaces and names of one
	// length.
	flood, victim := many("flood", 40, 0), many("fence", 3, 100)
	twenty := rlsSize(t, flood[:20]...)
	tests := []struct {
		name     string
		policies []v1alpha1.RateLimitPolicy
		maxBytes int
		// kept per namespace
		want map[string]int
	}{
		{"a flood, then another namespace's policy", append(append([]v1alpha1.RateLimitPolicy{}, flood...), victim[0]), twenty,
			map[string]int{"flood": 19, "fence": 1}},
		{"a flood, then three policies of another namespace", append(append([]v1alpha1.RateLimitPolicy{}, flood...), victim...), twenty,
			map[string]int{"flood": 17, "fence": 3}},
		{"alone: the whole budget, oldest first", flood, twenty, map[string]int{"flood": 20}},
		// 21 policies' room, 7 each: the small namespace uses 1, and its 6
		// go to the older of the two big ones.
		{"three namespaces: the small one's room goes to the older big one", append(append(many("bigol", 20, 0), many("bignw", 20, 50)...), at("small", "p00", 200)),
			rlsSize(t, flood[:21]...), map[string]int{"bigol": 13, "bignw": 7, "small": 1}},
		{"all fit", append(many("a", 3, 0), many("b", 3, 0)...), 0, map[string]int{"a": 3, "b": 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fit, tooLarge, err := render.FitRLS(tc.policies, tc.maxBytes)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int{}
			for _, p := range fit {
				got[p.Namespace]++
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("kept per namespace (-want +got):\n%s", diff)
			}
			budget := tc.maxBytes
			if budget == 0 {
				budget = render.DefaultMaxBytes
			}
			if size := rlsSize(t, fit...); size > budget {
				t.Errorf("the document is %d bytes, over %d", size, budget)
			}
			for _, e := range tooLarge {
				if e.Namespaces != len(tc.want) || !strings.Contains(e.Error(), "shared by the") {
					t.Errorf("left out: %v", e)
				}
			}
		})
	}
}

// TestFitRLSMaximal: whatever the mix of namespaces, ages and sizes, the
// document stays within the budget and no policy left out would fit in
// what remains; each namespace within its share keeps all its policies.
func TestFitRLSMaximal(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var ps []v1alpha1.RateLimitPolicy
		for i := range 1 + rng.IntN(30) {
			entries := 1 + rng.IntN(8)
			p := rlsPolicy(fmt.Sprintf("ns%d", rng.IntN(4)), fmt.Sprintf("p%d", i), func(s *v1alpha1.RateLimitPolicySpec) {
				s.RateLimitService.Descriptor = nil
				for j := range entries {
					s.RateLimitService.Descriptor = append(s.RateLimitService.Descriptor,
						v1alpha1.DescriptorEntry{Key: fmt.Sprintf("k%d", j), Value: strings.Repeat("v", rng.IntN(200))})
				}
			})
			p.CreationTimestamp = metav1.NewTime(now.Add(time.Duration(rng.IntN(20)) * time.Second))
			ps = append(ps, p)
		}
		budget := rlsSize(t) + rng.IntN(rlsSize(t, ps...))
		fit, tooLarge, err := render.FitRLS(ps, budget)
		if err != nil {
			t.Fatal(err)
		}
		size := rlsSize(t, fit...)
		if size > budget || len(fit)+len(tooLarge) != len(ps) {
			t.Fatalf("round %d: %d kept in %d bytes of %d, %d left out of %d", round, len(fit), size, budget, len(tooLarge), len(ps))
		}
		for _, e := range tooLarge {
			var p v1alpha1.RateLimitPolicy
			for _, q := range ps {
				if q.Namespace == e.Namespace && q.Name == e.Name {
					p = q
				}
			}
			if with := rlsSize(t, append(append([]v1alpha1.RateLimitPolicy{}, fit...), p)...); with <= budget {
				t.Fatalf("round %d: %s/%s left out, yet the document with it is %d bytes of %d", round, e.Namespace, e.Name, with, budget)
			}
			if e.NamespaceBytes+e.PolicyBytes <= e.ShareBytes {
				t.Fatalf("round %d: %s/%s left out within its namespace's share: %d + %d of %d", round, e.Namespace, e.Name, e.NamespaceBytes, e.PolicyBytes, e.ShareBytes)
			}
		}
	}
}
