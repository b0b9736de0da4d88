// Command limiter writes the limiter's benchmark report: decisions/s and
// latency at several numbers of concurrent callers for both algorithms,
// side by side with the textbook approach (one EVAL round trip per
// decision, go-redis defaults) and with the ceiling (redis-benchmark
// running the same script, 16 requests per pipeline), the limiter calling
// the slidegate library's functions (FCALL) against its scripts (EVALSHA)
// with redis-server's CPU time per decision, the cost of durable
// admits (a replica acknowledges each round trip: WAIT) beside the same
// decisions without, Redis memory per tracked client, weighted decisions
// (cost limits, issue 27: an admit, a check and a charge) against count
// decisions in Redis CPU and memory, with the exact Retry-After of a key
// deep in debt (cost.go), and the deny cache under attack before and after
// issue 25 (the limiter package's BenchmarkViewUnderAttack, run by go
// test). It starts its own redis-server (and a replica of it).
//
//	go run ./test/bench/limiter -out bench/limiter.md
//
// writes a Markdown section starting at "## Limiter" to -out and the
// decisions/s per concurrency as CSV next to it (same name, .csv), for a
// plot. A full run takes about six minutes; -cost-only and
// -deny-cache-only measure their sections alone and replace them in -out.
package main

import (
	"context"
	"encoding/csv"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
	"github.com/slidegate/slidegate/test/bench/internal/closedloop"
)

const (
	clients     = 10000 // distinct clients (keys) the load spreads over
	benchLimit  = 1000  // per client per window: nearly every decision admits (the costly path)
	benchWindow = time.Second
)

func main() {
	out := flag.String("out", "", "Markdown file to write (required); the CSV goes next to it")
	dur := flag.Duration("duration", 2500*time.Millisecond, "measuring time per point for the limiter and the textbook")
	ceilN := flag.Int("ceiling-requests", 200000, "requests per redis-benchmark run")
	callersFlag := flag.String("callers", "1,16,64,256", "concurrent callers to measure")
	denyCacheOnly := flag.Bool("deny-cache-only", false, "measure only the deny cache under attack and replace its section in -out, keeping the rest")
	costOnly := flag.Bool("cost-only", false, "measure only the cost limits (weighted decisions, issue 27) and replace their sections in -out, keeping the rest")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "limiter bench: -out is required")
		os.Exit(2)
	}
	var callers []int
	for _, s := range strings.Split(*callersFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fatalf("bad -callers %q", *callersFlag)
		}
		callers = append(callers, n)
	}
	if *denyCacheOnly {
		dc, err := measureDenyCache()
		if err != nil {
			fatalf("%v", err)
		}
		if err := replaceDenyCache(*out, dc); err != nil {
			fatalf("%v", err)
		}
		return
	}
	if *costOnly {
		if err := runCostOnly(*out); err != nil {
			fatalf("%v", err)
		}
		return
	}
	if err := run(*out, *dur, *ceilN, callers); err != nil {
		fatalf("%v", err)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "limiter bench: "+format+"\n", args...)
	os.Exit(1)
}

// point is one measurement of one approach.
type point struct {
	dps       float64 // decisions per second (from Redis only)
	p50, p99  time.Duration
	perTrip   float64 // scripts per round trip (limiter only)
	fallbacks int64   // decisions not from Redis (limiter only)
	// cpuPerDecision is redis-server's CPU time (user+system, from
	// /proc) over the point divided by the decisions Redis made (limiter
	// only).
	cpuPerDecision time.Duration
}

type row struct {
	alg                    limiter.Algorithm
	callers                int
	lim, textbook, ceiling point
	// fcall is the limiter calling the slidegate library's functions
	// (limiter.Options.Functions), measured right after lim (EVALSHA).
	fcall point
	// perCall is fcall with one function call per decision
	// (limiter.Options.CallPerDecision), the form before the batch call;
	// fixed is a fixed-window client batching as the limiter does
	// (measureFixedWindow). Both right after fcall.
	perCall, fixed point
	// packed is the same client deciding through issue 39's packed log
	// (SlidingLog rows only), right after fixed.
	packed point
}

// durableRow compares, at one concurrency, the limiter on a master with a
// replica without and with durable admits.
type durableRow struct {
	callers          int
	primary, durable point
}

func run(out string, dur time.Duration, ceilN int, callers []int) error {
	benchBin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return fmt.Errorf("redis-benchmark not found (hack/redis.sh installs it): %w", err)
	}
	srv, err := testsupport.NewRedis()
	if err != nil {
		return err
	}
	defer srv.Close()
	redis.SetLogger(quiet{})
	ctx := context.Background()
	started := time.Now()
	loadBefore := loadAvg()

	var rows []row
	for _, alg := range []limiter.Algorithm{limiter.SlidingLog, limiter.SlidingWindowCounter} {
		for _, c := range callers {
			r := row{alg: alg, callers: c}
			if r.lim, err = measureLimiter(ctx, srv, alg, c, dur, false, limiter.Options{}); err != nil {
				return err
			}
			if r.fcall, err = measureLimiter(ctx, srv, alg, c, dur, false, limiter.Options{Functions: true}); err != nil {
				return err
			}
			if r.perCall, err = measureLimiter(ctx, srv, alg, c, dur, false, limiter.Options{Functions: true, CallPerDecision: true}); err != nil {
				return err
			}
			if r.fixed, err = measureFixedWindow(ctx, srv, c, dur, false); err != nil {
				return err
			}
			if alg == limiter.SlidingLog {
				if r.packed, err = measureFixedWindow(ctx, srv, c, dur, true); err != nil {
					return err
				}
			}
			if r.textbook, err = measureTextbook(ctx, srv, alg, c, dur); err != nil {
				return err
			}
			if r.ceiling, err = measureCeiling(srv, benchBin, alg, c, ceilN); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "%-20s callers=%-3d limiter %8.0f/s (%v redis CPU/decision)  fcall %8.0f/s (%v)  fcall per decision %8.0f/s (%v)  fixed window %8.0f/s (%v)  textbook %8.0f/s  ceiling %8.0f/s\n",
				alg, c, r.lim.dps, r.lim.cpuPerDecision, r.fcall.dps, r.fcall.cpuPerDecision, r.perCall.dps, r.perCall.cpuPerDecision, r.fixed.dps, r.fixed.cpuPerDecision, r.textbook.dps, r.ceiling.dps)
			rows = append(rows, r)
		}
	}
	durable, err := measureDurable(ctx, srv, callers, dur)
	if err != nil {
		return err
	}
	mem, err := measureMemory(ctx, srv)
	if err != nil {
		return err
	}
	packedMem, err := measurePackedMemory(ctx, srv)
	if err != nil {
		return err
	}
	mem = append(mem, packedMem...)
	cost, err := measureCost(ctx, srv)
	if err != nil {
		return err
	}
	dc, err := measureDenyCache()
	if err != nil {
		return err
	}
	version, _ := srv.Do("INFO", "server")
	return write(out, rows, durable, mem, cost, dc, report{
		started: started, took: time.Since(started), loadBefore: loadBefore, loadAfter: loadAvg(),
		redisVersion: field(version, "redis_version"), dur: dur, ceilN: ceilN,
	})
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func flush(srv *testsupport.Redis) error {
	_, err := srv.Do("FLUSHALL")
	return err
}

// drive runs f from `callers` goroutines for d (closedloop.Drive).
func drive(callers int, d time.Duration, f func(rng *rand.Rand) bool) ([]time.Duration, time.Duration) {
	return closedloop.Drive(callers, d, func(_ int, rng *rand.Rand) bool { return f(rng) })
}

func summarize(lat []time.Duration, elapsed time.Duration) point {
	p := closedloop.Summarize(lat, elapsed)
	return point{dps: p.DPS, p50: p.P50, p99: p.P99}
}

func measureLimiter(ctx context.Context, srv *testsupport.Redis, alg limiter.Algorithm, callers int, d time.Duration, durable bool, opts limiter.Options) (point, error) {
	if err := flush(srv); err != nil {
		return point{}, err
	}
	rdb, err := redisconn.NewClient(redisconn.Config{Addrs: []string{srv.Addr}})
	if err != nil {
		return point{}, err
	}
	defer func() { _ = rdb.Close() }()
	if opts.Functions {
		if _, err := redisschema.EnsureLibrary(ctx, rdb); err != nil {
			return point{}, err
		}
	}
	l, err := limiter.New(rdb, opts)
	if err != nil {
		return point{}, err
	}
	defer func() { _ = l.Close() }()
	rule := limiter.Rule{ID: "bench/" + string(alg), Limit: benchLimit, Window: benchWindow, Algorithm: alg, Durable: durable}
	// Warm up: scripts loaded, connections open.
	l.Decide(ctx, []limiter.Request{{Rule: rule, Client: "warmup"}})
	before := l.Stats()
	cpuBefore, err := srv.CPUTime()
	if err != nil {
		return point{}, err
	}
	lat, elapsed := drive(callers, d, func(rng *rand.Rand) bool {
		dec := l.Decide(ctx, []limiter.Request{{Rule: rule, Client: strconv.Itoa(rng.IntN(clients))}})
		return dec[0].Source == limiter.SourceRedis
	})
	cpuAfter, err := srv.CPUTime()
	if err != nil {
		return point{}, err
	}
	st := l.Stats()
	p := summarize(lat, elapsed)
	if n := st.Redis - before.Redis; n > 0 {
		p.cpuPerDecision = (cpuAfter - cpuBefore) / time.Duration(n)
	}
	p.perTrip = float64(st.Ops-before.Ops) / float64(max(1, st.RoundTrips-before.RoundTrips))
	p.fallbacks = st.Fallback + st.FailedClosed - before.Fallback - before.FailedClosed
	return p, nil
}

// measureDurable attaches a replica to srv and measures the limiter with
// SlidingLog at each concurrency twice, one right after the other: without
// durable admits and with them (every round trip ends with WAIT 1).
func measureDurable(ctx context.Context, srv *testsupport.Redis, callers []int, d time.Duration) ([]durableRow, error) {
	// The first sync at once: Redis waits 5 s by default for more replicas.
	if _, err := srv.Do("CONFIG", "SET", "repl-diskless-sync-delay", "0"); err != nil {
		return nil, err
	}
	replica, err := testsupport.NewRedis("--replicaof", "127.0.0.1", strconv.Itoa(srv.Port))
	if err != nil {
		return nil, err
	}
	defer replica.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if info, err := replica.Do("INFO", "replication"); err == nil && strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("replica %s not in sync after 10s", replica.Addr)
		}
	}
	var rows []durableRow
	for _, c := range callers {
		r := durableRow{callers: c}
		if r.primary, err = measureLimiter(ctx, srv, limiter.SlidingLog, c, d, false, limiter.Options{}); err != nil {
			return nil, err
		}
		if r.durable, err = measureLimiter(ctx, srv, limiter.SlidingLog, c, d, true, limiter.Options{}); err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "durable callers=%-3d primary %8.0f/s  replicated %8.0f/s\n", c, r.primary.dps, r.durable.dps)
		rows = append(rows, r)
	}
	return rows, nil
}

// measureTextbook: the same script, one EVAL (source included) per
// decision, with a go-redis client on its default options.
func measureTextbook(ctx context.Context, srv *testsupport.Redis, alg limiter.Algorithm, callers int, d time.Duration) (point, error) {
	if err := flush(srv); err != nil {
		return point{}, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer func() { _ = rdb.Close() }()
	src, flags := redisschema.Decide.Body, 0
	if alg == limiter.SlidingWindowCounter {
		flags = 1
	}
	var seq atomic.Int64
	var firstErr atomic.Pointer[error]
	lat, elapsed := drive(callers, d, func(rng *rand.Rand) bool {
		member := "tb" + strconv.FormatInt(seq.Add(1), 36)
		key := redisschema.Key("slidegate:", "bench/textbook", strconv.Itoa(rng.IntN(clients)))
		err := rdb.Eval(ctx, src, []string{key}, member, 1000, 1, benchLimit, benchWindow.Microseconds(), flags, 1).Err()
		if err != nil {
			firstErr.CompareAndSwap(nil, &err)
		}
		return err == nil
	})
	if e := firstErr.Load(); e != nil {
		return point{}, fmt.Errorf("textbook: %w", *e)
	}
	return summarize(lat, elapsed), nil
}

// measureCeiling runs redis-benchmark with the limiter's script through
// EVALSHA, 16 requests per pipeline, `callers` connections: what the
// server can do with the lightest possible client.
func measureCeiling(srv *testsupport.Redis, bin string, alg limiter.Algorithm, callers, n int) (point, error) {
	if err := flush(srv); err != nil {
		return point{}, err
	}
	sha, err := srv.Do("SCRIPT", "LOAD", redisschema.Decide.Body)
	if err != nil {
		return point{}, fmt.Errorf("SCRIPT LOAD: %w", err)
	}
	key, flags := "slidegate:{bench/ceiling:__rand_int__}", "0"
	if alg == limiter.SlidingWindowCounter {
		key, flags = key+"c", "1"
	}
	args := []string{"-p", strconv.Itoa(srv.Port), "-c", strconv.Itoa(callers), "-n", strconv.Itoa(n),
		"-P", "16", "-r", strconv.Itoa(clients), "--csv",
		// Two random numbers make the member unique enough, like the
		// limiter's process id and sequence.
		"EVALSHA", sha, "1", key, "m__rand_int____rand_int__", "1000", "1",
		strconv.Itoa(benchLimit), strconv.FormatInt(benchWindow.Microseconds(), 10), flags, "1"}
	outb, err := exec.Command(bin, args...).Output()
	if err != nil {
		return point{}, fmt.Errorf("redis-benchmark: %w", err)
	}
	// Last line: "test","rps","avg","min","p50","p95","p99","max" (ms).
	recs, err := csv.NewReader(strings.NewReader(string(outb))).ReadAll()
	if err != nil || len(recs) < 2 || len(recs[len(recs)-1]) < 7 {
		return point{}, fmt.Errorf("redis-benchmark output %q: %w", outb, err)
	}
	last := recs[len(recs)-1]
	rps, err := strconv.ParseFloat(last[1], 64)
	if err != nil {
		return point{}, fmt.Errorf("redis-benchmark rps %q: %w", last[1], err)
	}
	ms := func(s string) time.Duration {
		f, _ := strconv.ParseFloat(s, 64)
		return time.Duration(f * float64(time.Millisecond))
	}
	return point{dps: rps, p50: ms(last[4]), p99: ms(last[6])}, nil
}

// memRow is the Redis memory of one client's key, full at its limit.
// packedLog names the packed log's rows of the memory table.
const packedLog limiter.Algorithm = "packed log (issue 39)"

// measurePackedMemory fills 200 clients' packed logs to each limit (window
// 1h), one call per client deciding limit times on its key, and measures
// them as measureMemory does.
func measurePackedMemory(ctx context.Context, srv *testsupport.Redis) ([]memRow, error) {
	const tracked = 200
	script := redis.NewScript(redisschema.PackedCallScript())
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer func() { _ = rdb.Close() }()
	var rows []memRow
	for _, limit := range []int64{10, 100, 1000} {
		if err := flush(srv); err != nil {
			return nil, err
		}
		usedBefore := usedMemory(srv)
		var sum float64
		for c := range tracked {
			key := "pk:client-" + strconv.Itoa(c)
			call := redisschema.PackedCall{Margin: time.Second}
			for i := range limit {
				if err := call.Add(key, fmt.Sprintf("%08d", i), redisschema.PackedRule{Limit: limit, Window: time.Hour, Hits: 1}, true); err != nil {
					return nil, err
				}
			}
			keys, args := call.Args()
			if err := script.Run(ctx, rdb, keys, args...).Err(); err != nil {
				return nil, fmt.Errorf("filling %s: %w", key, err)
			}
		}
		used := (usedMemory(srv) - usedBefore) / tracked
		for c := range tracked {
			v, err := srv.Do("MEMORY", "USAGE", "pk:client-"+strconv.Itoa(c), "SAMPLES", "0")
			if err != nil {
				return nil, err
			}
			n, _ := strconv.ParseFloat(v, 64)
			sum += n
		}
		rows = append(rows, memRow{alg: packedLog, limit: limit, bytes: sum / tracked, used: used})
		fmt.Fprintf(os.Stderr, "memory %-20s limit=%-4d %8.0f B/client\n", packedLog, limit, sum/tracked)
	}
	return rows, nil
}

type memRow struct {
	alg   limiter.Algorithm
	limit int64
	bytes float64 // MEMORY USAGE, mean over the keys
	used  float64 // used_memory growth per client, for comparison
}

func measureMemory(ctx context.Context, srv *testsupport.Redis) ([]memRow, error) {
	const tracked = 200
	var rows []memRow
	for _, alg := range []limiter.Algorithm{limiter.SlidingLog, limiter.SlidingWindowCounter} {
		for _, limit := range []int64{10, 100, 1000} {
			if err := flush(srv); err != nil {
				return nil, err
			}
			rdb, err := redisconn.NewClient(redisconn.Config{Addrs: []string{srv.Addr}})
			if err != nil {
				return nil, err
			}
			l, err := limiter.New(rdb, limiter.Options{Timeout: 10 * time.Second})
			if err != nil {
				return nil, err
			}
			usedBefore := usedMemory(srv)
			rule := limiter.Rule{ID: "bench/memory", Limit: limit, Window: time.Hour, Algorithm: alg}
			var wg sync.WaitGroup
			for g := range 64 {
				wg.Go(func() {
					for c := g; c < tracked; c += 64 {
						for range limit {
							l.Decide(ctx, []limiter.Request{{Rule: rule, Client: "client-" + strconv.Itoa(c)}})
						}
					}
				})
			}
			wg.Wait()
			used := (usedMemory(srv) - usedBefore) / tracked
			var sum float64
			for c := range tracked {
				key := redisschema.Key("slidegate:", rule.ID, "client-"+strconv.Itoa(c))
				if alg == limiter.SlidingWindowCounter {
					key += "c"
				}
				v, err := srv.Do("MEMORY", "USAGE", key, "SAMPLES", "0")
				if err != nil {
					return nil, fmt.Errorf("MEMORY USAGE %s: %w", key, err)
				}
				n, _ := strconv.ParseFloat(v, 64)
				sum += n
			}
			_ = l.Close()
			_ = rdb.Close()
			rows = append(rows, memRow{alg: alg, limit: limit, bytes: sum / tracked, used: used})
			fmt.Fprintf(os.Stderr, "memory %-20s limit=%-4d %8.0f B/client\n", alg, limit, sum/tracked)
		}
	}
	return rows, nil
}

func usedMemory(srv *testsupport.Redis) float64 {
	info, _ := srv.Do("INFO", "memory")
	f, _ := strconv.ParseFloat(field(info, "used_memory"), 64)
	return f
}

func field(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

type report struct {
	started               time.Time
	took                  time.Duration
	loadBefore, loadAfter string
	redisVersion          string
	dur                   time.Duration
	ceilN                 int
}

func write(out string, rows []row, durable []durableRow, mem []memRow, cost costResult, dc denyCache, rep report) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	us := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e3, 'f', 0, 64) }
	p("## Limiter\n\n")
	p("Generated by `go run ./test/bench/limiter -out %s` on %s: %d CPUs (GOMAXPROCS %d), %s, redis-server %s on loopback; load average %s before, %s after; took %s.\n\n",
		filepath.Base(out), rep.started.UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), runtime.GOMAXPROCS(0),
		runtime.Version(), rep.redisVersion, rep.loadBefore, rep.loadAfter, rep.took.Round(time.Second))
	p("Workload: %d clients chosen at random per decision, limit %d per %v, so nearly every decision admits (the costlier path). ", clients, benchLimit, benchWindow)
	p("Each point is measured for %v (redis-benchmark: %d requests), one after another against the same server, FLUSHALL in between.\n\n", rep.dur, rep.ceilN)
	p("- **limiter**: `limiter.Decide` with default Options (decisions coalesced into pipelines: MaxInflight 2, MaxBatch 256; Timeout 1s), client from `redisconn.NewClient`. Only decisions answered by Redis are counted.\n")
	p("- **textbook**: the same Lua script, one `EVAL` round trip per decision, go-redis default options.\n")
	p("- **ceiling**: `redis-benchmark -P 16 -c <callers>` running the same script by EVALSHA: the server's capacity with the lightest client.\n\n")
	for _, alg := range []limiter.Algorithm{limiter.SlidingLog, limiter.SlidingWindowCounter} {
		p("### %s\n\n", alg)
		p("| callers | limiter dec/s | p50 µs | p99 µs | scripts/trip | textbook dec/s | p50 µs | p99 µs | ceiling dec/s | limiter ÷ ceiling | limiter ÷ textbook |\n")
		p("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range rows {
			if r.alg != alg {
				continue
			}
			p("| %d | %.0f | %s | %s | %.1f | %.0f | %s | %s | %.0f | %.2f | %.2f |\n",
				r.callers, r.lim.dps, us(r.lim.p50), us(r.lim.p99), r.lim.perTrip,
				r.textbook.dps, us(r.textbook.p50), us(r.textbook.p99), r.ceiling.dps,
				r.lim.dps/r.ceiling.dps, r.lim.dps/r.textbook.dps)
		}
		p("\n")
	}
	var fb int64
	for _, r := range rows {
		fb += r.lim.fallbacks
	}
	if fb > 0 {
		p("%d limiter decisions timed out (50ms) and were made by the fallback; they are not counted above.\n\n", fb)
	}
	p("### FCALL against EVALSHA\n\n")
	p("The limiter as above (**EVALSHA**: the scripts, as sidecars with a Redis identity shared by every namespace run them) and, measured right after it at each point against the same server, calling the slidegate library's functions (**FCALL**, `limiter.Options.Functions`: as sidecars with their namespace's own Redis identity, which may run no script of their own). ")
	p("Both run the same Lua on the same keys. Redis CPU is redis-server's user+system time over the point (`/proc/<pid>/stat`, 10 ms ticks) divided by the decisions Redis made.\n\n")
	p("| algorithm | callers | EVALSHA dec/s | Redis CPU µs/dec | FCALL dec/s | Redis CPU µs/dec | dec/s FCALL ÷ EVALSHA | CPU FCALL ÷ EVALSHA |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		p("| %s | %d | %.0f | %.2f | %.0f | %.2f | %.2f | %.2f |\n", r.alg, r.callers,
			r.lim.dps, float64(r.lim.cpuPerDecision)/1e3, r.fcall.dps, float64(r.fcall.cpuPerDecision)/1e3,
			r.fcall.dps/r.lim.dps, float64(r.fcall.cpuPerDecision)/float64(max(1, r.lim.cpuPerDecision)))
	}
	p("\n")
	p("### Redis CPU per decision: one call per decision, one call per round trip, and a fixed window\n\n")
	p("What exactness costs Redis. **per decision**: the limiter calling the functions one decide call per decision (`limiter.Options.CallPerDecision`, the form before issue 25); **batch**: the limiter as it is (FCALL column above: one `slidegate_decide_batch_v1` call decides every decision of a round trip); **fixed window**: the same callers and keys through a client that batches the same way (MaxInflight 2, up to 256 decisions per pipeline) but counts a fixed window with `INCRBY` + `EXPIRE` per decision, as envoyproxy/ratelimit does — not exact, the cheapest a Redis limiter gets. Measured one right after the other at each point, against the same server.\n\n")
	p("| algorithm | callers | per decision dec/s | Redis CPU µs/dec | batch dec/s | Redis CPU µs/dec | CPU batch ÷ per decision | fixed window dec/s | Redis CPU µs/dec | CPU batch ÷ fixed window |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	cpu := func(p point) float64 { return float64(p.cpuPerDecision) / 1e3 }
	for _, r := range rows {
		p("| %s | %d | %.0f | %.2f | %.0f | %.2f | %.2f | %.0f | %.2f | %.2f |\n", r.alg, r.callers,
			r.perCall.dps, cpu(r.perCall), r.fcall.dps, cpu(r.fcall), cpu(r.fcall)/max(0.01, cpu(r.perCall)),
			r.fixed.dps, cpu(r.fixed), cpu(r.fcall)/max(0.01, cpu(r.fixed)))
	}
	p("\n")
	for _, r := range rows {
		if r.callers != 64 {
			continue
		}
		goal := 6.0
		if r.alg == limiter.SlidingWindowCounter {
			goal = 4
		}
		p("- Goal (issue 25) %s at 64 callers ≤ %.0f µs of Redis CPU per decision: %.2f µs with FCALL (%s), %.2f µs with EVALSHA (%s).\n",
			r.alg, goal, cpu(r.fcall), met(cpu(r.fcall) <= goal), cpu(r.lim), met(cpu(r.lim) <= goal))
	}
	p("\n### The packed log (issue 39)\n\n")
	p("The exact count log packed in one string per client (`redisschema.PackedCall`, docs/design/packed-log.md: the admit instants, 7 bytes each; GET, then on an admit SETRANGE into empty slots or, about once a window, SET PX), sent by the fixed window's client, one EVALSHA per batch in the packed call's format (the rule once per call, a byte per decision, one reply string), right after the fixed window at each point. The limiter does not call it yet (its replay, cancel, weighted keys and the move from the sorted sets are not built).\n\n")
	p("| callers | packed log dec/s | Redis CPU µs/dec | fixed window Redis CPU µs/dec | packed ÷ fixed window | sorted sets (batch) ÷ fixed window |\n")
	p("|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		if r.alg == limiter.SlidingLog {
			p("| %d | %.0f | %.2f | %.2f | %.2f | %.2f |\n", r.callers, r.packed.dps, cpu(r.packed), cpu(r.fixed),
				cpu(r.packed)/max(0.01, cpu(r.fixed)), cpu(r.fcall)/max(0.01, cpu(r.fixed)))
		}
	}
	for _, r := range rows {
		if r.alg == limiter.SlidingLog && r.callers == 64 {
			p("\n- Goal (issue 39) an exact SlidingLog decision at 64 callers ≤ 1.5 × a fixed window's Redis CPU: the packed log %.2f × (%s); the limiter's sorted sets %.2f × (%s).\n",
				cpu(r.packed)/max(0.01, cpu(r.fixed)), met(cpu(r.packed) <= 1.5*cpu(r.fixed)), cpu(r.fcall)/max(0.01, cpu(r.fixed)), met(cpu(r.fcall) <= 1.5*cpu(r.fixed)))
		}
	}
	p("\n### Goal at 64 callers: ≥ 0.5 × ceiling and ≥ 3 × textbook\n\n")
	for _, r := range rows {
		if r.callers != 64 {
			continue
		}
		vc, vt := r.lim.dps/r.ceiling.dps, r.lim.dps/r.textbook.dps
		p("- %s: %.2f × ceiling (%s), %.2f × textbook (%s).\n", r.alg, vc, met(vc >= 0.5), vt, met(vt >= 3))
	}
	p("\n### Durable admits\n\n")
	p("The same SlidingLog workload on the same server with one replica attached (on loopback), measured without and with durable admits (`spec.durability: Replicated`, `limiter.Rule.Durable`), one right after the other at each concurrency: durable, each pipelined round trip ends with `WAIT 1 <ReplicaWait>`, and its admits count once the replica has acknowledged them. ")
	p("The ratios are durable ÷ without: what durability costs on a replica one loopback hop away; a replica across a network adds its round trip to every decision.\n\n")
	p("| callers | without dec/s | p50 µs | p99 µs | durable dec/s | p50 µs | p99 µs | dec/s ratio | p50 ratio | p99 ratio |\n")
	p("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var notDurable int64
	for _, r := range durable {
		notDurable += r.durable.fallbacks
		p("| %d | %.0f | %s | %s | %.0f | %s | %s | %.2f | %.2f | %.2f |\n",
			r.callers, r.primary.dps, us(r.primary.p50), us(r.primary.p99), r.durable.dps, us(r.durable.p50), us(r.durable.p99),
			r.durable.dps/r.primary.dps, float64(r.durable.p50)/float64(r.primary.p50), float64(r.durable.p99)/float64(r.primary.p99))
	}
	p("\n%d durable decisions were not acknowledged by the replica in time (fail mode; not counted above).\n", notDurable)
	p("\n### Redis memory per tracked client\n\n")
	p("A client's key filled to the limit (window 1h, nothing expires), `MEMORY USAGE <key> SAMPLES 0` averaged over 200 clients; in brackets the growth of `used_memory` per client.\n\n")
	p("| algorithm | limit 10 | limit 100 | limit 1000 |\n|---|---:|---:|---:|\n")
	for _, alg := range []limiter.Algorithm{limiter.SlidingLog, limiter.SlidingWindowCounter, packedLog} {
		p("| %s |", alg)
		for _, m := range mem {
			if m.alg == alg {
				p(" %.0f B (%.0f B) |", m.bytes, m.used)
			}
		}
		p("\n")
	}
	p("\nSlidingLog keeps one sorted-set member per admit in the window (a listpack up to 128 members, then a skiplist); SlidingWindowCounter keeps one small hash whatever the limit; the packed log (issue 39, not yet called by the limiter) one string of 7 bytes per admit.\n\n")
	for _, alg := range []limiter.Algorithm{limiter.SlidingLog, packedLog} {
		var per []string
		for _, m := range mem {
			if m.alg == alg {
				b := m.bytes / float64(m.limit)
				per = append(per, fmt.Sprintf("%.1f B at %d (%s)", b, m.limit, met(b <= 9)))
			}
		}
		p("- Goal (issue 39) ≤ 9 B per admitted request at limits up to 1,000: %s %s.\n", alg, strings.Join(per, ", "))
	}
	for _, m := range mem {
		if m.alg == packedLog && m.limit == 10 {
			over := m.bytes - float64(7*(m.limit+1))
			p("\nAt limit 10 the packed key's own overhead (its `MEMORY USAGE` less its value of 7 bytes per admit and the header) is %.0f B, %.1f B per admit before any admit is stored: no layout of one key per client meets 9 B there.\n",
				over, over/float64(m.limit))
		}
	}
	writeCost(p, cost)
	writeDenyCache(p, dc)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
		return err
	}

	var c strings.Builder
	w := csv.NewWriter(&c)
	_ = w.Write([]string{"algorithm", "callers", "limiter_dps", "textbook_dps", "ceiling_dps",
		"limiter_p50_us", "limiter_p99_us", "textbook_p50_us", "textbook_p99_us", "ceiling_p50_us", "ceiling_p99_us"})
	for _, r := range rows {
		_ = w.Write([]string{string(r.alg), strconv.Itoa(r.callers),
			fmt.Sprintf("%.0f", r.lim.dps), fmt.Sprintf("%.0f", r.textbook.dps), fmt.Sprintf("%.0f", r.ceiling.dps),
			us(r.lim.p50), us(r.lim.p99), us(r.textbook.p50), us(r.textbook.p99), us(r.ceiling.p50), us(r.ceiling.p99)})
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return err
	}
	return os.WriteFile(strings.TrimSuffix(out, filepath.Ext(out))+".csv", []byte(c.String()), 0o644)
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}
