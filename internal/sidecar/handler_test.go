package sidecar

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// harness is one sidecar in front of an httptest upstream, its config in a
// ConfigMap-like volume.
type harness struct {
	s      *Sidecar
	up     *upstream
	cfg    *volume
	labels *volume
	front  *httptest.Server
}

func newHarness(t testing.TB, lim enforce.Decider, cfg *sidecarconfig.Config, mods ...func(*Options)) *harness {
	t.Helper()
	h := &harness{up: newUpstream(t), cfg: newVolume(t), labels: newVolume(t)}
	if cfg != nil {
		h.cfg.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t, cfg)})
	}
	h.labels.write(t, map[string][]byte{"labels": []byte("app=\"shop\"\n")})
	o := testOptions(h.up.URL, h.cfg, h.labels)
	for _, m := range mods {
		m(&o)
	}
	s, err := New(o, lim, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	h.s = s
	h.front = httptest.NewServer(s)
	t.Cleanup(h.front.Close)
	return h
}

// reply is the part of a response the tests look at (the body is read and
// closed by do).
type reply struct {
	StatusCode int
	Status     string
	Header     http.Header
}

func (h *harness) do(t testing.TB, method, path string, hdr map[string]string) (reply, string) {
	t.Helper()
	req, err := http.NewRequest(method, h.front.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := h.front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{StatusCode: resp.StatusCode, Status: resp.Status, Header: resp.Header}, string(body)
}

func TestRejectAndAdmitHeaders(t *testing.T) {
	mem := newMemLimiter()
	h := newHarness(t, mem, testConfig(nil, testPolicy("per-client", 2, withKey("Header", "X-User", "Deny"))))
	user := map[string]string{"X-User": "alice"}
	for i, wantRemaining := range []string{"1", "0"} {
		resp, _ := h.do(t, "GET", "/", user)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		if got := resp.Header.Get("RateLimit-Policy"); got != `"per-client";q=2;w=60` {
			t.Errorf("RateLimit-Policy = %q", got)
		}
		if got := resp.Header.Get("RateLimit"); got != `"per-client";r=`+wantRemaining+`;t=60` {
			t.Errorf("RateLimit = %q", got)
		}
		if resp.Header.Get("X-Upstream") != "yes" {
			t.Error("admitted response does not come from the application")
		}
	}
	resp, body := h.do(t, "GET", "/", user)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third request: status %d, want 429", resp.StatusCode)
	}
	if got := resp.Header.Get("Retry-After"); got != "60" {
		t.Errorf("Retry-After = %q, want 60", got)
	}
	if got := resp.Header.Get("RateLimit"); got != `"per-client";r=0;t=60` {
		t.Errorf("RateLimit = %q", got)
	}
	// The client learns when to retry and, in the RateLimit fields, the
	// policy's own name (the IETF draft's policy identifier); not the
	// namespace behind the sidecar (docs/security.md, "What clients learn").
	if body != "slidegate: rate limit exceeded; retry in 60s\n" || strings.Contains(body, "shop") {
		t.Errorf("429 body %q: want only the retry time", body)
	}
	for _, f := range []string{"RateLimit-Policy", "RateLimit"} {
		if v := resp.Header.Get(f); strings.Contains(v, "shop") || !strings.HasPrefix(v, `"per-client";`) {
			t.Errorf("%s = %q: want the policy's own name, not the namespace", f, v)
		}
	}
	if h.up.hits.Load() != 2 {
		t.Errorf("upstream saw %d requests, want 2", h.up.hits.Load())
	}
	// Another client has its own budget.
	if resp, _ := h.do(t, "GET", "/", map[string]string{"X-User": "bob"}); resp.StatusCode != 200 {
		t.Errorf("bob: status %d", resp.StatusCode)
	}
	if got := requestsCount(h.s, "per-client", enforce.Rejected); got != 1 {
		t.Errorf("rejected count = %v", got)
	}
	if got := requestsCount(h.s, "per-client", enforce.Allowed); got != 3 {
		t.Errorf("allowed count = %v", got)
	}
}

func TestRetryAfterRoundsUp(t *testing.T) {
	tests := []struct {
		wait time.Duration
		want string
	}{
		{0, "1"}, {time.Millisecond, "1"}, {time.Second, "1"}, {time.Second + time.Nanosecond, "2"}, {59500 * time.Millisecond, "60"},
	}
	for _, tt := range tests {
		mem := newMemLimiter()
		mem.decide = func(reqs []limiter.Request) []limiter.Decision {
			return []limiter.Decision{{Allowed: false, Limit: 5, RetryAfter: tt.wait, ResetAfter: 2 * tt.wait, Source: limiter.SourceRedis}}
		}
		h := newHarness(t, mem, testConfig(nil, testPolicy("p", 5)))
		resp, _ := h.do(t, "GET", "/", nil)
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != tt.want {
			t.Errorf("wait %v: status %d Retry-After %q, want %s", tt.wait, resp.StatusCode, resp.Header.Get("Retry-After"), tt.want)
		}
	}
}

func TestSeveralPolicies(t *testing.T) {
	mem := newMemLimiter()
	cfg := testConfig(nil,
		testPolicy("a-global", 3),
		testPolicy("b-per-user", 1, withKey("Header", "X-User", "Allow")),
		testPolicy("c-dry", 1, dryRun),
		testPolicy("d-posts", 1, func(p *sidecarconfig.Policy) { p.Match.Methods = []string{"POST"} }),
	)
	h := newHarness(t, mem, cfg)

	resp, _ := h.do(t, "GET", "/", map[string]string{"X-User": "alice"})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// Enforced policies only, in config order; the DryRun one and the POST
	// one are not advertised.
	if got := resp.Header.Get("RateLimit-Policy"); got != `"a-global";q=3;w=60, "b-per-user";q=1;w=60` {
		t.Errorf("RateLimit-Policy = %q", got)
	}
	if got := resp.Header.Get("RateLimit"); got != `"a-global";r=2;t=60, "b-per-user";r=0;t=60` {
		t.Errorf("RateLimit = %q", got)
	}
	// alice is now over b-per-user: rejected, and the admit in a-global is
	// undone (the global budget stays at 2 left).
	resp, _ = h.do(t, "GET", "/", map[string]string{"X-User": "alice"})
	if resp.StatusCode != 429 || !strings.HasPrefix(resp.Header.Get("RateLimit"), `"b-per-user";`) {
		t.Fatalf("status %d RateLimit %q, want 429 by b-per-user", resp.StatusCode, resp.Header.Get("RateLimit"))
	}
	if got := requestsCount(h.s, "a-global", enforce.NotCounted); got != 1 {
		t.Errorf("a-global not_counted = %v, want 1", got)
	}
	// Anonymous requests skip b-per-user (onMissing Allow); the dry-run
	// policy would reject the second one of them but does not.
	for i := range 2 {
		if resp, _ := h.do(t, "GET", "/", nil); resp.StatusCode != 200 {
			t.Fatalf("anonymous request %d: status %d", i, resp.StatusCode)
		}
	}
	if got := requestsCount(h.s, "c-dry", enforce.DryRunRejected); got < 1 {
		t.Errorf("c-dry dry_run_rejected = %v, want >= 1", got)
	}
	if got := requestsCount(h.s, "b-per-user", enforce.Skipped); got != 2 {
		t.Errorf("b-per-user skipped = %v, want 2", got)
	}
	// The global budget is spent now (1 + 2 admitted).
	resp, _ = h.do(t, "GET", "/", nil)
	if resp.StatusCode != 429 || !strings.HasPrefix(resp.Header.Get("RateLimit"), `"a-global";`) {
		t.Errorf("status %d RateLimit %q, want 429 by a-global", resp.StatusCode, resp.Header.Get("RateLimit"))
	}
	if h.up.hits.Load() != 3 {
		t.Errorf("upstream saw %d, want 3", h.up.hits.Load())
	}
}

func TestMissingKeyDenyAsksNothing(t *testing.T) {
	mem := newMemLimiter()
	h := newHarness(t, mem, testConfig(nil,
		testPolicy("a", 10),
		testPolicy("keyed", 10, withKey("QueryParameter", "api_key", "Deny")),
		testPolicy("keyed-dry", 10, dryRun, withKey("Header", "X-Key", "Deny")),
	))
	resp, body := h.do(t, "GET", "/items", nil)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "" {
		t.Fatalf("status %d Retry-After %q, want 429 without Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if !strings.Contains(body, `query parameter "api_key"`) || resp.Header.Get("RateLimit-Policy") != `"keyed";q=10;w=60` {
		t.Errorf("body %q", body)
	}
	if mem.calls.Load() != 0 || h.up.hits.Load() != 0 {
		t.Errorf("limiter calls %d, upstream hits %d: a request without its key must cost nothing", mem.calls.Load(), h.up.hits.Load())
	}
	if resp, _ := h.do(t, "GET", "/items?api_key=k", nil); resp.StatusCode != 200 {
		t.Errorf("with the key: status %d", resp.StatusCode)
	}
	if got := requestsCount(h.s, "keyed-dry", enforce.MissingKey); got != 2 {
		t.Errorf("keyed-dry missing_key_rejected = %v, want 2 (dry run only counts)", got)
	}
}

func TestFailClosedAnswers503(t *testing.T) {
	mem := newMemLimiter()
	redisDown := errors.New("dial tcp: connection refused")
	mem.decide = func(reqs []limiter.Request) []limiter.Decision {
		out := make([]limiter.Decision, len(reqs))
		for i, r := range reqs {
			if r.Rule.FailMode == limiter.FailClosed {
				out[i] = limiter.Decision{Limit: r.Rule.Limit, RetryAfter: 1500 * time.Millisecond, Source: limiter.SourceFailedClosed, Err: redisDown}
			} else {
				out[i] = limiter.Decision{Allowed: true, Limit: r.Rule.Limit, Remaining: 1, Source: limiter.SourceFallback, Err: redisDown}
			}
		}
		return out
	}
	h := newHarness(t, mem, testConfig(nil, testPolicy("closed", 10, failClosed), testPolicy("open", 10)))
	resp, body := h.do(t, "GET", "/", nil)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "2" || body != "slidegate: rate limiter unavailable; retry in 2s\n" {
		t.Errorf("status %d Retry-After %q body %q, want 503, 2, the retry time only", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if got := requestsCount(h.s, "closed", enforce.FailedClosed); got != 1 {
		t.Errorf("failed_closed = %v", got)
	}
	if got := testutilCounter(h.s.metrics.decisions.RedisErrors); got != 1 {
		t.Errorf("redis errors = %v", got)
	}
}

func TestNoConfigAnswers503AndIsNotReady(t *testing.T) {
	h := newHarness(t, newMemLimiter(), nil)
	resp, _ := h.do(t, "GET", "/", nil)
	if resp.StatusCode != 503 || h.up.hits.Load() != 0 {
		t.Errorf("status %d, upstream hits %d", resp.StatusCode, h.up.hits.Load())
	}
	if h.s.Ready() {
		t.Error("ready without a config")
	}
	rec := httptest.NewRecorder()
	h.s.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != 503 {
		t.Errorf("/readyz = %d", rec.Code)
	}
}

func TestNoMatchingPolicyForwards(t *testing.T) {
	mem := newMemLimiter()
	h := newHarness(t, mem, testConfig(nil,
		testPolicy("other-pods", 1, func(p *sidecarconfig.Policy) {
			p.Selector.MatchLabels = map[string]string{"app": "billing"}
		}),
		testPolicy("api-only", 1, func(p *sidecarconfig.Policy) { p.Match.PathPrefixes = []string{"/api/"} }),
	))
	for range 3 {
		resp, _ := h.do(t, "GET", "/static/x", nil)
		if resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
			t.Fatalf("status %d RateLimit %q", resp.StatusCode, resp.Header.Get("RateLimit"))
		}
	}
	if mem.calls.Load() != 0 {
		t.Errorf("limiter asked %d times for requests no policy matches", mem.calls.Load())
	}
	if got := len(h.s.state.Load().policies); got != 1 {
		t.Errorf("%d policies apply to the pod, want 1 (the selector of other-pods does not match)", got)
	}
}

// TestRedisErrorsAreLoggedSparingly: Redis being down is logged with its
// reason once per interval, not once per request, and the next line counts
// the errors in between.
func TestRedisErrorsAreLoggedSparingly(t *testing.T) {
	mem := newMemLimiter()
	mem.decide = func(reqs []limiter.Request) []limiter.Decision {
		out := make([]limiter.Decision, len(reqs))
		for i, r := range reqs {
			out[i] = limiter.Decision{Allowed: true, Limit: r.Rule.Limit, Source: limiter.SourceFallback, Err: errors.New("dial tcp 10.0.0.9:6379: connection refused")}
		}
		return out
	}
	h := newHarness(t, mem, testConfig(nil, testPolicy("open", 10)))
	var logs syncBuffer
	h.s.log = slog.New(slog.NewTextHandler(&logs, nil))
	lines := func() []string {
		return slices.DeleteFunc(strings.Split(grepLines(logs.String(), "Redis did not decide"), "\n"), func(l string) bool { return l == "" })
	}
	for range 30 {
		if resp, _ := h.do(t, "GET", "/", nil); resp.StatusCode != 200 {
			t.Fatalf("fail-open policy: status %d", resp.StatusCode)
		}
	}
	if got := testutilCounter(h.s.metrics.decisions.RedisErrors); got != 30 {
		t.Errorf("redis errors = %v, want 30", got)
	}
	if l := lines(); len(l) != 1 || !strings.Contains(l[0], "connection refused") || !strings.Contains(l[0], "errorsSinceLastLog=1") {
		t.Fatalf("after 30 failed decisions, want one log line with the reason, got:\n%s", strings.Join(l, "\n"))
	}
	h.s.redisErrLogged.Add(-int64(redisErrorLogEvery)) // the interval has passed
	h.do(t, "GET", "/", nil)
	if l := lines(); len(l) != 2 || !strings.Contains(l[1], "errorsSinceLastLog=30") {
		t.Fatalf("after the interval, want a second line counting the 30 errors since the first, got:\n%s", strings.Join(l, "\n"))
	}
}
