package render

import (
	"errors"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// TestCheckFootprint: a policy whose clients could each make the shared
// Redis hold more than the platform team's bound is refused, with what to
// do; the counter algorithm's constant footprint passes where the log's
// does not.
func TestCheckFootprint(t *testing.T) {
	policy := func(limit int32, alg v1alpha1.Algorithm) *v1alpha1.RateLimitPolicy {
		p := &v1alpha1.RateLimitPolicy{}
		p.Namespace, p.Name = "shop", "per-user"
		p.Spec.Limit, p.Spec.Algorithm = limit, alg
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
			if !errors.As(err, &fe) || fe.Bytes != int64(tt.p.Spec.Limit)*SlidingLogBytesPerAdmit {
				t.Errorf("error %#v", err)
			}
			for _, want := range []string{"shop/per-user", "--max-client-bytes", "SlidingWindowCounter", "1,048,576"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%q does not say %q", err, want)
				}
			}
		})
	}
}
