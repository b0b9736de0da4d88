// Command costdesign measures the candidate designs of issue 27's weighted
// sliding log (docs/design/cost-limits.md) on a real redis-server it
// starts: Redis CPU per admit (redis-server's /proc CPU time and INFO
// commandstats), memory per tracked client (MEMORY USAGE) and the cost
// of an exact Retry-After, for today's count log and each weighted
// design. The designs run side by side, round after round in a rotating
// order, so that the load of a shared machine weighs on all of them
// alike; the spread over the rounds is printed with the medians.
//
//	go run ./test/bench/costdesign
//
// prints Markdown to stdout, progress to stderr. About a minute.
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/testsupport"
)

const (
	window   = 60_000_000            // µs: a minute
	baseNow  = 1_000_000_000_000_000 // µs since the score epoch, arbitrary
	maxCost  = 4000
	bigLimit = 10_000_000
)

// A design is one prototype under measurement.
type design struct {
	id     string // in its keys
	name   string
	src    string
	extra  []string // its other keys' suffixes: "s" the sum, "p" the prefix index
	limit  int64    // every steady-state call admits under it
	weight bool     // random costs 1..maxCost, else 1
	sha    string
	tick   int64 // its synthetic clock, in steps of window/live
}

func main() {
	rounds := flag.Int("rounds", 5, "rounds of every design")
	keys := flag.Int("keys", 1000, "tracked clients per design")
	live := flag.Int("live", 100, "admits per window per client (the steady state's live members)")
	ticks := flag.Int("ticks", 30, "admits per client per design per round")
	workers := flag.Int("workers", 4, "concurrent pipelines")
	flag.Parse()
	if err := run(*rounds, *keys, *live, *ticks, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "costdesign:", err)
		os.Exit(1)
	}
}

func run(rounds, nkeys, live, ticks, workers int) error {
	srv, err := testsupport.NewRedis()
	if err != nil {
		return err
	}
	defer srv.Close()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: workers + 2})
	defer func() { _ = rdb.Close() }()

	designs := []*design{
		{id: "n", name: "count (today), limit = live", src: countLua, limit: int64(live)},
		{id: "a", name: "(a) running sum", src: sumLua, extra: []string{"s"}, limit: bigLimit, weight: true},
		{id: "b", name: "(b) rescan live members", src: rescanLua, limit: bigLimit, weight: true},
		{id: "c", name: "(c) prefix sums", src: prefixLua, extra: []string{"s"}, limit: bigLimit, weight: true},
		{id: "d", name: "(d) running sum + prefix index", src: indexLua, extra: []string{"s", "p"}, limit: bigLimit, weight: true},
		{id: "e", name: "(e) count log + twin prefix set", src: twinLua, extra: []string{"s", "p"}, limit: bigLimit, weight: true},
		{id: "f", name: "(f) running sum + checkpoint every 32nd", src: checkpointLua, extra: []string{"s", "p"}, limit: bigLimit, weight: true},
		{id: "h", name: "counter, HINCRBY by cost", src: counterLua, limit: bigLimit, weight: true},
	}
	for _, d := range designs {
		if d.sha, err = rdb.ScriptLoad(ctx, d.src).Result(); err != nil {
			return fmt.Errorf("%s: SCRIPT LOAD: %w", d.name, err)
		}
	}
	// Fill every log to its steady state: live admits per window.
	for _, d := range designs {
		if _, _, _, err := segment(ctx, srv, rdb, d, nkeys, live, live, workers); err != nil {
			return err
		}
	}
	cpu := make(map[string][]float64)
	script := make(map[string][]float64)
	for r := range rounds {
		k := r % len(designs)
		order := append(slices.Clone(designs[k:]), designs[:k]...)
		for _, d := range order {
			c, u, denied, err := segment(ctx, srv, rdb, d, nkeys, live, ticks, workers)
			if err != nil {
				return err
			}
			if denied > 0 {
				return fmt.Errorf("%s: %d steady-state calls denied; every one should admit", d.name, denied)
			}
			cpu[d.name] = append(cpu[d.name], c)
			script[d.name] = append(script[d.name], u)
			fmt.Fprintf(os.Stderr, "round %d %-26s redis CPU %6.2f µs/admit, script %6.2f µs/admit\n", r+1, d.name, c, u)
		}
	}
	fmt.Printf("## Admit at the steady state: %d clients, %d admits per window each, %d rounds × %d admits per client\n\n", nkeys, live, rounds, ticks)
	fmt.Println("| design | redis CPU µs/admit, median (min–max) | ×count | script µs/admit (commandstats), median (min–max) | ×count | bytes per client (MEMORY USAGE) | live members |")
	fmt.Println("|---|---|---|---|---|---|---|")
	base := designs[0].name
	for _, d := range designs {
		bytes, members, err := memory(ctx, rdb, d, nkeys, live)
		if err != nil {
			return err
		}
		fmt.Printf("| %s | %s | %s | %s | %s | %.0f | %.1f |\n", d.name,
			spread(cpu[d.name]), ratio(cpu[d.name], cpu[base]), spread(script[d.name]), ratio(script[d.name], script[base]), bytes, members)
	}
	fmt.Println()
	if err := exact(ctx, rdb, designs, nkeys, live); err != nil {
		return err
	}
	fmt.Println("Exactness: for every client of (a), (c), (d) and (f), the kept sum (and (d)'s index) equals the sum of the live members' weights, and (f)'s retry from the checkpoints its admits kept equals the brute force's at three limits; (e)'s twin lists the log's live ids in order, each step a weight in 1..4000 (checked).")
	fmt.Println()
	return retries(ctx, rdb)
}

// key is the log of client i of design d; its sum key appends "s"
// outside the braces, so both share a hash slot.
func key(d *design, i int) string { return fmt.Sprintf("{cost:%s:%d}", d.id, i) }

// keysOf is every key of client i of design d.
func keysOf(d *design, i int) []string {
	ks := []string{key(d, i)}
	for _, x := range d.extra {
		ks = append(ks, key(d, i)+x)
	}
	return ks
}

// member is an 8-byte id as the limiter makes them.
func member(rng *rand.Rand) string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rng.Uint64())
	return string(b[:])
}

// segment runs ticks admits for every client of d, advancing d's clock
// by window/live per tick. It returns redis-server's CPU µs and the
// script's µs (commandstats) per call, and how many calls were denied.
func segment(ctx context.Context, srv *testsupport.Redis, rdb *redis.Client, d *design, nkeys, live, ticks, workers int) (cpuPer, scriptPer float64, denied int, err error) {
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		return 0, 0, 0, err
	}
	cpu0, err := srv.CPUTime()
	if err != nil {
		return 0, 0, 0, err
	}
	step := int64(window / live)
	t0 := d.tick
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), uint64(t0))) //nolint:gosec // load, not secrecy
			for t := range int64(ticks) {
				now := strconv.FormatInt(baseNow+(t0+t)*step, 10)
				pipe := rdb.Pipeline()
				var cmds []*redis.Cmd
				for i := g; i < nkeys; i += workers {
					cost := "1"
					if d.weight {
						cost = strconv.Itoa(1 + rng.IntN(maxCost))
					}
					ks := keysOf(d, i)
					cmds = append(cmds, pipe.EvalSha(ctx, d.sha, ks, now, window, d.limit, cost, member(rng)))
				}
				_, perr := pipe.Exec(ctx)
				mu.Lock()
				if perr != nil && firstErr == nil {
					firstErr = perr
				}
				for _, c := range cmds {
					if v, _ := c.Int(); v != 1 {
						denied++
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	d.tick += int64(ticks)
	if firstErr != nil {
		return 0, 0, 0, fmt.Errorf("%s: %w", d.name, firstErr)
	}
	cpu1, err := srv.CPUTime()
	if err != nil {
		return 0, 0, 0, err
	}
	calls := float64(nkeys * ticks)
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, 0, 0, err
	}
	usec := statField(info, "cmdstat_evalsha", "usec")
	return float64((cpu1 - cpu0).Microseconds()) / calls, usec / calls, denied, nil
}

// statField reads name=value from an INFO commandstats line.
func statField(info, cmd, name string) float64 {
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd+":")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, name+"="); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
	}
	return 0
}

// memory is the mean MEMORY USAGE of a client's keys and its mean live
// members.
func memory(ctx context.Context, rdb *redis.Client, d *design, nkeys, live int) (bytes, members float64, err error) {
	cut := baseNow + (d.tick-1)*int64(window/live) - window
	for i := range nkeys {
		for _, k := range keysOf(d, i) {
			n, err := rdb.MemoryUsage(ctx, k, 0).Result()
			if err != nil {
				return 0, 0, fmt.Errorf("MEMORY USAGE %s: %w", k, err)
			}
			bytes += float64(n)
		}
		if d.src == counterLua {
			continue
		}
		c, err := rdb.ZCount(ctx, key(d, i), "("+strconv.FormatInt(cut, 10), "+inf").Result()
		if err != nil {
			return 0, 0, err
		}
		members += float64(c)
	}
	return bytes / float64(nkeys), members / float64(nkeys), nil
}

// exact checks that designs (a) and (c) keep each client's sum exactly:
// the sum of the live members' weights, read back from the members.
func exact(ctx context.Context, rdb *redis.Client, designs []*design, nkeys, live int) error {
	for _, d := range designs {
		if d.src == twinLua {
			if err := exactTwin(ctx, rdb, d, nkeys, live); err != nil {
				return err
			}
			continue
		}
		if d.src != sumLua && d.src != prefixLua && d.src != indexLua && d.src != checkpointLua {
			continue
		}
		cut := baseNow + (d.tick-1)*int64(window/live) - window
		for i := range nkeys {
			ms, err := rdb.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: key(d, i), Start: "(" + strconv.FormatInt(cut, 10), Stop: "+inf", ByScore: true}).Result()
			if err != nil {
				return err
			}
			var want, kept int64
			for _, m := range ms {
				mem := m.Member.(string)
				wt := mem[8:]
				if j := strings.IndexByte(wt, ':'); j >= 0 {
					wt = wt[j+1:]
				}
				n, _ := strconv.ParseInt(wt, 10, 64)
				want += n
			}
			var side int64
			if d.src == checkpointLua {
				side, err = rdb.HGet(ctx, key(d, i)+"s", "s").Int64()
			} else {
				side, err = rdb.Get(ctx, key(d, i)+"s").Int64()
			}
			if err != nil {
				return err
			}
			kept = side
			if d.src == prefixLua && len(ms) > 0 {
				mem := ms[0].Member.(string)[8:]
				tb, _ := strconv.ParseInt(mem[:strings.IndexByte(mem, ':')], 10, 64)
				kept = side - tb
			}
			if d.src == indexLua {
				p, err := rdb.ZRangeWithScores(ctx, key(d, i)+"p", 0, -1).Result()
				if err != nil {
					return err
				}
				first, last := p[0], p[len(p)-1]
				fw, _ := strconv.ParseInt(first.Member.(string)[8:], 10, 64)
				if len(p) != len(ms) || int64(last.Score-first.Score)+fw != want {
					return fmt.Errorf("%s client %d: index of %d entries spans %d, live members %d weigh %d", d.name, i, len(p), int64(last.Score-first.Score)+fw, len(ms), want)
				}
			}
			if kept != want {
				return fmt.Errorf("%s client %d: kept sum %d, live members weigh %d", d.name, i, kept, want)
			}
			if d.src == checkpointLua {
				if err := checkpointRetries(ctx, rdb, d, i, ms, live); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// checkpointRetries checks design (f)'s retry on the checkpoints its
// admits kept (through every trim of the run), against the brute force
// over the live members ms, for a target at each member in turn.
func checkpointRetries(ctx context.Context, rdb *redis.Client, d *design, i int, ms []redis.Z, live int) error {
	sha, err := rdb.ScriptLoad(ctx, retryCheckpointLua).Result()
	if err != nil {
		return err
	}
	now := baseNow + (d.tick-1)*int64(window/live)
	ws := make([]int64, len(ms))
	scores := make([]int64, len(ms))
	var sum int64
	for j, m := range ms {
		ws[j], _ = strconv.ParseInt(m.Member.(string)[8:], 10, 64)
		scores[j] = int64(m.Score)
		sum += ws[j]
	}
	k := key(d, i)
	for _, limit := range []int64{sum, sum / 2, ws[len(ws)-1]} {
		want := bruteRetry(ws, scores, sum, limit, now)
		got, err := rdb.EvalSha(ctx, sha, []string{k, k + "s", k + "p"}, now, window, limit, 1, "", 0).Int64Slice()
		if err != nil {
			return err
		}
		if got[0] != want {
			return fmt.Errorf("%s client %d, limit %d: retry %d µs from the kept checkpoints, brute force %d", d.name, i, limit, got[0], want)
		}
	}
	return nil
}

// exactTwin checks design (e): the twin holds the live members in the
// log's order, and its last score minus b is their weight; the weights
// are not stored anywhere else, so the check is that the twin's
// neighbouring differences are each in 1..maxCost and the log and the
// twin list the same ids in the same order.
func exactTwin(ctx context.Context, rdb *redis.Client, d *design, nkeys, live int) error {
	cut := baseNow + (d.tick-1)*int64(window/live) - window
	for i := range nkeys {
		k := key(d, i)
		logm, err := rdb.ZRangeArgs(ctx, redis.ZRangeArgs{Key: k, Start: "(" + strconv.FormatInt(cut, 10), Stop: "+inf", ByScore: true}).Result()
		if err != nil {
			return err
		}
		twin, err := rdb.ZRangeWithScores(ctx, k+"p", 0, -1).Result()
		if err != nil {
			return err
		}
		b, err := rdb.Get(ctx, k+"s").Int64()
		if err != nil {
			return err
		}
		if len(twin) != len(logm) {
			return fmt.Errorf("%s client %d: twin has %d entries, log %d live", d.name, i, len(twin), len(logm))
		}
		prev := b
		for j, z := range twin {
			wt := int64(z.Score) - prev
			if z.Member.(string) != logm[j] || wt < 1 || wt > maxCost {
				return fmt.Errorf("%s client %d: twin entry %d (weight %d) out of step with the log", d.name, i, j, wt)
			}
			prev = int64(z.Score)
		}
	}
	return nil
}

// retries measures the exact Retry-After of a weighted log of n live
// members: walking from the oldest ((a), (b)) against bisecting the
// prefix sums ((c)), when the oldest member's leaving makes room and when
// the client is in debt so deep that all but the newest must leave. Each
// answer is checked against the brute force.
func retries(ctx context.Context, rdb *redis.Client) error {
	walkSHA, err := rdb.ScriptLoad(ctx, retryWalkLua).Result()
	if err != nil {
		return err
	}
	bisectSHA, err := rdb.ScriptLoad(ctx, retryBisectLua).Result()
	if err != nil {
		return err
	}
	indexSHA, err := rdb.ScriptLoad(ctx, retryIndexLua).Result()
	if err != nil {
		return err
	}
	twinSHA, err := rdb.ScriptLoad(ctx, retryTwinLua).Result()
	if err != nil {
		return err
	}
	cpSHA, err := rdb.ScriptLoad(ctx, retryCheckpointLua).Result()
	if err != nil {
		return err
	}
	fmt.Println("## Exact Retry-After of a weighted log (denied call)")
	fmt.Println()
	fmt.Println("| live members | case | (a)/(b) walk from oldest: script µs/call, median (min–max) | members read | (c) bisect prefix sums: script µs/call | probes | (d) prefix index: script µs/call | (e) twin prefix set: script µs/call | (f) checkpoints: script µs/call | members read |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	rng := rand.New(rand.NewPCG(7, 7)) //nolint:gosec // data, not secrecy
	now := int64(baseNow)
	for _, n := range []int{100, 1000, 10000} {
		wk, pk, tk := fmt.Sprintf("{retry:%d}w", n), fmt.Sprintf("{retry:%d}", n), fmt.Sprintf("{retry:%d}t", n)
		ws := make([]int64, n)
		scores := make([]int64, n)
		var t int64
		pw, pp := rdb.Pipeline(), rdb.Pipeline()
		for j := range n {
			ws[j] = 1 + rng.Int64N(maxCost)
			scores[j] = now - window + int64(j+1)*window/int64(n+1)
			id := member(rng)
			pw.ZAdd(ctx, wk, redis.Z{Score: float64(scores[j]), Member: id + strconv.FormatInt(ws[j], 10)})
			pw.ZAdd(ctx, wk+"p", redis.Z{Score: float64(t + ws[j]), Member: id + strconv.FormatInt(ws[j], 10)})
			pw.ZAdd(ctx, tk, redis.Z{Score: float64(scores[j]), Member: id})
			pw.ZAdd(ctx, tk+"p", redis.Z{Score: float64(t + ws[j]), Member: id})
			if j%32 == 31 {
				pw.ZAdd(ctx, wk+"c", redis.Z{Score: float64(t + ws[j]), Member: id + strconv.FormatInt(ws[j], 10)})
			}
			pp.ZAdd(ctx, pk, redis.Z{Score: float64(scores[j]), Member: id + strconv.FormatInt(t, 10) + ":" + strconv.FormatInt(ws[j], 10)})
			t += ws[j]
		}
		pp.Set(ctx, pk+"s", t, 0)
		pw.Set(ctx, wk+"s", t, 0)
		pw.Set(ctx, tk+"s", 0, 0)
		pw.HSet(ctx, wk+"h", "s", t, "t", t)
		if _, err := pw.Exec(ctx); err != nil {
			return err
		}
		if _, err := pp.Exec(ctx); err != nil {
			return err
		}
		sum := t
		for _, c := range []struct {
			name  string
			limit int64
		}{
			{"at the limit: the oldest's leaving makes room for 1", sum},
			{"debt: all but the newest must leave", ws[n-1]},
		} {
			want := bruteRetry(ws, scores, sum, c.limit, now)
			reps := max(20000/n, 20)
			wu, wr, err := timeRetry(ctx, rdb, walkSHA, []string{wk}, reps, c.limit, sum, want)
			if err != nil {
				return fmt.Errorf("walk, %d members, %s: %w", n, c.name, err)
			}
			bu, br, err := timeRetry(ctx, rdb, bisectSHA, []string{pk, pk + "s"}, reps, c.limit, sum, want)
			if err != nil {
				return fmt.Errorf("bisect, %d members, %s: %w", n, c.name, err)
			}
			iu, _, err := timeRetry(ctx, rdb, indexSHA, []string{wk, wk + "s", wk + "p"}, reps, c.limit, sum, want)
			if err != nil {
				return fmt.Errorf("index, %d members, %s: %w", n, c.name, err)
			}
			tu, _, err := timeRetry(ctx, rdb, twinSHA, []string{tk, tk + "s", tk + "p"}, reps, c.limit, sum, want)
			if err != nil {
				return fmt.Errorf("twin, %d members, %s: %w", n, c.name, err)
			}
			cu, cr, err := timeRetry(ctx, rdb, cpSHA, []string{wk, wk + "h", wk + "c"}, reps, c.limit, sum, want)
			if err != nil {
				return fmt.Errorf("checkpoints, %d members, %s: %w", n, c.name, err)
			}
			fmt.Printf("| %d | %s | %s | %d | %s | %d | %s | %s | %s | %d |\n", n, c.name, spread(wu), wr, spread(bu), br, spread(iu), spread(tu), spread(cu), cr)
		}
	}
	fmt.Println()
	fmt.Println("Every retry above equals the brute force's (checked).")
	return nil
}

// bruteRetry: the first member, oldest first, whose leaving brings the
// sum plus 1 within limit.
func bruteRetry(ws, scores []int64, sum, limit, now int64) int64 {
	need := sum + 1 - limit
	for j, w := range ws {
		need -= w
		if need <= 0 {
			return scores[j] + window - now
		}
	}
	return window
}

// timeRetry runs one retry script reps times in 5 batches and returns
// the script µs per call of each batch, and what one call read.
func timeRetry(ctx context.Context, rdb *redis.Client, sha string, keys []string, reps int, limit, sum, want int64) ([]float64, int64, error) {
	var per []float64
	var read int64
	for range 5 {
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			return nil, 0, err
		}
		for range reps {
			v, err := rdb.EvalSha(ctx, sha, keys, int64(baseNow), window, limit, 1, "", sum).Int64Slice()
			if err != nil {
				return nil, 0, err
			}
			if v[0] != want {
				return nil, 0, fmt.Errorf("retry %d µs, brute force says %d", v[0], want)
			}
			read = v[1]
		}
		info, err := rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			return nil, 0, err
		}
		per = append(per, statField(info, "cmdstat_evalsha", "usec")/float64(reps))
	}
	return per, read, nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func spread(v []float64) string {
	return fmt.Sprintf("%.2f (%.2f–%.2f)", median(v), slices.Min(v), slices.Max(v))
}

// ratio is the median over the rounds of v's value over base's in the
// same round, with its spread: the ratio the shared machine disturbs least.
func ratio(v, base []float64) string {
	r := make([]float64, len(v))
	for i := range v {
		r[i] = v[i] / base[i]
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f)", median(r), slices.Min(r), slices.Max(r))
}
