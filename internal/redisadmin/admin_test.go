package redisadmin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

func TestParseClusterNodes(t *testing.T) {
	out := strings.Join([]string{
		"a1 127.0.0.1:7001@17001,node1 myself,master - 0 0 1 connected 0-5460",
		"b2 127.0.0.1:7002@17002 slave a1 0 1 1 connected",
		"c3 :7003@17003 master - 0 1 2 connected 5461-10922",
		"d4 :0@0 master,noaddr - 0 1 3 disconnected",
		"e5 127.0.0.9:7005@17005 handshake - 0 0 0 connected",
	}, "\n")
	want := []string{"127.0.0.1:7001", "127.0.0.1:7002", "10.0.0.1:7003"}
	slices.Sort(want)
	if got := parseClusterNodes(out, "10.0.0.1:7001"); !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestPasswords: derived from the install key, per user, binding and
// epoch; with a rotation period the previous epoch's password stays valid
// beside the current one, so a sidecar that has not seen the new one yet
// connects.
func TestPasswords(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	now := time.Unix(1_000_000, 0)
	p, valid := Passwords(key, "slidegate-ns-shop", "uid-1", 0, now)
	if len(valid) != 1 || valid[0] != p || len(p) < 40 {
		t.Fatalf("without rotation: %q %q", p, valid)
	}
	for _, tc := range []struct {
		name          string
		key           []byte
		user, binding string
		at            time.Time
		wantSame      bool
	}{
		{"later, without rotation", key, "slidegate-ns-shop", "uid-1", now.Add(1000 * time.Hour), true},
		{"another user", key, "slidegate-ns-other", "uid-1", now, false},
		{"another install key", []byte("another install key, 32 bytes.."), "slidegate-ns-shop", "uid-1", now, false},
		// A namespace deleted and created again under its name: its
		// former holders' password is refused.
		{"another incarnation", key, "slidegate-ns-shop", "uid-2", now, false},
		{"no binding (before bindings)", key, "slidegate-ns-shop", "", now, false},
	} {
		if q, _ := Passwords(tc.key, tc.user, tc.binding, 0, tc.at); (q == p) != tc.wantSame {
			t.Errorf("%s: same password %v, want %v", tc.name, q == p, tc.wantSame)
		}
	}
	// The label keeps a binding from forging a v1 input ("user\x00epoch").
	if q, _ := Passwords(key, "u", "", 0, now); q == password(key, "u", "0", 0) {
		t.Error("a binding gives the v1 password")
	}
	const period = time.Hour
	cur, valid := Passwords(key, "u", "b", period, now)
	next := NextRotation(period, now)
	if !next.After(now) || next.Sub(now) > period {
		t.Fatalf("next rotation %v after %v", next, now)
	}
	after, validAfter := Passwords(key, "u", "b", period, next)
	if after == cur || len(validAfter) != 2 || validAfter[1] != cur || len(valid) != 2 {
		t.Errorf("rotation: before %q %q, after %q %q", cur, valid, after, validAfter)
	}
}

func TestNamespaceIdentityRefusesRLS(t *testing.T) {
	if _, err := NamespaceIdentity("", RLSScope, nil, []string{"p"}); err == nil || !strings.Contains(err.Error(), "rate limit service") {
		t.Fatalf("namespace rls: %v", err)
	}
	u, err := NamespaceIdentity("", "shop", []string{"shop/a"}, []string{"p"})
	if err != nil || u.Name != "slidegate-ns-shop" || !slices.Contains(u.Rules, "~slidegate:{shop/*") {
		t.Fatalf("namespace shop: %+v, %v", u, err)
	}
}

// users are identities of the namespaces ns, with password "pw-<ns>".
func users(t *testing.T, ns ...string) []User {
	t.Helper()
	var out []User
	for _, n := range ns {
		u, err := NamespaceIdentity("", n, nil, []string{"pw-" + n})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	return out
}

func newAdmin(t *testing.T, cfg redisconn.Config) *Admin {
	t.Helper()
	a, err := New(Options{Redis: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

// hasUser reports whether the server at r has user name, enabled.
func hasUser(r *testsupport.Redis, name string) bool {
	got, err := r.Do("ACL", "GETUSER", name)
	return err == nil && strings.Contains(got, "\non\n")
}

// TestSyncStandalone: Sync sets the users and loads the library; deletes
// the managed users it was not given (closing their connections), and
// leaves every other user; after a restart that lost both (no
// persistence: another run_id), it sets them up again.
func TestSyncStandalone(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	ctx := context.Background()
	for _, u := range []string{"slidegate-ns-gone", "someone-else"} {
		if _, err := r.Do("ACL", "SETUSER", u, "on", ">pw", "~*", "+@all"); err != nil {
			t.Fatal(err)
		}
	}
	gone, err := redisconn.NewClient(redisconn.Config{Addrs: []string{r.Addr}, Username: "slidegate-ns-gone", Password: "pw", PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = gone.Close() }()
	if err := gone.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	a := newAdmin(t, redisconn.Config{Addrs: []string{r.Addr}})
	st, err := a.Sync(ctx, users(t, "a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Nodes) != 1 || !st.Nodes[0].Master || !st.Nodes[0].Restarted || st.Nodes[0].Library != redisschema.LibraryLoaded || !st.Nodes[0].Unauthenticated {
		t.Errorf("first sync: %+v", st)
	}
	for name, want := range map[string]bool{"slidegate-ns-a": true, "slidegate-ns-b": true, "slidegate-ns-gone": false, "someone-else": true} {
		if got := hasUser(r, name); got != want {
			t.Errorf("user %s: present %v, want %v", name, got, want)
		}
	}
	if err := gone.Ping(ctx).Err(); err == nil {
		t.Error("the deleted user's connection still works")
	}
	if err := a.applyErr(ctx, nil, []string{"slidegate-ns-b", "someone-else"}); err != nil {
		t.Fatal(err)
	}
	if hasUser(r, "slidegate-ns-b") || !hasUser(r, "someone-else") {
		t.Error("Apply removed the wrong users")
	}

	st, err = a.Sync(ctx, users(t, "a"))
	if err != nil || st.Nodes[0].Restarted || st.Nodes[0].Library != redisschema.LibraryCurrent {
		t.Fatalf("second sync: %+v, %v", st, err)
	}
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	st, err = a.Sync(ctx, users(t, "a"))
	if err != nil || !st.Nodes[0].Restarted || st.Nodes[0].Library != redisschema.LibraryLoaded || !hasUser(r, "slidegate-ns-a") {
		t.Fatalf("after a restart without persistence: %+v, %v", st, err)
	}
}

// Apply returns an error only (the status is for Sync's callers).
func (a *Admin) applyErr(ctx context.Context, set []User, remove []string) error {
	_, err := a.Apply(ctx, set, remove)
	return err
}

// TestSyncCluster: on a Cluster every node — masters and replicas, since
// ACLs are not replicated — gets the users, and every master the library
// (which its replica has by replication).
// Not parallel: the other tests on the shared cluster would lose their
// users to Sync.
func TestSyncCluster(t *testing.T) {
	c := sharedCluster(t)
	a := newAdmin(t, redisconn.Config{Mode: redisconn.Cluster, Addrs: c.Addrs()[:1]})
	ns := "cluster-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	st, err := a.Sync(context.Background(), users(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	masters := 0
	for _, n := range st.Nodes {
		if n.Master {
			masters++
		}
	}
	if len(st.Nodes) != len(c.Nodes) || masters != 3 {
		t.Fatalf("sync found %d nodes (%d masters): %+v", len(st.Nodes), masters, st)
	}
	for _, n := range c.Nodes {
		if !hasUser(n, NamespaceUser(ns)) {
			t.Errorf("node %s lacks the user", n.Addr)
		}
		testsupport.Eventually(t, 10*time.Second, 20*time.Millisecond, "the library on "+n.Addr, func() error {
			got, err := n.Do("FUNCTION", "LIST", "LIBRARYNAME", redisschema.LibraryName)
			if err == nil && !strings.Contains(got, "slidegate_decide_v1") {
				err = errMissing
			}
			return err
		})
	}
	if err := a.applyErr(context.Background(), nil, []string{NamespaceUser(ns)}); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		if hasUser(n, NamespaceUser(ns)) {
			t.Errorf("node %s still has the removed user", n.Addr)
		}
	}
}

var errMissing = errors.New("the library is missing")

// TestSyncSentinel: through the sentinels, the master and its replicas
// get the users, the master the library.
func TestSyncSentinel(t *testing.T) {
	t.Parallel()
	master := testsupport.StartRedis(t)
	replica := testsupport.StartReplica(t, master, 0)
	s := testsupport.StartSentinel(t, master, "mymaster", "")
	if err := s.WaitReplicas("mymaster", 1, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	a := newAdmin(t, redisconn.Config{Mode: redisconn.Sentinel, Addrs: []string{s.Addr}, MasterName: "mymaster"})
	// A replica the sentinel has not connected to yet ("disconnected") is
	// left for the next Sync.
	testsupport.Eventually(t, 20*time.Second, 50*time.Millisecond, "Sync finds the master and the replica", func() error {
		st, err := a.Sync(context.Background(), users(t, "shop"))
		if err == nil && len(st.Nodes) != 2 {
			err = fmt.Errorf("sync found %+v", st)
		}
		return err
	})
	for _, n := range []*testsupport.Redis{master, replica.Redis} {
		if !hasUser(n, "slidegate-ns-shop") {
			t.Errorf("%s lacks the user", n.Addr)
		}
	}
}

// TestUnauthenticated: a Redis whose default user needs no password is
// reported; one with requirepass is not, and is administered with the
// credentials of a mounted Secret.
func TestUnauthenticated(t *testing.T) {
	t.Parallel()
	open := testsupport.StartRedis(t)
	closed := testsupport.StartRedis(t)
	if _, err := closed.Do("CONFIG", "SET", "requirepass", "admin-secret"); err != nil {
		t.Fatal(err)
	}
	vol := testsupport.NewSecretVolume(t)
	vol.Set(t, map[string]string{redisconn.CredentialsPasswordFile: "admin-secret"})
	for _, tc := range []struct {
		name string
		cfg  redisconn.Config
		want bool
	}{
		{"open", redisconn.Config{Addrs: []string{open.Addr}}, true},
		{"requirepass", redisconn.Config{Addrs: []string{closed.Addr}, CredentialsDir: vol.Dir}, false},
	} {
		st, err := newAdmin(t, tc.cfg).Sync(context.Background(), users(t, "shop"))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := len(st.Unauthenticated()) > 0; got != tc.want {
			t.Errorf("%s: unauthenticated %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestRunDoesNotUndoAnApply: a namespace's user set up by Apply (a
// reconcile) while a pass of Run is deciding what it wants is not deleted
// by that pass. Here the pass's state is older than the Apply (desired
// returns no user, as the controller's cache did a moment before); Run
// asks desired while holding the lock, so the Apply waits for the pass.
// Before, desired was asked before the lock: the Apply went through while
// it ran, and the pass then deleted the user as stale (its sidecars were
// refused until the next pass, 10 s by default).
func TestRunDoesNotUndoAnApply(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	a := newAdmin(t, redisconn.Config{Addrs: []string{r.Addr}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	u := users(t, "new")
	applied := make(chan error, 1)
	first := true
	desired := func(context.Context) ([]User, error) {
		if first {
			first = false
			go func() {
				_, err := a.Apply(ctx, u, nil)
				applied <- err
			}()
			// Long enough for the Apply to finish when nothing holds it
			// back (it takes a few ms); with the lock held, it waits.
			select {
			case err := <-applied:
				applied <- err
			case <-time.After(time.Second):
			}
		}
		return nil, nil // the state from before the Apply
	}
	passes := make(chan struct{}, 10)
	go a.Run(ctx, time.Hour, desired, func(Status, error) { passes <- struct{}{} })
	<-passes
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
	if !hasUser(r, u[0].Name) {
		t.Error("the pass deleted the user an Apply had just set up")
	}
}
