// Package closedloop is the benchmarks' closed-loop driver: a fixed number
// of callers, each sending its next call when the last one returned.
package closedloop

import (
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Point is a throughput and latency summary of one run.
type Point struct {
	DPS      float64 // counted calls per second
	N        int     // counted calls
	P50, P99 time.Duration
}

// Drive runs f from `callers` goroutines for d; g is the caller's index.
// It returns the latencies of the calls for which f returned true, and how
// long the run took.
func Drive(callers int, d time.Duration, f func(g int, rng *rand.Rand) bool) ([]time.Duration, time.Duration) {
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for g := range callers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), uint64(start.UnixNano()))) //nolint:gosec // load generation, not security
			lat := make([]time.Duration, 0, 1<<14)
			for {
				t0 := time.Now()
				if !t0.Before(stop) {
					break
				}
				if f(g, rng) {
					lat = append(lat, time.Since(t0))
				}
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return all, time.Since(start)
}

// Summarize sorts lat and returns its rate over elapsed and percentiles.
func Summarize(lat []time.Duration, elapsed time.Duration) Point {
	if len(lat) == 0 {
		return Point{}
	}
	slices.Sort(lat)
	return Point{DPS: float64(len(lat)) / elapsed.Seconds(), N: len(lat), P50: lat[len(lat)/2], P99: lat[len(lat)*99/100]}
}
