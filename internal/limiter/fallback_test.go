package limiter

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// fakeFallback returns a fallback on a clock the test moves.
func fakeFallback(maxClients int) (*fallback, *int64) {
	f := newFallback(maxClients, defaultFallbackLogBytes)
	now := new(int64)
	f.clock = func() int64 { return *now }
	return f, now
}

func fbDecide(f *fallback, rule Rule, client string, replicas int64) Decision {
	var d Decision
	f.decide([]fbReq{{rule: &rule, client: client, share: ceilDiv(rule.Limit, replicas), out: &d}}, true)
	return d
}

func TestFallbackEnforcesShare(t *testing.T) {
	for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			f, now := fakeFallback(100)
			rule := Rule{ID: "r", Limit: 10, Window: time.Second, Algorithm: alg}
			// 3 replicas: share ceil(10/3) = 4.
			for i := range 4 {
				d := fbDecide(f, rule, "c", 3)
				if !d.Allowed || d.Limit != 4 || d.Remaining != int64(3-i) || d.Source != SourceFallback {
					t.Fatalf("admit %d: %+v", i, d)
				}
				*now += int64(10 * time.Millisecond)
			}
			d := fbDecide(f, rule, "c", 3)
			if d.Allowed || d.RetryAfter <= 0 {
				t.Fatalf("5th: %+v", d)
			}
			*now += int64(d.RetryAfter) - 1
			if d := fbDecide(f, rule, "c", 3); d.Allowed {
				t.Fatalf("admitted 1ns before the retry-after: %+v", d)
			}
			*now++
			if d := fbDecide(f, rule, "c", 3); !d.Allowed {
				t.Fatalf("denied at the retry-after: %+v", d)
			}
		})
	}
}

// TestFallbackNeverEvictsACountedClient: with the table full of clients
// that still have admits in their window, a denied client stays denied (it
// is not evicted and re-created with a fresh budget) and newcomers share
// one overflow budget.
func TestFallbackNeverEvictsACountedClient(t *testing.T) {
	f, now := fakeFallback(3)
	rule := Rule{ID: "r", Limit: 2, Window: time.Second}
	for _, c := range []string{"a", "b", "c"} {
		fbDecide(f, rule, c, 1)
		fbDecide(f, rule, c, 1)
	}
	if d := fbDecide(f, rule, "a", 1); d.Allowed {
		t.Fatal("a not denied after its share")
	}
	// A flood of new clients while a, b, c are still counted.
	admitted := 0
	for i := range 1000 {
		if fbDecide(f, rule, fmt.Sprintf("new-%d", i), 1).Allowed {
			admitted++
		}
		if d := fbDecide(f, rule, "a", 1); d.Allowed {
			t.Fatalf("a got a fresh budget after %d new clients", i+1)
		}
	}
	if admitted != 2 {
		t.Errorf("new clients admitted %d times, want the one overflow share of 2", admitted)
	}
	if tracked, overflow := f.size(); tracked != 3 || overflow != 1 {
		t.Errorf("tracked %d overflow %d, want 3 and 1", tracked, overflow)
	}
	// Once a's admits leave the window it may be evicted for a newcomer:
	// that hands out nothing a did not have anyway.
	*now += int64(time.Second)
	if d := fbDecide(f, rule, "z", 1); !d.Allowed {
		t.Fatalf("newcomer after the window: %+v", d)
	}
	if _, ok := f.entries[fbKey{"r", "z"}]; !ok {
		t.Error("the newcomer did not get a tracked entry after the window")
	}
}

func TestFallbackAllOrNothing(t *testing.T) {
	f, _ := fakeFallback(10)
	a := Rule{ID: "a", Limit: 5, Window: time.Second}
	b := Rule{ID: "b", Limit: 1, Window: time.Second}
	decide := func() (bool, Decision, Decision) {
		var da, db Decision
		pass := f.decide([]fbReq{
			{rule: &a, client: "c", share: 5, out: &da},
			{rule: &b, client: "c", share: 1, out: &db},
		}, true)
		return pass, da, db
	}
	if pass, _, _ := decide(); !pass {
		t.Fatal("first request denied")
	}
	for range 3 {
		if pass, da, db := decide(); pass || !da.Allowed || db.Allowed {
			t.Fatalf("pass %v a %+v b %+v", pass, da, db)
		}
	}
	// The denied requests took nothing from a.
	if _, da, _ := decide(); da.Remaining != 4 {
		t.Errorf("a remaining %d, want 4", da.Remaining)
	}
	// commit=false (Redis already denied the request) admits nothing.
	var d Decision
	f.decide([]fbReq{{rule: &a, client: "d", share: 5, out: &d}}, false)
	if !d.Allowed || d.Remaining != 5 {
		t.Errorf("uncommitted: %+v", d)
	}
}

// TestFallbackReshapeKeepsAdmits: a change of the replica count (share) or
// of the algorithm keeps the admits already counted.
func TestFallbackReshapeKeepsAdmits(t *testing.T) {
	f, _ := fakeFallback(10)
	rule := Rule{ID: "r", Limit: 8, Window: time.Second}
	for range 3 {
		fbDecide(f, rule, "c", 2) // share 4
	}
	if d := fbDecide(f, rule, "c", 4); d.Allowed { // share 2: still 3 counted
		t.Fatalf("share shrank to 2 yet admitted: %+v", d)
	}
	counter := rule
	counter.Algorithm = SlidingWindowCounter
	if d := fbDecide(f, counter, "c", 1); !d.Allowed || d.Remaining != 4 { // share 8, counter: 3 counted + 1
		t.Fatalf("share 8 as a counter: %+v", d)
	}
	if d := fbDecide(f, rule, "c", 2); d.Allowed { // back to a log of 4, 4 counted
		t.Fatalf("back to share 4: %+v", d)
	}
}

func TestBreaker(t *testing.T) {
	b := newBreaker(3)
	for range 2 {
		b.failure(ErrTimeout)
	}
	b.success()
	for range 2 {
		b.failure(ErrTimeout)
	}
	if !b.allow() {
		t.Fatal("opened without 3 consecutive failures")
	}
	b.failure(ErrTimeout)
	if b.allow() || b.opens.Load() != 1 {
		t.Fatal("not open after 3 consecutive failures")
	}
	select {
	case <-b.wake:
	default:
		t.Fatal("prober not woken")
	}
	b.close()
	if !b.allow() {
		t.Fatal("still open after close")
	}
}

// TestFallbackExactAtAnyShare: the local log admits exactly the share in
// any window, with the exact retry time, whatever the share; its memory
// follows the admits in the window and is given back when they leave.
func TestFallbackExactAtAnyShare(t *testing.T) {
	for _, share := range []int64{1, 128, 129, 1000, 100000} {
		t.Run(fmt.Sprint(share), func(t *testing.T) {
			f, now := fakeFallback(10)
			rule := Rule{ID: "r", Limit: share, Window: time.Second}
			step := max(1, int64(time.Second)/share/2) // all within half a window
			first := *now
			for i := range share {
				if d := fbDecide(f, rule, "c", 1); !d.Allowed {
					t.Fatalf("admit %d of %d denied: %+v", i+1, share, d)
				}
				*now += step
			}
			d := fbDecide(f, rule, "c", 1)
			if d.Allowed {
				t.Fatalf("admit %d of a share of %d", share+1, share)
			}
			// The first admit leaves the window at first+window.
			if want := time.Duration(first + int64(time.Second) - *now); d.RetryAfter != want {
				t.Errorf("retry after %v, want %v", d.RetryAfter, want)
			}
			*now += int64(d.RetryAfter) - 1
			if d := fbDecide(f, rule, "c", 1); d.Allowed {
				t.Fatalf("admitted 1ns before the retry time")
			}
			*now++
			if d := fbDecide(f, rule, "c", 1); !d.Allowed {
				t.Fatalf("denied at the retry time: %+v", d)
			}
			e := f.entries[fbKey{"r", "c"}]
			if n := int64(len(e.log) - e.head); n != share {
				t.Errorf("%d admits in the log, want the %d in the window", n, share)
			}
			*now += int64(2 * time.Second)
			fbDecide(f, rule, "c", 1)
			if len(e.log)-e.head != 1 || cap(e.log) > 64 {
				t.Errorf("after a quiet window: %d in the log, capacity %d; want 1 and the memory back", len(e.log)-e.head, cap(e.log))
			}
		})
	}
}

// TestFallbackStartsFromRedis is the fleet bound of docs/operations.md on
// three limiters sharing one redis-server, limit 30 (share 10): what
// Redis admitted before it died plus what each replica admits on its own
// in the same window is at most
//
//	A + Σᵢ max(0, share − ceil(cᵢ/N))
//
// where A is Redis's admits in the window and cᵢ the count replica i last
// heard from Redis. A key Redis reported exhausted admits nothing locally
// until its retry time. The naive fallback, blind to Redis, breaks both.
func TestFallbackStartsFromRedis(t *testing.T) {
	const limit, n = 30, 3
	rule := Rule{ID: "ns/seeded", Limit: limit, Window: time.Minute, FailMode: FailOpen, Replicas: n}
	run := func(t *testing.T, blind bool, client string, before int) (redisAdmits int, heard []int64, local []int) {
		r := testsupport.StartRedis(t)
		var lims []*Limiter
		for range n {
			l := newLimiter(t, standalone(t, r.Addr), Options{Timeout: 2 * time.Second, ProbeInterval: time.Hour})
			l.fallback.blind = blind
			lims = append(lims, l)
		}
		heard = make([]int64, n)
		for i := range before {
			d := one(lims[i%n], rule, client)
			if d.Source != SourceRedis && d.Source != SourceDenyCache {
				t.Fatalf("decision %d not from Redis: %+v", i, d)
			}
			if d.Allowed {
				redisAdmits++
			}
			if d.Source == SourceRedis {
				heard[i%n] = limit - d.Remaining
			}
		}
		if err := r.Kill(); err != nil {
			t.Fatal(err)
		}
		local = make([]int, n)
		for i, l := range lims {
			for range 2 * limit {
				d := one(l, rule, client)
				if d.Source == SourceRedis {
					t.Fatalf("Redis answered after the kill: %+v", d)
				}
				if d.Allowed {
					local[i]++
				}
			}
		}
		return redisAdmits, heard, local
	}
	bound := func(a int, heard []int64) int {
		b := a
		for _, c := range heard {
			b += int(max(0, ceilDiv(limit, n)-ceilDiv(c, n)))
		}
		return b
	}
	sum := func(xs []int) (s int) {
		for _, x := range xs {
			s += x
		}
		return s
	}

	t.Run("part of the window spent", func(t *testing.T) {
		a, heard, local := run(t, false, "half", 12)
		total, b := a+sum(local), bound(a, heard)
		t.Logf("Redis admitted %d, replicas last heard %v, then admitted %v on their own: %d in the window, bound %d", a, heard, local, total, b)
		if total > b || total > limit {
			t.Errorf("%d admits in the window, bound %d, limit %d", total, b, limit)
		}
	})
	t.Run("exhausted key", func(t *testing.T) {
		a, heard, local := run(t, false, "spent", limit+n)
		t.Logf("Redis admitted %d, replicas last heard %v, then admitted %v on their own", a, heard, local)
		if sum(local) != 0 {
			t.Errorf("replicas admitted %v on their own a key Redis reported exhausted for a minute", local)
		}
	})
	t.Run("naive fallback, blind to Redis", func(t *testing.T) {
		a, _, local := run(t, true, "half", 12)
		total := a + sum(local)
		t.Logf("Redis admitted %d, then the blind replicas %v: %d in the window", a, local, total)
		if total <= limit {
			t.Errorf("the blind fallback kept the window at %d ≤ %d: this case cannot fail", total, limit)
		}
	})
}

// TestFallbackMemoryBounded measures, with the heap, the fail-open state of
// the worst case a policy allows: 10,000 clients (FallbackMaxClients) of a
// rule at the largest share (limit 1,000,000, replicas 1, window 24h) all
// sending during an outage. A log of 8 bytes per admit would hold up to
// 10,000 × 1,000,000 × 8 bytes = 80 GB; the logs together stay within
// defaultFallbackLogBytes, and a client whose log would grow past it
// continues as a sliding-window counter that keeps every admit it counted
// (so the bound hands no client more than its share).
//
// Phase 1 admits 1,000 per client (10 million admits: about 100 MB of
// logs without the bound; the check fails there on the unbounded
// fallback). Phase 2 takes every client to its whole share.
func TestFallbackMemoryBounded(t *testing.T) {
	const clients, share = defaultFallbackMax, 1_000_000
	rule := Rule{ID: "ns/huge", Limit: share, Window: 24 * time.Hour}
	names := make([]string, clients)
	for i := range names {
		names[i] = fmt.Sprintf("h:client-%05d-aaaaaaaaaaaaaaaa", i) // as long as a hashed key
	}
	before := liveHeap()
	f, now := fakeFallback(clients)
	admit := func(client string, hits int64) Decision {
		var d Decision
		f.decide([]fbReq{{rule: &rule, client: client, share: share, hits: hits, out: &d}}, true)
		return d
	}
	bound := int64(defaultFallbackLogBytes) + clients*fallbackEntryBytes
	check := func(phase string) {
		t.Helper()
		used := liveHeap() - before
		f.mu.Lock()
		logs, held := f.logBytes, int64(0)
		for _, e := range f.entries {
			held += int64(cap(e.log)) * 8
		}
		f.mu.Unlock()
		if logs != held {
			t.Errorf("%s: the budget counts %d bytes of logs, the entries hold %d", phase, logs, held)
		}
		t.Logf("%s: live heap %.1f MiB: logs %.1f MiB, %d B per client besides (bound %.1f MiB: logs %d MiB + %d clients × %d B)",
			phase, mib(used), mib(logs), (used-logs)/clients, mib(bound), defaultFallbackLogBytes>>20, clients, fallbackEntryBytes)
		if used > bound {
			t.Fatalf("%s: the fail-open state holds %.1f MiB, over its bound of %.1f MiB", phase, mib(used), mib(bound))
		}
	}
	for round := range 10 {
		for _, c := range names {
			if d := admit(c, 100); !d.Allowed {
				t.Fatalf("round %d: %s denied below its share: %+v", round, c, d)
			}
		}
		*now += int64(time.Second)
	}
	check("1,000 admits per client")
	for _, c := range names {
		if d := admit(c, share-1000); !d.Allowed {
			t.Fatalf("%s denied below its share: %+v", c, d)
		}
	}
	check("the whole share of 1,000,000 per client")
	// Bounded, not lenient: every client has spent its share.
	for _, c := range names {
		if d := admit(c, 1); d.Allowed || d.Remaining != 0 {
			t.Fatalf("%s admitted past its share: %+v", c, d)
		}
	}
	runtime.KeepAlive(f)
}

// liveHeap is the heap in use after a full collection.
func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
