package sidecar

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// Ways around a limit (issue 23), end to end: a policy as a user writes it,
// rendered as the controller renders it, enforced by a sidecar. Each case
// spends a client's whole budget with an ordinary request, then tries a
// cheap variation that the application would serve the same way (or that
// a gateway turns into the same client); the variation must not get
// through. New cases go at the end.

// apiPolicy is a RateLimitPolicy of limit 1 selecting the harness's pod;
// mutate sets its key and match.
func apiPolicy(mutate func(*v1alpha1.RateLimitPolicySpec)) v1alpha1.RateLimitPolicy {
	p := v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: testNamespace},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "shop"}},
			Window:         "1m",
			Limit:          1,
			Key:            v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal},
		},
	}
	mutate(&p.Spec)
	return p
}

// renderedConfig renders policies as the controller does, with the
// loopback address (the tests' client) as the trusted proxy.
func renderedConfig(t *testing.T, policies ...v1alpha1.RateLimitPolicy) *sidecarconfig.Config {
	t.Helper()
	cfg, err := render.Render(policies, render.Options{
		Namespace:      testNamespace,
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
	})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// rawRequest sends one request, exactly as written (request line and
// header lines, CRLF added), to the sidecar and returns the status.
func (h *harness) rawRequest(t *testing.T, lines ...string) int {
	t.Helper()
	c, err := net.Dial("tcp", h.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	msg := strings.Join(lines, "\r\n") + "\r\nHost: app\r\nConnection: close\r\n\r\n"
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	method, _, _ := strings.Cut(lines[0], " ")
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	return resp.StatusCode
}

func TestWaysAroundALimit(t *testing.T) {
	byHeader := func(s *v1alpha1.RateLimitPolicySpec) {
		s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User", OnMissing: v1alpha1.MissingKeyAllow}
	}
	byHeaderOrDeny := func(s *v1alpha1.RateLimitPolicySpec) {
		s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User", OnMissing: v1alpha1.MissingKeyDeny}
	}
	byQuery := func(s *v1alpha1.RateLimitPolicySpec) {
		s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceQueryParameter, Name: "key", OnMissing: v1alpha1.MissingKeyAllow}
	}
	byAddress := func(s *v1alpha1.RateLimitPolicySpec) {
		s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceRemoteAddress}
	}
	methods := func(ms ...v1alpha1.HTTPMethod) func(*v1alpha1.RateLimitPolicySpec) {
		return func(s *v1alpha1.RateLimitPolicySpec) { s.Match = &v1alpha1.RequestMatch{Methods: ms} }
	}
	prefix := func(s *v1alpha1.RateLimitPolicySpec) {
		s.Match = &v1alpha1.RequestMatch{PathPrefixes: []v1alpha1.PathPrefix{"/api/"}}
	}
	tests := []struct {
		name   string
		policy func(*v1alpha1.RateLimitPolicySpec)
		// spend is the ordinary request that spends the budget; around is
		// the variation, answered with want.
		spend, around []string
		want          int
	}{
		// Methods.
		{name: "HEAD where GET is limited", policy: methods("GET"),
			spend: []string{"GET /x HTTP/1.1"}, around: []string{"HEAD /x HTTP/1.1"}, want: 429},
		{name: "lower-case get", policy: methods("GET"),
			spend: []string{"GET /x HTTP/1.1"}, around: []string{"get /x HTTP/1.1"}, want: 429},
		{name: "POST overridden to DELETE by header", policy: methods("DELETE"),
			spend: []string{"DELETE /x HTTP/1.1"}, around: []string{"POST /x HTTP/1.1", "X-HTTP-Method-Override: delete", "Content-Length: 0"}, want: 429},
		{name: "POST overridden to DELETE by _method", policy: methods("DELETE"),
			spend: []string{"DELETE /x HTTP/1.1"}, around: []string{"POST /x?_method=DELETE HTTP/1.1", "Content-Length: 0"}, want: 429},

		// Paths.
		{name: "segment parameter", policy: prefix,
			spend: []string{"GET /api/users HTTP/1.1"}, around: []string{"GET /api;jsessionid=1/users HTTP/1.1"}, want: 429},
		{name: "dot segment with a parameter", policy: prefix,
			spend: []string{"GET /api/users HTTP/1.1"}, around: []string{"GET /.;/api/users HTTP/1.1"}, want: 429},
		{name: "backslash", policy: prefix,
			spend: []string{"GET /api/users HTTP/1.1"}, around: []string{`GET /api\users HTTP/1.1`}, want: 429},
		{name: "trailing dot-dot", policy: prefix,
			spend: []string{"GET /api/users HTTP/1.1"}, around: []string{"GET /api/users/.. HTTP/1.1"}, want: 429},
		{name: "parameter hiding dot-dots", policy: prefix,
			spend: []string{"GET /api/users HTTP/1.1"}, around: []string{`GET /api/users;x\..\..\admin HTTP/1.1`}, want: 429},

		// Repeated identity values.
		{name: "header line in front of the gateway's", policy: byHeader,
			spend: []string{"GET / HTTP/1.1", "X-User: real"}, around: []string{"GET / HTTP/1.1", "X-User: random", "X-User: real"}, want: 400},
		{name: "header values joined by a comma", policy: byHeader,
			spend: []string{"GET / HTTP/1.1", "X-User: real"}, around: []string{"GET / HTTP/1.1", "X-User: random, real"}, want: 400},
		{name: "header spelled with an underscore", policy: byHeader,
			spend: []string{"GET / HTTP/1.1", "X-User: real"}, around: []string{"GET / HTTP/1.1", "X_User: random", "X-User: real"}, want: 400},
		{name: "query parameter twice", policy: byQuery,
			spend: []string{"GET /?key=real HTTP/1.1"}, around: []string{"GET /?key=random&key=real HTTP/1.1"}, want: 400},
		{name: "query parameter behind a semicolon", policy: byQuery,
			spend: []string{"GET /?key=real HTTP/1.1"}, around: []string{"GET /?x=1;key=random&key=real HTTP/1.1"}, want: 400},
		{name: "query parameter in another case", policy: byQuery,
			spend: []string{"GET /?key=real HTTP/1.1"}, around: []string{"GET /?KEY=random&key=real HTTP/1.1"}, want: 400},

		{name: "second Authorization line", policy: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceJWTClaim, Name: "sub", OnMissing: v1alpha1.MissingKeyAllow}
		},
			spend:  []string{"GET / HTTP/1.1", "Authorization: Bearer " + jwt(`{"sub":"real"}`)},
			around: []string{"GET / HTTP/1.1", "Authorization: Bearer " + jwt(`{"sub":"random"}`), "Authorization: Bearer " + jwt(`{"sub":"real"}`)}, want: 400},

		// Client addresses.
		{name: "IPv6 client moving in its /64", policy: byAddress,
			spend:  []string{"GET / HTTP/1.1", "X-Forwarded-For: 2001:db8:1:2::1"},
			around: []string{"GET / HTTP/1.1", "X-Forwarded-For: 2001:db8:1:2:ffff:ffff:ffff:fffe"}, want: 429},

		// What the sidecar reads, hidden from the application: a header the
		// Connection header names is hop-by-hop, and the reverse proxy
		// removes it. Keyed on it, the client picks a bucket while the
		// application serves a client without one (past onMissing Deny).
		{name: "key header named in Connection", policy: byHeaderOrDeny,
			spend:  []string{"GET / HTTP/1.1", "X-User: real"},
			around: []string{"GET / HTTP/1.1", "X-User: random", "Connection: keep-alive, x-user"}, want: 400},
		{name: "bearer token named in Connection", policy: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceJWTClaim, Name: "sub", OnMissing: v1alpha1.MissingKeyDeny}
		},
			spend:  []string{"GET / HTTP/1.1", "Authorization: Bearer " + jwt(`{"sub":"real"}`)},
			around: []string{"GET / HTTP/1.1", "Authorization: Bearer " + jwt(`{"sub":"random"}`), "Connection: Authorization"}, want: 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, newMemLimiter(), renderedConfig(t, apiPolicy(tt.policy)))
			if got := h.rawRequest(t, tt.spend...); got != http.StatusOK {
				t.Fatalf("spending request: status %d, want 200", got)
			}
			if got := h.rawRequest(t, tt.around...); got != tt.want {
				t.Errorf("%q: status %d, want %d", tt.around, got, tt.want)
			}
			if n := h.up.hits.Load(); n != 1 {
				t.Errorf("the application saw %d requests, want 1", n)
			}
		})
	}
}

// TestHiddenCostHeader: a request whose Connection header names the
// policy's cost header would be charged a cost the application never sees
// (the reverse proxy removes the header, and the application does the work
// of its own default): refused, as an ambiguous key is.
func TestHiddenCostHeader(t *testing.T) {
	h := newHarness(t, newMemLimiter(), renderedConfig(t, apiPolicy(func(s *v1alpha1.RateLimitPolicySpec) {
		s.Cost = &v1alpha1.Cost{Request: &v1alpha1.RequestCost{Header: "X-Cost", Default: new(int64(1))}}
	})))
	if got := h.rawRequest(t, "GET / HTTP/1.1", "X-Cost: 1", "Connection: X-Cost"); got != http.StatusBadRequest || h.up.hits.Load() != 0 {
		t.Errorf("X-Cost named in Connection: status %d, the application saw %d requests; want 400 and none", got, h.up.hits.Load())
	}
	if got := h.rawRequest(t, "GET / HTTP/1.1", "X-Cost: 1"); got != http.StatusOK {
		t.Errorf("X-Cost alone: status %d, want 200", got)
	}
}

// TestWaysAroundALimitSettings: the ways around that a policy closes with
// its settings (issue 23): the forwarding header its trusted proxy writes,
// the IPv6 network a client is counted by, case-insensitive paths.
func TestWaysAroundALimitSettings(t *testing.T) {
	address := func(ca v1alpha1.ClientAddress) func(*v1alpha1.RateLimitPolicySpec) {
		return func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceRemoteAddress, RemoteAddress: &ca}
		}
	}
	tests := []struct {
		name          string
		policy        func(*v1alpha1.RateLimitPolicySpec)
		spend, around []string
		want          int
	}{
		{name: "the client's X-Forwarded-For behind a proxy that writes Forwarded",
			policy: address(v1alpha1.ClientAddress{ForwardedHeader: v1alpha1.ForwardedHeaderForwarded}),
			spend:  []string{"GET / HTTP/1.1", "Forwarded: for=198.51.100.7"},
			around: []string{"GET / HTTP/1.1", "X-Forwarded-For: 6.6.6.6", "Forwarded: for=198.51.100.7"}, want: 429},
		{name: "the client's Forwarded behind a proxy that writes X-Forwarded-For",
			policy: address(v1alpha1.ClientAddress{}),
			spend:  []string{"GET / HTTP/1.1", "X-Forwarded-For: 198.51.100.7"},
			around: []string{"GET / HTTP/1.1", "X-Forwarded-For: 198.51.100.7", "Forwarded: for=6.6.6.6"}, want: 429},
		{name: "IPv6 client moving in its /56",
			policy: address(v1alpha1.ClientAddress{IPv6PrefixLength: 56}),
			spend:  []string{"GET / HTTP/1.1", "X-Forwarded-For: 2001:db8:1:200::1"},
			around: []string{"GET / HTTP/1.1", "X-Forwarded-For: 2001:db8:1:2ff::1"}, want: 429},
		{name: "IPv6 client in another network: its own budget",
			policy: address(v1alpha1.ClientAddress{}),
			spend:  []string{"GET / HTTP/1.1", "X-Forwarded-For: 2001:db8:1:2::1"},
			around: []string{"GET / HTTP/1.1", "X-Forwarded-For: 2001:db8:1:3::1"}, want: 200},
		{name: "upper-case path against a case-insensitive prefix",
			policy: func(s *v1alpha1.RateLimitPolicySpec) {
				s.Match = &v1alpha1.RequestMatch{PathPrefixes: []v1alpha1.PathPrefix{"/api/"}, PathCase: v1alpha1.PathCaseInsensitive}
			},
			spend: []string{"GET /api/users HTTP/1.1"}, around: []string{"GET /API/users HTTP/1.1"}, want: 429},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, newMemLimiter(), renderedConfig(t, apiPolicy(tt.policy)))
			if got := h.rawRequest(t, tt.spend...); got != http.StatusOK {
				t.Fatalf("spending request: status %d, want 200", got)
			}
			if got := h.rawRequest(t, tt.around...); got != tt.want {
				t.Errorf("%q: status %d, want %d", tt.around, got, tt.want)
			}
		})
	}
}

// TestAmbiguousKeyAnswer: a request with two values for a client key is
// refused with 400 before Redis is asked, saying why; a DryRun policy
// refuses nothing and counts it.
func TestAmbiguousKeyAnswer(t *testing.T) {
	mem := newMemLimiter()
	h := newHarness(t, mem, testConfig(nil,
		testPolicy("a-dry", 5, dryRun, withKey("QueryParameter", "key", "Allow")),
		testPolicy("b-user", 5, withKey("Header", "X-User", "RemoteAddress")),
	))
	code := h.rawRequest(t, "GET /?key=1 HTTP/1.1", "X-User: random", "X-User: real")
	if code != http.StatusBadRequest || mem.calls.Load() != 0 || h.up.hits.Load() != 0 {
		t.Fatalf("status %d, limiter calls %d, application hits %d; want 400, 0, 0", code, mem.calls.Load(), h.up.hits.Load())
	}
	if resp, _ := h.do(t, "GET", "/?key=1&key=2", map[string]string{"X-User": "real"}); resp.StatusCode != http.StatusOK {
		t.Fatalf("DryRun policy with an ambiguous key: status %d, want 200", resp.StatusCode)
	}
	req, _ := http.NewRequest("GET", h.front.URL+"/", nil)
	req.Header["X-User"] = []string{"a, b"}
	r, err := h.front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(r.Body)
	_ = r.Body.Close()
	if r.StatusCode != http.StatusBadRequest || !strings.Contains(string(msg), `request refused: it gives more than one header "X-User"`) {
		t.Errorf("status %d body %q", r.StatusCode, msg)
	}
	if got := requestsCount(h.s, "b-user", enforce.AmbiguousKey); got != 2 {
		t.Errorf("b-user %s = %v, want 2", enforce.AmbiguousKey, got)
	}
	if got := requestsCount(h.s, "a-dry", enforce.AmbiguousKey); got != 1 {
		t.Errorf("a-dry %s = %v, want 1", enforce.AmbiguousKey, got)
	}
	if got := testutilCounter(h.s.respBadRequest); got != 2 {
		t.Errorf("responses bad_request = %v, want 2", got)
	}
}
