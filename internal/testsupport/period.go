package testsupport

import (
	"fmt"
	"slices"
	"time"
)

// A quota counts admits per calendar period (a day, a month), not in a
// sliding window. Judged from outside, a decision was made somewhere
// between its Sent and Done: inside one period when both are, perhaps in
// either of two when they straddle a boundary.

// PeriodOf gives the period that holds t: start <= t < end.
type PeriodOf func(t time.Time) (start, end time.Time)

// BusiestPeriod is the most admits of one key surely made in one period
// (sent and back inside it), and where. A quota that admits more than its
// limit in a period shows as most > limit; latency only hides admits (an
// admit that straddles a boundary is in neither), never adds them.
func BusiestPeriod(ds []Decision, period PeriodOf) (most int, where string) {
	type at struct {
		key   string
		start time.Time
	}
	n := map[at]int{}
	for _, d := range ds {
		if !d.Admitted {
			continue
		}
		if s, _ := period(d.Sent); s.Equal(first(period(d.Done))) {
			n[at{d.Key, s}] += d.cost()
		}
	}
	keys := make([]at, 0, len(n))
	for k := range n {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b at) int { return a.start.Compare(b.start) })
	for _, k := range keys {
		if n[k] > most {
			most = n[k]
			where = fmt.Sprintf("%d admits of %s in the period from %s", n[k], k.key, k.start.Format("15:04:05.000"))
		}
	}
	return most, where
}

// DenialsWithRoomInPeriod lists the denials surely made in one period
// (sent and back inside it) while the admits of their key that may have
// been made in it (any that overlapped it) were fewer than limit: an
// exact quota refused a request with room.
func DenialsWithRoomInPeriod(ds []Decision, limit int, period PeriodOf) []string {
	admits := admitsByKey(ds)
	var out []string
	for _, d := range ds {
		if d.Admitted {
			continue
		}
		s, e := period(d.Sent)
		if !d.Done.Before(e) {
			continue
		}
		n := 0
		for _, a := range admits[d.Key] {
			if !a.Done.Before(s) && a.Sent.Before(e) {
				n += a.cost()
			}
		}
		if n < limit {
			out = append(out, fmt.Sprintf("%s denied at %s–%s with %d admits in the period from %s, limit %d",
				d.Key, d.Sent.Format("15:04:05.000"), d.Done.Format("15:04:05.000"), n, s.Format("15:04:05.000"), limit))
		}
	}
	return out
}

func first(a, _ time.Time) time.Time { return a }
