package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/redisadmin"
)

// credentialsSecret is the Secret the manager writes into a namespace whose
// sidecars need Redis credentials.
const credentialsSecret = "slidegate-redis-credentials"

// testCredentialsOnlyWhereOptedIn (docs/security.md, boundary 1): the demo's
// sidecars reach Redis as their namespace's own user, and a tenant who
// writes a policy in a namespace without the injection label gets neither
// a Secret nor a Redis user; labelling it gives both, and taking the label
// away takes both away again. The labelled half is the case that shows the
// check can fail: the same reads find the Secret and the user there.
func testCredentialsOnlyWhereOptedIn(ctx context.Context, t *testing.T, n *node) {
	rdb := n.redis.testClient()
	defer func() { _ = rdb.Close() }()

	// The demo's sidecars authenticate as slidegate-ns-slidegate-demo: every
	// client connection from a demo pod's address is that user's.
	want := redisadmin.NamespaceUser(demo)
	pods := demoPods(ctx, t)
	eventually(t, 30*time.Second, time.Second, "the demo's sidecars connected as "+want, func() error {
		return connectedAs(ctx, rdb, pods, want)
	})

	ns := "slidegate-not-opted-in"
	mustKubectl(ctx, t, "create", "namespace", ns)
	defer func() { _, _ = kubectl(ctx, "", "delete", "namespace", ns, "--wait=false") }()
	policy := `apiVersion: ratelimit.slidegate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: tenant}
spec:
  targetSelector: {matchLabels: {app: tenant}}
  window: 10s
  limit: 5
  key: {source: Global}
`
	if _, err := kubectl(ctx, policy, "-n", ns, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, time.Second, "the policy reconciled", func() error {
		var p v1alpha1.RateLimitPolicy
		getJSON(ctx, t, &p, "-n", ns, "get", "rlp", "tenant")
		c := meta.FindStatusCondition(p.Status.Conditions, string(v1alpha1.ConditionAccepted))
		if c == nil || c.ObservedGeneration != p.Generation {
			return fmt.Errorf("not reconciled yet: %+v", p.Status.Conditions)
		}
		return nil
	})
	// A reconcile that handed out credentials would have done so with the
	// status; the identity loop (every 10 s) gets two more passes.
	time.Sleep(25 * time.Second)
	user := redisadmin.NamespaceUser(ns)
	has := func() (secret, redisUser bool) {
		out, err := kubectl(ctx, "", "-n", ns, "get", "secret", credentialsSecret, "--ignore-not-found", "-o", "name")
		if err != nil {
			t.Fatal(err)
		}
		err = rdb.Do(ctx, "ACL", "GETUSER", user).Err()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("ACL GETUSER %s: %v", user, err)
		}
		return strings.TrimSpace(out) != "", err == nil
	}
	if s, u := has(); s || u {
		t.Fatalf("a namespace without the injection label has credentials: Secret %v, Redis user %v", s, u)
	}

	mustKubectl(ctx, t, "label", "namespace", ns, v1alpha1.InjectionLabel+"="+v1alpha1.InjectionEnabled)
	eventually(t, time.Minute, time.Second, "credentials once labelled", func() error {
		if s, u := has(); !s || !u {
			return fmt.Errorf("Secret %v, Redis user %v", s, u)
		}
		return nil
	})
	mustKubectl(ctx, t, "label", "namespace", ns, v1alpha1.InjectionLabel+"-")
	eventually(t, time.Minute, time.Second, "credentials gone with the label", func() error {
		if s, u := has(); s || u {
			return fmt.Errorf("still there: Secret %v, Redis user %v", s, u)
		}
		return nil
	})
}

// connectedAs checks that every pod of pods has a connection to Redis, and
// that all of them are user want's.
func connectedAs(ctx context.Context, rdb *redis.Client, pods []corev1.Pod, want string) error {
	list, err := rdb.ClientList(ctx).Result()
	if err != nil {
		return err
	}
	for _, p := range pods {
		users := clientUsers(list, p.Status.PodIP)
		if len(users) == 0 {
			return fmt.Errorf("no connection from pod %s (%s)", p.Name, p.Status.PodIP)
		}
		for _, u := range users {
			if u != want {
				return fmt.Errorf("pod %s connects as %q, want %q", p.Name, u, want)
			}
		}
	}
	return nil
}

// clientUsers returns the users of the connections in a CLIENT LIST reply
// that come from ip.
func clientUsers(list, ip string) []string {
	var users []string
	for _, line := range strings.Split(list, "\n") {
		var addr, user string
		for _, f := range strings.Fields(line) {
			switch k, v, _ := strings.Cut(f, "="); k {
			case "addr":
				addr = v
			case "user":
				user = v
			}
		}
		if host, _, ok := strings.Cut(addr, ":"); ok && host == ip {
			users = append(users, user)
		}
	}
	return users
}

// The users of the node's Redis (TestNode): docs/quickstart.md's, with the
// password the quickstart draws, and one more for the test's own reads
// (CLIENT LIST, ACL GETUSER, FUNCTION LIST), which the quickstart's
// administrative user may not do.
const (
	testRedisUser     = "node-test"
	testRedisPassword = "node-test-password"
)

// quickstartRedis starts the node's Redis as docs/quickstart.md sets it up
// (quickstartACL) and returns it with the administrative user's name and
// password.
func quickstartRedis(t *testing.T, n *node) (r *redisProc, adminUser, adminPassword string) {
	t.Helper()
	acl, adminUser, adminPassword := quickstartACL(t, n)
	return startRedisACL(t, n, acl), adminUser, adminPassword
}

// quickstartACL is the ACL file of docs/quickstart.md's Secret redis-acl
// (the default user off, slidegate's administrative user with the rights
// the quickstart grants), read from the document so that what users copy is
// what runs here, with a password filled in; and that user's name and
// password.
func quickstartACL(t *testing.T, n *node) (acl, adminUser, adminPassword string) {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(n.root, "docs", "quickstart.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`--from-literal=users\.acl="([^"]+)"`).FindSubmatch(doc)
	if m == nil {
		t.Fatal(`docs/quickstart.md: no --from-literal=users.acl="..." (the Redis users the quickstart sets up)`)
	}
	adminPassword = "quickstart-admin-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	acl = strings.ReplaceAll(string(m[1]), "$ADMIN_PW", adminPassword)
	for _, line := range strings.Split(acl, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] == "user" && f[1] != "default" {
			adminUser = f[1]
		}
	}
	if adminUser == "" || !strings.Contains(acl, "user default off") {
		t.Fatalf("docs/quickstart.md: the ACL file turns the default user off and names the administrative user; got:\n%s", acl)
	}
	return acl, adminUser, adminPassword
}

// startRedisACL starts the node's Redis with the users of acl and the
// test's own.
func startRedisACL(t *testing.T, n *node, acl string) *redisProc {
	t.Helper()
	acl += fmt.Sprintf("\nuser %s on >%s ~* &* +@all\n", testRedisUser, testRedisPassword)
	file := filepath.Join(t.TempDir(), "users.acl")
	if err := os.WriteFile(file, []byte(acl), 0o600); err != nil {
		t.Fatal(err)
	}
	return startRedis(t, n.ip, "--aclfile", file)
}

// testClient is the test's own connection to the node's Redis.
func (r *redisProc) testClient() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: r.addr, Username: testRedisUser, Password: testRedisPassword})
}
