package sidecar

import (
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidegate/slidegate/internal/ratelimitheader"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// The header fields are formatted by ratelimitheader, shared with the RLS
// server.
const (
	headerRateLimitPolicy = ratelimitheader.Policy
	headerRateLimit       = ratelimitheader.RateLimit
	headerRetryAfter      = ratelimitheader.RetryAfter
)

// The same names in the canonical form of http.Header keys.
var (
	canonRateLimitPolicy = http.CanonicalHeaderKey(headerRateLimitPolicy)
	canonRateLimit       = http.CanonicalHeaderKey(headerRateLimit)
)

// answer is a response of the sidecar itself instead of the application's.
// It is a plain value, so that what each case answers is tested without a
// server; write puts it on the wire.
type answer struct {
	status int
	// retryAfter, policy and rateLimit are the Retry-After,
	// RateLimit-Policy and RateLimit fields; "" leaves a field out.
	retryAfter, policy, rateLimit string
	body                          string
}

// noConfig says why the sidecar answers 503 before its first config load,
// on the proxied port and on the admin port alike.
const noConfig = "no rate limit configuration loaded yet"

// noConfigAnswer is the 503 before any config is loaded: the first load is
// expected within a second.
var noConfigAnswer = answer{
	status:     http.StatusServiceUnavailable,
	retryAfter: "1",
	body:       "slidegate: " + noConfig + "\n",
}

// badGatewayAnswer is the 502 for a request that could not be forwarded to
// the application.
var badGatewayAnswer = answer{
	status: http.StatusBadGateway,
	body:   "slidegate: the application is unavailable\n",
}

// What a client learns from the sidecar's own answers: what it needs to
// act (when to retry, which value to send), and in the RateLimit fields of
// a 429 the policy's own name, the draft's policy identifier. Never the
// namespace, nor which other policies exist: the bodies are the same for
// every workload behind a sidecar (docs/security.md, "What clients learn").

// rejectedAnswer is the 429 of policy p, which denied a request until
// retryAfter has passed.
func rejectedAnswer(p *policy, retryAfter time.Duration) answer {
	retry := ratelimitheader.RetryAfterSeconds(retryAfter)
	return answer{
		status:     http.StatusTooManyRequests,
		retryAfter: retry,
		policy:     p.policyItem,
		rateLimit:  ratelimitheader.DeniedItem(p.nameItem, retryAfter),
		body:       "slidegate: rate limit exceeded; retry in " + retry + "s\n",
	}
}

// missingKeyAnswer is the 429 for a request without the client key of
// policy p, whose onMissing is Deny. It has no Retry-After: waiting does
// not help; sending the key does.
func missingKeyAnswer(p *policy) answer {
	return answer{
		status: http.StatusTooManyRequests,
		policy: p.policyItem,
		body:   "slidegate: request rejected: it has no " + describeKey(p) + "\n",
	}
}

// describeKey names the value policy p keys on, for an answer.
func describeKey(p *policy) string {
	switch p.source {
	case sidecarconfig.SourceHeader:
		return "header " + strconv.Quote(p.keyName)
	case sidecarconfig.SourceQueryParameter:
		return "query parameter " + strconv.Quote(p.keyName)
	}
	return "bearer token claim " + strconv.Quote(p.keyName)
}

// ambiguousKeyAnswer is the 400 for a request that gives more than one
// value for the client key of policy p, or hides what the sidecar reads
// from the application (see keyAmbiguous, connectionNames): whichever the
// sidecar took, the client could have chosen its bucket.
func ambiguousKeyAnswer(p *policy) answer {
	return answer{
		status: http.StatusBadRequest,
		body: "slidegate: request refused: it gives more than one " + describeKey(p) +
			" (repeated, comma-separated, or spelled another way), or its Connection header names a header the rate limit reads; send exactly one, and no such Connection\n",
	}
}

// failedClosedAnswer is the 503 of a fail-closed policy that Redis could
// not decide; retryAfter is the limiter's advice.
func failedClosedAnswer(retryAfter time.Duration) answer {
	retry := ratelimitheader.RetryAfterSeconds(retryAfter)
	return answer{
		status:     http.StatusServiceUnavailable,
		retryAfter: retry,
		body:       "slidegate: rate limiter unavailable; retry in " + retry + "s\n",
	}
}

// write sends a as plain text that is neither sniffed nor cached.
func (a *answer) write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	if a.retryAfter != "" {
		h.Set(headerRetryAfter, a.retryAfter)
	}
	if a.policy != "" {
		h.Set(headerRateLimitPolicy, a.policy)
	}
	if a.rateLimit != "" {
		h.Set(headerRateLimit, a.rateLimit)
	}
	w.WriteHeader(a.status)
	_, _ = io.WriteString(w, a.body)
}

// reply counts a under its outcome in slidegate_sidecar_responses_total and
// writes it.
func (s *Sidecar) reply(w http.ResponseWriter, outcome prometheus.Counter, a answer) {
	outcome.Inc()
	a.write(w)
}
