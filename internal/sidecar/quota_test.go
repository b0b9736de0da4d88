package sidecar

import (
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/kubectlplugin"
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

// TestQuotaWhy: /debug/why reads a client's quota in the period Redis's
// clock is in, with the period's bounds in its zone, and `kubectl
// slidegate quota` prints it: used, limit, remaining, the day, its reset.
func TestQuotaWhy(t *testing.T) {
	r := testsupport.StartRedis(t)
	h := newHarness(t, redisLimiter(t, r, 1, exactTimeout), testConfig(nil,
		testPolicy("api", 100, withKey("Header", "X-User", "Deny"), func(p *sidecarconfig.Policy) {
			p.Quotas = []sidecarconfig.Quota{{Period: sidecarconfig.QuotaDay, Limit: 5, TimeZone: "Asia/Kolkata"}, {Period: sidecarconfig.QuotaMonth, Limit: 1_000_000_000_000}}
		})))
	for range 3 {
		h.do(t, "GET", "/", map[string]string{"X-User": "alice"})
	}
	debug := newTestServer(t, h.s.DebugHandler()).URL
	resp := whyAnswer(t, debug, url.Values{"policy": {"api"}, "header": {"alice"}})
	ls := resp.Policies[0].AdditionalLimits
	if len(ls) != 2 || ls[0].Quota == nil || ls[1].Quota == nil || ls[0].Window == nil {
		t.Fatalf("rows %+v, want the day and the month", ls)
	}
	// The periods that hold Redis's clock at the read.
	read := ls[0].Window.ServerTime
	kolkata, _ := time.LoadLocation("Asia/Kolkata")
	dayCal, _ := limiter.NewCalendar(limiter.Day, kolkata)
	start, end := dayCal.Period(read)
	day := ls[0]
	if day.Name != "api/day" || day.Window == nil || day.Window.InWindow != 3 || day.Window.Remaining != 2 ||
		day.Quota.TimeZone != "Asia/Kolkata" || !day.Quota.Start.Equal(start) || !day.Quota.End.Equal(end) || day.WindowSeconds != 86400 {
		t.Errorf("the day: %+v %+v %+v, want 3 of 5 in [%v, %v)", day, day.Window, day.Quota, start, end)
	}
	if m := ls[1]; m.Name != "api/month" || m.Quota.TimeZone != "UTC" || m.Quota.Start.Day() != 1 || m.Window.Remaining != 1_000_000_000_000-3 {
		t.Errorf("the month: %+v %+v %+v", m, m.Window, m.Quota)
	}
	q, err := kubectlplugin.Quotas(&kubectlplugin.WhyResult{Pod: "api-0", WhyResponse: resp})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := kubectlplugin.PrintQuota(&out, q, ""); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"api/day", start.In(kolkata).Format(time.DateOnly) + " Asia/Kolkata", end.Format(time.RFC3339), "api/month", read.UTC().Format("2006-01") + " UTC"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the plugin's table lacks %q:\n%s", want, out.String())
		}
	}
	// A policy without quotas is said to have none.
	resp.Policies[0].AdditionalLimits = nil
	if _, err := kubectlplugin.Quotas(&kubectlplugin.WhyResult{WhyResponse: resp}); err == nil || !strings.Contains(err.Error(), "has no quotas") {
		t.Errorf("a policy without quotas: %v", err)
	}
}
