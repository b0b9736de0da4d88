package testsupport

import (
	"fmt"
	"slices"
	"time"
)

// Admit is one request that reached the application: Key is what it was
// limited by (a client of a rule), Sent when its client sent it and
// Arrived when the application had it. Whatever decided it, Redis's clock
// or a fallback's, decided between the two.
type Admit struct {
	Key           string
	Sent, Arrived time.Time
}

// Excess judges a fleet's exactness from the application's side alone: it
// returns the largest number of admits of one key beyond limit that fall
// within some window, and a description of where ("" when none). Admits
// that were all sent after a−window and had all arrived by a were decided
// within an interval shorter than window, whatever clock the limiter used,
// so more than limit of them is proven excess; no clock but the test's is
// trusted.
func Excess(admits []Admit, limit int, window time.Duration) (int, string) {
	byKey := map[string][]Admit{}
	for _, a := range admits {
		byKey[a.Key] = append(byKey[a.Key], a)
	}
	worst, where := 0, ""
	for key, as := range byKey {
		n, at := excessOfKey(as, window)
		if n-limit > worst {
			worst = n - limit
			where = fmt.Sprintf("%d admits of %s sent after %s and arrived by %s (limit %d per %v)",
				n, key, at.Add(-window).Format("15:04:05.000"), at.Format("15:04:05.000"), limit, window)
		}
	}
	return worst, where
}

// excessOfKey is the largest number of as sent after a−window and arrived
// by a, over every arrival a, and that a. Taken in order of arrival, each
// admit's rank among all send times goes into a Fenwick tree, which counts
// the admits so far sent after a−window in O(log n).
func excessOfKey(as []Admit, window time.Duration) (int, time.Time) {
	as = slices.Clone(as)
	slices.SortFunc(as, func(a, b Admit) int { return a.Arrived.Compare(b.Arrived) })
	bySent := make([]int, len(as)) // indexes of as in order of sending
	for i := range bySent {
		bySent[i] = i
	}
	slices.SortStableFunc(bySent, func(i, j int) int { return as[i].Sent.Compare(as[j].Sent) })
	rank := make([]int, len(as))
	sent := make([]time.Time, len(as))
	for r, i := range bySent {
		rank[i], sent[r] = r, as[i].Sent
	}
	tree := make([]int, len(as)+1)
	best, at := 0, time.Time{}
	for j, a := range as {
		for i := rank[j] + 1; i < len(tree); i += i & -i {
			tree[i]++
		}
		// k: how many send times are ≤ a−window; the ranks below k are
		// admits sent too early to share a's window.
		from := a.Arrived.Add(-window)
		k, _ := slices.BinarySearchFunc(sent, from, func(s, t time.Time) int {
			if s.After(t) {
				return 1
			}
			return -1
		})
		early := 0
		for i := k; i > 0; i -= i & -i {
			early += tree[i]
		}
		if n := j + 1 - early; n > best {
			best, at = n, a.Arrived
		}
	}
	return best, at
}
