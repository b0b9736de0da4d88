package limiter

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// Request.Hits: a request worth h admits fits only if all h do, and then
// counts h times, on every algorithm and on every path (Redis, the undo of
// a cross-slot request, the fail-open fallback).

func TestHitsSequence(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	l := newLimiter(t, standalone(t, r.Addr), Options{Timeout: 5 * time.Second, DenyCacheMax: -1})
	for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			// A minute-long window: nothing leaves it during the test.
			rule := Rule{ID: "hits/" + string(alg), Limit: 10, Window: time.Minute, Algorithm: alg}
			steps := []struct {
				hits    int64
				allowed bool
				rem     int64
			}{
				{4, true, 6}, {4, true, 2}, {3, false, 2}, {2, true, 0}, {1, false, 0}, {0, false, 0},
			}
			for i, s := range steps {
				d := hitsDecide(l, rule, "c", s.hits)
				if d.Allowed != s.allowed || d.Remaining != s.rem || d.Source != SourceRedis {
					t.Fatalf("step %d (hits %d): %+v, want allowed %v remaining %d", i, s.hits, d, s.allowed, s.rem)
				}
				// A counter may wait past its fixed window for the previous
				// window's weight to fade: up to two windows.
				if !d.Allowed && (d.RetryAfter <= 0 || d.RetryAfter > 2*rule.Window) {
					t.Fatalf("step %d: retry after %v", i, d.RetryAfter)
				}
			}
			// More hits than the limit never fit: retry after a whole window.
			d := hitsDecide(l, Rule{ID: "hits/big/" + string(alg), Limit: 3, Window: time.Minute, Algorithm: alg}, "c", 4)
			if d.Allowed || d.Remaining != 3 || d.RetryAfter != time.Minute {
				t.Fatalf("hits above limit: %+v", d)
			}
		})
	}
	for _, h := range []int64{-1, MaxHits + 1} {
		d := hitsDecide(l, Rule{ID: "hits/invalid", Limit: 10, Window: time.Minute}, "c", h)
		if d.Allowed || !errors.Is(d.Err, ErrInvalidRule) {
			t.Errorf("hits %d: %+v, want denied with ErrInvalidRule", h, d)
		}
	}
}

func hitsDecide(l *Limiter, rule Rule, client string, hits int64) Decision {
	return l.Decide(context.Background(), []Request{{Rule: rule, Client: client, Hits: hits}})[0]
}

// TestHitsRetryAfterIsExact: a denied request of h hits is told the time at
// which exactly enough admits have left the window for h.
func TestHitsRetryAfterIsExact(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	l := newLimiter(t, standalone(t, r.Addr), Options{Timeout: 5 * time.Second, DenyCacheMax: -1})
	rule := Rule{ID: "hits/retry", Limit: 4, Window: 3 * time.Second}
	// Four single admits, 300ms apart; then 3 hits need the three oldest gone.
	var at, took []time.Duration // each admit's call: start since t0, and duration
	t0 := time.Now()
	for range 4 {
		start := time.Now()
		if d := hitsDecide(l, rule, "c", 1); !d.Allowed {
			t.Fatalf("admit %d denied", len(at)+1)
		}
		at, took = append(at, start.Sub(t0)), append(took, time.Since(start))
		time.Sleep(300 * time.Millisecond) // spaces the admits in time
	}
	asked := time.Now()
	d := hitsDecide(l, rule, "c", 3)
	askTook := time.Since(asked)
	if d.Allowed {
		t.Fatal("3 hits admitted into a full window")
	}
	// The third admit leaves at (its server time)+W, the server time lying
	// within its call; the decision's own server time lies within its call.
	// So RetryAfter is the third admit's departure seen from the decision,
	// within the two calls' measured durations of want (not the first's).
	want := t0.Add(at[2]).Add(rule.Window).Sub(asked)
	lo, hi := want-askTook-time.Millisecond, want+took[2]+time.Millisecond
	if d.RetryAfter < lo || d.RetryAfter > hi {
		t.Fatalf("retry after %v, want within [%v, %v]", d.RetryAfter, lo, hi)
	}
}

// TestHitsExactUnderContention: 4 limiters × 16 goroutines send requests of
// 1..5 hits at one key; no sliding window may hold more hits than the limit.
// The naive way, a request of h hits sent as h copies of one Request in one
// Decide, must be caught over-admitting: the script checks each copy against
// the same count and adds one member for all of them.
func TestHitsExactUnderContention(t *testing.T) {
	t.Parallel()
	const limit, window, dur = 60, time.Second, 2500 * time.Millisecond
	for _, tc := range []struct {
		name  string
		naive bool
	}{{"hits", false}, {"copies", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := testsupport.StartRedis(t)
			rule := Rule{ID: "hits/contended", Limit: limit, Window: window, FailMode: FailClosed}
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
					rng := rand.New(rand.NewPCG(uint64(g), 7))
					wg.Go(func() {
						for time.Now().Before(stop) {
							h := int64(1 + rng.IntN(5))
							reqs := []Request{{Rule: rule, Client: "hot", Hits: h}}
							if tc.naive {
								reqs = slices.Repeat([]Request{{Rule: rule, Client: "hot"}}, int(h))
							}
							at := new(int64)
							ds := l.Decide(context.WithValue(context.Background(), serverTimeKey{}, at), reqs)
							if ds[0].Source != SourceRedis {
								t.Errorf("decision not from redis: %+v", ds[0])
								return
							}
							if ds[0].Allowed {
								mu.Lock()
								admits = append(admits, serverAdmit(*at, h))
								mu.Unlock()
							}
						}
					})
				}
			}
			wg.Wait()
			busiest, _ := testsupport.BusiestWindow(admits, window)
			t.Logf("%d admitted requests; busiest window %d hits, limit %d", len(admits), busiest, limit)
			switch {
			case !tc.naive && busiest > limit:
				t.Errorf("a sliding window holds %d hits, limit %d", busiest, limit)
			case !tc.naive && busiest < limit-5:
				t.Errorf("busiest window %d hits: the limit was never reached, the test proves nothing", busiest)
			case tc.naive && busiest <= limit:
				t.Errorf("copies did not over-admit (busiest window %d): the check cannot fail", busiest)
			}
		})
	}
}

// TestHitsUndoAcrossSlots: a request whose rule in one slot admits h hits
// and whose rule in another denies gives all h back.
func TestHitsUndoAcrossSlots(t *testing.T) {
	t.Parallel()
	c := sharedCluster(t)
	opts := Options{Timeout: 5 * time.Second, DenyCacheMax: -1, Prefix: "h" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"}
	l := newLimiter(t, client(t, redisconn.Config{Mode: redisconn.Cluster, Addrs: c.Addrs()}), opts)
	for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
		a := Rule{ID: "hits/a/" + string(alg), Limit: 10, Window: time.Minute, Algorithm: alg}
		b := Rule{ID: "hits/b/" + string(alg), Limit: 2, Window: time.Minute, Algorithm: alg}
		// Different clients hash to different slots; find a pair that does.
		ca, cb := "x", ""
		for i := 0; cb == ""; i++ {
			if k := "y" + strconv.Itoa(i); redisschema.Slot(l.keyOf(&Request{Rule: b, Client: k})) != redisschema.Slot(l.keyOf(&Request{Rule: a, Client: ca})) {
				cb = k
			}
		}
		ds := l.Decide(context.Background(), []Request{{Rule: a, Client: ca, Hits: 3}, {Rule: b, Client: cb, Hits: 3}})
		if !ds[0].Allowed || ds[1].Allowed || ds[0].Remaining != 10 {
			t.Fatalf("%s: %+v", alg, ds)
		}
		if d := hitsDecide(l, a, ca, 10); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%s: after the undo, 10 hits: %+v", alg, d)
		}
	}
	if l.Stats().Undos == 0 {
		t.Fatal("no undo happened: the rules shared a slot")
	}
}

func TestFallbackHits(t *testing.T) {
	for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			f, now := fakeFallback(100)
			rule := Rule{ID: "r", Limit: 10, Window: time.Second, Algorithm: alg}
			decide := func(h int64) Decision {
				var d Decision
				f.decide([]fbReq{{rule: &rule, client: "c", hits: h, share: rule.Limit, out: &d}}, true)
				return d
			}
			for i, s := range []struct {
				hits    int64
				allowed bool
				rem     int64
			}{{6, true, 4}, {5, false, 4}, {4, true, 0}, {1, false, 0}} {
				if d := decide(s.hits); d.Allowed != s.allowed || d.Remaining != s.rem {
					t.Fatalf("step %d: %+v", i, d)
				}
			}
			// Two windows on, even the counter's previous window is empty.
			*now += int64(2 * time.Second)
			if d := decide(10); !d.Allowed {
				t.Fatalf("two windows on: %+v", d)
			}
		})
	}
}
