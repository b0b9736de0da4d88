package sidecar

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestQuotaHeadersAndCounts: a policy with a daily quota in New York's
// time zone answers with an item for the day (no w in its policy item: a
// day has no one length), refuses once the day's quota is spent until
// New York's next midnight, and counts each request once; the day's
// admits are in one counter of that day.
func TestQuotaHeadersAndCounts(t *testing.T) {
	r := testsupport.StartRedis(t)
	h := newHarness(t, redisLimiter(t, r, 1, exactTimeout), testConfig(nil,
		testPolicy("api", 100, withKey("Header", "X-User", "Deny"), func(p *sidecarconfig.Policy) {
			p.WindowMillis = 1000
			p.Quotas = []sidecarconfig.Quota{{Period: sidecarconfig.QuotaDay, Limit: 2, TimeZone: "America/New_York"}}
		})))
	user := map[string]string{"X-User": "alice"}
	ny, _ := time.LoadLocation("America/New_York")
	cal, _ := limiter.NewCalendar(limiter.Day, ny)
	start, end := cal.Period(time.Now())

	before := int64(time.Until(end)/time.Second) + 1
	resp, _ := h.do(t, "GET", "/", user)
	if resp.StatusCode != 200 {
		t.Fatalf("first request: status %d", resp.StatusCode)
	}
	if got, want := resp.Header.Get("RateLimit-Policy"), `"api";q=100;w=1, "api/day";q=2`; got != want {
		t.Errorf("RateLimit-Policy = %q, want %q", got, want)
	}
	// The day's reset is the seconds to New York's midnight rounded up,
	// as they were between before and after the request.
	const prefix = `"api";r=99;t=1, "api/day";r=1;t=`
	got := resp.Header.Get("RateLimit")
	reset, err := strconv.ParseInt(strings.TrimPrefix(got, prefix), 10, 64)
	if left := int64(time.Until(end) / time.Second); !strings.HasPrefix(got, prefix) || err != nil || reset < left || reset > before {
		t.Errorf("RateLimit = %q, want %q and New York's midnight (%ds away)", got, prefix, left)
	}
	if resp, _ := h.do(t, "GET", "/", user); resp.StatusCode != 200 {
		t.Fatalf("second request: status %d", resp.StatusCode)
	}
	before = int64(time.Until(end)/time.Second) + 1
	resp, _ = h.do(t, "GET", "/", user)
	retry, _ := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
	left := int64(time.Until(end) / time.Second)
	if resp.StatusCode != 429 || retry < left || retry > before || resp.Header.Get("RateLimit") != `"api/day";r=0;t=`+resp.Header.Get("Retry-After") {
		t.Fatalf("third request: %d, Retry-After %q, RateLimit %q; want 429 until New York's midnight (%ds)", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit"), left)
	}
	if a, rj := requestsCount(h.s, "api", enforce.Allowed), requestsCount(h.s, "api", enforce.Rejected); a != 2 || rj != 1 {
		t.Errorf("allowed %v, rejected %v; want 2 and 1", a, rj)
	}
	client := hashKey(keyPrefixHeader, "alice")
	day := redisschema.VariantKey(redisschema.Key("test:", testNamespace+"/api", client), "day."+strconv.FormatInt(start.UnixMilli(), 10))
	if n, err := r.Do("HGET", day, "0"); err != nil || n != "2" {
		t.Errorf("HGET %s 0 = %q (%v), want 2", day, n, err)
	}
}
