package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
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
	"github.com/slidegate/slidegate/test/bench/internal/mdsection"
)

// Issue 27's "Measure": Redis CPU and memory per weighted decision against
// a count decision, through the real limiter, at a live size a busy key
// has (costLive admits per key), and the exact Retry-After of a key deep in
// debt.
const (
	costKeys    = 2000 // keys per case
	costLive    = 100  // admits per key before the measured decisions
	costGrowth  = 20   // measured decisions per key: the keys go from 100 to 120 live
	costCallers = 64
	costRounds  = 3
	costMax     = 4000 // a weighted admit or charge costs 1..costMax (tokens)
)

// costCase is one kind of decision measured.
type costCase struct {
	name     string
	alg      limiter.Algorithm
	weighted bool
	op       limiter.Op
	base     string // the case its ratio is against ("" for a baseline)
}

var costCases = []costCase{
	{name: "count SlidingLog admit", alg: limiter.SlidingLog},
	{name: "weighted SlidingLog admit", alg: limiter.SlidingLog, weighted: true, base: "count SlidingLog admit"},
	{name: "weighted SlidingLog check (OpCheck)", alg: limiter.SlidingLog, weighted: true, op: limiter.OpCheck, base: "count SlidingLog admit"},
	{name: "weighted SlidingLog charge (OpCharge)", alg: limiter.SlidingLog, weighted: true, op: limiter.OpCharge, base: "count SlidingLog admit"},
	{name: "count SlidingWindowCounter admit", alg: limiter.SlidingWindowCounter},
	{name: "weighted SlidingWindowCounter admit", alg: limiter.SlidingWindowCounter, weighted: true, base: "count SlidingWindowCounter admit"},
}

// costPoint is one case in one round.
type costPoint struct {
	cpu time.Duration // redis-server CPU per measured decision
	dps float64
	// perTrip is the decisions per pipelined round trip (limiter.Stats):
	// Redis CPU per decision falls as more share a round trip.
	perTrip float64
	bytes   float64 // MEMORY USAGE of the key and its companions, at costLive, mean per key
}

type costResult struct {
	points map[string][]costPoint // per case, per round
	retry  []retryRow
	// load is the load average around a -cost-only run (a full run states
	// its own at the top).
	load string
}

// measureCost runs every case costRounds times, the cases of a round one
// right after the other in a rotating order, so that the load of a shared
// machine weighs on all of them alike.
func measureCost(ctx context.Context, srv *testsupport.Redis) (costResult, error) {
	res := costResult{points: map[string][]costPoint{}}
	for round := range costRounds {
		for i := range costCases {
			c := costCases[(i+round)%len(costCases)]
			p, err := measureCostCase(ctx, srv, c)
			if err != nil {
				return res, fmt.Errorf("%s: %w", c.name, err)
			}
			res.points[c.name] = append(res.points[c.name], p)
			fmt.Fprintf(os.Stderr, "cost round %d %-38s %6.2f µs Redis CPU/decision %8.0f dec/s %5.1f/trip %6.0f B/key\n",
				round+1, c.name, float64(p.cpu)/1e3, p.dps, p.perTrip, p.bytes)
		}
	}
	var err error
	res.retry, err = measureRetry(ctx, srv)
	return res, err
}

func costRule(c costCase, limit int64) limiter.Rule {
	return limiter.Rule{ID: "bench/cost", Limit: limit, Window: time.Hour, Algorithm: c.alg, Weighted: c.weighted}
}

// measureCostCase fills costKeys keys to costLive admits (a window of an
// hour: nothing leaves it while measured), reads their memory, then times
// costKeys*costGrowth decisions of the case from costCallers callers.
func measureCostCase(ctx context.Context, srv *testsupport.Redis, c costCase) (costPoint, error) {
	if err := flush(srv); err != nil {
		return costPoint{}, err
	}
	rdb, err := redisconn.NewClient(redisconn.Config{Addrs: []string{srv.Addr}})
	if err != nil {
		return costPoint{}, err
	}
	defer func() { _ = rdb.Close() }()
	l, err := limiter.New(rdb, limiter.Options{Timeout: 10 * time.Second})
	if err != nil {
		return costPoint{}, err
	}
	defer func() { _ = l.Close() }()
	// Limits far above what the keys reach: every decision admits (the
	// costlier path), as in the tables above.
	limit := int64(benchLimit)
	if c.weighted {
		limit = 10 * costMax * (costLive + costGrowth)
	}
	rule := costRule(c, limit)
	client := func(k int) string { return "client-" + strconv.Itoa(k) }
	cost := func(rng *rand.Rand) int64 {
		if !c.weighted {
			return 0
		}
		return 1 + rng.Int64N(costMax)
	}
	// Fill: every key gets costLive admits (weighted: of a cost each).
	if _, err := runDecisions(ctx, l, costKeys*costLive, func(i int, rng *rand.Rand) limiter.Request {
		return limiter.Request{Rule: rule, Client: client(i % costKeys), Hits: cost(rng)}
	}); err != nil {
		return costPoint{}, fmt.Errorf("fill: %w", err)
	}
	bytes, err := keyBytes(srv, rule, c, client)
	if err != nil {
		return costPoint{}, err
	}
	cpu0, err := srv.CPUTime()
	if err != nil {
		return costPoint{}, err
	}
	st0 := l.Stats()
	elapsed, err := runDecisions(ctx, l, costKeys*costGrowth, func(_ int, rng *rand.Rand) limiter.Request {
		return limiter.Request{Rule: rule, Client: client(rng.IntN(costKeys)), Hits: cost(rng), Op: c.op}
	})
	if err != nil {
		return costPoint{}, err
	}
	cpu1, err := srv.CPUTime()
	if err != nil {
		return costPoint{}, err
	}
	st1 := l.Stats()
	n := st1.Redis - st0.Redis
	if n != costKeys*costGrowth {
		return costPoint{}, fmt.Errorf("%d of %d decisions made by Redis", n, costKeys*costGrowth)
	}
	return costPoint{cpu: (cpu1 - cpu0) / time.Duration(n), dps: float64(n) / elapsed.Seconds(), bytes: bytes,
		perTrip: float64(st1.Ops-st0.Ops) / float64(max(1, st1.RoundTrips-st0.RoundTrips))}, nil
}

// runDecisions makes n decisions, req(i) the i-th, from costCallers
// callers, and fails if one is not Redis's admit.
func runDecisions(ctx context.Context, l *limiter.Limiter, n int, req func(i int, rng *rand.Rand) limiter.Request) (time.Duration, error) {
	var next atomic.Int64
	var firstErr atomic.Pointer[error]
	start := time.Now()
	var wg sync.WaitGroup
	for g := range costCallers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), uint64(start.UnixNano()))) //nolint:gosec // load generation, not security
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				d := l.Decide(ctx, []limiter.Request{req(i, rng)})[0]
				if !d.Allowed || d.Source != limiter.SourceRedis {
					err := fmt.Errorf("decision %d: allowed %v, source %v", i, d.Allowed, d.Source)
					if d.Err != nil {
						err = fmt.Errorf("%w: %w", err, d.Err)
					}
					firstErr.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		return 0, *e
	}
	return time.Since(start), nil
}

// keyBytes is the mean MEMORY USAGE of a case's keys, with a weighted
// log's companions (<key>s, <key>p).
func keyBytes(srv *testsupport.Redis, rule limiter.Rule, c costCase, client func(int) string) (float64, error) {
	const sample = 200
	var sum float64
	for k := range sample {
		var keys []string
		switch {
		case c.weighted:
			key := redisschema.WeightedKey("slidegate:", rule.ID, client(k), c.alg == limiter.SlidingWindowCounter)
			keys = append(keys, key)
			if c.alg == limiter.SlidingLog {
				keys = append(keys, key+"s", key+"p")
			}
		case c.alg == limiter.SlidingWindowCounter:
			keys = append(keys, redisschema.Key("slidegate:", rule.ID, client(k))+"c")
		default:
			keys = append(keys, redisschema.Key("slidegate:", rule.ID, client(k)))
		}
		for i, key := range keys {
			v, err := srv.Do("MEMORY", "USAGE", key, "SAMPLES", "0")
			if err != nil {
				return 0, fmt.Errorf("MEMORY USAGE %s: %w", key, err)
			}
			if v == "" && i == 0 {
				return 0, fmt.Errorf("MEMORY USAGE %s: no such key (has the key layout changed?)", key)
			}
			n, _ := strconv.ParseFloat(v, 64)
			sum += n
		}
	}
	return sum / sample, nil
}

// retryRow is the cost of a denied weighted SlidingLog decision, whose
// Retry-After is exact, on a key of n live admits.
type retryRow struct {
	live        int
	case_       string
	usPerCall   float64 // INFO commandstats, the script's µs per call (one decision per call)
	zrangeUs    float64 // of which in ZRANGE (the reads of the log and its checkpoints)
	cpuPerDec   float64 // redis-server CPU µs per decision
	countUsCall float64 // the same for a count log's denial at its limit, same n (0: not measured)
}

// measureRetry fills one weighted log key with n admits of cost 1000 under
// a limit of n*1000, and times denied decisions (one caller, one decision
// per script call, no deny cache) at the limit (the oldest admit's leaving
// makes room: the retry reads it) and deep in debt (one charge of MaxCost
// on top: every admit must leave, the retry starts from the last
// checkpoint); beside them a count log's denial at its limit.
func measureRetry(ctx context.Context, srv *testsupport.Redis) ([]retryRow, error) {
	var rows []retryRow
	for _, n := range []int{100, 1000, 10000} {
		if err := flush(srv); err != nil {
			return nil, err
		}
		rdb, err := redisconn.NewClient(redisconn.Config{Addrs: []string{srv.Addr}})
		if err != nil {
			return nil, err
		}
		l, err := limiter.New(rdb, limiter.Options{Timeout: 10 * time.Second, DenyCacheMax: -1})
		if err != nil {
			_ = rdb.Close()
			return nil, err
		}
		w := limiter.Rule{ID: "bench/retry", Limit: int64(n) * 1000, Window: time.Hour, Algorithm: limiter.SlidingLog, Weighted: true}
		cnt := limiter.Rule{ID: "bench/retry-count", Limit: int64(n), Window: time.Hour, Algorithm: limiter.SlidingLog}
		fill := func(rule limiter.Rule, hits int64) error {
			_, err := runDecisions(ctx, l, n, func(int, *rand.Rand) limiter.Request {
				return limiter.Request{Rule: rule, Client: "deep", Hits: hits}
			})
			return err
		}
		if err := fill(w, 1000); err != nil {
			return nil, err
		}
		if err := fill(cnt, 1); err != nil {
			return nil, err
		}
		denied := func(rule limiter.Rule, hits int64) (commandTimes, error) {
			return timeDenials(ctx, srv, l, limiter.Request{Rule: rule, Client: "deep", Hits: hits})
		}
		count, err := denied(cnt, 1)
		if err != nil {
			return nil, err
		}
		at, err := denied(w, 1000)
		if err != nil {
			return nil, err
		}
		rows = append(rows, retryRow{live: n, case_: "at the limit", usPerCall: at.script, zrangeUs: at.zrange, cpuPerDec: at.cpu, countUsCall: count.script})
		if d := l.Decide(ctx, []limiter.Request{{Rule: w, Client: "deep", Hits: limiter.MaxCost, Op: limiter.OpCharge}})[0]; !d.Allowed || d.Source != limiter.SourceRedis {
			return nil, fmt.Errorf("charge: %+v", d)
		}
		debt, err := denied(w, 1000)
		if err != nil {
			return nil, err
		}
		rows = append(rows, retryRow{live: n, case_: "debt (MaxCost charged on top)", usPerCall: debt.script, zrangeUs: debt.zrange, cpuPerDec: debt.cpu})
		_ = l.Close()
		_ = rdb.Close()
		fmt.Fprintf(os.Stderr, "retry live=%-5d at the limit %.2f µs/call (count log %.2f), debt %.2f µs/call\n", n, at.script, count.script, debt.script)
	}
	return rows, nil
}

// commandTimes is what denied decisions cost Redis, per decision.
type commandTimes struct {
	script, zrange float64 // µs, INFO commandstats
	cpu            float64 // µs, redis-server's /proc CPU
}

// timeDenials makes denied decisions of r one after the other (one script
// call each) and returns their cost; every decision must be Redis's
// denial with a Retry-After.
func timeDenials(ctx context.Context, srv *testsupport.Redis, l *limiter.Limiter, r limiter.Request) (commandTimes, error) {
	const calls = 2000
	if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
		return commandTimes{}, err
	}
	cpu0, err := srv.CPUTime()
	if err != nil {
		return commandTimes{}, err
	}
	for range calls {
		d := l.Decide(ctx, []limiter.Request{r})[0]
		if d.Allowed || d.Source != limiter.SourceRedis || d.RetryAfter <= 0 {
			return commandTimes{}, fmt.Errorf("%s: want Redis's denial with a Retry-After, got %+v", r.Rule.ID, d)
		}
	}
	cpu1, err := srv.CPUTime()
	if err != nil {
		return commandTimes{}, err
	}
	info, err := srv.Do("INFO", "commandstats")
	if err != nil {
		return commandTimes{}, err
	}
	st := commandStats(info)
	scripts := st["evalsha"].calls + st["fcall"].calls + st["eval"].calls
	if scripts != calls {
		return commandTimes{}, fmt.Errorf("INFO commandstats: %v script calls for %d decisions", scripts, calls)
	}
	return commandTimes{
		script: (st["evalsha"].usec + st["fcall"].usec + st["eval"].usec) / calls,
		zrange: st["zrange"].usec / calls,
		cpu:    float64(cpu1-cpu0) / 1e3 / calls,
	}, nil
}

type commandStat struct{ calls, usec float64 }

// commandStats reads INFO commandstats: calls and µs per command.
func commandStats(info string) map[string]commandStat {
	out := map[string]commandStat{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		var st commandStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			f, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				st.calls = f
			case "usec":
				st.usec = f
			}
		}
		out[name] = st
	}
	return out
}

// writeCost writes the cost limits' section.
func writeCost(p func(string, ...any), res costResult) {
	p("\n%s\n\n", costHeading)
	if res.load != "" {
		p("Measured alone by `go run ./test/bench/limiter -cost-only -out <this file>` on %s, load average %s.\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), res.load)
	}
	p("Through the real limiter (`limiter.Decide`, default Options, EVALSHA), %d callers, %d keys per case, window 1h: each key first filled with %d admits (weighted: of a cost uniform in 1..%d), then %d decisions per key measured (%d in all; the keys go from %d to %d live admits, nothing leaves the window, so no trim is in these figures), every one admitted by Redis. ",
		costCallers, costKeys, costLive, costMax, costGrowth, costKeys*costGrowth, costLive, costLive+costGrowth)
	p("The cases run one right after the other in a rotating order, %d rounds, FLUSHALL in between; each cell is the median of the rounds, and the ratio the median of the per-round ratios (the figure a shared machine disturbs least). ", costRounds)
	p("**check** (`OpCheck`, a cost known only from the response) and **charge** (`OpCharge`, after the response, even past the limit) run on weighted log keys filled the same way. ")
	p("Bytes/key: `MEMORY USAGE … SAMPLES 0` at %d live admits, averaged over 200 keys, with a weighted log's companions `<key>s` (the sums) and `<key>p` (a checkpoint every 32nd admit).\n\n", costLive)
	p("| decision | Redis CPU µs/decision | × count | dec/s | decisions/round trip | bytes/key | × count |\n|---|---:|---:|---:|---:|---:|---:|\n")
	med := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		if len(s) == 0 {
			return 0
		}
		return s[len(s)/2]
	}
	for _, c := range costCases {
		pts := res.points[c.name]
		var cpu, dps, trip, bytes, rc, rb []float64
		for i, pt := range pts {
			cpu = append(cpu, float64(pt.cpu)/1e3)
			dps = append(dps, pt.dps)
			trip = append(trip, pt.perTrip)
			bytes = append(bytes, pt.bytes)
			if b := res.points[c.base]; c.base != "" && i < len(b) {
				rc = append(rc, float64(pt.cpu)/float64(max(1, b[i].cpu)))
				rb = append(rb, pt.bytes/max(1, b[i].bytes))
			}
		}
		ratio := func(xs []float64) string {
			if c.base == "" {
				return "1"
			}
			return strconv.FormatFloat(med(xs), 'f', 2, 64)
		}
		var spread []string
		for _, x := range cpu {
			spread = append(spread, strconv.FormatFloat(x, 'f', 2, 64))
		}
		p("| %s | %.2f (%s) | %s | %.0f | %.1f | %.0f | %s |\n", c.name, med(cpu), strings.Join(spread, ", "), ratio(rc), med(dps), med(trip), med(bytes), ratio(rb))
	}
	p("\nIn brackets the rounds in order. × count is against the count decision of the same algorithm (check and charge: against the count log's admit). The 10 ms tick of /proc CPU is %.2f µs per decision here.\n", 10e3/float64(costKeys*costGrowth))
	if len(res.retry) == 0 {
		return
	}
	p("\n### Cost limits: exact Retry-After of a weighted log (a denied decision)\n\n")
	p("One key of n live admits of cost 1000 under a limit of n×1000 (window 1h), denied decisions of cost 1000 one after the other, one decision per script call, no deny cache, every one Redis's denial with a Retry-After. **at the limit**: the oldest admit's leaving makes room; **debt**: the same key after one `OpCharge` of `MaxCost` (10⁹): every admit must leave, the retry reads the last checkpoint and at most ~32 members (design (f), docs/design/cost-limits.md). Script µs/call from `INFO commandstats` (reset before), and of it the time in `ZRANGE` (the log's and its checkpoints' reads), beside a count log's denial at its limit (n admits) on the same server.\n\n")
	p("| live admits | case | script µs/call | of which ZRANGE µs | Redis CPU µs/decision | count log denial µs/call |\n|---:|---|---:|---:|---:|---:|\n")
	for _, r := range res.retry {
		count := "–"
		if r.countUsCall > 0 {
			count = strconv.FormatFloat(r.countUsCall, 'f', 2, 64)
		}
		p("| %d | %s | %.2f | %.2f | %.2f | %s |\n", r.live, r.case_, r.usPerCall, r.zrangeUs, r.cpuPerDec, count)
	}
}

// costHeading starts the cost limits' sections, which stand before the
// deny cache's (the last) in the report.
const costHeading = "### Cost limits: weighted decisions against count decisions (issue 27)"

// runCostOnly measures the cost limits alone, on a redis-server of its own,
// and replaces their sections in out.
func runCostOnly(out string) error {
	srv, err := testsupport.NewRedis()
	if err != nil {
		return err
	}
	defer srv.Close()
	redis.SetLogger(quiet{})
	load := loadAvg()
	res, err := measureCost(context.Background(), srv)
	if err != nil {
		return err
	}
	res.load = load + " before, " + loadAvg() + " after"
	var b strings.Builder
	writeCost(func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }, res)
	return mdsection.Replace(out, costHeading, "### Deny cache under attack", b.String())
}
