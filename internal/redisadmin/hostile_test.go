package redisadmin

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// The hostile-tenant suite (docs/security.md, boundary 1). A tenant is the
// admin of namespace A: it reads A's Redis credentials, as the manager
// hands them out, and tries everything with them against namespace B's
// keys, the rate limit service's keys and the server itself, while B's
// sidecar decides. Every attempt must be refused (NOPERM), B's decisions
// must be what they would be without A, and no code of A's runs on the
// server. Its pair, "shared identity", makes the same attempts with the
// one identity every namespace held before (redisschema.ACLRules, which this
// suite's own check must catch): they succeed.
func TestHostileTenant(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		r := testsupport.StartRedis(t)
		hostileTenant(t, redisconn.Config{Addrs: []string{r.Addr}}, false)
	})
	t.Run("cluster", func(t *testing.T) {
		c := sharedCluster(t)
		hostileTenant(t, redisconn.Config{Mode: redisconn.Cluster, Addrs: c.Addrs()}, false)
	})
	t.Run("sentinel", hostileSentinel)
	t.Run("shared identity", func(t *testing.T) {
		// A script running 100 ms makes the server answer BUSY, so that the
		// test can tell, and SCRIPT KILL stop it.
		r := testsupport.StartRedis(t, "--busy-reply-threshold", "100")
		hostileTenant(t, redisconn.Config{Addrs: []string{r.Addr}}, true)
	})
}

// attack is one command of A's, against one boundary.
type attack struct {
	boundary string
	name     string
	args     []any
}

// boundaryOf is the boundary a command of A's (not on a key) tries.
func boundaryOf(command string) string {
	switch command {
	case "script", "function", "evalsha", "eval_ro", "eval":
		return "code of its own"
	case "acl", "client", "monitor":
		return "identities and connections"
	case "blpop", "brpop", "bzpopmin", "xread":
		return "blocking the server"
	case "subscribe", "publish":
		return "Pub/Sub"
	}
	return "the server (keyspace, configuration, persistence)"
}

// boundaryCounts logs, per boundary, how many of A's attempts were made
// and how many Redis refused.
func boundaryCounts(t *testing.T, attacks []attack, refused map[int]bool) {
	t.Helper()
	type count struct{ tried, refused int }
	counts := map[string]*count{}
	var order []string
	for i, a := range attacks {
		c := counts[a.boundary]
		if c == nil {
			c = &count{}
			counts[a.boundary] = c
			order = append(order, a.boundary)
		}
		c.tried++
		if refused[i] {
			c.refused++
		}
	}
	var b strings.Builder
	for _, name := range order {
		fmt.Fprintf(&b, "\n  %-52s %3d attempts, %3d refused", name, counts[name].tried, counts[name].refused)
	}
	t.Logf("A's attempts per boundary:%s", b.String())
}

func hostileTenant(t *testing.T, cfg redisconn.Config, shared bool) {
	ctx := context.Background()
	run := strconv.FormatInt(time.Now().UnixNano()%1e9, 36) // a fresh keyspace per run (-count, the shared cluster)
	nsA, nsB := "a-"+run, "b-"+run
	longB := nsB + "/" + strings.Repeat("long", 40) // hashed keys (redisschema.HashedRuleID)
	rlsID := "rls/" + nsB + "/gateway"
	perUser := limiter.Rule{ID: nsB + "/per-user", Limit: 10, Window: time.Minute}
	counter := limiter.Rule{ID: nsB + "/counter", Limit: 10, Window: time.Minute, Algorithm: limiter.SlidingWindowCounter}
	long := limiter.Rule{ID: longB, Limit: 10, Window: time.Minute}

	// The identities, as the manager sets them up, and the library.
	admin := newAdmin(t, cfg)
	userA, err := NamespaceIdentity("", nsA, []string{nsA + "/p"}, []string{"pw-a"})
	if err != nil {
		t.Fatal(err)
	}
	userB, err := NamespaceIdentity("", nsB, []string{perUser.ID, counter.ID, long.ID}, []string{"pw-b"})
	if err != nil {
		t.Fatal(err)
	}
	rls := RLSIdentity("", []string{rlsID}, []string{"pw-rls"})
	if _, err := admin.Apply(ctx, []User{userA, userB, rls}, nil); err != nil {
		t.Fatal(err)
	}
	if shared {
		// Before: one user for the whole keyspace, handed to every namespace.
		userA = User{Name: "slidegate", Passwords: []string{"pw-a"}, Rules: redisschema.ACLRules("")}
		if _, err := admin.Apply(ctx, []User{userA}, nil); err != nil {
			t.Fatal(err)
		}
	}
	adminClient := client(t, cfg)
	loadLibrary(t, adminClient)

	rdbA, rdbB := clientAs(t, cfg, userA, "pw-a"), clientAs(t, cfg, userB, "pw-b")
	limB, err := limiter.New(rdbB, limiter.Options{Functions: true, Timeout: 5 * time.Second, DenyCacheMax: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = limB.Close() })

	// B's keys exist before A tries anything.
	for _, r := range []limiter.Rule{perUser, counter, long} {
		if d := limB.Decide(ctx, []limiter.Request{{Rule: r, Client: "victim"}})[0]; d.Source != limiter.SourceRedis || !d.Allowed {
			t.Fatalf("B's first decision on %s: %+v", r.ID, d)
		}
	}
	if _, err := limB.Announce(ctx, []string{perUser.ID}, time.Minute); err != nil {
		t.Fatal(err)
	}
	rlsKey := redisschema.Key("slidegate:", rlsID, "victim")
	if err := adminClient.ZAdd(ctx, rlsKey, redis.Z{Score: 1, Member: "admit"}).Err(); err != nil {
		t.Fatal(err)
	}
	victimKey := redisschema.Key("slidegate:", perUser.ID, "victim")
	counterKey := redisschema.Key("slidegate:", counter.ID, "victim") + "c"
	longKey := redisschema.Key("slidegate:", long.ID, "victim")
	presence := "slidegate:peers:" + perUser.ID
	before := snapshot(t, adminClient, victimKey, counterKey, longKey, presence, rlsKey)

	// B decides throughout: 20 clients × 15 requests of a limit of 10.
	var wg sync.WaitGroup
	decisions := make([][]limiter.Decision, 20)
	stop := make(chan struct{})
	for c := range decisions {
		wg.Go(func() {
			for range 15 {
				d := limB.Decide(ctx, []limiter.Request{{Rule: perUser, Client: "during-" + strconv.Itoa(c)}})[0]
				decisions[c] = append(decisions[c], d)
				select {
				case <-stop:
				case <-time.After(5 * time.Millisecond):
				}
			}
		})
	}

	// A's attempts.
	var attacks []attack
	boundary := ""
	cmd := func(args ...any) { attacks = append(attacks, attack{boundary, fmt.Sprint(args...), args}) }
	for _, k := range []string{victimKey, counterKey, longKey, presence, rlsKey, "slidegate:peers:rls"} {
		boundary = "another namespace's keys"
		if k == rlsKey || k == "slidegate:peers:rls" {
			boundary = "the rate limit service's keys"
		}
		cmd("zremrangebyscore", k, "-inf", "+inf")
		cmd("zadd", k, 0, "forged")
		cmd("zrange", k, 0, -1)
		cmd("zcard", k)
		cmd("zrem", k, "admit")
		cmd("pexpire", k, 1)
		cmd("hset", k, "1", "1000")
		cmd("hincrby", k, "1", "1000")
		cmd("del", k)
		cmd("get", k)
		cmd("dump", k)
		cmd("fcall", "slidegate_decide_v1", 1, k, "forged", "1000", "1", 1000, 60000000, "0", "1000")
		cmd("fcall", "slidegate_undo_v1", 1, k, "admit", "", "1")
		cmd("fcall", "slidegate_cancel_v1", 1, k, "admit", "1000", "1", 60000000)
		cmd("fcall", "slidegate_announce_v1", 1, k, "forged", 600000)
		cmd("fcall_ro", "slidegate_peek_v1", 1, k, 10, 60000000, "0")
	}
	for _, a := range [][]any{
		{"keys", "*"}, {"scan", 0}, {"randomkey"}, {"flushall"}, {"flushdb"},
		{"config", "get", "*"}, {"config", "set", "maxmemory", "1"}, {"debug", "sleep", 0},
		{"script", "flush"}, {"script", "load", "return 1"}, {"script", "kill"},
		{"function", "load", "replace", "#!lua name=slidegate\nredis.register_function('x', function() return 1 end)"},
		{"function", "flush"}, {"function", "delete", "slidegate"}, {"function", "list"}, {"function", "kill"}, {"function", "dump"},
		{"acl", "list"}, {"acl", "setuser", userA.Name, "~*", "+@all"}, {"acl", "deluser", userB.Name}, {"acl", "getuser", userB.Name},
		{"monitor"}, {"client", "kill", "user", userB.Name}, {"client", "list"}, {"client", "pause", 10000},
		{"evalsha", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", 0}, {"eval_ro", "return 1", 0},
		{"blpop", "slidegate:{" + nsA + "/x}", 1}, {"brpop", "slidegate:{" + nsA + "/x}", 1}, {"bzpopmin", "slidegate:{" + nsA + "/x}", 1},
		{"xread", "block", 1000, "streams", "slidegate:{" + nsA + "/x}", "$"},
		{"subscribe", "anything"}, {"publish", "anything", "x"},
		{"shutdown", "nosave"}, {"replicaof", "127.0.0.1", 1}, {"save"}, {"bgsave"}, {"bgrewriteaof"},
		{"object", "encoding", victimKey}, {"sort", "slidegate:{" + nsA + "/x}"},
	} {
		boundary = boundaryOf(a[0].(string))
		cmd(a...)
	}
	// Last: a script that never ends, which blocks the server for everyone
	// (lua-time-limit only makes it answer BUSY).
	boundary = boundaryOf("eval")
	cmd("eval", "while true do end", 0)
	succeeded := 0
	refusedAt := map[int]bool{}
	for i, a := range attacks {
		actx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := rdbA.Do(actx, a.args...).Err()
		cancel()
		refused := err != nil && strings.Contains(err.Error(), "NOPERM")
		refusedAt[i] = refused
		switch {
		case shared && !refused:
			succeeded++
		case !shared && !refused:
			t.Errorf("A's %s: %v, want NOPERM", a.name, err)
		}
	}
	boundaryCounts(t, attacks, refusedAt)
	// No code of A's runs: the server answers at once.
	blocked := false
	start := time.Now()
	if err := adminClient.Ping(ctx).Err(); err != nil || time.Since(start) > time.Second {
		if !shared {
			t.Errorf("PING after A's attempts: %v after %v", err, time.Since(start))
		} else {
			blocked = true
			t.Logf("shared identity: A's busy loop blocks the server: %v", err)
			testsupport.Eventually(t, 10*time.Second, 50*time.Millisecond, "SCRIPT KILL", func() error {
				_ = adminClient.Do(ctx, "script", "kill").Err()
				return adminClient.Ping(ctx).Err()
			})
		}
	}
	close(stop)
	wg.Wait()
	after := snapshot(t, adminClient, victimKey, counterKey, longKey, presence, rlsKey)

	if shared {
		// The check can fail: with the shared identity A reset B's window,
		// forged members, ran its own Lua.
		if after == before || !blocked {
			t.Fatalf("with the shared identity B's keys are unchanged (%v) or A's loop did not block the server (%v): the suite cannot tell", after == before, blocked)
		}
		t.Logf("shared identity: %d of %d attempts succeeded; B's keys before %s\nafter %s", succeeded, len(attacks), before, after)
		return
	}
	if after != before {
		t.Errorf("B's keys changed while A tried:\nbefore %s\nafter  %s", before, after)
	}
	for c, ds := range decisions {
		for i, d := range ds {
			if d.Source != limiter.SourceRedis || d.Allowed != (i < 10) || (i < 10 && d.Remaining != int64(9-i)) {
				t.Errorf("B's client %d, request %d while A tried: %+v", c, i, d)
			}
		}
	}
	// A's own keys still work through the functions (the refusals above
	// are about B's keys and the commands, not a broken identity).
	limA, err := limiter.New(rdbA, limiter.Options{Functions: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = limA.Close() }()
	if d := limA.Decide(ctx, []limiter.Request{{Rule: limiter.Rule{ID: nsA + "/p", Limit: 1, Window: time.Minute}, Client: "c"}})[0]; d.Source != limiter.SourceRedis {
		t.Errorf("A's own decision: %+v", d)
	}
	t.Logf("%d attempts refused; B decided %d requests meanwhile, unchanged", len(attacks), 20*15)
}

// snapshot describes the keys as the admin reads them.
func snapshot(t *testing.T, rdb redis.UniversalClient, keys ...string) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	for _, k := range keys {
		typ, err := rdb.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %s ", k, typ)
		switch typ {
		case "zset":
			zs, err := rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			if k == "slidegate:peers:"+strings.TrimPrefix(k, "slidegate:peers:") {
				// Presence scores move with each announcement: members only.
				for _, z := range zs {
					fmt.Fprintf(&b, "%v ", z.Member)
				}
			} else {
				fmt.Fprintf(&b, "%v ", zs)
			}
		case "hash":
			h, err := rdb.HGetAll(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%v ", h)
		}
		b.WriteString("; ")
	}
	return b.String()
}

func client(t *testing.T, cfg redisconn.Config) redis.UniversalClient {
	t.Helper()
	c, err := redisconn.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// clientAs is a client of cfg's Redis that authenticates as u with pw.
func clientAs(t *testing.T, cfg redisconn.Config, u User, pw string) redis.UniversalClient {
	t.Helper()
	cfg.Username, cfg.Password = u.Name, pw
	return client(t, cfg)
}

// loadLibrary loads the slidegate library on every master of rdb.
func loadLibrary(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	var err error
	if c, ok := rdb.(*redis.ClusterClient); ok {
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			_, err := redisschema.EnsureLibrary(ctx, m)
			return err
		})
	} else {
		_, err = redisschema.EnsureLibrary(ctx, rdb)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// hostileSentinel: the tenant holds the sentinels' identity its sidecars
// discover the master with. Given the discovery identity
// (SentinelDiscoveryACL), every attempt to change what the sentinels
// monitor is refused, while a sidecar still finds the master and decides.
// Its pair is the identity a namespace held before (the sentinels'
// administrative one): SentinelPowers names its powers, and with it the
// tenant removes the master, so that every namespace falls to its fail
// mode.
func hostileSentinel(t *testing.T) {
	ctx := context.Background()
	master := testsupport.StartRedis(t)
	const name = "mymaster"
	s := testsupport.StartSentinelWith(t, master, name, testsupport.SentinelOptions{
		Password: "sentinel-admin",
		Users:    []string{"slidegate-discovery on >discovery-pw " + SentinelDiscoveryACL},
	})
	cfg := redisconn.Config{Mode: redisconn.Sentinel, Addrs: []string{s.Addr}, MasterName: name}
	// The tenant's attempts: another master of its own (which would
	// collect every sidecar's AUTH), the master removed or failed over,
	// the sentinels reconfigured, their users and clients.
	evil := testsupport.StartRedis(t)
	attempts := [][]any{
		{"sentinel", "monitor", "evil", "127.0.0.1", evil.Port, 1},
		{"sentinel", "remove", name},
		{"sentinel", "set", name, "down-after-milliseconds", 1},
		{"sentinel", "set", name, "auth-pass", "x"},
		{"sentinel", "failover", name},
		{"sentinel", "reset", "*"},
		{"sentinel", "config", "set", "announce-ip", "10.0.0.1"},
		{"sentinel", "debug", "info-period", 1},
		{"sentinel", "simulate-failure", "crash-after-election"},
		{"sentinel", "is-master-down-by-addr", "127.0.0.1", master.Port, 1000, "tenant"},
		{"sentinel", "masters"}, {"sentinel", "master", name}, {"sentinel", "flushconfig"},
		{"acl", "setuser", "tenant", "on", ">x", "+@all"}, {"acl", "list"}, {"acl", "deluser", "default"},
		{"client", "list"}, {"client", "kill", "user", "default"}, {"info"},
		{"publish", "__sentinel__:hello", "x"}, {"subscribe", "__sentinel__:hello"},
		{"shutdown", "nosave"},
	}
	attack := func(user, password string) (refused int) {
		t.Helper()
		c := redis.NewClient(&redis.Options{Addr: s.Addr, Username: user, Password: password, DisableIdentity: true, MaxRetries: -1})
		defer func() { _ = c.Close() }()
		for _, a := range attempts {
			actx, cancel := context.WithTimeout(ctx, 3*time.Second)
			err := c.Do(actx, a...).Err()
			cancel()
			if err != nil && strings.HasPrefix(err.Error(), "NOPERM") {
				refused++
			} else if user == "slidegate-discovery" {
				t.Errorf("the discovery identity's %v: %v, want NOPERM", a, err)
			}
		}
		return refused
	}

	// Discovery only: refused, and fit to hand out.
	powers, err := SentinelPowers(ctx, cfg, "slidegate-discovery", "discovery-pw")
	if err != nil || len(powers) != 0 {
		t.Fatalf("SentinelPowers(discovery) = %v, %v; want none", powers, err)
	}
	refused := attack("slidegate-discovery", "discovery-pw")
	if got, err := s.Master(name); err != nil || got != master.Addr {
		t.Fatalf("after the attempts the sentinel gives %q (%v), want %s", got, err, master.Addr)
	}
	// ... and enough for a sidecar: it finds the master and decides there.
	side := cfg
	side.SentinelUsername, side.SentinelPassword = "slidegate-discovery", "discovery-pw"
	lim, err := limiter.New(client(t, side), limiter.Options{Timeout: 5 * time.Second, DenyCacheMax: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	rule := limiter.Rule{ID: "b/p", Limit: 1, Window: time.Minute}
	for i, want := range []bool{true, false} {
		if d := lim.Decide(ctx, []limiter.Request{{Rule: rule, Client: "c"}})[0]; d.Source != limiter.SourceRedis || d.Allowed != want {
			t.Fatalf("decision %d through the sentinel with the discovery identity: %+v", i, d)
		}
	}
	t.Logf("sentinel: %d of %d attempts with the discovery identity refused; the sidecar found the master", refused, len(attempts))

	// The pair: the administrative identity, which every namespace held
	// before. The check names what it may do, and the tenant removes the
	// master with it.
	powers, err = SentinelPowers(ctx, cfg, "default", "sentinel-admin")
	if err != nil || len(powers) != len(sentinelProbes) {
		t.Fatalf("SentinelPowers(admin) = %v, %v; want all %d probes allowed", powers, err, len(sentinelProbes))
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Password: "sentinel-admin", DisableIdentity: true})
	defer func() { _ = c.Close() }()
	if err := c.Do(ctx, "sentinel", "remove", name).Err(); err != nil {
		t.Fatalf("SENTINEL REMOVE with the administrative identity: %v", err)
	}
	if got, err := s.Master(name); err == nil {
		t.Fatalf("the sentinel still gives %q after SENTINEL REMOVE", got)
	}
	t.Logf("sentinel, administrative identity: %d probes allowed (%s ...); SENTINEL REMOVE took the master away", len(powers), powers[0])
}
