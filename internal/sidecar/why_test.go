package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/debugapi"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// recordingLimiter is the real limiter, remembering what the request path
// asked it and answered last: the client key the sidecar derived for live
// traffic, and its decision; and every call (limiterCall).
type recordingLimiter struct {
	*limiter.Limiter
	mu    sync.Mutex
	reqs  []limiter.Request
	ds    []limiter.Decision
	begun time.Time // wall clock just before the last Decide
	ended time.Time
	calls []limiterCall
}

// limiterCall is one Decide: Redis decided at its own time somewhere in
// [begun, ended] (the same machine's clock).
type limiterCall struct {
	begun, ended time.Time
	reqs         []limiter.Request
	ds           []limiter.Decision
}

func (rl *recordingLimiter) Decide(ctx context.Context, reqs []limiter.Request) []limiter.Decision {
	begun := time.Now()
	ds := rl.Limiter.Decide(ctx, reqs)
	rl.mu.Lock()
	rl.reqs, rl.ds, rl.begun, rl.ended = reqs, ds, begun, time.Now()
	rl.calls = append(rl.calls, limiterCall{begun: begun, ended: rl.ended, reqs: slices.Clone(reqs), ds: slices.Clone(ds)})
	rl.mu.Unlock()
	return ds
}

func (rl *recordingLimiter) last() ([]limiter.Request, []limiter.Decision, time.Time, time.Time) {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	return rl.reqs, rl.ds, rl.begun, rl.ended
}

// askWhy calls the admin port's /debug/why with the value in the
// Slidegate-Client-Value header, as the plugin does.
func askWhy(t *testing.T, admin string, query url.Values, value string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, admin+"/debug/why?"+query.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if value != "" {
		req.Header.Set(debugapi.WhyValueHeader, value)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// whyAnswer is askWhy's answer to a query that must succeed, decoded.
func whyAnswer(t *testing.T, admin string, query url.Values) debugapi.WhyResponse {
	t.Helper()
	code, body := askWhy(t, admin, query, "")
	var resp debugapi.WhyResponse
	if code != http.StatusOK || json.Unmarshal(body, &resp) != nil {
		t.Fatalf("%d %s", code, body)
	}
	return resp
}

// TestWhyIsTheSidecarsTruth: for every key source, live requests through
// the sidecar fill a client's window in a real redis-server; /debug/why,
// given the identity as the user knows it, names the very client key the
// request path derived, and its window agrees with the sidecar's next
// decision: remaining (one less after an admit) and, once over the limit,
// the retry instant. The raw value never appears in the answer or the log.
func TestWhyIsTheSidecarsTruth(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	const secret = "s3cr3t-api-key"
	token := "Bearer " + jwt(`{"sub":"`+secret+`"}`)
	cases := []struct {
		source, name string
		hdr          map[string]string // what a live request carries
		path         string
		shorthand    string // the /debug/why parameter; value in the header when ""
		value        string
	}{
		{source: sidecarconfig.SourceHeader, name: "X-Api-Key", hdr: map[string]string{"X-Api-Key": " " + secret + " "}, path: "/", value: secret},
		{source: sidecarconfig.SourceQueryParameter, name: "api_key", path: "/?a=1&api_key=" + url.QueryEscape(secret+" +x"), value: secret + " +x"},
		{source: sidecarconfig.SourceJWTClaim, name: "sub", hdr: map[string]string{"Authorization": token}, path: "/", value: secret},
		{source: sidecarconfig.SourceRemoteAddress, path: "/", shorthand: "ip", value: "127.0.0.1"},
		{source: sidecarconfig.SourceGlobal, path: "/", shorthand: "global"},
	}
	for _, alg := range []string{"SlidingLog", "SlidingWindowCounter"} {
		for _, tc := range cases {
			t.Run(alg+"/"+tc.source, func(t *testing.T) {
				t.Parallel()
				var logs bytes.Buffer
				rl := &recordingLimiter{Limiter: redisLimiter(t, r, 1, exactTimeout)}
				name := strings.ToLower(alg + "-" + tc.source)
				cfg := testConfig(nil,
					testPolicy(name, 3, withKey(tc.source, tc.name, sidecarconfig.MissingDeny), func(p *sidecarconfig.Policy) { p.Algorithm = alg }),
					testPolicy("site-wide", 1000),
					testPolicy("admin-only", 1000, func(p *sidecarconfig.Policy) { p.Match.PathPrefixes = []string{"/admin"} }))
				h := newHarness(t, rl, cfg)
				h.s.log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
				debug := newTestServer(t, h.s.DebugHandler()).URL
				q := url.Values{"policy": {name}}
				hv := tc.value
				if tc.shorthand != "" {
					q.Set(tc.shorthand, tc.value)
					hv = ""
				} else {
					q.Set("source", tc.source)
				}
				why := func() debugapi.WhyPolicy {
					t.Helper()
					code, body := askWhy(t, debug, q, hv)
					if code != http.StatusOK {
						t.Fatalf("/debug/why: %d %s", code, body)
					}
					if tc.value != "" && tc.source != sidecarconfig.SourceRemoteAddress && bytes.Contains(body, []byte("s3cr3t")) {
						t.Fatalf("the answer holds the raw value: %s", body)
					}
					var resp debugapi.WhyResponse
					if err := json.Unmarshal(body, &resp); err != nil {
						t.Fatal(err)
					}
					if len(resp.Policies) != 2 || resp.Policies[1].Name != "site-wide" || resp.Policies[1].ClientKey != keyGlobal {
						t.Fatalf("want the target and site-wide (not admin-only): %s", body)
					}
					return resp.Policies[0]
				}

				for i := range 4 {
					before := why()
					if !before.Target || before.Window == nil {
						t.Fatalf("request %d: %+v", i, before)
					}
					status, _ := h.do(t, http.MethodGet, tc.path, tc.hdr)
					reqs, ds, begun, ended := rl.last()
					k := slices.IndexFunc(reqs, func(r limiter.Request) bool { return r.Rule.ID == testNamespace+"/"+name })
					if len(reqs) != 2 || k < 0 {
						t.Fatalf("request %d: decided %+v", i, reqs)
					}
					if before.ClientKey != h.s.hasher.Load().Sum(reqs[k].Client) || !strings.Contains(before.RedisKey, ":"+reqs[k].Client+"}") {
						t.Fatalf("request %d: /debug/why derived %q (Redis key %q), the request path %q", i, before.ClientKey, before.RedisKey, reqs[k].Client)
					}
					d, w := ds[k], before.Window
					if d.Allowed != w.Allowed || (status.StatusCode == http.StatusOK) != w.Allowed {
						t.Fatalf("request %d: why says allowed=%v, the sidecar answered %d (%+v)", i, w.Allowed, status.StatusCode, d)
					}
					if w.Allowed {
						if d.Remaining != w.Remaining-1 {
							t.Errorf("request %d: remaining: why %d, decision %d", i, w.Remaining, d.Remaining)
						}
						continue
					}
					// Denied: the decision's retry instant, on the shared clock,
					// is the one /debug/why announced.
					if d.Remaining != 0 || w.Remaining != 0 || w.InWindow < 3 {
						t.Errorf("request %d: remaining why %d decision %d, in window %v", i, w.Remaining, d.Remaining, w.InWindow)
					}
					lo, hi := begun.Add(d.RetryAfter), ended.Add(d.RetryAfter)
					if w.RetryAt.Before(lo.Add(-time.Millisecond)) {
						t.Errorf("request %d: retry at %v, before the decision's [%v, %v]", i, w.RetryAt, lo, hi)
					}
					// A deny-cache answer's retry instant is, by design, up to
					// one round trip early (internal/limiter/view.go): it only
					// must not be late. Redis's own must agree.
					if d.Source == limiter.SourceRedis && w.RetryAt.After(hi.Add(time.Millisecond)) {
						t.Errorf("request %d: retry at %v, after the decision's [%v, %v]", i, w.RetryAt, lo, hi)
					}
				}
				if strings.Contains(logs.String(), "s3cr3t") {
					t.Errorf("the log holds the raw value:\n%s", logs.String())
				}
			})
		}
	}
}

// TestWhyReadsWithoutCounting: asking many times changes nothing the next
// request sees; the paired check shows a request does change it.
func TestWhyReadsWithoutCounting(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	rl := &recordingLimiter{Limiter: redisLimiter(t, r, 1, exactTimeout)}
	h := newHarness(t, rl, testConfig(nil, testPolicy("per-user", 2, withKey("Header", "X-User", "Deny"))))
	debug := newTestServer(t, h.s.DebugHandler()).URL
	q := url.Values{"policy": {"per-user"}, "header": {"alice"}}
	remaining := func() int64 {
		return whyAnswer(t, debug, q).Policies[0].Window.Remaining
	}
	for range 20 {
		if got := remaining(); got != 2 {
			t.Fatalf("remaining %d after reads only", got)
		}
	}
	h.do(t, http.MethodGet, "/", map[string]string{"X-User": "alice"})
	if got := remaining(); got != 1 {
		t.Fatalf("remaining %d after one request", got)
	}
}

func TestWhyRefusesBadQueries(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &recordingLimiter{Limiter: redisLimiter(t, testsupport.StartRedis(t), 1, exactTimeout)},
		testConfig(nil, testPolicy("per-user", 2, withKey("Header", "X-User", "Deny"))))
	debug := newTestServer(t, h.s.DebugHandler()).URL
	for _, tc := range []struct {
		q    url.Values
		code int
		want string
	}{
		{url.Values{"policy": {"per-user"}}, 400, "exactly one client identity"},
		{url.Values{"policy": {"per-user"}, "header": {"a"}, "ip": {"1.2.3.4"}}, 400, "exactly one client identity"},
		{url.Values{"policy": {"per-user"}, "source": {"Header"}}, 400, "needs a value"},
		{url.Values{"policy": {"nope"}, "header": {"a"}}, 404, "policies here: per-user"},
		{url.Values{"header": {"a"}}, 400, "needs a policy or a name"},
		{url.Values{"policy": {"per-user"}, "ip": {"not-an-ip"}}, 400, "ip:"},
	} {
		code, body := askWhy(t, debug, tc.q, "")
		if code != tc.code || !strings.Contains(string(body), tc.want) {
			t.Errorf("%v: %d %s; want %d %q", tc.q, code, body, tc.code, tc.want)
		}
	}
	// A limiter that cannot read windows says so.
	h2 := newHarness(t, newMemLimiter(), testConfig(nil, testPolicy("g", 2)))
	if code, body := askWhy(t, newTestServer(t, h2.s.DebugHandler()).URL, url.Values{"global": {""}}, ""); code != http.StatusNotImplemented {
		t.Errorf("memLimiter: %d %s", code, body)
	}
}

// TestWhyWithRedisDown: the window cannot be read; the answer says so per
// policy, with the key still derived.
func TestWhyWithRedisDown(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	lim := redisLimiter(t, r, 1, 200*time.Millisecond)
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, &recordingLimiter{Limiter: lim}, testConfig(nil, testPolicy("per-user", 2, withKey("Header", "X-User", "Deny"))))
	code, body := askWhy(t, newTestServer(t, h.s.DebugHandler()).URL, url.Values{"policy": {"per-user"}, "header": {"alice"}}, "")
	var resp debugapi.WhyResponse
	if code != http.StatusOK || json.Unmarshal(body, &resp) != nil {
		t.Fatalf("%d %s", code, body)
	}
	if p := resp.Policies[0]; p.Error == "" || p.Window != nil || p.ClientKey != h.s.hasher.Load().Sum(hashKey(keyPrefixHeader, "alice")) {
		t.Errorf("%s", body)
	}
}

// TestWhyQueryComplete: what a /debug/why query leaves out comes from the
// policy asked about, then from the defaults; what it gives stays. New
// cases go at the end.
func TestWhyQueryComplete(t *testing.T) {
	target := compiledPolicy(t, testPolicy("posts", 5, withKey("Header", "x-user", "Deny"), func(p *sidecarconfig.Policy) {
		p.Match = sidecarconfig.Match{Methods: []string{"POST", "PUT"}, PathPrefixes: []string{"/api/", "/v2/"}}
	}))
	tests := []struct {
		name    string
		q       whyQuery
		target  *policy
		want    whyQuery
		wantErr bool
	}{
		{"from the target", whyQuery{source: "Header"}, target,
			whyQuery{source: "Header", name: "X-User", method: "POST", path: "/api/"}, false},
		{"given values stay", whyQuery{source: "Header", name: "X-Other", method: "GET", path: "/x"}, target,
			whyQuery{source: "Header", name: "X-Other", method: "GET", path: "/x"}, false},
		{"defaults without a target", whyQuery{source: "RemoteAddress"}, nil,
			whyQuery{source: "RemoteAddress", method: "GET", path: "/"}, false},
		{"a header source without a name or a target", whyQuery{source: "Header"}, nil, whyQuery{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := tt.q
			err := q.complete(tt.target)
			if (err != nil) != tt.wantErr {
				t.Fatalf("error %v, want error %v", err, tt.wantErr)
			}
			if err == nil && q != tt.want {
				t.Errorf("got %+v, want %+v", q, tt.want)
			}
		})
	}
}
