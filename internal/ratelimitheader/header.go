// Package ratelimitheader formats the rate limit header fields that the
// sidecar sets on its responses and the RLS server hands to Envoy, so a
// client sees the same fields whichever of the two enforced its limit.
//
// Header fields of draft-ietf-httpapi-ratelimit-headers (drafts 08 to 11):
//
//	RateLimit-Policy: "per-user";q=100;w=60
//	RateLimit: "per-user";r=42;t=17
//
// Both are RFC 9651 Lists of Items: the item is the policy name as a String,
// q the quota (the limit), w the window in seconds, r the remaining quota and
// t the seconds until more quota is available. Windows under a second are
// rounded up to w=1 (the field has whole seconds only).
package ratelimitheader

import (
	"strconv"
	"strings"
	"time"
)

// Header names.
const (
	Policy     = "RateLimit-Policy"
	RateLimit  = "RateLimit"
	RetryAfter = "Retry-After"
)

// PolicyItem is one RateLimit-Policy item: `<nameItem>;q=<limit>;w=<seconds>`,
// nameItem being the policy name as made by String. A window of 0 (a
// calendar quota, whose days and months have no one length) leaves out w,
// which the draft makes optional: `<nameItem>;q=<limit>`.
func PolicyItem(nameItem string, limit int64, window time.Duration) string {
	if window <= 0 {
		return nameItem + ";q=" + strconv.FormatInt(limit, 10)
	}
	return nameItem + ";q=" + strconv.FormatInt(limit, 10) + ";w=" + strconv.FormatInt(CeilSeconds(window), 10)
}

// AppendItem appends one RateLimit item: `<nameItem>;r=<remaining>;t=<seconds>`.
func AppendItem(buf []byte, nameItem string, remaining int64, reset time.Duration) []byte {
	buf = append(buf, nameItem...)
	buf = append(buf, ";r="...)
	buf = strconv.AppendInt(buf, max(remaining, 0), 10)
	buf = append(buf, ";t="...)
	return strconv.AppendInt(buf, CeilSeconds(reset), 10)
}

// DeniedItem is the RateLimit item of the policy that denied a request: no
// quota remaining, more after retryAfter.
func DeniedItem(nameItem string, retryAfter time.Duration) string {
	return string(AppendItem(nil, nameItem, 0, retryAfter))
}

// Fields joins the RateLimit and RateLimit-Policy fields of a request that
// several policies admitted: each field a List of one item per policy, in
// the order added. The zero value holds no policy.
type Fields struct {
	n         int
	rateLimit []byte
	// first is the first policy's RateLimit-Policy item, the whole field
	// while it is alone; policies is the field from the second policy on.
	first    string
	policies []byte
}

// Add appends one policy's items: nameItem and policyItem as made by String
// and PolicyItem, with the quota remaining and the time until more is
// available.
func (f *Fields) Add(nameItem, policyItem string, remaining int64, reset time.Duration) {
	if f.n > 0 {
		f.rateLimit = append(f.rateLimit, ", "...)
	}
	f.rateLimit = AppendItem(f.rateLimit, nameItem, remaining, reset)
	switch f.n {
	case 0:
		f.first = policyItem
	case 1:
		f.policies = append(append(append(f.policies, f.first...), ", "...), policyItem...)
	default:
		f.policies = append(append(f.policies, ", "...), policyItem...)
	}
	f.n++
}

// Len is the number of policies added; with none, a response carries
// neither field.
func (f *Fields) Len() int { return f.n }

// RateLimit is the RateLimit field.
func (f *Fields) RateLimit() string { return string(f.rateLimit) }

// Policy is the RateLimit-Policy field. One policy's is its item itself,
// which costs no copy.
func (f *Fields) Policy() string {
	if f.n < 2 {
		return f.first
	}
	return string(f.policies)
}

// RetryAfterSeconds is a Retry-After value: the limiter's exact wait rounded
// up to whole seconds, at least 1.
func RetryAfterSeconds(d time.Duration) string {
	return strconv.FormatInt(max(CeilSeconds(d), 1), 10)
}

// CeilSeconds rounds a duration up to whole seconds (0 stays 0).
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// String serialises s as an RFC 9651 (Structured Field Values) String:
// quoted, with '"' and '\' escaped; bytes outside printable ASCII (which a
// Kubernetes name never has) are replaced by '?'.
func String(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
