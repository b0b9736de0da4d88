package limiter

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// Contention: 8 limiter instances, each with its own client and connection
// pool as separate sidecars have, × 64 goroutines, one key, limit 100 per
// 2s, for 6.5s. The same harness runs the limiter and the textbook script;
// the limiter must be exact and the textbook must be caught over-admitting
// (the proof that the check can fail).
const (
	contInstances = 8
	contWorkers   = 64
	contLimit     = 100
	contWindow    = 2 * time.Second
	contDuration  = 6500 * time.Millisecond
)

// outcome is what one decision recorded: its time in µs and whether it
// admitted.
type outcome struct {
	at      int64
	allowed bool
}

// contender makes one decision for one simulated sidecar; it returns the
// time of the decision (server time for the limiter, the caller's clock
// for the textbook script, which is the time it stores).
type contender func(ctx context.Context) (outcome, bool)

func TestExactnessUnderContention(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		wantExact bool
		make      func(t *testing.T, addr string) contender
	}{
		{"limiter", true, limiterContender(false)},
		{"functions", true, limiterContender(true)},
		// A fleet being upgraded: half its sidecars call EVALSHA, half FCALL.
		{"mixed", true, nil},
		// Sidecars of the release before the batch call (one decide call
		// per decision) beside those of this one.
		{"mixed releases", true, func() func(t *testing.T, addr string) contender {
			n := 0
			return func(t *testing.T, addr string) contender {
				n++
				return limiterContenderOpts(t, addr, Options{Functions: true, CallPerDecision: n%2 == 0})
			}
		}()},
		{"textbook", false, textbookContender},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := testsupport.StartRedis(t)
			loadLibrary(t, standalone(t, r.Addr))
			n := 0
			outs := contend(t, func() contender {
				if tc.make == nil {
					n++
					return limiterContender(n%2 == 0)(t, r.Addr)
				}
				return tc.make(t, r.Addr)
			})
			rep := analyze(outs, contWindow.Microseconds(), contLimit)
			t.Logf("%d admits, %d denials; busiest window %d; fullest window at a denial %d-%d; aligned windows %v",
				rep.admits, rep.denials, rep.maxInWindow, rep.minAtDenial, rep.maxAtDenial, rep.aligned)
			exact := rep.maxInWindow <= contLimit && rep.minAtDenial >= contLimit-1 && slices.Min(rep.aligned) >= contLimit-1
			switch {
			case tc.wantExact:
				if rep.maxInWindow > contLimit {
					t.Errorf("a sliding window holds %d admits, limit %d", rep.maxInWindow, contLimit)
				}
				if rep.minAtDenial < contLimit-1 {
					t.Errorf("a request was denied while its window held only %d admits", rep.minAtDenial)
				}
				for i, n := range rep.aligned {
					if n < contLimit-1 {
						t.Errorf("full window %d after the first holds %d admits, want ≥ %d", i+1, n, contLimit-1)
					}
				}
			case exact:
				t.Errorf("the textbook script passed the exactness check: the check cannot fail")
			case rep.maxInWindow <= contLimit:
				t.Errorf("the textbook script did not over-admit (busiest window %d)", rep.maxInWindow)
			}
		})
	}
}

// contend runs contInstances × contWorkers goroutines for contDuration and
// returns every decision's outcome.
func contend(t *testing.T, newContender func() contender) []outcome {
	ctx := context.Background()
	perInstance := make([][]outcome, contInstances)
	var wg sync.WaitGroup
	start := make(chan struct{})
	stop := time.Now().Add(contDuration + 50*time.Millisecond)
	for i := range contInstances {
		decide := newContender()
		var mu sync.Mutex
		for range contWorkers {
			wg.Go(func() {
				<-start
				var local []outcome
				for time.Now().Before(stop) {
					if o, ok := decide(ctx); ok {
						local = append(local, o)
					}
				}
				mu.Lock()
				perInstance[i] = append(perInstance[i], local...)
				mu.Unlock()
			})
		}
	}
	close(start)
	wg.Wait()
	var all []outcome
	for _, o := range perInstance {
		all = append(all, o...)
	}
	if len(all) == 0 {
		t.Fatal("no decisions")
	}
	return all
}

// limiterContender is one sidecar: its own client, pool and Limiter. Its
// timeout is long because a decision that times out goes to the fallback
// and its server timestamp is lost; exactness is about the script, so the
// deny cache, which answers without a server timestamp, is off
// (TestDenyCache covers it).
func limiterContender(functions bool) func(t *testing.T, addr string) contender {
	return func(t *testing.T, addr string) contender { return limiterContenderWith(t, addr, functions) }
}

func limiterContenderWith(t *testing.T, addr string, functions bool) contender {
	return limiterContenderOpts(t, addr, Options{Functions: functions})
}

func limiterContenderOpts(t *testing.T, addr string, opts Options) contender {
	opts.Timeout, opts.DenyCacheMax = 10*time.Second, -1
	l := newLimiter(t, standalone(t, addr), opts)
	l.observe = func(ctx context.Context, now int64, _ []Request, _ []int, _ []Decision) {
		*ctx.Value(serverTimeKey{}).(*int64) = now
	}
	rule := Rule{ID: "ns/contended", Limit: contLimit, Window: contWindow, FailMode: FailClosed}
	reqs := []Request{{Rule: rule, Client: "hot"}}
	return func(ctx context.Context) (outcome, bool) {
		at := new(int64)
		d := l.Decide(context.WithValue(ctx, serverTimeKey{}, at), reqs)[0]
		if d.Source != SourceRedis || *at == 0 {
			t.Errorf("decision not from redis: %+v", d)
			return outcome{}, false
		}
		return outcome{at: *at, allowed: d.Allowed}, true
	}
}

// serverTimeKey carries, in a test's context, where observe stores the
// server time of the decision.
type serverTimeKey struct{}

// textbookContender is one sidecar using the textbook script with go-redis
// defaults: one EVAL round trip per decision, the caller's clock.
func textbookContender(t *testing.T, addr string) contender {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	keys := []string{"textbook:{contended}"}
	return func(ctx context.Context) (outcome, bool) {
		now := time.Now().UnixMilli()
		v, err := rdb.Eval(ctx, textbookScript, keys, now, contWindow.Milliseconds(), contLimit).Int64()
		if err != nil {
			t.Errorf("textbook: %v", err)
			return outcome{}, false
		}
		return outcome{at: now * 1000, allowed: v == 1}, true
	}
}

type report struct {
	admits, denials          int
	maxInWindow              int   // most admits in any window (t-W, t]
	minAtDenial, maxAtDenial int   // admits in (p-W, p] at denials p after the first window
	aligned                  []int // admits in consecutive full windows after the first
}

// analyze checks the recorded decisions against the sliding window
// semantics of the script: a window (t-W, t] may hold at most `limit`
// admits. The busiest window ends at an admit, so checking windows ending
// at each admit finds it. A denial at p says the window (p-W, p] was full:
// counting the admits in it checks that no request was denied early.
// Aligned windows [t0+kW, t0+(k+1)W), t0 the first admit, are the "every
// full window" view.
func analyze(outs []outcome, window int64, limit int) report {
	var admits, denials []int64
	for _, o := range outs {
		if o.allowed {
			admits = append(admits, o.at)
		} else {
			denials = append(denials, o.at)
		}
	}
	slices.Sort(admits)
	slices.Sort(denials)
	rep := report{admits: len(admits), denials: len(denials), minAtDenial: 1 << 30}
	if len(admits) == 0 {
		return rep
	}
	// inWindow counts admits in (t-W, t].
	inWindow := func(t int64) int {
		hi, _ := slices.BinarySearch(admits, t+1)
		lo, _ := slices.BinarySearch(admits, t-window+1)
		return hi - lo
	}
	for _, a := range admits {
		rep.maxInWindow = max(rep.maxInWindow, inWindow(a))
	}
	t0 := admits[0]
	end := max(admits[len(admits)-1], denials[len(denials)-1])
	for _, p := range denials {
		if p < t0+window {
			continue
		}
		n := inWindow(p)
		rep.minAtDenial = min(rep.minAtDenial, n)
		rep.maxAtDenial = max(rep.maxAtDenial, n)
	}
	for k := int64(1); t0+(k+1)*window <= end; k++ {
		lo, _ := slices.BinarySearch(admits, t0+k*window)
		hi, _ := slices.BinarySearch(admits, t0+(k+1)*window)
		rep.aligned = append(rep.aligned, hi-lo)
	}
	if len(rep.aligned) == 0 {
		rep.aligned = []int{0}
	}
	return rep
}
