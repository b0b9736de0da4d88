package sidecar

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestRunOnRedisCluster runs two sidecar processes (Run, as cmd/sidecar
// does) against a real 3-master Redis Cluster. A request under two policies
// touches two keys that live in different slots, so the limiter decides it
// in two scripts and undoes the admit of one when the other denies: the
// limit must still be exact and a rejected request must leave no entry.
func TestRunOnRedisCluster(t *testing.T) {
	if _, err := testsupport.RedisCLIPath(); err != nil {
		testsupport.Missing(t, "redis-cli", err)
	}
	if _, err := testsupport.RedisServerPath(); err != nil {
		testsupport.Missing(t, "redis-server", err)
	}
	cl, err := testsupport.NewCluster(3)
	if err != nil {
		t.Fatalf("starting a Redis Cluster: %v", err)
	}
	t.Cleanup(cl.Close)

	const prefix, limit = "cl:", 30
	global := redisschema.Key(prefix, testNamespace+"/global", keyGlobal)
	// userOutside is a user, named from base, whose per-user key is in
	// another slot than the global key, and that key.
	userOutside := func(base string) (string, string) {
		t.Helper()
		for i := range 100 {
			u := fmt.Sprintf("%s-%d", base, i)
			k := redisschema.Key(prefix, testNamespace+"/per-user", hashKey(keyPrefixHeader, u))
			if keySlot(t, cl, k) != keySlot(t, cl, global) {
				return u, k
			}
		}
		t.Fatalf("no %s key outside the global key's slot", base)
		return "", ""
	}
	user, userKey := userOutside("user")

	up := newUpstream(t)
	cfg := newVolume(t)
	cfg.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t, testConfig(nil,
		testPolicy("global", limit),
		testPolicy("per-user", 5, withKey("Header", "X-User", "Allow")),
	))})
	var fronts []string
	for range 2 {
		o := testOptions(up.URL, cfg, nil)
		o.Redis.Mode = redisconn.Cluster
		o.Redis.Addrs = cl.Addrs()[:1] // one seed: the client discovers the rest
		o.KeyPrefix = prefix
		o.DecisionTimeout = exactTimeout
		front, _ := startRun(t, o, testLogger(t))
		fronts = append(fronts, front)
	}

	send := func(n int, header map[string]string) map[int]int {
		var mu sync.Mutex
		counts := map[int]int{}
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				req, _ := http.NewRequest("GET", fronts[i%len(fronts)]+"/", nil)
				for k, v := range header {
					req.Header.Set(k, v)
				}
				code := 0
				if resp, err := http.DefaultClient.Do(req); err == nil {
					code = resp.StatusCode
					drain(resp)
				}
				mu.Lock()
				counts[code]++
				mu.Unlock()
			})
		}
		wg.Wait()
		return counts
	}

	// The user's budget first: 5 of 8 admitted, and each admit also counts
	// in the global budget (two slots, one request).
	if got := send(8, map[string]string{"X-User": user}); got[200] != 5 || got[429] != 3 {
		t.Fatalf("user %s: statuses %v, want 5×200 and 3×429", user, got)
	}
	// Anonymous traffic takes the rest of the global budget, exactly.
	if got := send(100, nil); got[200] != limit-5 || got[429] != 100-(limit-5) {
		t.Fatalf("anonymous: statuses %v, want exactly %d admitted", got, limit-5)
	}
	if n := up.hits.Load(); n != limit {
		t.Fatalf("the app saw %d requests, want %d", n, limit)
	}
	if n := clusterDo(t, cl, "ZCARD", global); n != fmt.Sprint(limit) {
		t.Errorf("global key holds %s entries, want %d", n, limit)
	}

	// A second user, under their own limit but rejected by the spent
	// global policy: their per-user admits must be undone on the other slot.
	other, otherKey := userOutside("other")
	if got := send(4, map[string]string{"X-User": other}); got[429] != 4 {
		t.Fatalf("user %s after the global budget is spent: statuses %v, want 4×429", other, got)
	}
	if n := clusterDo(t, cl, "ZCARD", otherKey); n != "0" {
		t.Errorf("per-user key of %s holds %s entries after only rejections, want 0 (admits undone across slots)", other, n)
	}
	if n := clusterDo(t, cl, "ZCARD", userKey); n != "5" {
		t.Errorf("per-user key of %s holds %s entries, want 5", user, n)
	}
	if n := up.hits.Load(); n != limit {
		t.Errorf("the app saw %d requests, want still %d", n, limit)
	}
}

// keySlot is the cluster's slot of key (CLUSTER KEYSLOT).
func keySlot(t *testing.T, cl *testsupport.Cluster, key string) string {
	t.Helper()
	s, err := cl.Nodes[0].Do("CLUSTER", "KEYSLOT", key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// clusterDo runs a one-key command on the master that serves key.
func clusterDo(t *testing.T, cl *testsupport.Cluster, cmd, key string) string {
	t.Helper()
	for _, n := range cl.Nodes {
		out, err := n.Do(cmd, key)
		if err == nil {
			return out
		}
	}
	t.Fatalf("%s %s: no node served the key", cmd, key)
	return ""
}
