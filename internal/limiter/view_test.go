package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestDenyCache: a key Redis reported exhausted is denied without a round
// trip until Redis's own retry time and not after it, with the Retry-After
// Redis gave less the time since; a request that one cached rule denies
// consumes nothing in its other rules; and a reload that changes the rule
// is not answered from the cache (the naive cache, which ignores the rule,
// fails that case).
func TestDenyCache(t *testing.T) {
	r := testsupport.StartRedis(t)
	for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			l := newLimiter(t, standalone(t, r.Addr), Options{Timeout: 2 * time.Second})
			rule := Rule{ID: "ns/cache-" + string(alg), Limit: 3, Window: 400 * time.Millisecond, Algorithm: alg}
			for i := range 3 {
				if d := one(l, rule, "c"); !d.Allowed || d.Source != SourceRedis {
					t.Fatalf("admit %d: %+v", i, d)
				}
			}
			start := time.Now()
			d := one(l, rule, "c")
			if d.Allowed || d.Source != SourceRedis {
				t.Fatalf("4th: %+v, want Redis's denial", d)
			}
			trips := l.Stats().RoundTrips
			c := one(l, rule, "c")
			elapsed := time.Since(start)
			if c.Allowed || c.Source != SourceDenyCache {
				t.Fatalf("5th: %+v, want the cached denial", c)
			}
			if got := l.Stats().RoundTrips; got != trips {
				t.Errorf("the cached denial made %d round trips", got-trips)
			}
			if c.RetryAfter > d.RetryAfter || c.RetryAfter < d.RetryAfter-elapsed {
				t.Errorf("cached retry-after %v, want Redis's %v less at most %v", c.RetryAfter, d.RetryAfter, elapsed)
			}

			// A second rule beside the cached one: the request is denied
			// and the other rule's key gets nothing.
			other := Rule{ID: "ns/cache-other-" + string(alg), Limit: 10, Window: time.Minute, Algorithm: alg}
			ds := l.Decide(context.Background(), []Request{{Rule: other, Client: "c"}, {Rule: rule, Client: "c"}})
			if !ds[0].Allowed || ds[1].Allowed || ds[1].Source != SourceDenyCache {
				t.Errorf("two rules, one cached as exhausted: %+v", ds)
			}
			if n, _ := r.Do("EXISTS", l.keyOf(&Request{Rule: other, Client: "c"})); n != "0" {
				t.Errorf("the other rule's key exists after a request the cache denied")
			}

			// Never past the retry time: from then on Redis decides, and a
			// cached denial may follow only a Redis denial whose own retry
			// time has not come. The cache counts that time from when the
			// limiter queued the decision, somewhere between the call and
			// its return, so the test counts from the return.
			time.Sleep(c.RetryAfter)
			var redisUntil time.Time
			for {
				start := time.Now()
				d := one(l, rule, "c")
				if d.Source == SourceDenyCache && start.Before(redisUntil) {
					continue
				}
				if d.Source != SourceRedis {
					t.Fatalf("after the cached retry time: %+v, want Redis's answer", d)
				}
				if d.Allowed {
					break
				}
				redisUntil = time.Now().Add(d.RetryAfter)
			}
		})
	}

	// A reload that raises the limit: the key is exhausted under the old
	// rule, not under the new one.
	reload := func(t *testing.T, naive bool) Decision {
		l := newLimiter(t, standalone(t, r.Addr), Options{Timeout: 2 * time.Second})
		l.view.ignoreRule = naive
		rule := Rule{ID: "ns/cache-reload", Limit: 2, Window: time.Minute}
		client := "c-" + time.Now().Format("150405.000000")
		for range 3 {
			one(l, rule, client)
		}
		if d := one(l, rule, client); d.Source != SourceDenyCache {
			t.Fatalf("not cached: %+v", d)
		}
		rule.Limit = 5
		return one(l, rule, client)
	}
	t.Run("reload", func(t *testing.T) {
		if d := reload(t, false); !d.Allowed || d.Source != SourceRedis {
			t.Errorf("after the limit went 2 → 5: %+v, want admitted by Redis", d)
		}
	})
	t.Run("naive cache ignores the reload", func(t *testing.T) {
		if d := reload(t, true); d.Allowed {
			t.Errorf("the naive cache admitted (%+v): this case cannot fail", d)
		}
	})
}

// TestDenyCacheIsBounded: a full cache takes no new key until entries
// expire, and the keys it did not take are still decided by Redis.
func TestDenyCacheIsBounded(t *testing.T) {
	r := testsupport.StartRedis(t)
	l := newLimiter(t, standalone(t, r.Addr), Options{Timeout: 2 * time.Second, DenyCacheMax: 2})
	rule := Rule{ID: "ns/bounded", Limit: 1, Window: time.Minute}
	for _, c := range []string{"a", "b", "c"} {
		one(l, rule, c)
		if d := one(l, rule, c); d.Allowed {
			t.Fatalf("%s admitted twice", c)
		}
	}
	if n := l.view.len(); n != 2 {
		t.Errorf("%d cached keys, want the bound 2", n)
	}
	if d := one(l, rule, "c"); d.Allowed || d.Source != SourceRedis {
		t.Errorf("uncached key: %+v, want Redis's denial", d)
	}
}

// TestDenyCacheOneHitOnly: a denial is cached for one hit; a request of
// more hits for the same key asks Redis, whose retry time is later (the
// cache's would have the client denied again when it retries).
func TestDenyCacheOneHitOnly(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	l := newLimiter(t, standalone(t, r.Addr), Options{})
	rule := Rule{ID: "ns/multi-hit", Limit: 3, Window: 5 * time.Second}
	dec := func(h int64) Decision {
		return l.Decide(context.Background(), []Request{{Rule: rule, Client: "c", Hits: h}})[0]
	}
	dec(1)
	time.Sleep(500 * time.Millisecond) // the two admits have different ages
	dec(2)
	one := dec(1) // denied by Redis, and cached
	if one.Allowed || one.Source != SourceRedis {
		t.Fatalf("third request: %+v", one)
	}
	if d := dec(1); d.Source != SourceDenyCache {
		t.Fatalf("the denial was not cached: %+v", d)
	}
	two := dec(2)
	if two.Allowed || two.Source != SourceRedis {
		t.Fatalf("two hits: %+v, want a denial by Redis", two)
	}
	if two.RetryAfter <= one.RetryAfter {
		t.Errorf("two hits retry after %v, one hit after %v: two must wait for both admits to leave", two.RetryAfter, one.RetryAfter)
	}
}
