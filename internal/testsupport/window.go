package testsupport

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// Decision is one rate-limited request as its client (or the app behind the
// limiter) saw it: the limiter decided it at some moment between Sent and
// Done, which nobody outside Redis knows more precisely.
type Decision struct {
	Key        string // the client the limit counts by
	Sent, Done time.Time
	Admitted   bool
	// Cost is what the admit counts in a weighted (cost) limit; 0 means 1,
	// an admit of a count limit.
	Cost int64
}

func (d *Decision) cost() int {
	if d.Cost == 0 {
		return 1
	}
	return int(d.Cost)
}

// BusiestWindow judges a sliding-window limit from outside: admits of one
// key that were all sent after d−window and had all come back by d were
// decided inside (d−window, d], one window. It returns the most admits of
// one key so proven to share a window (their summed Cost, in a cost
// limit), and a description of where (empty when there are no admits). A limiter that admits more than its limit in
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
		if n, at := busiestOfKey(admits[k], window); n > most {
			most = n
			where = fmt.Sprintf("%d admits of %s sent after %s and back by %s",
				n, k, at.Add(-window).Format("15:04:05.000"), at.Format("15:04:05.000"))
		}
	}
	return most, where
}

// busiestOfKey is the largest cost of as sent after d−window and back by
// d, over every return d, and that d. Taken in order of return, each
// admit's cost goes into a Fenwick tree at its rank among all send times,
// which sums those so far sent after d−window in O(log n): a failover test
// judges thousands of admits of one key.
func busiestOfKey(as []Decision, window time.Duration) (int, time.Time) {
	slices.SortFunc(as, func(a, b Decision) int { return a.Done.Compare(b.Done) })
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
	var best, sum int
	at := time.Time{}
	for j, a := range as {
		sum += a.cost()
		for i := rank[j] + 1; i < len(tree); i += i & -i {
			tree[i] += a.cost()
		}
		// k: how many send times are ≤ d−window; the ranks below k are
		// admits sent too early to share a window with d.
		from := a.Done.Add(-window)
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
		if n := sum - early; n > best {
			best, at = n, a.Done
		}
	}
	return best, at
}

// DenialsBelowLimit is the other half of exactness: a denial is right only
// if the window it was decided in already held limit admits. It returns the
// denials (described) for which fewer than limit admits of their key could
// have been decided in any window ending while the denial was in flight:
// an admit counts if it was sent before the denial came back and came back
// after the denial was sent minus window. Denials by another limit than the
// one judged must be left out of ds.
func DenialsBelowLimit(ds []Decision, limit int, window time.Duration) []string {
	admits := admitsByKey(ds)
	var out []string
	for _, i := range denialsBelow(ds, admits, limit, window) {
		d := ds[i]
		out = append(out, fmt.Sprintf("%s denied at %s–%s with at most %d admits in its window, limit %d",
			d.Key, d.Sent.Format("15:04:05.000"), d.Done.Format("15:04:05.000"), admitsAround(admits[d.Key], d, window), limit))
	}
	return out
}

// admitsByKey are the admits of ds by key.
func admitsByKey(ds []Decision) map[string][]Decision {
	admits := map[string][]Decision{}
	for _, d := range ds {
		if d.Admitted {
			admits[d.Key] = append(admits[d.Key], d)
		}
	}
	return admits
}

// denialsBelow is DenialsBelowLimit's judgement: the indexes of the
// denials in ds with fewer than limit admits of their key (admits, by
// key) around them.
func denialsBelow(ds []Decision, admits map[string][]Decision, limit int, window time.Duration) []int {
	var out []int
	for i, d := range ds {
		if !d.Admitted && admitsAround(admits[d.Key], d, window) < limit {
			out = append(out, i)
		}
	}
	return out
}

// admitsAround is how many of admits (of d's key) can have been decided
// in a window ending while d was in flight: sent before d came back, back
// after d was sent minus window.
func admitsAround(admits []Decision, d Decision, window time.Duration) int {
	from := d.Sent.Add(-window)
	n := 0
	for _, a := range admits {
		if !a.Sent.After(d.Done) && a.Done.After(from) {
			n++
		}
	}
	return n
}

// Limit is one window of a key's limits and the admits it allows.
type Limit struct {
	Limit  int
	Window time.Duration
}

// DenialsBelowLimits is DenialsBelowLimit for a key limited by several
// windows at once (a policy's additionalLimits): a denial is right if any
// one of the windows already held its limit, so it is listed only when
// every window held fewer admits than its limit, each counted as
// DenialsBelowLimit counts them.
func DenialsBelowLimits(ds []Decision, limits []Limit) []string {
	admits := admitsByKey(ds)
	wrong := make([]int, len(ds)) // the windows each denial is wrong for
	for _, l := range limits {
		for _, i := range denialsBelow(ds, admits, l.Limit, l.Window) {
			wrong[i]++
		}
	}
	var out []string
	for i, d := range ds {
		if !d.Admitted && len(limits) > 0 && wrong[i] == len(limits) {
			out = append(out, fmt.Sprintf("%s denied at %s–%s with fewer admits than the limit in every window %v",
				d.Key, d.Sent.Format("15:04:05.000"), d.Done.Format("15:04:05.000"), limits))
		}
	}
	return out
}

// Paced sends requests from workers goroutines until d has passed, worker
// w as client keys[w%len(keys)], each pausing 3ms after every answer (so
// that windows slide under a steady load rather than one burst). send
// makes request n of worker w and says whether it was admitted; ok false
// stops that worker. It returns what the clients saw.
func Paced(workers int, keys []string, d time.Duration, send func(w, n int, key string) (admitted, ok bool)) []Decision {
	var (
		mu  sync.Mutex
		ds  []Decision
		wg  sync.WaitGroup
		end = time.Now().Add(d)
	)
	for w := range workers {
		wg.Go(func() {
			key := keys[w%len(keys)]
			for n := 0; time.Now().Before(end); n++ {
				sent := time.Now()
				admitted, ok := send(w, n, key)
				if !ok {
					return
				}
				dec := Decision{Key: key, Sent: sent, Done: time.Now(), Admitted: admitted}
				mu.Lock()
				ds = append(ds, dec)
				mu.Unlock()
				time.Sleep(3 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	return ds
}

// Admitted is how many of ds were admitted.
func Admitted(ds []Decision) int {
	n := 0
	for _, d := range ds {
		if d.Admitted {
			n++
		}
	}
	return n
}
