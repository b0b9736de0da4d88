package limiter

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// sharedSlot finds a rule id that shares a slot with rule a for every
// client of n, and n clients whose keys under either rule all lie in one
// slot, and that slot: requests of those clients under both rules are
// multi-key scripts on one slot.
//
// The keys' hash tags are "<rule>:<client>", and CRC16 is linear: the
// CRCs of two tags with the same client differ by a value that depends
// on the rules and the client's length only. So a second rule found for
// one client serves every client of the same length, while distinct
// clients share a slot only by chance (1 in 16384).
func sharedSlot(a string, n int) (b string, clients []string, at int) {
	client := func(i int) string { return fmt.Sprintf("hot-%06d", i) }
	for j := 0; b == ""; j++ {
		if id := fmt.Sprintf("ns/b-%d", j); redisschema.Slot(Key("", a, client(0))) == redisschema.Slot(Key("", id, client(0))) {
			b = id
		}
	}
	at = redisschema.Slot(Key("", a, client(0)))
	for i := 0; len(clients) < n; i++ {
		if c := client(i); redisschema.Slot(Key("", a, c)) == at {
			clients = append(clients, c)
		}
	}
	return b, clients, at
}

// TestClusterReshard moves the slot of a fleet's hot keys to another
// master (key by key, as redis-cli --cluster reshard does) while three
// limiters drive it with requests under two rules whose keys share that
// slot: each decision is one script over two keys. During the move the old
// node answers ASK for a key that has moved and TRYAGAIN when one key has
// moved and the other not; the new node answers TRYAGAIN (until the whole
// slot has moved) when a key is missing, as for clients that start during
// the move. Every decision must still come from Redis: nothing over the
// limit in any window, no decision by the fail mode. Before the limiter
// resent such scripts and split refused ones (see call.splitRefused), the
// refusals went to the fail mode: 132 requests failed closed (Closed); 525
// were decided by the fallback and 80 admits went over the limit (Open).
func TestClusterReshard(t *testing.T) {
	for _, mode := range []FailMode{FailClosed, FailOpen} {
		t.Run(string(mode), func(t *testing.T) {
			c := changingCluster(t)
			const limit, window = 200, 2 * time.Second
			prefix := uniquePrefix("rs")
			a := Rule{ID: "ns/a", Limit: limit, Window: window, FailMode: mode}
			bID, clients, hot := sharedSlot(a.ID, 8)
			b := Rule{ID: bID, Limit: limit, Window: window, FailMode: mode}
			// No deny cache: every request asks Redis, so many meet the move.
			lims := clusterLimiters(t, c, 3, Options{Prefix: prefix, Replicas: func() int { return 3 }, DenyCacheMax: -1})
			load := &changeLoad{lims: lims, clients: clients[:4], callers: 8, reqs: func(cl string) []Request {
				return []Request{{Rule: a, Client: cl}, {Rule: b, Client: cl}}
			}}
			from, err := c.Owner(hot)
			if err != nil {
				t.Fatal(err)
			}
			to := otherMaster(t, c, from)
			load.start()
			defer load.halt()
			load.waitFor(t, 10*time.Second, 1, "denied by redis", func(r *changeRec) bool { return r.fromRedis() && !r.passed() })
			start := time.Now()
			// A pause after each key stretches the move to about a second.
			var late sync.Once
			moved, err := c.MigrateSlot(hot, to, func() {
				late.Do(func() { load.addClients(clients[4:]...) })
				time.Sleep(100 * time.Millisecond)
			})
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			time.Sleep(window) // admits of the move's windows meet later ones
			load.halt()
			res := load.result(start, limit, window)
			resent := int64(0)
			for _, l := range lims {
				resent += l.Stats().Resent
			}
			t.Logf("moved %d keys of slot %d to %s in %v; %v; %d scripts resent or split", moved, hot, to.Addr, took, res, resent)
			if o, err := c.Owner(hot); err != nil || o != to {
				t.Fatalf("slot %d is on %v (%v), want %s", hot, o, err, to.Addr)
			}
			if resent == 0 {
				t.Error("no script met ASK or TRYAGAIN: the move tested nothing")
			}
			if res.excess > 0 {
				t.Errorf("more than %d admits in a %v window: %s", limit, window, res.where)
			}
			if res.failedClosed > 0 || res.fallback > 0 {
				t.Errorf("%d requests failed closed and %d were decided by the fallback during the move, want every decision from redis", res.failedClosed, res.fallback)
			}
		})
	}
}

// otherMaster is a running master of c other than m.
func otherMaster(t *testing.T, c *testsupport.Cluster, m *testsupport.Redis) *testsupport.Redis {
	t.Helper()
	view, err := c.View()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range view {
		if r := c.Node(n.Port); r != nil && r != m && n.Is("master") && !n.Is("fail") && len(n.Slots) > 0 {
			return r
		}
	}
	t.Fatal("no other master")
	return nil
}
