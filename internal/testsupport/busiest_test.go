package testsupport

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestBusiestWindowAtRandom compares BusiestWindow with counting every
// window by brute force, on random admits and denials (send-to-return lags
// of up to 50 ms, ties included), counted or of random cost.
func TestBusiestWindowAtRandom(t *testing.T) {
	base := time.Unix(1000, 0)
	brute := func(ds []Decision, w time.Duration) int {
		most := 0
		for _, a := range ds {
			n := 0
			for _, b := range ds {
				if a.Admitted && b.Admitted && b.Key == a.Key && b.Sent.After(a.Done.Add(-w)) && !b.Done.After(a.Done) {
					n += b.cost()
				}
			}
			most = max(most, n)
		}
		return most
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		var ds []Decision
		for range 1 + rng.IntN(120) {
			sent := base.Add(time.Duration(rng.IntN(40)) * 25 * time.Millisecond)
			ds = append(ds, Decision{Key: []string{"a", "b"}[rng.IntN(2)], Sent: sent, Done: sent.Add(time.Duration(rng.IntN(3)) * 25 * time.Millisecond), Admitted: rng.IntN(4) > 0, Cost: int64(rng.IntN(3) * rng.IntN(100))})
		}
		w := time.Duration(1+rng.IntN(8)) * 100 * time.Millisecond
		got, where := BusiestWindow(ds, w)
		if want := brute(ds, w); got != want {
			t.Fatalf("trial %d: BusiestWindow = %d (%s), counting every window: %d", trial, got, where, want)
		}
		if (got > 0) != (where != "") {
			t.Fatalf("trial %d: %d admits described as %q", trial, got, where)
		}
	}
}
