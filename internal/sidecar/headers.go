package sidecar

import (
	"net/http"
	"time"

	"github.com/slidegate/slidegate/internal/ratelimitheader"
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

// rateLimitItem is one RateLimit item of policy p.
func rateLimitItem(buf []byte, p *policy, remaining int64, reset time.Duration) []byte {
	return ratelimitheader.AppendItem(buf, p.nameItem, remaining, reset)
}

// setTextHeaders sets the headers of every answer of the sidecar itself.
func setTextHeaders(h http.Header) {
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
}
