package sidecar

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestAnswers pins each answer of the sidecar itself, field by field: what
// reaches the client besides the text headers. New answers get a case here.
func TestAnswers(t *testing.T) {
	perUser := compiledPolicy(t, testPolicy("per-user", 5, withKey("Header", "x-user", "Deny")))
	byQuery := compiledPolicy(t, testPolicy("by-query", 2, withKey("QueryParameter", "api_key", "Deny")))
	byClaim := compiledPolicy(t, testPolicy("by-claim", 2, withKey("JWTClaim", "sub", "Deny")))
	tests := []struct {
		name string
		got  answer
		want answer
	}{
		{"no config", noConfigAnswer, answer{
			status: 503, retryAfter: "1",
			body: "slidegate: no rate limit configuration loaded yet\n",
		}},
		{"rejected, the wait rounded up", rejectedAnswer(perUser, 1500*time.Millisecond), answer{
			status: 429, retryAfter: "2", policy: `"per-user";q=5;w=60`, rateLimit: `"per-user";r=0;t=2`,
			body: `slidegate: rate limit exceeded; retry in 2s` + "\n",
		}},
		{"rejected without a wait: Retry-After is at least 1, t stays 0", rejectedAnswer(perUser, 0), answer{
			status: 429, retryAfter: "1", policy: `"per-user";q=5;w=60`, rateLimit: `"per-user";r=0;t=0`,
			body: `slidegate: rate limit exceeded; retry in 1s` + "\n",
		}},
		{"missing header, named as the sidecar reads it", missingKeyAnswer(perUser), answer{
			status: 429, policy: `"per-user";q=5;w=60`,
			body: `slidegate: request rejected: it has no header "X-User"` + "\n",
		}},
		{"missing query parameter", missingKeyAnswer(byQuery), answer{
			status: 429, policy: `"by-query";q=2;w=60`,
			body: `slidegate: request rejected: it has no query parameter "api_key"` + "\n",
		}},
		{"missing claim", missingKeyAnswer(byClaim), answer{
			status: 429, policy: `"by-claim";q=2;w=60`,
			body: `slidegate: request rejected: it has no bearer token claim "sub"` + "\n",
		}},
		{"failed closed", failedClosedAnswer(1500 * time.Millisecond), answer{
			status: 503, retryAfter: "2",
			body: `slidegate: rate limiter unavailable; retry in 2s` + "\n",
		}},
		{"bad gateway", badGatewayAnswer, answer{
			status: 502, body: "slidegate: the application is unavailable\n",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got  %+v\nwant %+v", tt.got, tt.want)
			}
		})
	}
}

// TestAnswerWrite: the text headers on every answer, and a field left
// empty in the answer is not sent at all (an empty Retry-After would be
// invalid).
func TestAnswerWrite(t *testing.T) {
	text := http.Header{
		"Content-Type":           {"text/plain; charset=utf-8"},
		"X-Content-Type-Options": {"nosniff"},
		"Cache-Control":          {"no-store"},
	}
	with := func(kv ...string) http.Header {
		h := text.Clone()
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	tests := []struct {
		name string
		a    answer
		want http.Header
	}{
		{"every field", answer{status: 429, retryAfter: "2", policy: "P", rateLimit: "R", body: "b\n"},
			with("Retry-After", "2", "RateLimit-Policy", "P", "RateLimit", "R")},
		{"policy only", answer{status: 429, policy: "P", body: "b\n"}, with("RateLimit-Policy", "P")},
		{"none", answer{status: 502, body: "b\n"}, text},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			tt.a.write(rec)
			if rec.Code != tt.a.status || rec.Body.String() != tt.a.body {
				t.Errorf("status %d body %q, want %d %q", rec.Code, rec.Body.String(), tt.a.status, tt.a.body)
			}
			if got := rec.Header(); len(got) != len(tt.want) {
				t.Errorf("headers %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got := rec.Header()[k]; len(got) != 1 || got[0] != v[0] {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
		})
	}
}
