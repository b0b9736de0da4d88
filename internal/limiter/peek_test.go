package limiter

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// keyState is everything a read could change about a key, as text: its
// members or fields with scores or values, its absolute expiry (PEXPIRETIME
// moves with any PEXPIRE, where PTTL moves with time), and the server's
// count of writes since start (rdb_changes_since_last_save, which any write
// to any key increments).
func keyState(t *testing.T, r *testsupport.Redis, key string) string {
	t.Helper()
	typ, err := r.Do("TYPE", key)
	if err != nil {
		t.Fatal(err)
	}
	var content string
	switch typ {
	case "zset":
		content, err = r.Do("ZRANGE", key, "0", "-1", "WITHSCORES")
	case "hash":
		content, err = r.Do("HGETALL", key)
	}
	if err != nil {
		t.Fatal(err)
	}
	exp, err := r.Do("PEXPIRETIME", key)
	if err != nil {
		t.Fatal(err)
	}
	info, err := r.Do("INFO", "persistence")
	if err != nil {
		t.Fatal(err)
	}
	dirty := ""
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "rdb_changes_since_last_save:") {
			dirty = strings.TrimSpace(line)
		}
	}
	return fmt.Sprintf("type=%s expireat=%s %s\n%s", typ, exp, dirty, content)
}

func pttl(t *testing.T, r *testsupport.Redis, key string) int64 {
	t.Helper()
	s, err := r.Do("PTTL", key)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// addStale puts n admits that left the window long ago into a SlidingLog
// key, as a key holds them between decisions (Decide trims only when it
// runs).
func addStale(t *testing.T, r *testsupport.Redis, key string, n int) {
	t.Helper()
	old := time.Since(time.Unix(scoreEpoch, 0)).Microseconds() - 10*time.Minute.Microseconds()
	for i := range n {
		if _, err := r.Do("ZADD", key, strconv.FormatInt(old+int64(i), 10), "stale"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPeekNeverWrites: Peek leaves a key byte-identical (members, scores,
// absolute expiry, and not one write on the server), for both algorithms,
// full or not, with admits that left the window still stored. The paired
// naive read, the decide script asked only to decide (commit "0"), changes
// the same key: the check can fail.
func TestPeekNeverWrites(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	l := newLimiter(t, rdb, Options{Timeout: 5 * time.Second, DenyCacheMax: -1})
	ctx := context.Background()
	for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
		for _, admits := range []int{2, 5} {
			t.Run(fmt.Sprintf("%s/%d-of-5", alg, admits), func(t *testing.T) {
				rule := Rule{ID: fmt.Sprintf("ns/ro-%s-%d", alg, admits), Limit: 5, Window: time.Minute, Algorithm: alg}
				for range admits {
					one(l, rule, "alice")
				}
				key := l.keyOf(&Request{Rule: rule, Client: "alice"})
				if alg == SlidingLog {
					addStale(t, r, key, 3)
				}
				before, ttlBefore := keyState(t, r, key), pttl(t, r, key)
				for range 3 {
					w, err := l.Peek(ctx, rule, "alice")
					if err != nil {
						t.Fatal(err)
					}
					if w.Count != int64(admits) {
						t.Errorf("count %d, want %d", w.Count, admits)
					}
				}
				if after := keyState(t, r, key); after != before {
					t.Errorf("Peek changed the key:\nbefore %s\nafter  %s", before, after)
				}
				if ttlAfter := pttl(t, r, key); ttlAfter > ttlBefore {
					t.Errorf("PTTL grew from %d to %d ms", ttlBefore, ttlAfter)
				}

				// The naive read: decide without admitting.
				waitServerTick(t, r)
				flags := "0"
				if alg == SlidingWindowCounter {
					flags = "1"
				}
				err := rdb.Eval(ctx, redisschema.Decide.Body, []string{key}, "naive", "1000", "0",
					rule.Limit, rule.Window.Microseconds(), flags, 1).Err()
				if err != nil {
					t.Fatal(err)
				}
				if after := keyState(t, r, key); after == before {
					t.Errorf("the decide-only script left the key as it was: the check proves nothing")
				}
			})
		}
	}
	// Redis itself refuses a write from the read script's flags: a
	// future edit that writes fails loudly instead of changing windows.
	bad := strings.Replace(redisschema.Peek.Script(), "local pttl", "redis.call('PEXPIRE', key, 1)\nlocal pttl", 1)
	err := rdb.Eval(ctx, bad, []string{"ns:any"}, 5, 60_000_000, "0").Err()
	if err == nil || !strings.Contains(err.Error(), "Write commands are not allowed") {
		t.Errorf("a write in the no-writes script: %v", err)
	}
}

// waitServerTick waits until Redis's clock has moved by a millisecond, so
// that an expiry set now differs from one set before.
func waitServerTick(t *testing.T, r *testsupport.Redis) {
	t.Helper()
	first, _ := r.Do("TIME")
	testsupport.Eventually(t, time.Second, time.Millisecond, "redis clock moves", func() error {
		now, _ := r.Do("TIME")
		a, b := strings.Fields(first), strings.Fields(now)
		if len(a) == 2 && len(b) == 2 && (a[0] != b[0] || abs(atoi(b[1])-atoi(a[1])) >= 1000) {
			return nil
		}
		return fmt.Errorf("still %s", now)
	})
}

func atoi(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// TestPeekAgreesWithNextDecide: what Peek says a request now would be told
// is what the next Decide tells it: the same verdict, Remaining-1 after an
// admit, and for a denial the same retry instant to the microsecond on
// Redis's clock (Decide's RetryAfter counts from its own server time,
// which observe reports).
func TestPeekAgreesWithNextDecide(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	// No deny cache: every Decide asks Redis, which is what is compared.
	l := newLimiter(t, rdb, Options{Timeout: 5 * time.Second, DenyCacheMax: -1})
	var decidedAt int64
	l.observe = func(_ context.Context, now int64, _ []Request, _ []int, _ []Decision) { decidedAt = now }
	ctx := context.Background()

	cases := []struct {
		name    string
		alg     Algorithm
		admits  int   // by Decide, before peeking
		stale   int   // SlidingLog admits that left the window
		counter []int // SlidingWindowCounter: previous and current fixed-window admits, set directly
		// heavyPrev: the previous fixed window gets as many admits as make
		// its weighted share alone exceed the limit at the current instant.
		heavyPrev bool
		allowed   bool
	}{
		{name: "log empty", alg: SlidingLog, allowed: true},
		{name: "log partly full", alg: SlidingLog, admits: 3, allowed: true},
		{name: "log full", alg: SlidingLog, admits: 5},
		{name: "log full with stale admits", alg: SlidingLog, admits: 5, stale: 4},
		{name: "log room behind stale admits", alg: SlidingLog, admits: 4, stale: 4, allowed: true},
		{name: "counter empty", alg: SlidingWindowCounter, allowed: true},
		{name: "counter partly full", alg: SlidingWindowCounter, admits: 2, allowed: true},
		{name: "counter full", alg: SlidingWindowCounter, admits: 5},
		{name: "counter full from the previous window", alg: SlidingWindowCounter, counter: []int{0, 3}, heavyPrev: true},
		{name: "counter over in the current window", alg: SlidingWindowCounter, counter: []int{0, 7}},
		{name: "counter room despite the previous window", alg: SlidingWindowCounter, counter: []int{1, 1}, allowed: true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			limit := int64(5)
			if tc.heavyPrev {
				limit = 20
			}
			rule := Rule{ID: "ns/agree-" + strconv.Itoa(i), Limit: limit, Window: time.Minute, Algorithm: tc.alg}
			key := l.keyOf(&Request{Rule: rule, Client: "bob"})
			w := rule.Window.Microseconds()
			// A counter case holds only within one fixed window: retry if
			// the peek and the decision fell on both sides of a boundary.
			for attempt := 0; ; attempt++ {
				_, _ = r.Do("DEL", key)
				for range tc.admits {
					one(l, rule, "bob")
				}
				addStale(t, r, key, tc.stale)
				if tc.counter != nil {
					nowUS := time.Since(time.Unix(scoreEpoch, 0)).Microseconds()
					x := nowUS / w
					counts := tc.counter
					if tc.heavyPrev {
						left := float64(w-(nowUS-x*w)) / float64(w) // the previous window's weight now
						if left < 0.1 {
							// In the window's last tenth the previous one
							// weighs too little for a count that stays over
							// the limit until the peek (it failed once at
							// 21 ms before the boundary): start in the next.
							time.Sleep(time.Duration(float64(w)*left)*time.Microsecond + 10*time.Millisecond)
							nowUS = time.Since(time.Unix(scoreEpoch, 0)).Microseconds()
							x = nowUS / w
							left = float64(w-(nowUS-x*w)) / float64(w)
						}
						counts = []int{int(2*float64(limit)/left) + 1, tc.counter[1]}
					}
					for j, n := range counts {
						if n > 0 {
							if _, err := r.Do("HSET", key, strconv.FormatInt(x-1+int64(j), 10), strconv.Itoa(n)); err != nil {
								t.Fatal(err)
							}
						}
					}
				}
				pk, err := l.Peek(ctx, rule, "bob")
				if err != nil {
					t.Fatal(err)
				}
				d := one(l, rule, "bob")
				peekedAt := pk.Now.Sub(time.Unix(scoreEpoch, 0)).Microseconds()
				if tc.alg == SlidingWindowCounter && peekedAt/w != decidedAt/w && attempt < 3 {
					continue
				}
				if d.Source != SourceRedis {
					t.Fatalf("decision from %s: %v", d.Source, d.Err)
				}
				if pk.Allowed != tc.allowed || d.Allowed != tc.allowed {
					t.Fatalf("allowed: peek %v, decide %v, want %v (peek %+v)", pk.Allowed, d.Allowed, tc.allowed, pk)
				}
				if tc.allowed {
					if d.Remaining != pk.Remaining-1 || pk.RetryAfter != 0 {
						t.Errorf("remaining: decide %d, peek %d (retry %v)", d.Remaining, pk.Remaining, pk.RetryAfter)
					}
					return
				}
				if d.Remaining != 0 || pk.Remaining != 0 {
					t.Errorf("remaining: decide %d, peek %d", d.Remaining, pk.Remaining)
				}
				if got, want := serverTime(decidedAt).Add(d.RetryAfter), pk.RetryAt(); !got.Equal(want) {
					t.Errorf("retry at: decide %v, peek %v (%v apart)", got, want, got.Sub(want))
				}
				return
			}
		})
	}
}

// TestPeekWindow reads the fields an on-call engineer sees, and shows the
// naive count (ZCARD, what a hand-typed redis-cli shows) is wrong while
// the key holds admits that left the window.
func TestPeekWindow(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	l := newLimiter(t, rdb, Options{Timeout: 5 * time.Second, DenyCacheMax: -1})
	ctx := context.Background()
	rule := Rule{ID: "ns/fields", Limit: 3, Window: time.Minute}
	w, err := l.Peek(ctx, rule, "carol")
	if err != nil {
		t.Fatal(err)
	}
	if w.Count != 0 || !w.Allowed || w.Remaining != 3 || w.HasOldest || w.TTL != 0 || w.Algorithm != SlidingLog {
		t.Errorf("empty: %+v", w)
	}
	if _, err := r.Do("EXISTS", w.Key); err != nil {
		t.Fatal(err)
	}
	if n, _ := r.Do("EXISTS", w.Key); n != "0" {
		t.Errorf("Peek created %s", w.Key)
	}
	one(l, rule, "carol")
	time.Sleep(20 * time.Millisecond) // the oldest admit's age, not synchronisation
	one(l, rule, "carol")
	one(l, rule, "carol")
	addStale(t, r, w.Key, 2)
	w, err = l.Peek(ctx, rule, "carol")
	if err != nil {
		t.Fatal(err)
	}
	if w.Count != 3 || w.Allowed || w.Remaining != 0 || !w.HasOldest || w.OldestAge < 20*time.Millisecond || w.OldestAge > time.Minute {
		t.Errorf("full: %+v", w)
	}
	if w.RetryAfter <= time.Minute-w.OldestAge-time.Millisecond || w.RetryAfter > time.Minute-w.OldestAge {
		t.Errorf("retry after %v with the oldest admit %v old", w.RetryAfter, w.OldestAge)
	}
	if w.TTL <= 0 || w.TTL > time.Minute+2*time.Second {
		t.Errorf("ttl %v", w.TTL)
	}
	if n, _ := rdb.ZCard(ctx, w.Key).Result(); n != 5 {
		t.Errorf("ZCARD = %d: the naive count should include the 2 stale admits", n)
	}
	if _, err := l.Peek(ctx, Rule{ID: "ns/bad", Limit: 1, Window: 0}, "x"); err == nil {
		t.Error("an invalid rule was peeked")
	}
}

// TestPeekOnCluster: the key Peek reads on a Redis Cluster is the one Decide
// wrote, on the node that owns its slot.
func TestPeekOnCluster(t *testing.T) {
	c := sharedCluster(t)
	rdb := client(t, redisconn.Config{Mode: redisconn.Cluster, Addrs: c.Addrs()})
	l := newLimiter(t, rdb, Options{Timeout: 5 * time.Second, DenyCacheMax: -1})
	// The cluster outlives a test run (-count): a rule of this run only.
	rule := Rule{ID: "ns/cluster-peek-" + strconv.FormatInt(time.Now().UnixNano(), 36), Limit: 2, Window: time.Minute}
	for _, client := range []string{"a", "b", "c", "d"} {
		one(l, rule, client)
		w, err := l.Peek(context.Background(), rule, client)
		if err != nil {
			t.Fatal(err)
		}
		if w.Count != 1 || w.Remaining != 1 {
			t.Errorf("%s: %+v", client, w)
		}
	}
}
