package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestACLUser: the limiter works as an ACL user restricted to its key
// prefix (which also proves that every key a script touches is declared),
// and a wrong password sends decisions to the fallback with the error.
func TestACLUser(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	if _, err := r.Do(append([]string{"ACL", "SETUSER", "limiter", "on", ">s3cret"}, redisschema.ACLRules("")...)...); err != nil {
		t.Fatal(err)
	}
	good := newLimiter(t, client(t, redisconn.Config{Addrs: []string{r.Addr}, Username: "limiter", Password: "s3cret"}), Options{})
	rule := Rule{ID: "ns/acl", Limit: 2, Window: time.Minute}
	reqs := []Request{{Rule: rule, Client: "c"}, {Rule: Rule{ID: "ns/acl2", Limit: 5, Window: time.Minute, Algorithm: SlidingWindowCounter}, Client: "c"}}
	for i := range 3 {
		ds := good.Decide(context.Background(), reqs)
		for _, d := range ds {
			if d.Source != SourceRedis || d.Err != nil {
				t.Fatalf("decision %d as ACL user: %+v", i, d)
			}
		}
	}
	// Peek (the sidecar's /debug/why) runs as the same user.
	for _, r := range []Rule{rule, reqs[1].Rule} {
		if w, err := good.Peek(context.Background(), r, "c"); err != nil || w.Count == 0 {
			t.Fatalf("Peek of %s as ACL user: %+v, %v", r.ID, w, err)
		}
	}
	// The scripts' commands are checked too: without ZADD the user fails.
	if _, err := r.Do("ACL", "SETUSER", "limiter", "-zadd"); err != nil {
		t.Fatal(err)
	}
	if d := one(good, Rule{ID: "ns/acl3", Limit: 2, Window: time.Minute}, "c"); d.Source != SourceFallback || d.Err == nil {
		t.Fatalf("without +zadd: %+v", d)
	}
	bad := newLimiter(t, client(t, redisconn.Config{Addrs: []string{r.Addr}, Username: "limiter", Password: "wrong"}), Options{})
	d := one(bad, rule, "c")
	if d.Source != SourceFallback || d.Err == nil {
		t.Fatalf("wrong password: %+v", d)
	}
	t.Logf("wrong password: %v", d.Err)
}
