package testsupport

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestExcess compares the judge with counting every window by brute force,
// on random admits (send-to-arrival lags of up to 50 ms, ties included).
func TestExcess(t *testing.T) {
	base := time.Unix(1000, 0)
	brute := func(as []Admit, limit int, w time.Duration) int {
		worst := 0
		for _, a := range as {
			n := 0
			for _, b := range as {
				if b.Key == a.Key && b.Sent.After(a.Arrived.Add(-w)) && !b.Arrived.After(a.Arrived) {
					n++
				}
			}
			worst = max(worst, n-limit)
		}
		return worst
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		var as []Admit
		for range 1 + rng.IntN(120) {
			sent := base.Add(time.Duration(rng.IntN(40)) * 25 * time.Millisecond)
			as = append(as, Admit{Key: []string{"a", "b"}[rng.IntN(2)], Sent: sent, Arrived: sent.Add(time.Duration(rng.IntN(3)) * 25 * time.Millisecond)})
		}
		limit, w := rng.IntN(30), time.Duration(1+rng.IntN(8))*100*time.Millisecond
		got, where := Excess(as, limit, w)
		if want := brute(as, limit, w); got != want {
			t.Fatalf("trial %d: Excess = %d (%s), counting every window: %d", trial, got, where, want)
		}
		if (got > 0) != (where != "") {
			t.Fatalf("trial %d: excess %d described as %q", trial, got, where)
		}
	}
}
