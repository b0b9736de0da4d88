package redisadmin

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// The slidegate library on a Redis that goes away: functions replicate and
// persist, so a restart with persistence and a replica's promotion keep
// them, and decisions go on; a restart without persistence loses them (and
// the ACL users), and the manager's loop brings both back.

// decideOK reports whether a decision through the functions came from
// Redis.
func decideOK(l *limiter.Limiter, id string) bool {
	d := l.Decide(context.Background(), []limiter.Request{{Rule: limiter.Rule{ID: id, Limit: 1000, Window: time.Minute}, Client: "c"}})[0]
	return d.Source == limiter.SourceRedis
}

func functionsLimiter(t *testing.T, cfg redisconn.Config) *limiter.Limiter {
	t.Helper()
	l, err := limiter.New(client(t, cfg), limiter.Options{Functions: true, ProbeInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestFunctionsSurviveRestartWithPersistence(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	if _, err := newAdmin(t, redisconn.Config{Addrs: []string{r.Addr}}).Sync(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	l := functionsLimiter(t, redisconn.Config{Addrs: []string{r.Addr}})
	if !decideOK(l, "ns/persisted") {
		t.Fatal("no decision from Redis before the restart")
	}
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	// No admin since: the functions came back from the AOF.
	if took, ok := eventually(10*time.Second, func() bool { return decideOK(l, "ns/persisted") }); !ok {
		t.Fatal("decisions did not return to Redis after a restart with persistence")
	} else {
		t.Logf("decisions from Redis %v after the restart, without the manager", took)
	}
}

func TestFunctionsSurvivePromotion(t *testing.T) {
	t.Parallel()
	master := testsupport.StartRedis(t)
	replica := testsupport.StartReplica(t, master, 0)
	if _, err := newAdmin(t, redisconn.Config{Addrs: []string{master.Addr}}).Sync(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 10*time.Second, 20*time.Millisecond, "the library on the replica", func() error {
		got, err := replica.Do("FUNCTION", "LIST")
		if err == nil && !strings.Contains(got, "slidegate_decide_v1") {
			err = errMissing
		}
		return err
	})
	if err := master.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := replica.Do("REPLICAOF", "NO", "ONE"); err != nil {
		t.Fatal(err)
	}
	l := functionsLimiter(t, redisconn.Config{Addrs: []string{replica.Addr}})
	if !decideOK(l, "ns/promoted") {
		t.Fatal("the promoted replica does not decide through the functions")
	}
}

// TestFunctionsReloaded: a Redis restarted without persistence has lost
// the library and the namespace's user; the sidecar's decisions follow
// the fail mode (open here) until the manager's loop (Run, every
// interval) has loaded the one and set the other again. The time from
// the restart to the first decision from Redis is measured.
func TestFunctionsReloaded(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	a := newAdmin(t, redisconn.Config{Addrs: []string{r.Addr}})
	u, err := NamespaceIdentity("", "shop", nil, []string{"pw"})
	if err != nil {
		t.Fatal(err)
	}
	const interval = 500 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var syncs []time.Time
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Run(ctx, interval, func(context.Context) ([]User, error) { return []User{u}, nil }, func(st Status, err error) {
			if err == nil {
				mu.Lock()
				syncs = append(syncs, time.Now())
				mu.Unlock()
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	testsupport.Eventually(t, 10*time.Second, 20*time.Millisecond, "the first sync", func() error {
		if !hasUser(r, u.Name) {
			return errMissing
		}
		return nil
	})
	l := functionsLimiter(t, redisconn.Config{Addrs: []string{r.Addr}, Username: u.Name, Password: "pw"})
	if !decideOK(l, "shop/reloaded") {
		t.Fatal("no decision from Redis before the restart")
	}
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	fellBack := 0
	took, ok := eventually(20*interval, func() bool {
		if decideOK(l, "shop/reloaded") {
			return true
		}
		fellBack++
		return false
	})
	if !ok {
		t.Fatalf("decisions not from Redis %v after the restart", took)
	}
	mu.Lock()
	var firstSync time.Time
	for _, s := range syncs {
		if s.After(restarted) {
			firstSync = s
			break
		}
	}
	mu.Unlock()
	t.Logf("restart without persistence: %d decisions by the fail mode, back to Redis %v after the restart (the manager's first sync after it: %v; interval %v)",
		fellBack, took.Round(time.Millisecond), firstSync.Sub(restarted).Round(time.Millisecond), interval)
	if fellBack == 0 {
		t.Error("no decision fell back: the restart did not take the functions away")
	}
}

// eventually polls cond until it holds or d passes, and says how long it
// took.
func eventually(d time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > d {
			return time.Since(start), false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestUsersBackAtOnceAfterRestart: users set with ACL SETUSER are not kept
// by AOF (nor RDB), so every restart of a node takes the namespaces' users
// away, persistence or not, and their sidecars are refused (their fail
// mode decides) until the manager sets them again. Run watches the nodes'
// run_id every RestartWatch and does not wait for its interval: with an
// interval of a minute, decisions are Redis's again long before it. Without
// the watch they were not within half the interval (the case that fails).
func TestUsersBackAtOnceAfterRestart(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	a := newAdmin(t, redisconn.Config{Addrs: []string{r.Addr}})
	u, err := NamespaceIdentity("", "shop", nil, []string{"pw"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Sync(context.Background(), []User{u}); err != nil {
		t.Fatal(err)
	}
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	if hasUser(r, u.Name) {
		t.Fatal("the user survived a restart with AOF: the premise of the restart watch is wrong")
	}

	const interval = time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Run(ctx, interval, func(context.Context) ([]User, error) { return []User{u}, nil }, func(Status, error) {})
	}()
	t.Cleanup(func() { cancel(); <-done })
	testsupport.Eventually(t, 10*time.Second, 20*time.Millisecond, "the first pass", func() error {
		if !hasUser(r, u.Name) {
			return errMissing
		}
		return nil
	})
	l := functionsLimiter(t, redisconn.Config{Addrs: []string{r.Addr}, Username: u.Name, Password: "pw"})
	if !decideOK(l, "shop/restarted") {
		t.Fatal("no decision from Redis before the restart")
	}
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	fellBack := 0
	took, ok := eventually(interval/2, func() bool {
		if decideOK(l, "shop/restarted") {
			return true
		}
		fellBack++
		return false
	})
	if !ok {
		t.Fatalf("decisions not from Redis %v after the restart (interval %v, watch %v)", took, interval, RestartWatch)
	}
	t.Logf("restart with AOF: %d decisions by the fail mode, back to Redis %v after the restart (interval %v, watch %v)",
		fellBack, took.Round(time.Millisecond), interval, RestartWatch)
}
