package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// resetRules are one policy's rules: a window, an additional window (a
// Variant) and a quota, all of one rule ID.
func resetRules() []Rule {
	short := Rule{ID: "shop/reset", Limit: 3, Window: time.Minute, FailMode: FailClosed}
	long := short
	long.Limit, long.Window, long.Variant, long.Algorithm = 5, time.Hour, "3600", SlidingWindowCounter
	quota := quotaRule(time.Hour, 4)
	quota.ID = short.ID
	return []Rule{short, long, quota}
}

// TestResetStartsAClientOver: a reset empties every key of one client
// under a policy (its window, its additional window, its quota's period)
// in one call, standalone and on a Cluster (the keys share a slot), by
// EVALSHA and by FCALL: the client is admitted again as if new, and
// another client's keys are untouched.
func TestResetStartsAClientOver(t *testing.T) {
	for _, mode := range []string{"standalone", "cluster"} {
		for _, fn := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/functions=%v", mode, fn), func(t *testing.T) {
				rdb := windowClients(t, mode)[0]
				prefix := "r" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
				l := newLimiter(t, rdb, Options{Timeout: 10 * time.Second, Prefix: prefix, Functions: fn})
				rules := resetRules()
				ctx := context.Background()
				for i := range 4 {
					ds := l.Decide(ctx, windowRequests(rules, "a"))
					if allAllowed(ds) != (i < 3) {
						t.Fatalf("request %d of a: %+v", i, ds)
					}
				}
				l.Decide(ctx, windowRequests(rules, "b"))
				keys, existed, err := l.Reset(ctx, rules, "a")
				if err != nil || existed != 3 || len(keys) != 3 {
					t.Fatalf("reset: keys %q, %d existed, %v; want the 3 keys of a", keys, existed, err)
				}
				for _, k := range keys {
					if n := rdb.Exists(ctx, k).Val(); n != 0 {
						t.Errorf("key %s still exists after the reset", k)
					}
				}
				for i := range 3 {
					ds := l.Decide(ctx, windowRequests(rules, "a"))
					if !allAllowed(ds) || ds[0].Remaining != int64(2-i) || ds[2].Remaining != int64(3-i) {
						t.Fatalf("request %d of a after the reset: %+v, want a new client's answers", i, ds)
					}
				}
				for _, r := range rules {
					if w, err := l.Peek(ctx, r, "b"); err != nil || w.Count != 1 {
						t.Errorf("b under %s/%s after a's reset: %+v, %v; want its 1 admit", r.ID, r.Variant, w, err)
					}
				}
			})
		}
	}
}

// TestResetWeighted: a weighted log's keys are three (the log, its sums
// and its checkpoints); a reset that emptied the log alone would leave
// sums that count cost no log holds, and the client stays denied.
func TestResetWeighted(t *testing.T) {
	rdb := windowClients(t, "standalone")[0]
	l := newLimiter(t, rdb, Options{Timeout: 10 * time.Second, Functions: true})
	rule := Rule{ID: "shop/tokens", Limit: 10, Window: time.Minute, Weighted: true}
	ctx := context.Background()
	if d := weighted(l, rule, "a", OpDecide, 10); !d.Allowed {
		t.Fatalf("the first charge: %+v", d)
	}
	if d := weighted(l, rule, "a", OpDecide, 1); d.Allowed {
		t.Fatalf("past the limit: %+v", d)
	}
	keys, existed, err := l.Reset(ctx, []Rule{rule}, "a")
	if err != nil || len(keys) != 3 || existed < 2 {
		t.Fatalf("reset: keys %q, %d existed, %v", keys, existed, err)
	}
	if d := weighted(l, rule, "a", OpDecide, 10); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the whole limit after the reset: %+v", d)
	}
}

// TestResetReachesOtherReplicas: a replica that cached a client's
// denial (a quota's: its retry is the period's end, an hour away) serves
// it for at most DenyCacheHold after another replica reset the client;
// then it asks Redis and admits. The resetting replica admits at once.
// The naive cache, which serves a denial until its retry, still denies
// after the hold: it would for the rest of the hour.
func TestResetReachesOtherReplicas(t *testing.T) {
	rdb := windowClients(t, "standalone")[0]
	const hold = 200 * time.Millisecond
	a := newLimiter(t, rdb, Options{Timeout: 10 * time.Second, DenyCacheHold: hold})
	b := newLimiter(t, rdb, Options{Timeout: 10 * time.Second, DenyCacheHold: hold})
	naive := newLimiter(t, rdb, Options{Timeout: 10 * time.Second})
	naive.view.hold = 0
	rule := quotaRule(time.Hour, 1)
	ctx := context.Background()
	if d := one(a, rule, "c"); !d.Allowed {
		t.Fatalf("the first: %+v", d)
	}
	for name, l := range map[string]*Limiter{"a": a, "b": b, "naive": naive} {
		if d := one(l, rule, "c"); d.Allowed || d.Source != SourceRedis || d.RetryAfter < 2*hold {
			t.Fatalf("%s: %+v, want Redis's denial until the period's end", name, d)
		}
		if d := one(l, rule, "c"); d.Source != SourceDenyCache {
			t.Fatalf("%s: %+v, want the cached denial", name, d)
		}
	}
	if _, _, err := a.Reset(ctx, []Rule{rule}, "c"); err != nil {
		t.Fatal(err)
	}
	if d := one(a, rule, "c"); !d.Allowed || d.Source != SourceRedis {
		t.Fatalf("the resetting replica: %+v, want Redis's admit", d)
	}
	time.Sleep(hold) // b's and naive's denials were cached before the reset
	if d := one(naive, rule, "c"); d.Allowed || d.Source != SourceDenyCache {
		t.Errorf("naive cache after the hold: %+v, want its stale denial (the case the hold closes)", d)
	}
	// a took the one admit of the new period count; b asks Redis, which
	// now denies on a's admit: the answer is Redis's, not the cache's.
	if d := one(b, rule, "c"); d.Source != SourceRedis {
		t.Errorf("another replica after the hold: %+v, want Redis's answer", d)
	}
}

// TestResetOnlyTheNamespacesKeys: a namespace's Redis identity resets its
// own clients through the library, and Redis refuses it another
// namespace's keys (its key patterns) and a presence key (the function).
func TestResetOnlyTheNamespacesKeys(t *testing.T) {
	r := testsupport.StartRedis(t)
	admin := standalone(t, r.Addr)
	loadLibrary(t, admin)
	if _, err := r.Do(append([]string{"ACL", "SETUSER", "shop", "on", ">s3cret"}, redisschema.FunctionACLRules(redisschema.KeyPatterns("", "shop", nil, ""))...)...); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	owner := newLimiter(t, admin, Options{Timeout: 10 * time.Second, Functions: true})
	shop := newLimiter(t, client(t, redisconn.Config{Addrs: []string{r.Addr}, Username: "shop", Password: "s3cret"}), Options{Timeout: 10 * time.Second, Functions: true})
	mine := Rule{ID: "shop/api", Limit: 1, Window: time.Minute}
	theirs := Rule{ID: "bank/api", Limit: 1, Window: time.Minute}
	one(owner, theirs, "c")
	one(shop, mine, "c")
	if _, n, err := shop.Reset(ctx, []Rule{mine}, "c"); err != nil || n != 1 {
		t.Fatalf("shop resets its own client: %d, %v", n, err)
	}
	if _, _, err := shop.Reset(ctx, []Rule{theirs}, "c"); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("shop resets bank's client: %v, want Redis's NOPERM", err)
	}
	if n := admin.Exists(ctx, redisschema.Key(redisschema.DefaultPrefix, theirs.ID, "c")).Val(); n != 1 {
		t.Error("bank's key is gone")
	}
	presence := redisschema.PresenceKey(redisschema.DefaultPrefix, "shop/api")
	admin.ZAdd(ctx, presence, redis.Z{Score: 1, Member: "pod"})
	err := shop.rdb.Do(ctx, "fcall", redisschema.Reset.Name, 1, presence).Err()
	if err == nil || !strings.Contains(err.Error(), "no rule key") {
		t.Errorf("reset of a presence key: %v, want the function's refusal", err)
	}
}

// TestResetOnAnOlderLibrary: a library older than reset answers with
// ErrNoReset, which says what to do.
func TestResetOnAnOlderLibrary(t *testing.T) {
	rdb := client(t, redisconn.Config{Addrs: []string{testsupport.StartRedis(t).Addr}})
	older := strings.Replace(redisschema.LibrarySource(), "function_name='"+redisschema.Reset.Name+"'", "function_name='slidegate_other_v1'", 1)
	if err := rdb.FunctionLoadReplace(context.Background(), older).Err(); err != nil {
		t.Fatal(err)
	}
	l := newLimiter(t, rdb, Options{Timeout: 10 * time.Second, Functions: true})
	if _, _, err := l.Reset(context.Background(), []Rule{{ID: "shop/api", Limit: 1, Window: time.Minute}}, "c"); !errors.Is(err, ErrNoReset) {
		t.Fatalf("%v, want ErrNoReset", err)
	}
}
