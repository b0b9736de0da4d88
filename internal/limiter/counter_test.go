package limiter

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestCounterErrorBound drives SlidingWindowCounter's worst case: the
// whole limit admitted at the very end of one fixed window, then steady
// demand. The sliding window then holds more than the limit (the algorithm
// is approximate, as documented) but never 2×limit, and each aligned fixed
// window holds at most the limit.
func TestCounterErrorBound(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	const limit, window = 40, 500 * time.Millisecond
	l := newLimiter(t, standalone(t, r.Addr), Options{Timeout: 2 * time.Second})
	var admits []int64
	l.observe = func(_ context.Context, now int64, _ []Request, _ []int, out []Decision) {
		if out[0].Allowed {
			admits = append(admits, now) // one caller: no lock needed
		}
	}
	w := window.Microseconds()
	// The fixed windows are aligned on the score epoch; server and test
	// share the machine's clock. Start 60ms before a boundary; if the
	// machine was too slow and the burst missed it (seen in server time),
	// try again.
	for attempt := range 3 {
		admits = admits[:0]
		rule := Rule{ID: "ns/counter-bound-" + string(rune('a'+attempt)), Limit: limit, Window: window, Algorithm: SlidingWindowCounter}
		nowUS := time.Since(time.Unix(scoreEpoch, 0)).Microseconds()
		boundary := (nowUS/w + 1) * w
		if boundary-nowUS < 80_000 {
			boundary += w
		}
		time.Sleep(time.Duration(boundary-nowUS)*time.Microsecond - 60*time.Millisecond) // waiting for a point in time
		end := time.Now().Add(window + 200*time.Millisecond)
		for time.Now().Before(end) {
			one(l, rule, "c")
		}
		if len(admits) >= limit && admits[limit-1] < boundary {
			break
		}
		t.Logf("attempt %d: the burst missed the window boundary, retrying", attempt+1)
	}
	if len(admits) == 0 {
		t.Fatal("no admits")
	}
	slices.Sort(admits)
	busiest := 0
	for _, a := range admits {
		lo, _ := slices.BinarySearch(admits, a-w+1)
		hi, _ := slices.BinarySearch(admits, a+1)
		busiest = max(busiest, hi-lo)
	}
	perFixed := map[int64]int{}
	for _, a := range admits {
		perFixed[a/w]++
	}
	t.Logf("%d admits; busiest sliding window %d (limit %d); per fixed window %v", len(admits), busiest, limit, perFixed)
	for idx, n := range perFixed {
		if n > limit {
			t.Errorf("fixed window %d holds %d admits, limit %d", idx, n, limit)
		}
	}
	if busiest >= 2*limit {
		t.Errorf("a sliding window holds %d admits, the bound is < 2×limit = %d", busiest, 2*limit)
	}
	if busiest <= limit {
		t.Errorf("the worst case did not exceed the limit (%d): the test does not reach it", busiest)
	}
}
