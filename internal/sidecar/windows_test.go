package sidecar

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/kubectlplugin"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

func withWindows(ls ...sidecarconfig.Limit) func(*sidecarconfig.Policy) {
	return func(p *sidecarconfig.Policy) { p.AdditionalLimits = ls }
}

// TestSeveralWindowsHeadersAndCounts: a policy with an additional window
// answers with one RateLimit item per window (the IETF draft's form for
// several policies), refuses for the window that is full, with that
// window's wait and item, and counts each request once.
func TestSeveralWindowsHeadersAndCounts(t *testing.T) {
	r := testsupport.StartRedis(t)
	h := newHarness(t, redisLimiter(t, r, 1, exactTimeout), testConfig(nil,
		testPolicy("api", 2, withKey("Header", "X-User", "Deny"), func(p *sidecarconfig.Policy) { p.WindowMillis = 1000 },
			withWindows(sidecarconfig.Limit{WindowMillis: 3_600_000, Limit: 3}))))
	user := map[string]string{"X-User": "alice"}

	resp, _ := h.do(t, "GET", "/", user)
	if resp.StatusCode != 200 {
		t.Fatalf("first request: status %d", resp.StatusCode)
	}
	if got, want := resp.Header.Get("RateLimit-Policy"), `"api";q=2;w=1, "api/1h";q=3;w=3600`; got != want {
		t.Errorf("RateLimit-Policy = %q, want %q", got, want)
	}
	if got, want := resp.Header.Get("RateLimit"), `"api";r=1;t=1, "api/1h";r=2;t=3600`; got != want {
		t.Errorf("RateLimit = %q, want %q", got, want)
	}
	if resp, _ := h.do(t, "GET", "/", user); resp.StatusCode != 200 {
		t.Fatalf("second request: status %d", resp.StatusCode)
	}
	// The second's window is full; the hour has room.
	resp, _ = h.do(t, "GET", "/", user)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || resp.Header.Get("RateLimit") != `"api";r=0;t=1` {
		t.Fatalf("third request: %d, Retry-After %q, RateLimit %q; want 429 for the second's window", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit"))
	}
	time.Sleep(1100 * time.Millisecond)
	if resp, _ := h.do(t, "GET", "/", user); resp.StatusCode != 200 {
		t.Fatalf("a second later: status %d", resp.StatusCode)
	}
	// Now the hour is full (3), the second's window is not (1).
	resp, _ = h.do(t, "GET", "/", user)
	retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != 429 || retry < 3590 || retry > 3600 || resp.Header.Get("RateLimit") != `"api/1h";r=0;t=`+resp.Header.Get("Retry-After") {
		t.Fatalf("fifth request: %d, Retry-After %q, RateLimit %q; want 429 for the hour, retry in about an hour", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit"))
	}
	if resp.Header.Get("RateLimit-Policy") != `"api/1h";q=3;w=3600` {
		t.Errorf("RateLimit-Policy of the hour's 429 = %q", resp.Header.Get("RateLimit-Policy"))
	}
	// Five requests: three allowed, two rejected, each counted once.
	if a, rj, nc := requestsCount(h.s, "api", enforce.Allowed), requestsCount(h.s, "api", enforce.Rejected), requestsCount(h.s, "api", enforce.NotCounted); a != 3 || rj != 2 || nc != 0 {
		t.Errorf("allowed %v, rejected %v, not counted %v; want 3, 2 and 0", a, rj, nc)
	}
	if n := h.up.hits.Load(); n != 3 {
		t.Errorf("the application saw %d requests, want 3", n)
	}
	// The hour's admits are in a key of their own (the second's window
	// keeps the key it had before the policy had more windows).
	client := hashKey(keyPrefixHeader, "alice")
	hour := redisschema.VariantKey(redisschema.Key("test:", testNamespace+"/api", client), "3600000")
	if n, err := r.Do("ZCARD", hour); err != nil || n != "3" {
		t.Errorf("ZCARD %s = %q (%v), want 3", hour, n, err)
	}
}

// TestSeveralWindowsExactAcrossSidecars: three sidecars, one Redis, a
// policy of 3 requests in any 400ms and 7 in any 1.6s per user: no window
// of either length ever holds more than its limit, and no request is
// refused while both had room (the limiter's TestSeveralWindowsNaiveApartFails
// shows the windows decided apart failing the second).
func TestSeveralWindowsExactAcrossSidecars(t *testing.T) {
	r := testsupport.StartRedis(t)
	lims := []enforce.Decider{redisLimiter(t, r, 3, exactTimeout), redisLimiter(t, r, 3, exactTimeout), redisLimiter(t, r, 3, exactTimeout)}
	const short, long = 400 * time.Millisecond, 1600 * time.Millisecond
	f := newFleet(t, lims, testConfig(nil, testPolicy("api", 3, withKey("Header", "X-User", "Deny"),
		func(p *sidecarconfig.Policy) { p.WindowMillis = short.Milliseconds() },
		withWindows(sidecarconfig.Limit{WindowMillis: long.Milliseconds(), Limit: 7}))))

	var bad atomic.Int64
	ds := testsupport.Paced(6, []string{"user-0", "user-1"}, 4*long, func(w, n int, user string) (bool, bool) {
		req, _ := http.NewRequest("GET", f.fronts[(w+n)%len(f.fronts)]+"/", nil)
		req.Header.Set("X-User", user)
		resp, err := f.client.Do(req)
		if err != nil {
			t.Error(err)
			return false, false
		}
		drain(resp)
		if resp.StatusCode != 200 && (resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "") {
			bad.Add(1)
		}
		return resp.StatusCode == 200, true
	})
	if bad.Load() > 0 || len(ds) < 200 {
		t.Fatalf("%d answers neither 200 nor a 429 with Retry-After; %d requests", bad.Load(), len(ds))
	}
	admitted := testsupport.Admitted(ds)
	for _, l := range []testsupport.Limit{{Limit: 3, Window: short}, {Limit: 7, Window: long}} {
		if most, where := testsupport.BusiestWindow(ds, l.Window); most > l.Limit {
			t.Errorf("window %v: %d admits in one window, limit %d: %s", l.Window, most, l.Limit, where)
		}
	}
	if wrong := testsupport.DenialsBelowLimits(ds, []testsupport.Limit{{Limit: 3, Window: short}, {Limit: 7, Window: long}}); len(wrong) > 0 {
		t.Errorf("%d of %d requests refused with room in every window, first: %s", len(wrong), len(ds), wrong[0])
	}
	var counted float64
	for _, s := range f.sidecars {
		for _, o := range []enforce.Outcome{enforce.Allowed, enforce.Rejected, enforce.NotCounted} {
			counted += requestsCount(s, "api", o)
		}
	}
	// Too few admits would be denials with room, judged above.
	if int(counted) != len(ds) || admitted == 0 || admitted == len(ds) || int(f.up.hits.Load()) != admitted {
		t.Errorf("%d requests, %v counted, %d admitted, the application saw %d", len(ds), counted, admitted, f.up.hits.Load())
	}
	t.Logf("%d requests, %d admitted", len(ds), admitted)
}

// TestWhyShowsEveryWindow: /debug/why reads each window of a policy for
// the client, so a request refused by the hour is explained by the hour
// (the policy's own window shows room), and the plugin prints a row for
// it.
func TestWhyShowsEveryWindow(t *testing.T) {
	r := testsupport.StartRedis(t)
	h := newHarness(t, redisLimiter(t, r, 1, exactTimeout), testConfig(nil,
		testPolicy("api", 5, withKey("Header", "X-User", "Deny"), func(p *sidecarconfig.Policy) { p.WindowMillis = 1000 },
			withWindows(sidecarconfig.Limit{WindowMillis: 3_600_000, Limit: 2}))))
	for range 3 {
		h.do(t, "GET", "/", map[string]string{"X-User": "alice"})
	}
	debug := newTestServer(t, h.s.DebugHandler()).URL
	resp := whyAnswer(t, debug, url.Values{"policy": {"api"}, "header": {"alice"}})
	p := resp.Policies[0]
	if p.Window == nil || !p.Window.Allowed || p.Window.Remaining != 3 {
		t.Errorf("the second's window: %+v, want room for 3", p.Window)
	}
	if len(p.AdditionalLimits) != 1 {
		t.Fatalf("additional windows %+v, want the hour", p.AdditionalLimits)
	}
	l := p.AdditionalLimits[0]
	if l.Name != "api/1h" || l.Limit != 2 || l.WindowSeconds != 3600 || l.Window == nil || l.Window.Allowed || l.Window.Remaining != 0 || l.Window.RetryAfterSeconds < 3500 {
		t.Errorf("the hour: %+v %+v, want full, retry in about an hour", l, l.Window)
	}
	var out strings.Builder
	if err := kubectlplugin.PrintWhy(&out, &kubectlplugin.WhyResult{WhyResponse: resp}, ""); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "  api/1h ") {
		t.Errorf("the plugin's table has no row for the hour:\n%s", out.String())
	}
}
