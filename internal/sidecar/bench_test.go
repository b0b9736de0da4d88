package sidecar

import (
	"net/http"
	"net/http/httptest"
	"testing"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// BenchmarkDecisionPath is the sidecar's own per-request work (match, keys,
// headers, metrics) around a limiter that admits at once and an application
// that answers nothing: what the sidecar adds to a proxy hop besides the
// Redis round trip.
func BenchmarkDecisionPath(b *testing.B) {
	mem := newMemLimiter()
	mem.decide = func(reqs []limiter.Request) []limiter.Decision {
		out := make([]limiter.Decision, len(reqs))
		for i, r := range reqs {
			out[i] = limiter.Decision{Allowed: true, Limit: r.Rule.Limit, Remaining: 7, ResetAfter: 9e9, Source: limiter.SourceRedis}
		}
		return out
	}
	h := newHarness(b, mem, testConfig([]string{"10.0.0.0/8"},
		testPolicy("by-user", 100, withKey("Header", "X-User", "RemoteAddress")),
		testPolicy("by-ip", 100, withKey("RemoteAddress", "", "Deny")),
	))
	h.s.proxy = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	req := httptest.NewRequest("GET", "/api/items?x=1", nil)
	req.RemoteAddr = "10.1.2.3:4567"
	req.Header.Set("X-User", "alice")
	req.Header.Set("X-Forwarded-For", "198.51.100.7")
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		h.s.ServeHTTP(w, req)
	}
}

// BenchmarkDecisionPathJWT is BenchmarkDecisionPath's work for one policy
// keyed on a header and for the same policy keyed on the sub of a verified
// RS256 bearer token: what verification adds per request (issue 23).
//
//	go test -run XXX -bench DecisionPathJWT ./internal/sidecar
func BenchmarkDecisionPathJWT(b *testing.B) {
	key := testsupport.NewJWTKey("k1", jose.RS256)
	for _, tc := range []struct {
		name   string
		policy sidecarconfig.Policy
		header string
		value  string
	}{
		{"header", testPolicy("p", 100, withKey("Header", "X-User", "RemoteAddress")), "X-User", "alice"},
		{"jwt-RS256", verifiedPolicy(b, "p", 100, "RemoteAddress", key), "Authorization", "Bearer " + key.Sign(claimsFor("alice"))},
	} {
		b.Run(tc.name, func(b *testing.B) {
			mem := newMemLimiter()
			mem.decide = func(reqs []limiter.Request) []limiter.Decision {
				out := make([]limiter.Decision, len(reqs))
				for i, r := range reqs {
					out[i] = limiter.Decision{Allowed: true, Limit: r.Rule.Limit, Remaining: 7, ResetAfter: 9e9, Source: limiter.SourceRedis}
				}
				return out
			}
			h := newHarness(b, mem, testConfig(nil, tc.policy))
			h.s.proxy = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
			req := httptest.NewRequest("GET", "/api/items", nil)
			req.RemoteAddr = "10.1.2.3:4567"
			req.Header.Set(tc.header, tc.value)
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				h.s.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatal(w.Code)
				}
			}
			if n := requestsCount(h.s, "p", enforce.Allowed); n == 0 {
				b.Fatal("nothing allowed")
			}
		})
	}
}
