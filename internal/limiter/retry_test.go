package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// Scripts that Redis runs twice (a Cluster client resends a pipeline whose
// reply was lost) must count once.

// slotsCluster is a ClusterClient built as redisconn builds it, over
// standalone servers that hold the slots in equal ranges (they do not check
// slots, so no cluster needs to be started; each can be paused alone).
func slotsCluster(t *testing.T, addrs ...string) *redis.ClusterClient {
	t.Helper()
	uo, err := redisconn.Config{Mode: redisconn.Cluster, Addrs: addrs}.UniversalOptions()
	if err != nil {
		t.Fatal(err)
	}
	co := uo.Cluster()
	co.ClusterSlots = func(context.Context) ([]redis.ClusterSlot, error) {
		var s []redis.ClusterSlot
		per := 16384 / len(addrs)
		for i, a := range addrs {
			end := (i+1)*per - 1
			if i == len(addrs)-1 {
				end = 16383
			}
			s = append(s, redis.ClusterSlot{Start: i * per, End: end, Nodes: []redis.ClusterNode{{Addr: a}}})
		}
		return s, nil
	}
	rdb := redis.NewClusterClient(co)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// counted is what Redis counts for rule and client now.
func counted(t *testing.T, l *Limiter, rule Rule, client string) int64 {
	t.Helper()
	w, err := l.Peek(context.Background(), rule, client)
	if err != nil {
		t.Fatal(err)
	}
	return w.Count
}

// TestClusterRetryDecidesOnce: go-redis's ClusterClient resends a pipeline
// whose reply was lost (MaxRedirects, not MaxRetries, governs that), so
// Redis runs the decide script twice. The second run must find the first's
// admit and admit nothing more. SlidingLog keys only: a counter key keeps
// no members, and such a rerun counts twice (redisschema's decideScript says why).
func TestClusterRetryDecidesOnce(t *testing.T) {
	r := testsupport.StartRedis(t)
	// The reply to the decide script is lost after the script ran.
	p := testsupport.StartProxy(t, r.Addr, testsupport.ProxyOptions{DropAfter: "evalsha"})
	l := newLimiter(t, slotsCluster(t, p.Addr), Options{Timeout: 2 * time.Second, DenyCacheMax: -1})
	for _, rule := range []Rule{
		{ID: "ns/log", Limit: 10, Window: time.Hour},
		{ID: "ns/log1", Limit: 1, Window: time.Hour},
	} {
		t.Run(rule.ID, func(t *testing.T) {
			if d := one(l, Rule{ID: "ns/warm", Limit: 1 << 20, Window: time.Hour, Algorithm: rule.Algorithm}, "w"); d.Source != SourceRedis {
				t.Fatalf("warm-up: %+v", d)
			}
			dropped := p.Dropped()
			p.Arm()
			d := one(l, rule, "c")
			if p.Dropped() == dropped {
				t.Fatal("no reply was dropped")
			}
			if !d.Allowed || d.Source != SourceRedis || d.Remaining != rule.Limit-1 {
				t.Errorf("the client's first request: %+v", d)
			}
			if n := counted(t, l, rule, "c"); n != 1 {
				t.Errorf("one request counted %d times", n)
			}
		})
	}
}

// TestCounterFields: a counter key holds its two windows (and the undo's
// "u"), stale windows are dropped.
func TestCounterFields(t *testing.T) {
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	l := newLimiter(t, rdb, Options{DenyCacheMax: -1})
	rule := Rule{ID: "ns/fields", Limit: 100, Window: time.Millisecond, Algorithm: SlidingWindowCounter}
	key := l.keyOf(&Request{Rule: rule, Client: "c"})
	for range 5 {
		if d := one(l, rule, "c"); d.Source != SourceRedis {
			t.Fatalf("%+v", d)
		}
		time.Sleep(3 * time.Millisecond) // the next admit is in a new window
	}
	if fields := rdb.HKeys(context.Background(), key).Val(); len(fields) > 2 {
		t.Errorf("fields %q, want at most the two windows", fields)
	}
}

// TestUndoTwice: an undo that Redis runs twice (a Cluster client's retry)
// takes the admit back once.
func TestUndoTwice(t *testing.T) {
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	l := newLimiter(t, rdb, Options{DenyCacheMax: -1})
	ctx := context.Background()
	for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			rule := Rule{ID: "ns/undo2/" + string(alg), Limit: 5, Window: time.Hour, Algorithm: alg}
			one(l, rule, "c") // an admit of another decision, which must stay
			reqs := []Request{{Rule: rule, Client: "c", Hits: 2}}
			keys := []string{l.keyOf(&reqs[0])}
			member := l.nextMember()
			decide := asEval(decideArgs(nil, api{}, reqs, []int{0}, keys, member, l.marginMs, true), &decideLua)
			v, err := rdb.Do(ctx, decide...).Result()
			if err != nil {
				t.Fatal(err)
			}
			rep, err := decodeDecide(v, 1, nil)
			if err != nil {
				t.Fatal(err)
			}
			uk := undoKey{key: keys[0], counter: alg == SlidingWindowCounter, field: rep.keys[0].field, hits: 2}
			undo := asEval(undoArgs(api{}, member, []undoKey{uk}), &undoLua)
			for range 2 {
				if err := rdb.Do(ctx, undo...).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if n := counted(t, l, rule, "c"); n != 1 {
				t.Errorf("counts %d, want the other decision's 1", n)
			}
		})
	}
}

// TestUndoLeavesGoneCounterKeyAlone: an undo that comes after its counter
// key expired (a caller that gave up long ago) creates no key. Before, its
// idempotency field "u" created the key again, with no expiry: a key that
// never left Redis.
func TestUndoLeavesGoneCounterKeyAlone(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	l := newLimiter(t, rdb, Options{DenyCacheMax: -1})
	ctx := context.Background()
	rule := Rule{ID: "ns/undo-gone", Limit: 5, Window: time.Hour, Algorithm: SlidingWindowCounter}
	reqs := []Request{{Rule: rule, Client: "c"}}
	keys := []string{l.keyOf(&reqs[0])}
	member := l.nextMember()
	v, err := rdb.Do(ctx, asEval(decideArgs(nil, api{}, reqs, []int{0}, keys, member, l.marginMs, true), &decideLua)...).Result()
	if err != nil {
		t.Fatal(err)
	}
	rep, err := decodeDecide(v, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	// As if it expired: nothing of the admit is left to take back.
	if err := rdb.Del(ctx, keys[0]).Err(); err != nil {
		t.Fatal(err)
	}
	undo := asEval(undoArgs(api{}, member, []undoKey{{key: keys[0], counter: true, field: rep.keys[0].field, hits: 1}}), &undoLua)
	if err := rdb.Do(ctx, undo...).Err(); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, keys[0]).Val(); n != 0 {
		t.Errorf("the undo created %s again (PTTL %v): a key without an expiry", keys[0], rdb.PTTL(ctx, keys[0]).Val())
	}
}
