package sidecar

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// These tests run the sidecar against the real limiter and a real
// redis-server.

// exactTimeout is the decision timeout of tests that count exactly: long
// enough that no decision falls back to the local limiter on a loaded
// machine under -race (the fallback is exercised by the failure tests).
const exactTimeout = 10 * time.Second

// redisLimiter is a limiter on its own Redis client, like one sidecar pod.
func redisLimiter(t testing.TB, r *testsupport.Redis, replicas int, timeout time.Duration) *limiter.Limiter {
	t.Helper()
	rdb, err := redisconn.NewClient(redisconn.Config{Addrs: []string{r.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := limiter.New(rdb, limiter.Options{
		Prefix:   "test:",
		Timeout:  timeout,
		Replicas: func() int { return replicas },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close(); _ = rdb.Close() })
	return lim
}

// fleet is several sidecars (one limiter and Redis client each) sharing one
// config and one application, as the pods of one Deployment.
type fleet struct {
	up       *upstream
	cfg      *volume
	sidecars []*Sidecar
	fronts   []string
	client   *http.Client
}

func newFleet(t *testing.T, limiters []enforce.Decider, cfg *sidecarconfig.Config) *fleet {
	t.Helper()
	f := &fleet{up: newUpstream(t), cfg: newVolume(t)}
	f.cfg.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t, cfg)})
	for _, lim := range limiters {
		o := testOptions(f.up.URL, f.cfg, nil)
		s, err := New(o, lim, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		front := newTestServer(t, s)
		f.sidecars = append(f.sidecars, s)
		f.fronts = append(f.fronts, front.URL)
	}
	f.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(f.client.CloseIdleConnections)
	return f
}

// storm sends n requests from workers goroutines, round-robin over the
// sidecars, and returns the count of each status (0: transport error).
func (f *fleet) storm(t *testing.T, n, workers int, path string, header map[string]string) map[int]int {
	t.Helper()
	var mu sync.Mutex
	counts := map[int]int{}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				req, _ := http.NewRequest("GET", f.fronts[int(i)%len(f.fronts)]+path, nil)
				for k, v := range header {
					req.Header.Set(k, v)
				}
				code := 0
				resp, err := f.client.Do(req)
				if err == nil {
					code = resp.StatusCode
					if code == 429 && (resp.Header.Get("Retry-After") == "" || resp.Header.Get("RateLimit") == "") {
						code = -429 // a 429 without its headers
					}
					drain(resp)
				}
				mu.Lock()
				counts[code]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return counts
}

func TestExactLimitAcrossSidecars(t *testing.T) {
	r := testsupport.StartRedis(t)
	lims := []enforce.Decider{redisLimiter(t, r, 3, exactTimeout), redisLimiter(t, r, 3, exactTimeout), redisLimiter(t, r, 3, exactTimeout)}
	const limit = 40
	f := newFleet(t, lims, testConfig(nil,
		testPolicy("global", limit),
		testPolicy("per-user", 5, withKey("Header", "X-User", "Allow")),
	))

	// Anonymous traffic: only the global policy applies.
	got := f.storm(t, 200, 24, "/", nil)
	if src := f.sources(); got[200] != limit || got[429] != 200-limit || f.up.hits.Load() != limit || src["redis"]+src["deny-cache"] != 200 || src["fallback"] != 0 {
		t.Fatalf("statuses %v, upstream saw %d; want exactly %d admitted of 200, the rest 429 with headers (sources %v)",
			got, f.up.hits.Load(), limit, f.sources())
	}
	_ = f.up.hits.Swap(0)

	// The global budget is spent: a known user is rejected by it, and the
	// per-user admit is undone, so after... the user still has 5.
	got = f.storm(t, 10, 4, "/", map[string]string{"X-User": "alice"})
	if got[429] != 10 || f.up.hits.Load() != 0 {
		t.Fatalf("statuses %v, upstream %d; want every request rejected by the spent global budget", got, f.up.hits.Load())
	}
	var notCounted float64
	for _, s := range f.sidecars {
		notCounted += requestsCount(s, "per-user", enforce.NotCounted)
	}
	if notCounted != 10 {
		t.Errorf("per-user not_counted = %v, want 10 (admits undone)", notCounted)
	}
	n, err := r.Do("ZCARD", redisschema.Key("test:", testNamespace+"/per-user", hashKey(keyPrefixHeader, "alice")))
	if err != nil || n != "0" {
		t.Errorf("per-user entries of alice in Redis = %q (%v), want 0: a rejected request must not consume budget", n, err)
	}
}

// TestNaiveLocalCountingOverAdmits is the naive way the test above guards
// against: sidecars that count on their own (here: each on its own Redis)
// admit the limit once per replica.
func TestNaiveLocalCountingOverAdmits(t *testing.T) {
	lims := []enforce.Decider{
		redisLimiter(t, testsupport.StartRedis(t), 3, exactTimeout),
		redisLimiter(t, testsupport.StartRedis(t), 3, exactTimeout),
		redisLimiter(t, testsupport.StartRedis(t), 3, exactTimeout),
	}
	const limit = 40
	f := newFleet(t, lims, testConfig(nil, testPolicy("global", limit)))
	got := f.storm(t, 200, 24, "/", nil)
	if got[200] != 3*limit {
		t.Fatalf("statuses %v; unshared counting should admit %d (sources %v)", got, 3*limit, f.sources())
	}
}

func TestForgedForwardedForGetsNoExtraBudget(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trusted []string
		want    int
	}{
		// The test client connects from 127.0.0.1: untrusted here, so every
		// forged header shares the peer's budget of 3.
		{name: "untrusted peer", trusted: []string{"10.0.0.0/8"}, want: 3},
		// Trusted: each distinct right-most hop is its own client (5 × 3).
		{name: "trusted peer", trusted: []string{"127.0.0.0/8"}, want: 15},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(tc.trusted, testPolicy("by-ip", 3, withKey("RemoteAddress", "", "Deny")))
			f := newFleet(t, []enforce.Decider{redisLimiter(t, testsupport.StartRedis(t), 1, exactTimeout)}, cfg)
			admitted := 0
			for i := range 30 {
				req, _ := http.NewRequest("GET", f.fronts[0]+"/", nil)
				// Five clients, each forging a different left part every time.
				req.Header.Set("X-Forwarded-For", fmt.Sprintf("6.6.6.%d, 198.51.100.%d", i, i%5))
				resp, err := f.client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode == 200 {
					admitted++
				}
				drain(resp)
			}
			if admitted != tc.want {
				t.Errorf("admitted %d, want %d", admitted, tc.want)
			}
		})
	}
}

func TestDryRunForwardsAndCounts(t *testing.T) {
	r := testsupport.StartRedis(t)
	f := newFleet(t, []enforce.Decider{redisLimiter(t, r, 1, exactTimeout)}, testConfig(nil, testPolicy("shadow", 2, dryRun)))
	got := f.storm(t, 7, 1, "/", nil)
	if got[200] != 7 || f.up.hits.Load() != 7 {
		t.Fatalf("statuses %v, upstream %d; a DryRun policy must forward everything", got, f.up.hits.Load())
	}
	s := f.sidecars[0]
	if a, d := requestsCount(s, "shadow", enforce.Allowed), requestsCount(s, "shadow", enforce.DryRunRejected); a != 2 || d != 5 {
		t.Errorf("allowed %v, dry_run_rejected %v; want 2 and 5", a, d)
	}
}

// failureFleet is one sidecar with a fail-open policy on /open/ and a
// fail-closed one on /closed/.
func failureFleet(t *testing.T, r *testsupport.Redis) *fleet {
	cfg := testConfig(nil,
		testPolicy("open", 4, func(p *sidecarconfig.Policy) { p.Match.PathPrefixes = []string{"/open/"} }),
		testPolicy("closed", 1000, failClosed, func(p *sidecarconfig.Policy) { p.Match.PathPrefixes = []string{"/closed/"} }),
	)
	return newFleet(t, []enforce.Decider{redisLimiter(t, r, 2, 50*time.Millisecond)}, cfg)
}

// timedGet returns the status and the time a request took.
func (f *fleet) timedGet(t *testing.T, path string) (int, time.Duration, http.Header) {
	t.Helper()
	start := time.Now()
	resp, err := f.client.Get(f.fronts[0] + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	drain(resp)
	return resp.StatusCode, time.Since(start), resp.Header
}

func testRedisFailure(t *testing.T, fail, recover func(*testsupport.Redis) error) {
	r := testsupport.StartRedis(t)
	f := failureFleet(t, r)
	// Warm up (the first decision loads the scripts; on a loaded machine it
	// may miss the 50ms timeout).
	eventually(t, 10*time.Second, "the fail-closed policy admitting through Redis", func() bool {
		code, _, _ := f.timedGet(t, "/closed/x")
		return code == 200
	})
	if err := fail(r); err != nil {
		t.Fatal(err)
	}
	// Fail-closed: 503 with Retry-After, within a bound far above the
	// 50ms decision timeout (the machine may be loaded).
	const bound = 2 * time.Second
	for range 3 {
		code, took, h := f.timedGet(t, "/closed/x")
		if code != 503 || h.Get("Retry-After") == "" || took > bound {
			t.Fatalf("fail-closed: status %d Retry-After %q in %v; want 503 with Retry-After within %v", code, h.Get("Retry-After"), took, bound)
		}
	}
	// Fail-open: the local share ceil(4/2) = 2 per replica, then 429.
	var codes []int
	for range 4 {
		code, took, _ := f.timedGet(t, "/open/x")
		if took > bound {
			t.Fatalf("fail-open request took %v", took)
		}
		codes = append(codes, code)
	}
	if fmt.Sprint(codes) != "[200 200 429 429]" {
		t.Errorf("fail-open statuses %v, want [200 200 429 429] (per-replica share 2)", codes)
	}
	s := f.sidecars[0]
	eventually(t, 5*time.Second, "fallback_active = 1", func() bool {
		_, _, _ = f.timedGet(t, "/closed/x")
		return testutilCounter(s.metrics.decisions.RedisErrors) > 0 && gaugeValue(t, s, "slidegate_sidecar_fallback_active") == 1
	})

	repairAt := time.Now()
	if err := recover(r); err != nil {
		t.Fatal(err)
	}
	answered := time.Now()
	var gaugeBack time.Duration
	eventually(t, 10*time.Second, "fallback_active = 0", func() bool {
		gaugeBack = time.Since(answered)
		return gaugeValue(t, s, "slidegate_sidecar_fallback_active") == 0
	})
	eventually(t, 10*time.Second, "fail-closed policy serving again", func() bool {
		code, _, _ := f.timedGet(t, "/closed/x")
		return code == 200
	})
	// The limiter's TestFaults holds this to the probe interval with a
	// tolerance it measures; here it is the figure a user sees, logged.
	t.Logf("redis answered %v after the repair began; fallback_active was 0 %v after that, and the sidecar served from Redis again %v after that",
		answered.Sub(repairAt).Round(time.Millisecond), gaugeBack.Round(time.Millisecond), time.Since(answered).Round(time.Millisecond))
	if v := gaugeValue(t, s, "slidegate_sidecar_fallback_active"); v != 0 {
		t.Errorf("fallback_active = %v after recovery", v)
	}
}

func TestRedisKilled(t *testing.T) {
	testRedisFailure(t, (*testsupport.Redis).Kill, (*testsupport.Redis).Restart)
}

func TestRedisPaused(t *testing.T) {
	testRedisFailure(t, (*testsupport.Redis).Pause, (*testsupport.Redis).Resume)
}

// sources sums slidegate_sidecar_limiter_decisions_total by source.
func (f *fleet) sources() map[string]float64 {
	out := map[string]float64{}
	for _, s := range f.sidecars {
		for _, src := range []limiter.Source{limiter.SourceRedis, limiter.SourceDenyCache, limiter.SourceFallback, limiter.SourceFailedClosed} {
			out[string(src)] += testutilCounter(s.metrics.decisions.Sources.WithLabelValues(string(src)))
		}
	}
	return out
}

// TestRun is the whole process as cmd/sidecar runs it: Redis client and
// limiter from the options, both ports, and a clean exit when the context
// (SIGTERM) ends (startRun checks it at cleanup).
func TestRun(t *testing.T) {
	r := testsupport.StartRedis(t)
	up := newUpstream(t)
	cfg := newVolume(t)
	cfg.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t, testConfig(nil, testPolicy("p", 2)))})
	o := testOptions(up.URL, cfg, nil)
	o.Redis.Addrs = []string{r.Addr}
	o.KeyPrefix = "run:"
	o.DecisionTimeout = exactTimeout
	front, admin := startRun(t, o, testLogger(t))
	assertRedisDecides(t, front, admin, func() (string, error) {
		return r.Do("ZCARD", redisschema.Key("run:", testNamespace+"/p", keyGlobal))
	})
}

// TestLongKeyValuesGetTheirOwnBudget: client values that differ only after a
// 1,024-byte common prefix are distinct clients end to end, through Redis;
// the same value again is still limited.
func TestLongKeyValuesGetTheirOwnBudget(t *testing.T) {
	r := testsupport.StartRedis(t)
	f := newFleet(t, []enforce.Decider{redisLimiter(t, r, 1, exactTimeout)},
		testConfig(nil, testPolicy("per-user", 1, withKey("Header", "X-User-ID", "Deny"))))
	prefix := strings.Repeat("k", 1024)
	var got []int
	for _, user := range []string{"A", "B", "C", "A"} {
		req, _ := http.NewRequest("GET", f.fronts[0]+"/", nil)
		req.Header.Set("X-User-ID", prefix+user)
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, resp.StatusCode)
		drain(resp)
	}
	if want := []int{200, 200, 200, 429}; !slices.Equal(got, want) {
		t.Errorf("statuses %v, want %v (A, B, C each their own budget of 1, then A again)", got, want)
	}
}
