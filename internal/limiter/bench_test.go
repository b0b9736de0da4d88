package limiter

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// The hot path against a real redis-server: ns/op is the wall time per
// decision with N concurrent callers (so 1e9/ns_op is decisions/s), and
// allocs/op what one decision allocates, Redis client included.
//
//	go test -run '^$' -bench . -benchmem ./internal/limiter/
func BenchmarkDecide(b *testing.B) {
	r := testsupport.StartRedis(b)
	rdb := standalone(b, r.Addr)
	for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
		for _, callers := range []int{1, 16, 64, 256} {
			b.Run(fmt.Sprintf("%s/callers=%d", alg, callers), func(b *testing.B) {
				l := newLimiter(b, rdb, Options{Timeout: time.Second})
				rule := Rule{ID: "bench/" + string(alg), Limit: 1 << 40, Window: time.Second, Algorithm: alg}
				benchParallel(b, callers, func(i int) {
					if d := one(l, rule, strconv.Itoa(i%10000)); d.Source != SourceRedis {
						b.Fatalf("decision: %+v", d)
					}
				})
				st := l.Stats()
				b.ReportMetric(float64(st.Ops)/float64(max(st.RoundTrips, 1)), "scripts/roundtrip")
			})
		}
	}
}

// BenchmarkDecideFunctions is BenchmarkDecide through the slidegate
// Functions library (FCALL, as sidecars with their namespace's own Redis
// identity decide) beside the scripts (EVALSHA, the shared identity), each
// pair on the same server one after the other:
//
//	go test -run '^$' -bench DecideFunctions -benchmem ./internal/limiter/
//
// make bench (test/bench/limiter) adds Redis's CPU per decision.
func BenchmarkDecideFunctions(b *testing.B) {
	r := testsupport.StartRedis(b)
	rdb := standalone(b, r.Addr)
	if _, err := EnsureLibrary(context.Background(), rdb); err != nil {
		b.Fatal(err)
	}
	for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
		for _, callers := range []int{1, 64} {
			for _, functions := range []bool{false, true} {
				call := map[bool]string{false: "evalsha", true: "fcall"}[functions]
				b.Run(fmt.Sprintf("%s/callers=%d/%s", alg, callers, call), func(b *testing.B) {
					l := newLimiter(b, rdb, Options{Timeout: time.Second, Functions: functions})
					rule := Rule{ID: "bench/" + string(alg) + "-" + call, Limit: 1 << 40, Window: time.Second, Algorithm: alg}
					benchParallel(b, callers, func(i int) {
						if d := one(l, rule, strconv.Itoa(i%10000)); d.Source != SourceRedis {
							b.Fatalf("decision: %+v", d)
						}
					})
				})
			}
		}
	}
}

// BenchmarkTextbook is the same script with one EVAL round trip per
// decision and go-redis defaults: the baseline the coalescing beats.
func BenchmarkTextbook(b *testing.B) {
	r := testsupport.StartRedis(b)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer func() { _ = rdb.Close() }()
	for _, callers := range []int{1, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			benchParallel(b, callers, func(i int) {
				key := Key(defaultPrefix, "bench/textbook", strconv.Itoa(i%10000))
				member := "m" + strconv.Itoa(i)
				if err := rdb.Eval(context.Background(), decideScript, []string{key},
					member, 1000, 1, int64(1)<<40, time.Second.Microseconds(), 0, 1).Err(); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// benchParallel runs b.N calls of f spread over exactly `callers`
// goroutines (RunParallel's goroutine count is a multiple of GOMAXPROCS).
func benchParallel(b *testing.B, callers int, f func(i int)) {
	b.ReportAllocs()
	b.SetParallelism(max(1, (callers+runtime.GOMAXPROCS(0)-1)/runtime.GOMAXPROCS(0)))
	var n atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			f(int(n.Add(1)))
		}
	})
}
