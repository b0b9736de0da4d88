package limiter

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestDurableAdmits: a durable rule's admit counts once a replica has it.
// With the replica in sync, Redis decides and the replica holds the admit
// when the decision returns; with the replica gone, the admit is taken
// back and the rule's fail mode decides (ErrNotReplicated), after about
// ReplicaWait; a denial needs no replica and stays Redis's.
func TestDurableAdmits(t *testing.T) {
	t.Parallel()
	master := testsupport.StartRedis(t)
	replica := testsupport.StartReplica(t, master, 0)
	// ReplicaWait must outlast the replica's acknowledgements on this
	// machine, or "in sync" fails for a slow replica (it did, 200 ms on a
	// loaded machine): 20 times the slowest of 20 writes' acknowledgements,
	// and at least a second.
	slowest := time.Duration(0)
	for i := range 20 {
		start := time.Now()
		if _, err := master.Do("SET", "durable-probe", strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
		if n, err := master.Do("WAIT", "1", "0"); err != nil || n != "1" {
			t.Fatalf("WAIT 1 0 = %q, %v", n, err)
		}
		slowest = max(slowest, time.Since(start))
	}
	wait := max(time.Second, 20*slowest)
	t.Logf("slowest acknowledgement of 20 writes %v: ReplicaWait %v", slowest, wait)
	l := newLimiter(t, standalone(t, master.Addr), Options{ReplicaWait: wait, Timeout: 3 * wait, MaxTimeout: 3 * wait, DenyCacheMax: -1})
	rule := Rule{ID: "ns/durable", Limit: 2, Window: time.Minute, FailMode: FailClosed, Durable: true}
	key := Key(defaultPrefix, rule.ID, "c")

	if d := one(l, rule, "c"); d.Source != SourceRedis || !d.Allowed {
		t.Fatalf("with the replica in sync: %+v", d)
	}
	if n, err := replica.Do("ZCARD", key); err != nil || n != "1" {
		t.Errorf("the replica holds %q admits (%v) when the durable decision returns, want 1", n, err)
	}

	if err := replica.Kill(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	d := one(l, rule, "c")
	took := time.Since(start)
	if d.Source != SourceFailedClosed || d.Allowed || !errors.Is(d.Err, ErrNotReplicated) {
		t.Fatalf("without a replica: %+v, want failed closed with ErrNotReplicated", d)
	}
	if took < wait {
		t.Errorf("the decision without a replica took %v, want ≥ ReplicaWait %v", took, wait)
	}
	if _, ok := eventually(5*time.Second, func() bool { n, _ := master.Do("ZCARD", key); return n == "1" }); !ok {
		n, _ := master.Do("ZCARD", key)
		t.Errorf("the master holds %s admits, want 1: the unreplicated admit was not taken back", n)
	}
	if st := l.Stats(); st.NotReplicated != 1 {
		t.Errorf("Stats.NotReplicated = %d, want 1", st.NotReplicated)
	}

	// Fill the limit through a rule that is not durable: the durable
	// rule's request is then denied by Redis, which writes nothing.
	plain := rule
	plain.Durable = false
	if d := one(l, plain, "c"); d.Source != SourceRedis || !d.Allowed {
		t.Fatalf("not durable, without a replica: %+v", d)
	}
	if d := one(l, rule, "c"); d.Source != SourceRedis || d.Allowed || d.Err != nil {
		t.Errorf("a denial without a replica: %+v, want Redis's denial", d)
	}
}
