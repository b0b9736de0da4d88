package testsupport

import (
	"fmt"
	"slices"
	"time"
)

// Decision is one rate-limited request as its client (or the app behind the
// limiter) saw it: the limiter decided it at some moment between Sent and
// Done, which nobody outside Redis knows more precisely.
type Decision struct {
	Key        string // the client the limit counts by
	Sent, Done time.Time
	Admitted   bool
}

// BusiestWindow judges a sliding-window limit from outside: admits of one
// key that were all sent after d−window and had all come back by d were
// decided inside (d−window, d], one window. It returns the most admits of
// one key so proven to share a window, and a description of where (empty
// when there are no admits). A limiter that admits more than its limit in
// any window shows here as most > limit, whatever the clocks' latency; an
// exact one can still show fewer than it admitted per window (latency only
// hides admits, never adds them).
func BusiestWindow(ds []Decision, window time.Duration) (most int, where string) {
	admits := map[string][]Decision{}
	for _, d := range ds {
		if d.Admitted {
			admits[d.Key] = append(admits[d.Key], d)
		}
	}
	keys := make([]string, 0, len(admits))
	for k := range admits {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		as := admits[k]
		slices.SortFunc(as, func(a, b Decision) int { return a.Done.Compare(b.Done) })
		for j := range as {
			from := as[j].Done.Add(-window)
			n := 0
			for i := 0; i <= j; i++ {
				if as[i].Sent.After(from) {
					n++
				}
			}
			if n > most {
				most = n
				where = fmt.Sprintf("%d admits of %s sent after %s and back by %s",
					n, k, from.Format("15:04:05.000"), as[j].Done.Format("15:04:05.000"))
			}
		}
	}
	return most, where
}

// DenialsBelowLimit is the other half of exactness: a denial is right only
// if the window it was decided in already held limit admits. It returns the
// denials (described) for which fewer than limit admits of their key could
// have been decided in any window ending while the denial was in flight:
// an admit counts if it was sent before the denial came back and came back
// after the denial was sent minus window. Denials by another limit than the
// one judged must be left out of ds.
func DenialsBelowLimit(ds []Decision, limit int, window time.Duration) []string {
	admits := map[string][]Decision{}
	for _, d := range ds {
		if d.Admitted {
			admits[d.Key] = append(admits[d.Key], d)
		}
	}
	var out []string
	for _, d := range ds {
		if d.Admitted {
			continue
		}
		from := d.Sent.Add(-window)
		n := 0
		for _, a := range admits[d.Key] {
			if !a.Sent.After(d.Done) && a.Done.After(from) {
				n++
			}
		}
		if n < limit {
			out = append(out, fmt.Sprintf("%s denied at %s–%s with at most %d admits in its window, limit %d",
				d.Key, d.Sent.Format("15:04:05.000"), d.Done.Format("15:04:05.000"), n, limit))
		}
	}
	return out
}
