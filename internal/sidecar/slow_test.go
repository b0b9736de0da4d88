package sidecar

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// Slow is not down: while Redis answers at all, the fleet stays exact.
// Exactness is judged from what reaches the application (see
// provenExcess), and no decision may come from the fallback.
//
// Each case runs three sidecars (own limiter and Redis client each, as
// three pods) with callers per sidecar sending through one header key,
// SlidingLog 100 per 2 s, while Redis is made slow one way. `make
// test-stress` runs the same with every core busy (CPU-starved clients).
const (
	slowLimit  = 100
	slowWindow = 2 * time.Second
)

func TestExactOnASlowRedis(t *testing.T) {
	cases := []struct {
		name string
		// slow starts making Redis slow and returns the address the
		// sidecars dial and a stop function.
		slow func(t *testing.T, r *testsupport.Redis) (addr string, stop func())
	}{
		// Redis is fine; on a busy machine (make test-stress,
		// make test-exact-busy) the sidecars are what is slow.
		{"healthy", func(t *testing.T, r *testsupport.Redis) (string, func()) {
			return r.Addr, func() {}
		}},
		{"120 ms replies every other 400 ms", func(t *testing.T, r *testsupport.Redis) (string, func()) {
			return delayProxy(t, r.Addr, jitter), func() {}
		}},
		{"DEBUG SLEEP 0.3 every 0.8 s", func(t *testing.T, r *testsupport.Redis) (string, func()) {
			return r.Addr, every(800*time.Millisecond, func() { _, _ = r.Do("DEBUG", "SLEEP", "0.3") })
		}},
		{"SIGSTOP 300 ms every 1 s", func(t *testing.T, r *testsupport.Redis) (string, func()) {
			return r.Addr, every(time.Second, func() {
				_ = r.Pause()
				time.Sleep(300 * time.Millisecond)
				_ = r.Resume()
			})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := testsupport.StartRedis(t)
			addr, stop := c.slow(t, r)
			res := slowLoad(t, addr, 0)
			stop()
			res.log(t)
			if res.fallback > 0 {
				t.Errorf("%v decisions fell back while Redis was slow, not down", res.fallback)
			}
			if ex := res.excess(); ex != "" {
				t.Errorf("more than %d admits in a %v window: %s", slowLimit, slowWindow, ex)
			}
		})
	}
}

// TestSlowRedisBreaksTheOldBudget is the pair of the case with 120 ms
// replies: with the former fixed decision timeout of 50 ms, the decisions
// of the slow phases fall back and their local shares come on top of what
// Redis admitted in the fast phases; the judge sees it.
func TestSlowRedisBreaksTheOldBudget(t *testing.T) {
	r := testsupport.StartRedis(t)
	res := slowLoad(t, delayProxy(t, r.Addr, jitter), 50*time.Millisecond)
	res.log(t)
	if res.fallback == 0 || res.excess() == "" {
		t.Errorf("with a 50 ms budget: %v fallback decisions, excess %q; this case cannot fail", res.fallback, res.excess())
	}
}

// jitter is the latency the proxy adds: 120 ms in every other 400 ms.
func jitter(at time.Time) time.Duration {
	if at.UnixMilli()/400%2 == 1 {
		return 120 * time.Millisecond
	}
	return 0
}

// admit is one request the application received.
type admit struct {
	user          string
	sent, arrived time.Time
}

type slowResult struct {
	admits             []admit
	statuses           map[int]int
	fallback, redis    float64
	denyCache, elapsed float64
	maxLag             time.Duration
}

func (r *slowResult) log(t *testing.T) {
	t.Logf("statuses %v; sources redis %v, deny-cache %v, fallback %v; %d admits in %.1fs; longest send→arrival %v",
		r.statuses, r.redis, r.denyCache, r.fallback, len(r.admits), r.elapsed, r.maxLag)
}

// excess describes a window in which more than slowLimit admits of one
// user arrived (testsupport.BusiestWindow), or is "".
func (r *slowResult) excess() string {
	ds := make([]testsupport.Decision, len(r.admits))
	for i, a := range r.admits {
		ds[i] = testsupport.Decision{Key: a.user, Sent: a.sent, Done: a.arrived, Admitted: true}
	}
	if most, where := testsupport.BusiestWindow(ds, slowWindow); most > slowLimit {
		return where
	}
	return ""
}

// slowLoad runs three sidecars on Redis at addr (timeout 0: the defaults)
// with 32 callers each for 5 s, every request for one of two users.
// SLIDEGATE_SLOW_CALLERS and SLIDEGATE_SLOW_SECONDS change the load (make
// test-exact-busy: 64 callers for 10 s).
func slowLoad(t *testing.T, addr string, timeout time.Duration) *slowResult {
	t.Helper()
	var lims []enforce.Decider
	for range 3 {
		rdb, err := redisconn.NewClient(redisconn.Config{Addrs: []string{addr}})
		if err != nil {
			t.Fatal(err)
		}
		// A timeout given here is the former fixed budget: MaxTimeout the
		// same, so it does not stretch with Redis's latency.
		lim, err := limiter.New(rdb, limiter.Options{Prefix: "test:", Timeout: timeout, MaxTimeout: timeout, Replicas: func() int { return 3 }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lim.Close(); _ = rdb.Close() })
		lims = append(lims, lim)
	}
	p := testPolicy("slow", slowLimit, withKey("Header", "X-User", "Deny"))
	p.WindowMillis = slowWindow.Milliseconds()
	f := newFleet(t, lims, testConfig(nil, p))
	f.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
	t.Cleanup(f.client.CloseIdleConnections)

	callers, duration := 32, 5*time.Second
	if v, err := strconv.Atoi(os.Getenv("SLIDEGATE_SLOW_CALLERS")); err == nil && v > 0 {
		callers = v
	}
	if v, err := strconv.Atoi(os.Getenv("SLIDEGATE_SLOW_SECONDS")); err == nil && v > 0 {
		duration = time.Duration(v) * time.Second
	}
	var (
		mu    sync.Mutex
		sent  = map[string]admit{}
		codes = map[int]int{}
		seq   atomic.Int64
		wg    sync.WaitGroup
	)
	start := time.Now()
	for s := range f.fronts {
		for c := range callers {
			wg.Go(func() {
				for time.Since(start) < duration {
					id := strconv.FormatInt(seq.Add(1), 10)
					req, _ := http.NewRequestWithContext(context.Background(), "GET", f.fronts[s]+"/", nil)
					user := "user-" + strconv.Itoa(c%2)
					req.Header.Set("X-User", user)
					req.Header.Set("X-Request-Id", id)
					at := time.Now()
					code := 0
					if resp, err := f.client.Do(req); err == nil {
						code = resp.StatusCode
						drain(resp)
					}
					mu.Lock()
					codes[code]++
					if code == 200 {
						sent[id] = admit{user: user, sent: at}
					}
					mu.Unlock()
					if code != 200 && code != 429 {
						time.Sleep(10 * time.Millisecond)
					}
				}
			})
		}
	}
	wg.Wait()
	res := &slowResult{statuses: codes, elapsed: time.Since(start).Seconds()}
	f.up.mu.Lock()
	for id, a := range sent {
		a.arrived = f.up.arrivals[id]
		res.admits = append(res.admits, a)
		res.maxLag = max(res.maxLag, a.arrived.Sub(a.sent))
	}
	f.up.mu.Unlock()
	src := f.sources()
	res.redis, res.denyCache, res.fallback = src["redis"], src["deny-cache"], src["fallback"]
	return res
}

// every runs fn every d until stop is called; stop waits for a run in
// progress.
func every(d time.Duration, fn func()) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fn()
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// delayProxy forwards TCP connections to addr on loopback and holds each
// chunk of Redis's replies for delay(arrival), keeping their order.
func delayProxy(t *testing.T, addr string, delay func(time.Time) time.Duration) string {
	return testsupport.StartProxy(t, addr, testsupport.ProxyOptions{Delay: delay}).Addr
}
