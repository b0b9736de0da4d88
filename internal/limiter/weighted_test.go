package limiter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// Weighted rules (Rule.Weighted, issue 27): the limit is a cost per
// window; OpDecide admits a known cost if it fits, OpCheck admits while
// the window's cost is under the limit and counts nothing, OpCharge counts
// a cost even past the limit (debt).

func weighted(l *Limiter, rule Rule, client string, op Op, cost int64) Decision {
	return l.Decide(context.Background(), []Request{{Rule: rule, Client: client, Op: op, Hits: cost}})[0]
}

// weightedPaths are the ways a decision reaches Redis: the batch call, one
// call per decision (decideScript), each by EVALSHA and by FCALL.
func weightedPaths(t *testing.T, r *testsupport.Redis) map[string]*Limiter {
	rdb := standalone(t, r.Addr)
	loadLibrary(t, rdb)
	out := map[string]*Limiter{}
	for _, fn := range []bool{false, true} {
		for _, per := range []bool{false, true} {
			name := fmt.Sprintf("functions=%v/perDecision=%v", fn, per)
			out[name] = newLimiter(t, rdb, Options{Timeout: 5 * time.Second, DenyCacheMax: -1, Functions: fn, CallPerDecision: per})
		}
	}
	return out
}

func TestWeightedSequence(t *testing.T) {
	r := testsupport.StartRedis(t)
	for name, l := range weightedPaths(t, r) {
		for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
			t.Run(name+"/"+string(alg), func(t *testing.T) {
				// A minute-long window: nothing leaves it during the test.
				rule := Rule{ID: "w/" + name + "/" + string(alg), Limit: 100, Window: time.Minute, Algorithm: alg, Weighted: true}
				steps := []struct {
					op      Op
					cost    int64
					allowed bool
					rem     int64
				}{
					{OpDecide, 40, true, 60},
					{OpDecide, 50, true, 10},
					{OpDecide, 20, false, 10}, // does not fit: nothing counted
					{OpCheck, 0, true, 10},    // under the limit: admitted, nothing counted
					{OpDecide, 10, true, 0},
					{OpCheck, 0, false, 0},    // at the limit
					{OpCharge, 2500, true, 0}, // counted past the limit: debt of 2500
					{OpDecide, 1, false, 0},
					{OpCharge, 0, true, 0},
					{OpDecide, 0, false, 0}, // 0 means 1 for a decide
				}
				for i, s := range steps {
					d := weighted(l, rule, "c", s.op, s.cost)
					if d.Allowed != s.allowed || d.Remaining != s.rem || d.Source != SourceRedis {
						t.Fatalf("step %d (op %d cost %d): %+v, want allowed %v remaining %d", i, s.op, s.cost, d, s.allowed, s.rem)
					}
					if !d.Allowed && (d.RetryAfter <= 0 || d.RetryAfter > 2*rule.Window) {
						t.Fatalf("step %d: retry after %v", i, d.RetryAfter)
					}
				}
				// A cost above the limit never fits: retry after a whole window.
				d := weighted(l, Rule{ID: "w/big/" + name + "/" + string(alg), Limit: 3, Window: time.Minute, Algorithm: alg, Weighted: true}, "c", OpDecide, 4)
				if d.Allowed || d.Remaining != 3 || d.RetryAfter != time.Minute {
					t.Fatalf("cost above limit: %+v", d)
				}
			})
		}
	}
	l := newLimiter(t, standalone(t, r.Addr), Options{Timeout: 5 * time.Second})
	for _, c := range []struct {
		rule Rule
		op   Op
		cost int64
	}{
		{Rule{ID: "w/inv", Limit: 10, Window: time.Minute, Weighted: true}, OpDecide, MaxCost + 1},
		{Rule{ID: "w/inv", Limit: 10, Window: time.Minute, Weighted: true}, OpCharge, -1},
		{Rule{ID: "w/inv", Limit: 10, Window: time.Minute, Weighted: true}, OpCharge + 1, 1},
		{Rule{ID: "w/inv", Limit: 10, Window: time.Minute}, OpCheck, 0},  // not weighted
		{Rule{ID: "w/inv", Limit: 10, Window: time.Minute}, OpCharge, 1}, // not weighted
	} {
		if d := weighted(l, c.rule, "c", c.op, c.cost); d.Allowed || !errors.Is(d.Err, ErrInvalidRule) {
			t.Errorf("%+v op %d cost %d: %+v, want denied with ErrInvalidRule", c.rule, c.op, c.cost, d)
		}
	}
}

// TestWeightedCostIsNotCount pairs a weighted rule with the count rule a
// cost limit would otherwise be: under a 1,000-token limit, requests of
// 300 tokens each, the weighted rule admits 3 and the count rule 1,000
// (every request counts 1) — 300,000 tokens; and Hits, the count rule's
// own weight, cannot even carry a cost above MaxHits.
func TestWeightedCostIsNotCount(t *testing.T) {
	r := testsupport.StartRedis(t)
	l := newLimiter(t, standalone(t, r.Addr), Options{Timeout: 5 * time.Second, DenyCacheMax: -1})
	for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
		w := Rule{ID: "pair/w/" + string(alg), Limit: 1000, Window: time.Minute, Algorithm: alg, Weighted: true}
		n := Rule{ID: "pair/n/" + string(alg), Limit: 1000, Window: time.Minute, Algorithm: alg}
		var tokensW, tokensN int64
		for range 1100 {
			if weighted(l, w, "c", OpDecide, 300).Allowed {
				tokensW += 300
			}
			if one(l, n, "c").Allowed {
				tokensN += 300
			}
		}
		if tokensW != 900 {
			t.Errorf("%s weighted: %d tokens admitted, want 900", alg, tokensW)
		}
		if tokensN <= w.Limit {
			t.Errorf("%s count rule: %d tokens admitted; the pairing shows nothing", alg, tokensN)
		}
		t.Logf("%s: weighted admitted %d tokens, the count rule %d (limit %d)", alg, tokensW, tokensN, w.Limit)
	}
	if d := hitsDecide(l, Rule{ID: "pair/hits", Limit: 100000, Window: time.Minute}, "c", 5000); !errors.Is(d.Err, ErrInvalidRule) {
		t.Errorf("a count rule took 5000 hits: %+v", d)
	}
}

// serverAdmit is an admit of cost at the server time us (µs since the
// scores' epoch), as testsupport.BusiestWindow judges it: sent and back
// at that instant, so that windows are judged on the server's clock.
func serverAdmit(us, cost int64) testsupport.Decision {
	at := serverTime(us)
	return testsupport.Decision{Key: "hot", Sent: at, Done: at, Admitted: true, Cost: cost}
}

// wlog is a weighted log key's live members, oldest first, and its state.
type wlog struct {
	scores, costs []int64
	s, t, k       int64
	checkpoints   int64
}

func readWeighted(t *testing.T, rdb redis.UniversalClient, key string, now int64, window time.Duration) wlog {
	t.Helper()
	ctx := context.Background()
	zs, err := rdb.ZRangeByScoreWithScores(ctx, key, &redis.ZRangeBy{Min: "(" + strconv.FormatInt(now-window.Microseconds(), 10), Max: "+inf"}).Result()
	if err != nil {
		t.Fatal(err)
	}
	var w wlog
	for _, z := range zs {
		name := z.Member.(string)
		c, err := strconv.ParseInt(name[strings.LastIndexByte(name, '|')+1:], 10, 64)
		if err != nil {
			t.Fatalf("member %q: %v", name, err)
		}
		w.scores, w.costs = append(w.scores, int64(z.Score)), append(w.costs, c)
	}
	h, err := rdb.HGetAll(ctx, key+"s").Result()
	if err != nil {
		t.Fatal(err)
	}
	w.s, _ = strconv.ParseInt(h["s"], 10, 64)
	w.t, _ = strconv.ParseInt(h["t"], 10, 64)
	w.k, _ = strconv.ParseInt(h["k"], 10, 64)
	w.checkpoints = rdb.ZCard(ctx, key+"p").Val()
	return w
}

// bruteRetry is the retry of a key with these live members for need more
// under limit: the time until the oldest members of total cost
// sum+need-limit have left, found by walking them all.
func (w wlog) bruteRetry(need, limit, now int64, window time.Duration) time.Duration {
	var sum int64
	for _, c := range w.costs {
		sum += c
	}
	if sum+need <= limit {
		return 0
	}
	if need > limit {
		return window
	}
	gone := int64(0)
	for i, c := range w.costs {
		gone += c
		if sum-gone+need <= limit {
			return time.Duration(w.scores[i]+window.Microseconds()-now) * time.Microsecond
		}
	}
	return window
}

// TestWeightedRetryDeepInDebt: a key charged far past its limit by many
// members answers each denial with the exact retry (the brute force over
// its members), found from a checkpoint, not by walking from the oldest;
// after an undo of a member in the middle too (checkpoints lowered).
func TestWeightedRetryDeepInDebt(t *testing.T) {
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	l := newLimiter(t, rdb, Options{Timeout: 5 * time.Second, DenyCacheMax: -1})
	last := serverClock(l)
	rule := Rule{ID: "debt", Limit: 1000, Window: time.Minute, Weighted: true}
	key := redisschema.WeightedKey(l.opts.Prefix, rule.ID, "c", false)
	// 2,000 charges of 1..7 tokens: a debt of about 7 limits; the walk
	// from the oldest member would read about 1,900 of them.
	var want int64
	for i := range 2000 {
		c := int64(i%7 + 1)
		want += c
		if d := weighted(l, rule, "c", OpCharge, c); !d.Allowed {
			t.Fatalf("charge %d denied: %+v", i, d)
		}
	}
	check := func(step string) {
		for _, need := range []int64{1, 7, 500, 1000} {
			op, cost := OpDecide, need
			if need == 1 {
				op, cost = OpCheck, 0
			}
			d := weighted(l, rule, "c", op, cost)
			now := last()
			w := readWeighted(t, rdb, key, now, rule.Window)
			var sum int64
			for _, c := range w.costs {
				sum += c
			}
			if w.s != sum {
				t.Fatalf("%s: kept sum %d, members sum %d", step, w.s, sum)
			}
			if d.Allowed {
				t.Fatalf("%s need %d: allowed in debt: %+v", step, need, d)
			}
			if got, want := d.RetryAfter, w.bruteRetry(need, rule.Limit, now, rule.Window); got != want {
				t.Fatalf("%s need %d: retry after %v, brute force %v", step, need, got, want)
			}
		}
	}
	w := readWeighted(t, rdb, key, last(), rule.Window)
	if w.s != want || w.t != want || len(w.costs) != 2000 || w.checkpoints != 2000/32 {
		t.Fatalf("state s=%d t=%d members %d checkpoints %d, want %d, %d, 2000, %d", w.s, w.t, len(w.costs), w.checkpoints, want, want, 2000/32)
	}
	check("after the charges")
	// Peek (kubectl slidegate why) reads the cost and the check's retry
	// as the next decision reports them.
	for _, fn := range []bool{false, true} {
		loadLibrary(t, rdb)
		pl := newLimiter(t, rdb, Options{Timeout: 5 * time.Second, Functions: fn})
		win, err := pl.Peek(context.Background(), rule, "c")
		if err != nil {
			t.Fatal(err)
		}
		d := weighted(l, rule, "c", OpCheck, 0)
		if !win.Weighted || win.Count != want || win.Allowed || !win.RetryAt().Equal(serverTime(last()).Add(d.RetryAfter)) {
			t.Fatalf("functions %v: peek %+v (retry at %v), decision %+v (retry at %v); want the cost %d", fn, win, win.RetryAt(), d, serverTime(last()).Add(d.RetryAfter), want)
		}
	}
	// Undo a member in the middle (the compensating call of a cross-slot
	// request): the sums and the checkpoints after it are lowered.
	mid := w.scores[700]
	name := rdb.ZRangeByScore(context.Background(), key, &redis.ZRangeBy{Min: strconv.FormatInt(mid, 10), Max: strconv.FormatInt(mid, 10)}).Val()[0]
	cut := strings.LastIndexByte(name, '|') // the member is 8 random bytes: '|' may be one
	member := name[:cut]
	c, _ := strconv.ParseInt(name[cut+1:], 10, 64)
	for range 2 { // twice: the second finds nothing
		if err := rdb.Do(context.Background(), undoArgs(api{}, member, []undoKey{{key: key, weighted: true, hits: c}})...).Err(); err != nil && !isNoScript(err) {
			t.Fatal(err)
		} else if err != nil {
			if err := rdb.Do(context.Background(), asEval(undoArgs(api{}, member, []undoKey{{key: key, weighted: true, hits: c}}), &undoLua)...).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if w2 := readWeighted(t, rdb, key, last(), rule.Window); w2.s != want-c || len(w2.costs) != 1999 {
		t.Fatalf("after the undo: s=%d members %d, want %d, 1999", w2.s, len(w2.costs), want-c)
	}
	check("after an undo")
}

// TestWeightedRetryAfterIsExact: after admits spread in time and a charge
// into debt, the denied key reopens exactly at its retry time, on the
// server's clock.
func TestWeightedRetryAfterIsExact(t *testing.T) {
	r := testsupport.StartRedis(t)
	for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			l := newLimiter(t, standalone(t, r.Addr), Options{Timeout: 2 * time.Second, DenyCacheMax: -1})
			last := serverClock(l)
			rule := Rule{ID: "w/retry-" + string(alg), Limit: 100, Window: 600 * time.Millisecond, Algorithm: alg, Weighted: true}
			for i := range 4 {
				if d := weighted(l, rule, "c", OpDecide, 20); !d.Allowed {
					t.Fatalf("admit %d denied: %+v", i, d)
				}
				time.Sleep(15 * time.Millisecond) // spacing the admits, not synchronising
			}
			weighted(l, rule, "c", OpCharge, 60) // 140: 40 in debt
			d := weighted(l, rule, "c", OpCheck, 0)
			if d.Allowed {
				t.Fatalf("check admitted in debt: %+v", d)
			}
			// pollRetryExact polls with one-request decisions of the count
			// rule; a check is the weighted rule's one-unit request.
			check := rule
			pollWeighted(t, l, check, d, last)
		})
	}
}

// pollWeighted is pollRetryExact for checks of a weighted rule.
func pollWeighted(t *testing.T, l *Limiter, rule Rule, d Decision, last func() int64) {
	t.Helper()
	denyAt := last()
	openAt := denyAt + d.RetryAfter.Microseconds()
	t.Logf("retry after %v", d.RetryAfter)
	time.Sleep(d.RetryAfter - 30*time.Millisecond)
	for {
		d := weighted(l, rule, "c", OpCheck, 0)
		now := last()
		if !d.Allowed {
			if now >= openAt {
				t.Fatalf("denied %dµs after the retry-after", now-openAt)
			}
			continue
		}
		if now < openAt {
			t.Fatalf("admitted %dµs before the retry-after", openAt-now)
		}
		t.Logf("first admit %v after the retry-after", time.Duration(now-openAt)*time.Microsecond)
		return
	}
}

// TestWeightedResendAndCancel: a decision run twice (go-redis resending
// after a lost reply) counts its cost once; a cancel that runs before its
// lost decision leaves a placeholder that the decision finds, so it
// admits nothing; a cancel after it takes the cost back.
func TestWeightedResendAndCancel(t *testing.T) {
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	l := newLimiter(t, rdb, Options{Timeout: 5 * time.Second})
	ctx := context.Background()
	rule := Rule{ID: "resend", Limit: 100, Window: time.Minute, Weighted: true}
	key := redisschema.WeightedKey(l.opts.Prefix, rule.ID, "c", false)
	reqs := []Request{{Rule: rule, Client: "c", Hits: 30}}
	run := func(args []any) {
		t.Helper()
		err := rdb.Do(ctx, args...).Err()
		if isNoScript(err) {
			err = rdb.Do(ctx, asEval(args, scriptOf(args))...).Err()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	sum := func() int64 { v, _ := rdb.HGet(ctx, key+"s", "s").Int64(); return v }
	// Twice, by both scripts: one member, 30 counted.
	args := decideArgs(nil, api{}, reqs, []int{0}, []string{key}, "m1", "1000", true)
	run(args)
	run(args)
	run(batchArgs(api{}, []*op{{script: &decideLua, args: args}}, 1))
	if s, n := sum(), rdb.ZCard(ctx, key).Val(); s != 30 || n != 1 {
		t.Fatalf("after a decision run three times: sum %d, %d members; want 30, 1", s, n)
	}
	// A cancel after it takes it back; again, nothing more.
	run(cancelArgs(args))
	if s := sum(); s != 0 {
		t.Fatalf("after the cancel: sum %d, want 0", s)
	}
	// A cancel before its decision: the decision then admits nothing, by
	// either script. (Any call's trim drops the placeholder at its end, as
	// a count log's: the lost decision is the next call on the key or
	// close to it.)
	for i, batch := range []bool{true, false} {
		args := decideArgs(nil, api{}, reqs, []int{0}, []string{key}, "m"+strconv.Itoa(i+2), "1000", true)
		run(cancelArgs(args))
		if batch {
			args = batchArgs(api{}, []*op{{script: &decideLua, args: args}}, 1)
		}
		run(args)
		if s := sum(); s != 0 {
			t.Fatalf("a decision after its cancel counted (batch %v): sum %d, want 0", batch, s)
		}
	}
	// The placeholder counts in no sum and leaves with the next call's trim.
	if d := weighted(l, rule, "c", OpDecide, 100); !d.Allowed {
		t.Fatalf("the placeholder took budget: %+v", d)
	}
}

// scriptOf is the script a command of decideArgs, batchArgs, undoArgs or
// cancelArgs calls (by its SHA).
func scriptOf(args []any) *script {
	for _, s := range []*script{&decideLua, &decideBatchLua, &undoLua, &cancelLua} {
		if args[1] == s.shaArg {
			return s
		}
	}
	return nil
}

// TestWeightedWindowSlides: cost leaves the window with its member, and
// the keys expire a window (and the margin) after the last admit.
func TestWeightedWindowSlides(t *testing.T) {
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	l := newLimiter(t, rdb, Options{Timeout: 5 * time.Second, DenyCacheMax: -1, ExpiryMargin: 50 * time.Millisecond})
	rule := Rule{ID: "slide", Limit: 100, Window: 300 * time.Millisecond, Weighted: true}
	key := redisschema.WeightedKey(l.opts.Prefix, rule.ID, "c", false)
	if d := weighted(l, rule, "c", OpCharge, 150); !d.Allowed {
		t.Fatal(d)
	}
	for i := 0; i < 40; i++ { // so that the checkpoint set exists too
		weighted(l, rule, "c", OpCharge, 1)
	}
	if d := weighted(l, rule, "c", OpCheck, 0); d.Allowed {
		t.Fatalf("check in debt admitted: %+v", d)
	}
	ctx := context.Background()
	for _, k := range []string{key, key + "s", key + "p"} {
		if ttl := rdb.PTTL(ctx, k).Val(); ttl <= 0 || ttl > rule.Window+50*time.Millisecond {
			t.Fatalf("%s: PTTL %v, want in (0, window+margin]", k, ttl)
		}
	}
	time.Sleep(rule.Window + 10*time.Millisecond)
	if d := weighted(l, rule, "c", OpDecide, 100); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after the window: %+v, want allowed with 0 remaining", d)
	}
	if _, ok := eventually(5*time.Second, func() bool { return rdb.DBSize(ctx).Val() == 0 }); !ok {
		t.Fatalf("keys left after the window and margin: %v", rdb.Keys(ctx, "*").Val())
	}
}

// TestWeightedExactUnderContention: 4 limiters × 16 goroutines admit
// costs of 1..50 into one key; no sliding window (on the server's clock)
// may hold more cost than the limit. Paired with the naive way to limit a
// known cost, a check followed by a charge (two calls): under the same
// contention it must be caught over-admitting.
func TestWeightedExactUnderContention(t *testing.T) {
	t.Parallel()
	const limit, window, dur = 600, time.Second, 2500 * time.Millisecond
	for _, tc := range []struct {
		name  string
		naive bool
	}{{"decide", false}, {"check-then-charge", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := testsupport.StartRedis(t)
			rule := Rule{ID: "w/contended", Limit: limit, Window: window, FailMode: FailClosed, Weighted: true}
			var mu sync.Mutex
			var admits []testsupport.Decision
			var wg sync.WaitGroup
			stop := time.Now().Add(dur)
			for range 4 {
				l := newLimiter(t, standalone(t, r.Addr), Options{Timeout: 10 * time.Second, DenyCacheMax: -1})
				l.observe = func(ctx context.Context, now int64, _ []Request, _ []int, _ []Decision) {
					*ctx.Value(serverTimeKey{}).(*int64) = now
				}
				for g := range 16 {
					rng := rand.New(rand.NewPCG(uint64(g), 11))
					wg.Go(func() {
						for time.Now().Before(stop) {
							c := int64(1 + rng.IntN(50))
							at := new(int64)
							ctx := context.WithValue(context.Background(), serverTimeKey{}, at)
							req := Request{Rule: rule, Client: "hot", Hits: c}
							if tc.naive {
								req.Op = OpCheck
							}
							d := l.Decide(ctx, []Request{req})[0]
							if d.Source != SourceRedis {
								t.Errorf("decision not from redis: %+v", d)
								return
							}
							if !d.Allowed {
								continue
							}
							if tc.naive {
								req.Op = OpCharge
								l.Decide(ctx, []Request{req})
							}
							mu.Lock()
							admits = append(admits, serverAdmit(*at, c))
							mu.Unlock()
						}
					})
				}
			}
			wg.Wait()
			busiest, _ := testsupport.BusiestWindow(admits, window)
			t.Logf("%d admitted requests; busiest window %d, limit %d", len(admits), busiest, limit)
			switch {
			case !tc.naive && busiest > limit:
				t.Errorf("a sliding window holds %d, limit %d", busiest, limit)
			case !tc.naive && busiest < limit-50:
				t.Errorf("busiest window %d: the limit was never reached, the test proves nothing", busiest)
			case tc.naive && busiest <= limit:
				t.Errorf("check-then-charge did not over-admit (busiest window %d): the check cannot fail", busiest)
			}
		})
	}
}

// TestWeightedUndoAcrossSlots: a request whose weighted rule in one slot
// admits a cost and whose rule in another denies gets the cost back.
func TestWeightedUndoAcrossSlots(t *testing.T) {
	t.Parallel()
	c := sharedCluster(t)
	opts := Options{Timeout: 5 * time.Second, DenyCacheMax: -1, Prefix: "w" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"}
	l := newLimiter(t, client(t, redisconn.Config{Mode: redisconn.Cluster, Addrs: c.Addrs()}), opts)
	for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
		a := Rule{ID: "w/a/" + string(alg), Limit: 1000, Window: time.Minute, Algorithm: alg, Weighted: true}
		b := Rule{ID: "w/b/" + string(alg), Limit: 2, Window: time.Minute, Algorithm: alg}
		ca, cb := "x", ""
		for i := 0; cb == ""; i++ {
			if k := "y" + strconv.Itoa(i); redisschema.Slot(l.keyOf(&Request{Rule: b, Client: k})) != redisschema.Slot(l.keyOf(&Request{Rule: a, Client: ca})) {
				cb = k
			}
		}
		ds := l.Decide(context.Background(), []Request{{Rule: a, Client: ca, Hits: 300}, {Rule: b, Client: cb, Hits: 3}})
		if !ds[0].Allowed || ds[1].Allowed || ds[0].Remaining != 1000 {
			t.Fatalf("%s: %+v", alg, ds)
		}
		if d := weighted(l, a, ca, OpDecide, 1000); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%s: after the undo, the whole limit: %+v", alg, d)
		}
	}
	if l.Stats().Undos == 0 {
		t.Fatal("no undo happened: the rules shared a slot")
	}
}

// TestFallbackWeighted: while Redis cannot decide, a weighted fail-open
// rule counts cost in this replica's share (as a counter: a log would keep
// a time per unit of cost), and checks and charges keep their meaning.
func TestFallbackWeighted(t *testing.T) {
	f, now := fakeFallback(100)
	rule := Rule{ID: "w", Limit: 1000, Window: time.Second, Weighted: true}
	decide := func(op Op, cost int64) Decision {
		var d Decision
		f.decide([]fbReq{{rule: &rule, client: "c", hits: cost, op: op, share: rule.Limit, out: &d}}, true)
		return d
	}
	for i, s := range []struct {
		op      Op
		cost    int64
		allowed bool
		rem     int64
	}{{OpDecide, 600, true, 400}, {OpDecide, 500, false, 400}, {OpCheck, 0, true, 400}, {OpCharge, 900, true, 0}, {OpCheck, 0, false, 0}} {
		if d := decide(s.op, s.cost); d.Allowed != s.allowed || d.Remaining != s.rem {
			t.Fatalf("step %d: %+v", i, d)
		}
	}
	*now += int64(2 * time.Second)
	if d := decide(OpDecide, 1000); !d.Allowed {
		t.Fatalf("two windows on: %+v", d)
	}
}

// TestWeightedChargesAreCapped: a weighted log holds at most 10^6 live
// members (wCap): a charge at the cap is not written, so a caller that
// charges without end cannot grow one key without bound. (Before the cap,
// the charge made the 1,000,001st member.)
func TestWeightedChargesAreCapped(t *testing.T) {
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	l := newLimiter(t, rdb, Options{Timeout: 10 * time.Second, DenyCacheMax: -1})
	rule := Rule{ID: "cap", Limit: 1000, Window: time.Hour, Weighted: true}
	key := redisschema.WeightedKey(l.opts.Prefix, rule.ID, "c", false)
	const cap = 1000000
	// Fill the key to the cap as a million charges of 1 would.
	ctx := context.Background()
	if err := rdb.Eval(ctx, `
local t = redis.call('TIME')
local now = (tonumber(t[1]) - 1577836800) * 1000000 + tonumber(t[2]) - 1000000
for i = 1, tonumber(ARGV[1]), 1000 do
  local a = {}
  local p = {}
  for j = i, i + 999 do
    a[#a + 1] = now + j; a[#a + 1] = 'f' .. j .. '|1'
    -- and every 32nd a checkpoint, as the admits would have made
    if j % 32 == 0 then p[#p + 1] = j; p[#p + 1] = string.format('%d', now + j) end
  end
  redis.call('ZADD', KEYS[1], unpack(a))
  if #p > 0 then redis.call('ZADD', KEYS[1] .. 'p', unpack(p)) end
end
redis.call('HSET', KEYS[1] .. 's', 's', ARGV[1], 't', ARGV[1], 'k', 0, 'n', now + tonumber(ARGV[1]))
redis.call('PEXPIRE', KEYS[1], 3600000)
redis.call('PEXPIRE', KEYS[1] .. 's', 3600000)
redis.call('PEXPIRE', KEYS[1] .. 'p', 3600000)
return 1`, []string{key}, cap).Err(); err != nil {
		t.Fatal(err)
	}
	for _, per := range []bool{false, true} {
		pl := newLimiter(t, rdb, Options{Timeout: 10 * time.Second, DenyCacheMax: -1, CallPerDecision: per})
		if d := weighted(pl, rule, "c", OpCharge, 5); !d.Allowed || d.Source != SourceRedis {
			t.Fatalf("charge at the cap: %+v", d)
		}
	}
	if n, s := rdb.ZCard(ctx, key).Val(), rdb.HGet(ctx, key+"s", "s").Val(); n != cap || s != strconv.Itoa(cap) {
		t.Fatalf("after charges at the cap: %d members, sum %s; want %d and %d", n, s, cap, cap)
	}
	if d := weighted(l, rule, "c", OpCheck, 0); d.Allowed {
		t.Fatalf("a check on a key at the cap was admitted: %+v", d)
	}
}

// TestWeightedChargeBesideADenial: a charge counts whatever the other
// requests of its call decide (a rate limit service call may carry one
// policy's after-stream charge beside another's check), and is never
// answered by the deny cache. Before, one Decide was all or nothing, and
// the denied check took the charge with it.
func TestWeightedChargeBesideADenial(t *testing.T) {
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	l := newLimiter(t, rdb, Options{Timeout: 5 * time.Second})
	full := Rule{ID: "full", Limit: 10, Window: time.Minute, Weighted: true}
	other := Rule{ID: "other", Limit: 1000, Window: time.Minute, Weighted: true}
	weighted(l, full, "c", OpCharge, 50) // in debt
	for i := range 3 {                   // the second and third: the deny cache
		ds := l.Decide(context.Background(), []Request{{Rule: full, Client: "c", Op: OpCheck}, {Rule: other, Client: "c", Op: OpCharge, Hits: 100}})
		if ds[0].Allowed || !ds[1].Allowed || ds[1].Source != SourceRedis {
			t.Fatalf("call %d: %+v", i, ds)
		}
		key := redisschema.WeightedKey(l.opts.Prefix, other.ID, "c", false)
		if s, want := rdb.HGet(context.Background(), key+"s", "s").Val(), strconv.Itoa(100*(i+1)); s != want {
			t.Fatalf("call %d: charged %q in all, want %s", i, s, want)
		}
		if i > 0 && ds[0].Source != SourceDenyCache {
			t.Fatalf("call %d: the check in debt asked Redis again: %+v", i, ds[0])
		}
	}
}

// TestWeightedDenialWritesNothing: a client in debt that keeps asking
// costs Redis reads only: its denied checks change nothing (no
// replication or AOF traffic). Before, each rewrote the key's sums.
func TestWeightedDenialWritesNothing(t *testing.T) {
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	l := newLimiter(t, rdb, Options{Timeout: 5 * time.Second, DenyCacheMax: -1})
	rule := Rule{ID: "quiet", Limit: 10, Window: time.Minute, Weighted: true}
	weighted(l, rule, "c", OpCharge, 50)
	changes := func() string {
		for _, line := range strings.Split(rdb.Info(context.Background(), "persistence").Val(), "\r\n") {
			if v, ok := strings.CutPrefix(line, "rdb_changes_since_last_save:"); ok {
				return v
			}
		}
		t.Fatal("no rdb_changes_since_last_save in INFO persistence")
		return ""
	}
	before := changes()
	for range 5 {
		if d := weighted(l, rule, "c", OpCheck, 0); d.Allowed {
			t.Fatalf("check in debt admitted: %+v", d)
		}
	}
	if after := changes(); after != before {
		t.Fatalf("5 denied checks changed Redis: %s changes before, %s after", before, after)
	}
}
