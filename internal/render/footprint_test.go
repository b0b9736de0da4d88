package render

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// TestCheckFootprint: a policy whose clients could each make the shared
// Redis hold more than the platform team's bound is refused, with what to
// do; the counter algorithm's constant footprint passes where the log's
// does not.
func TestCheckFootprint(t *testing.T) {
	policy := func(limit int32, alg v1alpha1.Algorithm, more ...int32) *v1alpha1.RateLimitPolicy {
		p := &v1alpha1.RateLimitPolicy{}
		p.Namespace, p.Name = "shop", "per-user"
		p.Spec.Limit, p.Spec.Algorithm = limit, alg
		for i, l := range more {
			p.Spec.AdditionalLimits = append(p.Spec.AdditionalLimits, v1alpha1.AdditionalLimit{Window: v1alpha1.Duration(fmt.Sprint(i+2) + "s"), Limit: l})
		}
		return p
	}
	const mib = 1 << 20
	tests := []struct {
		name    string
		p       *v1alpha1.RateLimitPolicy
		max     int64
		refused bool
	}{
		{"no bound", policy(1_000_000, ""), 0, false},
		{"a log within the bound", policy(10_000, ""), mib, false},
		{"a log over the bound (the default algorithm)", policy(1_000_000, ""), mib, true},
		{"a log over the bound", policy(20_000, v1alpha1.AlgorithmSlidingLog), mib, true},
		{"the counter at the same limit", policy(1_000_000, v1alpha1.AlgorithmSlidingWindowCounter), mib, false},
		// Each additional window is a full window more per client.
		{"two windows within the bound", policy(5_000, "", 5_000), mib, false},
		{"two windows over the bound, each within it", policy(6_000, "", 6_000), mib, true},
		{"two counters", policy(1_000_000, v1alpha1.AlgorithmSlidingWindowCounter, 1_000_000), 2 * CounterBytes, false},
		{"three counters", policy(1_000_000, v1alpha1.AlgorithmSlidingWindowCounter, 1, 1), 2 * CounterBytes, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckFootprint(tt.p, tt.max)
			if (err != nil) != tt.refused {
				t.Fatalf("CheckFootprint = %v, refused want %v", err, tt.refused)
			}
			if err == nil {
				return
			}
			var fe *FootprintTooLargeError
			if !errors.As(err, &fe) || fe.Bytes != ClientFootprint(tt.p) {
				t.Errorf("error %#v", err)
			}
			if tt.p.Spec.Algorithm == v1alpha1.AlgorithmSlidingWindowCounter {
				return
			}
			if n := int64(tt.p.Spec.Limit); fe.Limit < n || fe.Bytes != fe.Limit*SlidingLogBytesPerAdmit {
				t.Errorf("error %#v: not a full window of each limit", err)
			}
			for _, want := range []string{"shop/per-user", "--max-client-bytes", "SlidingWindowCounter", "1,048,576"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%q does not say %q", err, want)
				}
			}
		})
	}
}
