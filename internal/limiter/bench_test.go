package limiter

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisschema"
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
// identity decide) beside the scripts (EVALSHA, the shared identity) and
// beside one function call per decision (Options.CallPerDecision, the form
// before the batch call), each on the same server one after the other,
// with redis-server's CPU time per decision (redis-µs/op, from /proc,
// 10 ms ticks) and the command time Redis itself counts per decision
// (cmd-µs/op, INFO commandstats: the calls and the commands they ran):
//
//	go test -run '^$' -bench DecideFunctions -benchtime 100000x ./internal/limiter/
//
// make bench (test/bench/limiter) measures the same side by side.
func BenchmarkDecideFunctions(b *testing.B) {
	r := testsupport.StartRedis(b)
	rdb := standalone(b, r.Addr)
	if _, err := redisschema.EnsureLibrary(context.Background(), rdb); err != nil {
		b.Fatal(err)
	}
	for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
		for _, callers := range []int{1, 64, -64} { // -64: 64 callers, one key (a hot key)
			clients := 10000
			if callers < 0 {
				callers, clients = -callers, 1
			}
			for _, v := range []struct {
				name string
				opts Options
			}{
				{"evalsha", Options{}},
				{"fcall", Options{Functions: true}},
				{"fcall-per-decision", Options{Functions: true, CallPerDecision: true}},
			} {
				b.Run(fmt.Sprintf("%s/callers=%d/keys=%d/%s", alg, callers, clients, v.name), func(b *testing.B) {
					v.opts.Timeout = time.Second
					l := newLimiter(b, rdb, v.opts)
					rule := Rule{ID: "bench/" + string(alg) + "-" + v.name, Limit: 1 << 40, Window: time.Second, Algorithm: alg}
					one(l, rule, "warm")
					cpu0, err := r.CPUTime()
					if err != nil {
						b.Fatal(err)
					}
					usec0, calls0 := commandUsec(b, r)
					benchParallel(b, callers, func(i int) {
						if d := one(l, rule, strconv.Itoa(i%clients)); d.Source != SourceRedis {
							b.Fatalf("decision: %+v", d)
						}
					})
					b.StopTimer()
					cpu1, err := r.CPUTime()
					if err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(float64(cpu1-cpu0)/float64(time.Microsecond)/float64(b.N), "redis-µs/op")
					usec1, calls1 := commandUsec(b, r)
					b.ReportMetric((usec1-usec0)/float64(b.N), "cmd-µs/op")
					b.ReportMetric(float64(b.N)/max(1, calls1-calls0), "decisions/call")
				})
			}
		}
	}
}

// commandUsec is the command time of the script and function calls Redis
// has counted (INFO commandstats; a call's time includes its inner
// commands', which are counted apart too), and the number of those calls.
func commandUsec(tb testing.TB, r *testsupport.Redis) (usec, calls float64) {
	tb.Helper()
	info, err := r.Do("INFO", "commandstats")
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		if name == "cmdstat_fcall" || name == "cmdstat_evalsha" || name == "cmdstat_eval" {
			for _, f := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(f, "usec="); ok {
					n, _ := strconv.ParseFloat(v, 64)
					usec += n
				}
				if v, ok := strings.CutPrefix(f, "calls="); ok {
					n, _ := strconv.ParseFloat(v, 64)
					calls += n
				}
			}
		}
	}
	return usec, calls
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
				if err := rdb.Eval(context.Background(), redisschema.Decide.Body, []string{key},
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
