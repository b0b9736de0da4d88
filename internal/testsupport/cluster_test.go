package testsupport

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestClusterFailoverAndLag checks the cluster helpers on a 3+3 cluster
// whose replicas lag by 200 ms: a write is on the replica only after the
// lag; a master killed right after a write loses it to the replica that
// takes over; the killed node comes back as a replica.
func TestClusterFailoverAndLag(t *testing.T) {
	t.Parallel()
	const lag = 200 * time.Millisecond
	c, err := NewClusterWith(ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: time.Second, ReplicationDelay: lag})
	if err != nil {
		if _, e := RedisServerPath(); e != nil {
			Missing(t, "redis-server", e)
		}
		t.Fatal(err)
	}
	defer c.Close()
	const key = "{lag}k"
	slot := 0
	if s, err := c.Nodes[0].Do("CLUSTER", "KEYSLOT", key); err == nil {
		slot, _ = strconv.Atoi(s)
	}
	master, err := c.Owner(slot)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := c.ReplicasOf(master)
	if err != nil || len(reps) != 1 {
		t.Fatalf("replicas of %s: %v %v", master.Addr, reps, err)
	}
	replica := reps[0]
	if _, err := master.Do("SET", key, "1"); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	if v, err := replica.ReadReplica("EXISTS", key); err != nil || v != "0" {
		t.Errorf("EXISTS on the replica at once: %q %v, want 0 (the write %v later)", v, err, lag)
	}
	for {
		if n, _ := replica.ReadReplica("EXISTS", key); n == "1" {
			break
		}
		if time.Since(written) > 10*lag {
			t.Fatal("the write never reached the replica")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := time.Since(written); got < lag {
		t.Errorf("the write reached the replica after %v, want ≥ %v", got, lag)
	}

	if _, err := master.Do("SET", key, "2"); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := master.Kill(); err != nil {
		t.Fatal(err)
	}
	for {
		if o, err := c.Owner(slot); err == nil && o == replica {
			break
		}
		if time.Since(killed) > 30*time.Second {
			t.Fatal("no failover within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("replica took over %v after the kill", time.Since(killed))
	// Events shows what a test's failure message needs: who saw the
	// master fail, and the failover.
	if ev := c.Events(); !strings.Contains(ev, "as failing") || !strings.Contains(ev, "ailover") {
		t.Errorf("the nodes' events after a failover:\n%s\nwant a node marked failing and a failover", ev)
	}
	// The cluster names the new master before that node counts the cluster
	// up again (its own state is updated on its next cron, 100 ms, longer
	// on a starved machine): until then it answers CLUSTERDOWN.
	v, err := replica.Do("GET", key)
	for err != nil && strings.HasPrefix(err.Error(), "CLUSTERDOWN") && time.Since(killed) < 30*time.Second {
		time.Sleep(20 * time.Millisecond)
		v, err = replica.Do("GET", key)
	}
	if err != nil || v != "1" {
		t.Errorf("the new master has %q (%v), want the write the old one held back, 1", v, err)
	}
	if err := master.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitOK(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if reps, err := c.ReplicasOf(replica); err != nil || len(reps) != 1 || reps[0] != master {
		t.Errorf("the killed master did not come back as the replica: %v %v", reps, err)
	}
}
