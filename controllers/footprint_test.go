package controllers

import (
	"strings"
	"testing"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
)

// TestFootprintBound: with the manager's --max-client-bytes, a policy whose
// every client could make the shared Redis hold more is left out of its
// namespace's document and reported FootprintTooLarge, for the sidecars
// and for the rate limit service; the others are published. Without the
// bound (the naive case), a tenant's limit of 1,000,000 would let each
// client of its API fill ~104 MB of the Redis every namespace shares.
func TestFootprintBound(t *testing.T) {
	const bound = 1 << 20 // 1 MiB: a SlidingLog limit of 10,082
	small := newPolicy("shop", "small", func(s *v1alpha1.RateLimitPolicySpec) { s.Limit = 1000 })
	huge := newPolicy("shop", "huge", func(s *v1alpha1.RateLimitPolicySpec) { s.Limit = 1_000_000 })
	counter := newPolicy("shop", "counter", func(s *v1alpha1.RateLimitPolicySpec) {
		s.Limit, s.Algorithm = 1_000_000, v1alpha1.AlgorithmSlidingWindowCounter
	})
	policies := []v1alpha1.RateLimitPolicy{*small, *huge, *counter}

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
			out, err := renderNamespace(policies, render.Options{Namespace: "shop", MaxClientBytes: tc.max})
			if err != nil {
				t.Fatal(err)
			}
			prob, refused := out.notAccepted["huge"]
			if refused != tc.wantHuge {
				t.Fatalf("huge refused %v (%v), want %v", refused, prob, tc.wantHuge)
			}
			if refused && (prob.Reason() != v1alpha1.ReasonFootprintTooLarge || !strings.Contains(prob.Message(), "104,000,000 bytes")) {
				t.Errorf("problem %s: %s", prob.Reason(), prob.Message())
			}
			if got := len(policies) - len(out.notAccepted); got != tc.published {
				t.Errorf("%d published, want %d (%v)", got, tc.published, out.notAccepted)
			}
		})
	}

	rls := func(name string, limit int32) v1alpha1.RateLimitPolicy {
		p := newPolicy("edge", name, func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector, s.Key, s.Limit = nil, v1alpha1.ClientKey{}, limit
			s.RateLimitService = &v1alpha1.RateLimitServiceTarget{Domain: "edge", Descriptor: []v1alpha1.DescriptorEntry{{Key: "remote_address"}}}
		})
		return *p
	}
	out, err := renderRLS([]v1alpha1.RateLimitPolicy{rls("small", 100), rls("huge", 1_000_000)}, nil, 0, bound)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.notAccepted) != 1 {
		t.Fatalf("rate limit service: not accepted %v, want huge only", out.notAccepted)
	}
	for k, prob := range out.notAccepted {
		if k.Name != "huge" || prob.Reason() != v1alpha1.ReasonFootprintTooLarge {
			t.Errorf("rate limit service: %s %s: %s", k, prob.Reason(), prob.Message())
		}
	}
}
