package sidecar

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/slidegate/slidegate/internal/limiter"
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
