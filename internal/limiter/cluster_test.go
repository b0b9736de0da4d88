package limiter

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestClusterMatchesStandalone: 3,400 clients × 3 rules (10,200 keys) on
// a 3-master Redis Cluster and on a standalone Redis, four requests each.
// The rules of one request mostly land in different slots, so on the
// cluster they are separate scripts with a compensating call when one
// denies. Every decision must come from Redis (no CROSSSLOT or other
// error) and match standalone's, step by step. Each runs once with the
// scripts (EVALSHA) and once with the library's functions (FCALL, whose
// undo and cancel are functions too): both decide the same.
func TestClusterMatchesStandalone(t *testing.T) {
	t.Parallel()
	for _, functions := range []bool{false, true} {
		t.Run(map[bool]string{false: "eval", true: "functions"}[functions], func(t *testing.T) {
			t.Parallel()
			clusterMatchesStandalone(t, functions)
		})
	}
}

func clusterMatchesStandalone(t *testing.T, functions bool) {
	c := sharedCluster(t)
	s := testsupport.StartRedis(t)
	// The cluster outlives one run (-count=2): fresh keys for each. No deny
	// cache: every answer is the script's.
	opts := Options{Timeout: 5 * time.Second, DenyCacheMax: -1, Prefix: "t" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":", Functions: functions}
	clusterClient := client(t, redisconn.Config{Mode: redisconn.Cluster, Addrs: c.Addrs()})
	loadLibrary(t, clusterClient)
	loadLibrary(t, standalone(t, s.Addr))
	cl := newLimiter(t, clusterClient, opts)
	st := newLimiter(t, standalone(t, s.Addr), opts)
	if cl.grouping != groupSlot || st.grouping != groupAll {
		t.Fatalf("grouping: cluster %v, standalone %v", cl.grouping, st.grouping)
	}

	const clients, steps = 3400, 4
	run := func(l *Limiter) [][]string {
		out := make([][]string, clients)
		var wg sync.WaitGroup
		next := make(chan int)
		for range 64 {
			wg.Go(func() {
				for i := range next {
					reqs := multiRuleRequest("ns/cluster", "client-"+strconv.Itoa(i))
					for range steps {
						out[i] = append(out[i], summarize(l.Decide(context.Background(), reqs)))
					}
				}
			})
		}
		for i := range clients {
			next <- i
		}
		close(next)
		wg.Wait()
		return out
	}
	var gotCluster, gotStandalone [][]string
	var wg sync.WaitGroup
	wg.Go(func() { gotCluster = run(cl) })
	wg.Go(func() { gotStandalone = run(st) })
	wg.Wait()

	want := strings.Join(multiRuleExpected, " ")
	mismatches := 0
	for i := range clients {
		c, s := strings.Join(gotCluster[i], " "), strings.Join(gotStandalone[i], " ")
		if c != s || c != want {
			if mismatches++; mismatches <= 5 {
				t.Errorf("client %d: cluster %q, standalone %q, want %q", i, c, s, want)
			}
		}
	}
	if mismatches > 0 {
		t.Fatalf("%d of %d clients decided differently", mismatches, clients)
	}
	stats := cl.Stats()
	t.Logf("cluster: %d scripts in %d round trips, %d compensating calls", stats.Ops, stats.RoundTrips, stats.Undos)
	if stats.Undos == 0 {
		t.Error("no compensating call on the cluster: the rules never spanned slots")
	}

	// Every key exists on the cluster, spread over all masters, and rule A
	// (a sorted set) kept only the admits of requests that passed.
	total := 0
	for _, n := range c.Nodes {
		v, err := n.Do("DBSIZE")
		if err != nil {
			t.Fatal(err)
		}
		k, _ := strconv.Atoi(v)
		if k == 0 {
			t.Errorf("node %s holds no key", n.Addr)
		}
		total += k
	}
	if want := clients * 3; total < want {
		t.Errorf("cluster holds %d keys, want at least %d", total, want)
	}
	rdb := client(t, redisconn.Config{Mode: redisconn.Cluster, Addrs: c.Addrs()})
	for i := 0; i < clients; i += 97 {
		reqs := multiRuleRequest("ns/cluster", "client-"+strconv.Itoa(i))
		if n, err := rdb.ZCard(context.Background(), cl.keyOf(&reqs[0])).Result(); err != nil || n != 2 {
			t.Errorf("client %d: rule A holds %d admits (%v), want 2", i, n, err)
		}
	}
}

// TestSlotMatchesRedis compares slot() with CLUSTER KEYSLOT.
func TestSlotMatchesRedis(t *testing.T) {
	t.Parallel()
	c := sharedCluster(t)
	rdb := redis.NewClient(&redis.Options{Addr: c.Nodes[0].Addr})
	defer func() { _ = rdb.Close() }()
	for i := range 300 {
		k := Key(defaultPrefix, fmt.Sprintf("ns/p%d", i%7), fmt.Sprintf("client-%d-%s", i, strings.Repeat("x", i%90)))
		want, err := rdb.ClusterKeySlot(context.Background(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := redisschema.Slot(k); int64(got) != want {
			t.Fatalf("redisschema.Slot(%q) = %d, CLUSTER KEYSLOT = %d", k, got, want)
		}
	}
}

// TestClusterACLUser: the least-privilege ACL user of ACLRules works on a
// Redis Cluster too, where the client also reads the slot map.
func TestClusterACLUser(t *testing.T) {
	c := sharedCluster(t)
	for _, n := range c.Nodes {
		if _, err := n.Do(append([]string{"ACL", "SETUSER", "limiter", "on", ">s3cret"}, redisschema.ACLRules("")...)...); err != nil {
			t.Fatal(err)
		}
	}
	l := newLimiter(t, client(t, redisconn.Config{Mode: redisconn.Cluster, Addrs: c.Addrs(), Username: "limiter", Password: "s3cret"}), Options{Timeout: 5 * time.Second})
	for i := range 20 {
		reqs := multiRuleRequest("ns/cluster-acl", "client-"+strconv.Itoa(i))
		for _, d := range l.Decide(context.Background(), reqs) {
			if d.Source != SourceRedis || d.Err != nil {
				t.Fatalf("decision as the ACL user on the cluster: %+v", d)
			}
		}
	}
}
