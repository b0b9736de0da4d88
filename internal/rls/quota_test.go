package rls

import (
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestQuotaThroughTheRLS: a policy for the rate limit service with a
// daily quota in New York's time zone decides it with its window for a
// descriptor: the statuses carry the day's limit (unit DAY) while it has
// the least room, the call past the quota is OVER_LIMIT until New York's
// midnight, the headers have an item for the day without w, and each
// call counts once; the day's admits are in one counter of that day.
func TestQuotaThroughTheRLS(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	p := pol("per-ip", 100, time.Second, entry("remote_address"))
	p.Quotas = []rlsconfig.Quota{{Period: sidecarconfig.QuotaDay, Limit: 2, TimeZone: "America/New_York"}}
	rep := startReplica(t, standaloneConfig(r.Addr), writeConfig(t, p), limiter.Options{Timeout: 5 * time.Second})
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "10.0.0.1")}}
	ny, _ := time.LoadLocation("America/New_York")
	cal, _ := limiter.NewCalendar(limiter.Day, ny)
	start, end := cal.Period(time.Now())

	for i, rem := range []uint32{1, 0} {
		before := int64(time.Until(end)/time.Second) + 1
		resp := ask(t, rep.client, req)
		v := view(resp)
		left := int64(time.Until(end) / time.Second)
		if resp.GetOverallCode() != ok || len(v) != 1 || v[0].Name != "t/per-ip/day" || v[0].Unit != rlsv3.RateLimitResponse_RateLimit_DAY ||
			v[0].PerUnit != 2 || v[0].Remaining != rem || v[0].ResetSecs < left || v[0].ResetSecs > before {
			t.Fatalf("call %d: %v %+v, want OK with the day's %d remaining, reset at New York's midnight (%ds)", i, resp.GetOverallCode(), v, rem, left)
		}
		if i == 0 {
			if got, want := headerMap(resp)["RateLimit-Policy"], `"t/per-ip";q=100;w=1, "t/per-ip/day";q=2`; got != want {
				t.Errorf("RateLimit-Policy %q, want %q", got, want)
			}
		}
	}
	before := int64(time.Until(end)/time.Second) + 1
	resp := ask(t, rep.client, req)
	v := view(resp)
	left := int64(time.Until(end) / time.Second)
	if resp.GetOverallCode() != over || len(v) != 1 || v[0].Name != "t/per-ip/day" || v[0].ResetSecs < left || v[0].ResetSecs > before {
		t.Fatalf("the third call: %v %+v, want OVER_LIMIT until New York's midnight (%ds)", resp.GetOverallCode(), v, left)
	}
	if got := headerMap(resp)["RateLimit"]; !strings.HasPrefix(got, `"t/per-ip/day";r=0;t=`) {
		t.Errorf("the refusal's RateLimit %q, want the day's item", got)
	}
	id := rlsconfig.PolicyID("t", "per-ip")
	for o, want := range map[enforce.Outcome]float64{enforce.Allowed: 2, enforce.Rejected: 1} {
		if got := testMetric(t, rep.srv, "slidegate_rls_requests_total", map[string]string{"policy": id, "decision": o.String()}); got != want {
			t.Errorf("%s: %v, want %v (each call once)", o, got, want)
		}
	}
	keys, err := r.Do("KEYS", "*@day."+strconv.FormatInt(start.UnixMilli(), 10))
	if err != nil || !strings.Contains(keys, id) {
		t.Fatalf("the day's key: %q, %v", keys, err)
	}
	if n, err := r.Do("HGET", strings.TrimSpace(keys), "0"); err != nil || n != "2" {
		t.Errorf("the day's counter: %q, %v; want 2", n, err)
	}
}
