package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestBatchResendDecidesOnce: the batch call looks up no member on the
// common path, yet every resend of a decision counts it once: go-redis
// resending the whole call (a Cluster client that lost its reply), the
// limiter resending one decision in another call (retryLater, a read that
// timed out), and the late call of a decision whose cancel ran first. A
// batch call with a plain ZADD and no lookup counts each of them twice.
func TestBatchResendDecidesOnce(t *testing.T) {
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	loadLibrary(t, rdb)
	ctx := context.Background()
	for _, functions := range []bool{false, true} {
		a := api{functions: functions}
		l := newLimiter(t, rdb, Options{DenyCacheMax: -1, Functions: functions})
		// d is one decision: its requests (one client per test), its op.
		type d struct {
			reqs []Request
			o    *op
		}
		n := 0
		decision := func(rules ...Rule) d {
			n++
			var x d
			var idx []int
			var keys []string
			for i, rule := range rules {
				x.reqs = append(x.reqs, Request{Rule: rule, Client: fmt.Sprint("c", n), Hits: rule.Limit / 4})
				idx = append(idx, i)
				keys = append(keys, l.keyOf(&x.reqs[i]))
			}
			x.o = &op{script: &decideLua, args: decideArgs(nil, a, x.reqs, idx, keys, l.nextMember(), l.marginMs, true)}
			return x
		}
		call := func(ds ...d) []any {
			var ops []*op
			for _, x := range ds {
				ops = append(ops, x.o)
			}
			return batchCall(t, rdb, a, ops...)
		}
		// each checks that every request of x counts its hits once.
		each := func(t *testing.T, x d) {
			t.Helper()
			for _, q := range x.reqs {
				if got := counted(t, l, q.Rule, q.Client); got != q.hits() {
					t.Errorf("%s: counts %d, want %d", q.Rule.ID, got, q.hits())
				}
			}
		}
		hour := func(id string, limit int64, alg Algorithm) Rule {
			return Rule{ID: fmt.Sprintf("ns/%v/%s", functions, id), Limit: limit, Window: time.Hour, Algorithm: alg}
		}
		// Limit 1 and hits 1: a resend finds its key full and is denied,
		// unless it finds its own admit. Limit 40 and hits 10: a resend
		// fits, unless its ZADD NX finds the member there.
		fresh := func() []d {
			return []d{
				decision(hour("full", 1, SlidingLog)),
				decision(hour("room", 40, SlidingLog)),
				decision(hour("two/log", 40, SlidingLog), hour("two/full", 1, SlidingLog)),
				decision(hour("mixed/ctr", 40, SlidingWindowCounter), hour("mixed/log", 40, SlidingLog)),
			}
		}
		t.Run(fmt.Sprintf("functions=%v/the call again", functions), func(t *testing.T) {
			ds := fresh()
			first := call(ds...)
			again := call(ds...)
			for i, x := range ds {
				each(t, x)
				f, _ := decodeDecide(first[i], len(x.reqs), nil)
				g, _ := decodeDecide(again[i], len(x.reqs), nil)
				if !f.committed || !g.committed {
					t.Errorf("decision %d: committed %v, then %v", i, f.committed, g.committed)
				}
				for k := range g.keys {
					if !g.keys[k].allowed || g.keys[k].field != f.keys[k].field {
						t.Errorf("decision %d key %d: the resend answered %+v, the first %+v", i, k, g.keys[k], f.keys[k])
					}
				}
			}
		})
		t.Run(fmt.Sprintf("functions=%v/one decision again in another call", functions), func(t *testing.T) {
			ds := fresh()
			call(ds...)
			later := decision(hour("later", 40, SlidingLog))
			again := call(ds[1], later, ds[0], ds[3], ds[2])
			for _, x := range append(ds, later) {
				each(t, x)
			}
			for i, x := range []d{ds[1], later, ds[0], ds[3], ds[2]} {
				if g, _ := decodeDecide(again[i], len(x.reqs), nil); !g.committed {
					t.Errorf("decision %d of the second call: %+v, want committed", i, g)
				}
			}
		})
		t.Run(fmt.Sprintf("functions=%v/cancel first", functions), func(t *testing.T) {
			ds := fresh()[:3] // SlidingLog only: a cancel leaves counter keys
			for _, x := range ds {
				cancel := cancelArgs(x.o.args)
				if !functions {
					cancel = asEval(cancel, &cancelLua)
				}
				if err := rdb.Do(ctx, cancel...).Err(); err != nil {
					t.Fatal(err)
				}
			}
			call(ds...)
			for _, x := range ds {
				for _, q := range x.reqs {
					if got := counted(t, l, q.Rule, q.Client); got != 0 {
						t.Errorf("%s: a cancelled decision counts %d", q.Rule.ID, got)
					}
				}
			}
		})
	}
}

// batchCall sends ops in one batch call (the function, or its script by
// EVAL) and returns each one's part of the reply.
func batchCall(t *testing.T, rdb redis.UniversalClient, a api, ops ...*op) []any {
	t.Helper()
	nk := 0
	for _, o := range ops {
		nk += o.args[2].(int)
	}
	args := batchArgs(a, ops, nk)
	if !a.functions {
		args = asEval(args, &decideBatchLua)
	}
	v, err := rdb.Do(context.Background(), args...).Result()
	if err != nil {
		t.Fatal(err)
	}
	parts, ok := splitBatch(v, ops)
	if !ok {
		t.Fatalf("malformed reply %v", v)
	}
	return parts
}

// TestBatchShortPathAnswersAsDecide: the batch call's short path for one
// hit on one count key (admitPlain) answers as its general path (decide)
// does: the same admit, remaining, retry, reset and counter field for two
// clients in the same state, decided in one call (one clock), one alone
// (the short path) and one beside a second key (the general path).
func TestBatchShortPathAnswersAsDecide(t *testing.T) {
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	loadLibrary(t, rdb)
	for _, functions := range []bool{false, true} {
		a := api{functions: functions}
		l := newLimiter(t, rdb, Options{DenyCacheMax: -1, Functions: functions})
		decision := func(reqs ...Request) *op {
			var idx []int
			var keys []string
			for i := range reqs {
				idx = append(idx, i)
				keys = append(keys, l.keyOf(&reqs[i]))
			}
			return &op{script: &decideLua, args: decideArgs(nil, a, reqs, idx, keys, l.nextMember(), l.marginMs, true)}
		}
		for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
			// Limit 10: room for many, for the last one, and for none.
			for _, before := range []int64{0, 6, 9, 10} {
				name := fmt.Sprintf("functions=%v/%s/%d before", functions, alg, before)
				t.Run(name, func(t *testing.T) {
					rule := Rule{ID: "ns/" + name, Limit: 10, Window: time.Hour, Algorithm: alg}
					other := Rule{ID: "ns/" + name + "/other", Limit: 1000, Window: time.Hour, Algorithm: alg}
					short, general := Request{Rule: rule, Client: "short"}, Request{Rule: rule, Client: "general"}
					if before > 0 {
						fill := func(q Request) *op { q.Hits = before; return decision(q) }
						batchCall(t, rdb, a, fill(short), fill(general))
					}
					parts := batchCall(t, rdb, a, decision(short), decision(general, Request{Rule: other, Client: "general"}))
					s, err := decodeDecide(parts[0], 1, nil)
					if err != nil {
						t.Fatal(err)
					}
					g, err := decodeDecide(parts[1], 2, nil)
					if err != nil {
						t.Fatal(err)
					}
					if s.keys[0] != g.keys[0] || s.committed != g.committed {
						t.Errorf("alone: committed %v %+v; beside another key: committed %v %+v", s.committed, s.keys[0], g.committed, g.keys[0])
					}
					if want := before < rule.Limit; s.keys[0].allowed != want {
						t.Errorf("with %d of %d counted, allowed %v, want %v", before, rule.Limit, s.keys[0].allowed, want)
					}
				})
			}
		}
	}
}

// TestLogEntrySize: a SlidingLog key (a listpack up to 128 members) grows
// by 22 B per admit in its window, measured as the bench does (MEMORY
// USAGE): 20 B of listpack entries (the 8-byte member in 10, its score in
// 10) and the allocator's rounding up to its size classes (512 B apart at
// these sizes; about a tenth more on average). The cost per admit is the
// slope of the key's size over 10, 20 .. 120 admits, which spreads that
// rounding evenly. With a process id and sequence number as the member
// (13-15 bytes) it was 24.6 B.
func TestLogEntrySize(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	l := newLimiter(t, standalone(t, r.Addr), Options{DenyCacheMax: -1})
	rule := Rule{ID: "ns/size", Limit: 128, Window: time.Hour}
	var xs, ys []float64
	for n := 10; n <= 120; n += 10 {
		for c := range 3 {
			client := fmt.Sprint(n, "/", c)
			for range n {
				if d := one(l, rule, client); !d.Allowed {
					t.Fatalf("admit: %+v", d)
				}
			}
			v, err := r.Do("MEMORY", "USAGE", l.keyOf(&Request{Rule: rule, Client: client}), "SAMPLES", "0")
			if err != nil {
				t.Fatal(err)
			}
			var size float64
			if _, err := fmt.Sscan(v, &size); err != nil {
				t.Fatalf("MEMORY USAGE: %q", v)
			}
			xs, ys = append(xs, float64(n)), append(ys, size)
		}
	}
	// Least squares: the slope of size over admits.
	var mx, my float64
	for i := range xs {
		mx, my = mx+xs[i]/float64(len(xs)), my+ys[i]/float64(len(xs))
	}
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	per := sxy / sxx
	t.Logf("%.1f B per admit (%v B at 10 admits, %v B at 120)", per, ys[0], ys[len(ys)-1])
	if per > 22.5 {
		t.Errorf("%.1f B per admit, want 22 (20 B of listpack entries)", per)
	}
}

// TestBatchHotKey: decisions of one call on one key (a hot key: a rule
// without a per-client key, or a busy client) see each other's admits,
// though the call reads the key once: a limit of 5 admits the first five
// of eight, each told what remains, and the denied ones when the first
// admit leaves the window; with hits of 2, two decisions and not a third.
func TestBatchHotKey(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	loadLibrary(t, rdb)
	ctx := context.Background()
	l := newLimiter(t, rdb, Options{DenyCacheMax: -1, Functions: true})
	for _, tc := range []struct {
		alg  Algorithm
		hits int64
		want int // admitted
	}{
		{SlidingLog, 1, 5}, {SlidingWindowCounter, 1, 5},
		{SlidingLog, 2, 2}, {SlidingWindowCounter, 2, 2},
	} {
		t.Run(fmt.Sprintf("%s/hits=%d", tc.alg, tc.hits), func(t *testing.T) {
			rule := Rule{ID: fmt.Sprintf("ns/hot-%s-%d", tc.alg, tc.hits), Limit: 5, Window: time.Hour, Algorithm: tc.alg}
			reqs := []Request{{Rule: rule, Client: "all", Hits: tc.hits}}
			keys := []string{l.keyOf(&reqs[0])}
			var ops []*op
			for range 8 {
				ops = append(ops, &op{script: &decideLua, args: decideArgs(nil, l.api, reqs, []int{0}, keys, l.nextMember(), l.marginMs, true)})
			}
			v, err := rdb.Do(ctx, batchArgs(l.api, ops, len(ops))...).Result()
			if err != nil {
				t.Fatal(err)
			}
			parts, ok := splitBatch(v, ops)
			if !ok {
				t.Fatalf("malformed reply %v", v)
			}
			for i, part := range parts {
				rep, err := decodeDecide(part, 1, nil)
				if err != nil {
					t.Fatal(err)
				}
				k := rep.keys[0]
				admit := i < tc.want
				if k.allowed != admit || rep.committed != admit {
					t.Errorf("decision %d: allowed %v, committed %v; want %v", i, k.allowed, rep.committed, admit)
				}
				if want := max(0, 5-int64(min(i+1, tc.want))*tc.hits); k.remaining != want {
					t.Errorf("decision %d: remaining %d, want %d", i, k.remaining, want)
				}
				if !admit {
					// SlidingLog: when the first admit leaves, a window
					// later. Counter: when the current fixed window's
					// estimate has room again, which depends on how far
					// into its hour the call ran (decideScript's formula,
					// with no previous window): the end of the fixed window
					// plus the part of the next one in which the
					// current one's count still weighs too much.
					want := 59 * time.Minute
					if tc.alg == SlidingWindowCounter {
						w := rule.Window.Microseconds()
						elapsed := rep.now % w
						c := float64(int64(tc.want) * tc.hits)
						need := float64(w) * (1 - float64(5-tc.hits)/c)
						want = time.Duration(float64(w-elapsed)+need)*time.Microsecond - time.Second
					}
					if k.retryAfter < want {
						t.Errorf("decision %d: retry after %v, want ≥ %v (the admits of the call before it count)", i, k.retryAfter, want)
					}
				}
			}
			if got := counted(t, l, rule, "all"); got != int64(tc.want)*tc.hits {
				t.Errorf("counts %d, want %d", got, int64(tc.want)*tc.hits)
			}
			if ttl, _ := r.Do("PTTL", keys[0]); ttl == "-1" || ttl == "-2" {
				t.Errorf("PTTL %s after admits", ttl)
			}
		})
	}
}
