package redisadmin

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// setAdmin creates the administrative user name with rules on r.
func setAdmin(t *testing.T, r *testsupport.Redis, name string, rules []string) {
	t.Helper()
	args := append([]string{"ACL", "SETUSER", name, "reset", "on", ">admin-pw"}, rules...)
	if _, err := r.Do(args...); err != nil {
		t.Fatal(err)
	}
}

// TestLeastPrivilegeAdmin: an administrative identity with
// AdminACLRules only (what docs/operations.md tells the platform team to
// create) administers a standalone Redis and the 3+3 Cluster: the library, the users set and a stale one deleted.
// Its pair: without any one of the rules Sync needs here, Sync fails, so
// the list is not merely sufficient by being broad.
func TestLeastPrivilegeAdmin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sync := func(t *testing.T, r *testsupport.Redis, rules []string) error {
		t.Helper()
		setAdmin(t, r, "slidegate-admin", rules)
		// A stale managed user, for ACL DELUSER.
		if _, err := r.Do("ACL", "SETUSER", "slidegate-ns-gone", "on", ">pw"); err != nil {
			t.Fatal(err)
		}
		a := newAdmin(t, redisconn.Config{Addrs: []string{r.Addr}, Username: "slidegate-admin", Password: "admin-pw"})
		st, err := a.Sync(ctx, users(t, "shop"))
		if err == nil && len(st.Nodes) != 1 {
			t.Errorf("status %+v", st)
		}
		return err
	}
	t.Run("standalone", func(t *testing.T) {
		r := testsupport.StartRedis(t)
		if err := sync(t, r, AdminACLRules()); err != nil {
			t.Fatalf("Sync with the least-privilege admin: %v", err)
		}
		if !hasUser(r, "slidegate-ns-shop") || hasUser(r, "slidegate-ns-gone") {
			t.Error("users not as desired")
		}
		if got, err := r.Do("FUNCTION", "LIST"); err != nil || !strings.Contains(got, "slidegate_decide_v1") {
			t.Errorf("library: %q %v", got, err)
		}
	})
	for _, drop := range []string{"+acl|setuser", "+acl|deluser", "+acl|users", "+function|load", "+function|list", "+info"} {
		t.Run("without "+drop, func(t *testing.T) {
			var rules []string
			for _, r := range AdminACLRules() {
				if r != drop {
					rules = append(rules, r)
				}
			}
			if err := sync(t, testsupport.StartRedis(t), rules); err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Errorf("Sync without %s: %v, want NOPERM", drop, err)
			}
		})
	}

	t.Run("cluster", func(t *testing.T) {
		c := sharedCluster(t)
		name := "slidegate-admin-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		for _, n := range c.Nodes {
			setAdmin(t, n, name, AdminACLRules())
		}
		a := newAdmin(t, redisconn.Config{Mode: redisconn.Cluster, Addrs: c.Addrs()[:1], Username: name, Password: "admin-pw"})
		ns := "lp-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		st, err := a.Apply(ctx, users(t, ns), nil)
		if err != nil {
			t.Fatalf("Apply with the least-privilege admin: %v", err)
		}
		if len(st.Nodes) != len(c.Nodes) {
			t.Errorf("found %d of %d nodes", len(st.Nodes), len(c.Nodes))
		}
		for _, n := range c.Nodes {
			if !hasUser(n, NamespaceUser(ns)) {
				t.Errorf("node %s lacks the user", n.Addr)
			}
		}
		if _, err := a.Apply(ctx, nil, []string{NamespaceUser(ns)}); err != nil {
			t.Fatal(err)
		}
	})
}
