package rls

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestExactAcrossReplicas: 3 RLS replicas, 12 gRPC callers each, one
// client address at a limit of 40 per second for 3.5s. The replicas
// sharing one Redis must never admit more than 40 in a sliding second;
// the naive deployment, each replica with a Redis of its own (what a
// per-replica in-memory limiter amounts to), must be caught admitting more.
//
// The server's decision time is not visible to a client, but it lies
// between the call's start and its answer: admits whose whole call fell in
// (x-W, x] were certainly decided in that window. Counting only those never
// blames the exact limiter for a window it kept, whatever the latency (a
// busy machine only makes the count smaller); the naive case admits three
// times the limit, far more than latency can hide.
func TestExactAcrossReplicas(t *testing.T) {
	t.Parallel()
	const limit, window, dur, callers = 40, time.Second, 3500 * time.Millisecond, 12
	for _, tc := range []struct {
		name  string
		naive bool
	}{{"shared-redis", false}, {"redis-per-replica", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := writeConfig(t,
				pol("api", 1_000_000, window, entry("generic_key", "api")),
				pol("per-ip", limit, window, entry("remote_address")),
			)
			shared := testsupport.StartRedis(t)
			var clients []rlsv3.RateLimitServiceClient
			for range 3 {
				addr := shared.Addr
				if tc.naive {
					addr = testsupport.StartRedis(t).Addr
				}
				clients = append(clients, startReplica(t, standaloneConfig(addr), cfg, limiter.Options{Timeout: 10 * time.Second}).client)
			}
			req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
				desc("remote_address", "192.0.2.7"), desc("generic_key", "api"),
			}}
			type call struct{ sent, recv time.Time }
			var mu sync.Mutex
			var admits []call
			var wg sync.WaitGroup
			stop := time.Now().Add(dur)
			for _, c := range clients {
				for range callers {
					wg.Go(func() {
						for time.Now().Before(stop) {
							sent := time.Now()
							resp, err := c.ShouldRateLimit(context.Background(), req)
							recv := time.Now()
							if err != nil {
								t.Errorf("ShouldRateLimit: %v", err)
								return
							}
							if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
								mu.Lock()
								admits = append(admits, call{sent, recv})
								mu.Unlock()
							}
						}
					})
				}
			}
			wg.Wait()
			slices.SortFunc(admits, func(a, b call) int { return a.recv.Compare(b.recv) })
			busiest := 0
			for _, a := range admits {
				n := 0
				for _, b := range admits {
					if b.sent.After(a.recv.Add(-window)) && !b.recv.After(a.recv) {
						n++
					}
				}
				busiest = max(busiest, n)
			}
			t.Logf("%d admits in %v; busiest sliding window (certain admits) %d, limit %d", len(admits), dur, busiest, limit)
			if !tc.naive {
				if busiest > limit {
					t.Errorf("a sliding window certainly holds %d admits, limit %d", busiest, limit)
				}
				// Saturated for 3.5 windows: at least 3 full windows of admits.
				if len(admits) < 3*limit {
					t.Errorf("%d admits in %v: the limiter denied below its limit", len(admits), dur)
				}
			} else if busiest <= limit {
				t.Errorf("the naive deployment did not over-admit (busiest window %d): the check cannot fail", busiest)
			}
		})
	}
}
