package render

import (
	"fmt"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// What one client of a policy can make the shared Redis hold, at most
// (docs/operations.md, "Sizing Redis memory", measured with MEMORY USAGE:
// a SlidingLog window of 1,000 admits ~102 KB, a SlidingWindowCounter
// client ~104 B whatever its limit), rounded up so that the bound holds.
const (
	// SlidingLogBytesPerAdmit is one admit of a SlidingLog window: a
	// sorted-set member, its score and the set's overhead per entry.
	SlidingLogBytesPerAdmit = 104
	// CounterBytes is a SlidingWindowCounter client's hash.
	CounterBytes = 128
	// QuotaBytes is a quota's counter of one client for one period, a hash
	// of one count (120 B measured; 152 B once an undo marked it), at any
	// limit. A period's key expires with the period.
	QuotaBytes = 160
)

// ClientFootprint is the most Redis memory one client of p holds: a full
// window. A tenant chooses the limit, and any client of its API fills one
// window per client key, so this is what a policy costs the Redis every
// namespace shares, per client.
// Each of its additionalLimits is one more window per client, and each
// quota one counter.
func ClientFootprint(p *v1alpha1.RateLimitPolicy) int64 {
	quotas := QuotaBytes * int64(len(p.Spec.Quotas))
	if p.Spec.Algorithm == v1alpha1.AlgorithmSlidingWindowCounter {
		return CounterBytes*int64(1+len(p.Spec.AdditionalLimits)) + quotas
	}
	return admits(p)*SlidingLogBytesPerAdmit + quotas
}

// admits is the most admits one client of p has in Redis at once: a full
// window of each of its limits.
func admits(p *v1alpha1.RateLimitPolicy) int64 {
	n := int64(p.Spec.Limit)
	for _, l := range p.Spec.AdditionalLimits {
		n += int64(l.Limit)
	}
	return n
}

// FootprintTooLargeError says that a policy's clients could each make
// Redis hold more than the platform team allows (the manager's
// --max-client-bytes).
type FootprintTooLargeError struct {
	Namespace, Name string
	Limit           int64 // the admits of a full window of each limit
	Bytes, Max      int64
}

func (e *FootprintTooLargeError) Error() string {
	return fmt.Sprintf("each client of policy %s/%s can make the shared Redis hold up to %s bytes (a full SlidingLog window: %s admits × %d B per admit), over the %s bytes per client the platform team allows (the manager's --max-client-bytes); "+
		"use algorithm SlidingWindowCounter (%d B per client, approximate), a lower limit, or ask for a larger bound",
		e.Namespace, e.Name, thousands(int(e.Bytes)), thousands(int(e.Limit)), SlidingLogBytesPerAdmit, thousands(int(e.Max)), CounterBytes)
}

// CheckFootprint refuses p when one of its clients could make Redis hold
// more than maxBytes (0: no bound).
func CheckFootprint(p *v1alpha1.RateLimitPolicy, maxBytes int64) error {
	if maxBytes <= 0 {
		return nil
	}
	if b := ClientFootprint(p); b > maxBytes {
		return &FootprintTooLargeError{Namespace: p.Namespace, Name: p.Name, Limit: admits(p), Bytes: b, Max: maxBytes}
	}
	return nil
}
