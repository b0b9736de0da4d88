package sidecar

import (
	"net/http"
	"strconv"
	"time"
)

// Header fields of draft-ietf-httpapi-ratelimit-headers (drafts 08 to 11):
//
//	RateLimit-Policy: "per-user";q=100;w=60
//	RateLimit: "per-user";r=42;t=17
//
// Both are RFC 9651 Lists of Items: the item is the policy name as a String,
// q the quota (the limit), w the window in seconds, r the remaining quota and
// t the seconds until more quota is available. Windows under a second are
// rounded up to w=1 (the field has whole seconds only).
const (
	headerRateLimitPolicy = "RateLimit-Policy"
	headerRateLimit       = "RateLimit"
	headerRetryAfter      = "Retry-After"
)

// The same names in the canonical form of http.Header keys.
var (
	canonRateLimitPolicy = http.CanonicalHeaderKey(headerRateLimitPolicy)
	canonRateLimit       = http.CanonicalHeaderKey(headerRateLimit)
)

// rateLimitItem is one RateLimit item: `"name";r=<remaining>;t=<seconds>`.
func rateLimitItem(buf []byte, p *policy, remaining int64, reset time.Duration) []byte {
	buf = append(buf, p.nameItem...)
	buf = append(buf, ";r="...)
	buf = strconv.AppendInt(buf, max(remaining, 0), 10)
	buf = append(buf, ";t="...)
	return strconv.AppendInt(buf, ceilSeconds(reset), 10)
}

// retryAfterSeconds is a Retry-After value: the limiter's exact wait rounded
// up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) string {
	return strconv.FormatInt(max(ceilSeconds(d), 1), 10)
}

// setTextHeaders sets the headers of every answer of the sidecar itself.
func setTextHeaders(h http.Header) {
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
}
