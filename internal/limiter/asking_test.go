package limiter

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
)

// TestFunctionIdentityFollowsASK: a namespace's own identity
// (FunctionACLRules) decides through a slot that is moving: the key has
// left for the importing node, the old owner answers ASK, and the Cluster
// client sends ASKING before the FCALL there. Without +asking in the rules
// that ASKING is NOPERM and every decision on a moving slot went by the
// fail mode for as long as the reshard took.
func TestFunctionIdentityFollowsASK(t *testing.T) {
	c := changingCluster(t)
	loadLibrary(t, clusterClient(t, c))
	ns := "ask" + strconv.FormatInt(time.Now().UnixNano(), 36)
	user := "test-ns-" + ns
	setuser := append([]string{"ACL", "SETUSER", user, "reset", "on", ">pw"}, redisschema.FunctionACLRules(redisschema.KeyPatterns("", ns, nil, ""))...)
	for _, n := range c.Nodes {
		if _, err := n.Do(setuser...); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, n := range c.Nodes {
			_, _ = n.Do("ACL", "DELUSER", user)
		}
	})

	rdb := client(t, redisconn.Config{Mode: redisconn.Cluster, Addrs: c.Addrs(), Username: user, Password: "pw"})
	l := newLimiter(t, rdb, Options{Functions: true, Timeout: 5 * time.Second, DenyCacheMax: -1})
	rule := Rule{ID: ns + "/p", Limit: 100, Window: time.Minute}
	decide := func() Decision {
		return l.Decide(context.Background(), []Request{{Rule: rule, Client: "c"}})[0]
	}
	if d := decide(); d.Source != SourceRedis || !d.Allowed {
		t.Fatalf("before the migration: %+v", d)
	}
	key := Key("", rule.ID, "c")
	from, err := c.Owner(redisschema.Slot(key))
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.StartMigration(redisschema.Slot(key), otherMaster(t, c, from))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := m.MoveAll(nil); err != nil {
			t.Error(err)
		}
		if err := m.Finish(); err != nil {
			t.Error(err)
		}
	}()
	if _, err := m.MoveAll(nil); err != nil {
		t.Fatal(err)
	}
	if d := decide(); d.Source != SourceRedis || !d.Allowed || d.Remaining != rule.Limit-2 {
		t.Errorf("with the key on the importing node (ASK): %+v", d)
	}
}
