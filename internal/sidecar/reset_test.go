package sidecar

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/internal/debugapi"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// postReset sends POST /debug/reset with query to the debug server at
// debug, and returns the status and body.
func postReset(t *testing.T, debug string, method string, query url.Values) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, debug+debugapi.ResetPath+"?"+query.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	return resp.StatusCode, body.Bytes()
}

// TestResetThroughTheDebugPort: POST /debug/reset empties one client's
// counters under one policy, its window, its hour and its day's quota,
// in a real redis-server: the client refused a moment ago (a denial this
// sidecar had cached) is admitted at once with a new client's answers,
// another client and another policy keep their counts, and the log names
// the client by its keyed hash, never by its value.
func TestResetThroughTheDebugPort(t *testing.T) {
	r := testsupport.StartRedis(t)
	h := newHarness(t, redisLimiter(t, r, 1, exactTimeout), testConfig(nil,
		testPolicy("api", 2, withKey("Header", "X-User", "Deny"),
			withWindows(sidecarconfig.Limit{WindowMillis: 3_600_000, Limit: 3}),
			func(p *sidecarconfig.Policy) {
				p.Quotas = []sidecarconfig.Quota{{Period: sidecarconfig.QuotaDay, Limit: 4}}
			}),
		testPolicy("other", 100, withKey("Header", "X-User", "Deny"))))
	var logs bytes.Buffer
	h.s.log = slog.New(slog.NewTextHandler(&logs, nil))
	const secret = "s3cr3t-alice"
	alice, bob := map[string]string{"X-User": secret}, map[string]string{"X-User": "bob"}
	for i, want := range []int{200, 200, 429, 429} {
		if resp, _ := h.do(t, "GET", "/", alice); resp.StatusCode != want {
			t.Fatalf("alice's request %d: %d, want %d", i, resp.StatusCode, want)
		}
	}
	h.do(t, "GET", "/", bob)
	debug := newTestServer(t, h.s.DebugHandler()).URL
	before := whyAnswer(t, debug, url.Values{"policy": {"api"}, "header": {secret}})

	code, body := postReset(t, debug, http.MethodPost, url.Values{"policy": {"api"}, "header": {secret}})
	var resp debugapi.ResetResponse
	if code != http.StatusOK || json.Unmarshal(body, &resp) != nil {
		t.Fatalf("reset: %d %s", code, body)
	}
	if resp.Policy != "api" || resp.Namespace != testNamespace || resp.ClientKey != before.Policies[0].ClientKey || len(resp.RedisKeys) != 3 || resp.NonEmpty != 3 {
		t.Fatalf("reset answered %+v, want alice's 3 keys (client %s)", resp, before.Policies[0].ClientKey)
	}
	resp2, _ := h.do(t, "GET", "/", alice)
	if resp2.StatusCode != 200 || resp2.Header.Get("RateLimit") != `"api";r=1;t=60, "api/1h";r=2;t=3600, "api/day";r=3;t=`+strings.SplitAfter(resp2.Header.Get("RateLimit"), `"api/day";r=3;t=`)[1] {
		t.Fatalf("alice after the reset: %d %q, want a new client's answer", resp2.StatusCode, resp2.Header.Get("RateLimit"))
	}
	after := whyAnswer(t, debug, url.Values{"header": {"bob"}, "name": {"X-User"}})
	for _, p := range after.Policies {
		if p.Window == nil || p.Window.InWindow != 1 {
			t.Errorf("bob under %s: %+v, want his 1 admit", p.Name, p.Window)
		}
	}
	other := whyAnswer(t, debug, url.Values{"policy": {"other"}, "header": {secret}})
	if w := other.Policies[0].Window; w == nil || w.InWindow != 3 {
		t.Errorf("alice under the other policy: %+v, want her 3 admits kept (the 4th was refused by api)", w)
	}
	if !strings.Contains(logs.String(), before.Policies[0].ClientKey) || strings.Contains(logs.String(), "s3cr3t") {
		t.Errorf("the log should name the client by its hash only:\n%s", logs.String())
	}

	for _, tc := range []struct {
		method string
		query  url.Values
		want   int
	}{
		{http.MethodGet, url.Values{"policy": {"api"}, "header": {secret}}, http.StatusMethodNotAllowed},
		{http.MethodPost, url.Values{"header": {secret}}, http.StatusBadRequest},                    // no policy
		{http.MethodPost, url.Values{"policy": {"nope"}, "header": {secret}}, http.StatusNotFound},  // not this pod's
		{http.MethodPost, url.Values{"policy": {"api"}, "ip": {"10.0.0.1"}}, http.StatusBadRequest}, // not its key
	} {
		if code, body := postReset(t, debug, tc.method, tc.query); code != tc.want {
			t.Errorf("%s %v: %d %s, want %d", tc.method, tc.query, code, body, tc.want)
		}
	}
}
