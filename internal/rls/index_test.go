package rls

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestCurrentLimitUnits: the largest unit dividing the window, with a
// multiplier for the rest; sub-second windows rounded up to seconds.
func TestCurrentLimitUnits(t *testing.T) {
	cases := []struct {
		window time.Duration
		unit   rlsv3.RateLimitResponse_RateLimit_Unit
		mult   uint32 // 0: no unit_multiplier (1)
	}{
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 0},
		{1500 * time.Millisecond, rlsv3.RateLimitResponse_RateLimit_SECOND, 2},
		{time.Millisecond, rlsv3.RateLimitResponse_RateLimit_SECOND, 0},
		{90 * time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 90},
		{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0},
		{90 * time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE, 90},
		{2 * time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR, 2},
		{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY, 0},
		{14 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK, 2},
	}
	for _, tc := range cases {
		l := currentLimit("ns/p", 7, tc.window)
		if l.GetUnit() != tc.unit || l.GetUnitMultiplier().GetValue() != tc.mult || l.GetRequestsPerUnit() != 7 || l.GetName() != "ns/p" {
			t.Errorf("%v: %v", tc.window, l)
		}
	}
}
