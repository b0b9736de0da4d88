package limiter

import (
	"testing"
	"time"
)

// TestClusterFailover kills (-9) the master that serves a fleet's hot key
// while three limiters drive it, on a cluster whose replicas lag by
// replicationLag (a replica across a slow link); the replica takes over
// after the node timeout, and the killed node comes back as its replica.
//
// What the replica never received is lost: admits the old master made in
// its last replicationLag. The new master admits that budget again, so
// the fleet goes over the limit by at most the admits acknowledged after
// the last replication bytes the replica got (measured at the proxy:
// testsupport.Proxy.LastDelivered), and by at least one, which shows the
// judge sees the loss. With durable admits (Rule.Durable) an admit counts
// only once a replica has it: nothing over the limit. Fail-open adds the
// fallback's admits during the failover on top of the loss.
//
// Decisions are Redis's again within the probe interval (and a decision's
// timeout) of the replica's promotion: the breaker's probe reloads the
// slot map. With durable admits, only once the new master has a replica.
func TestClusterFailover(t *testing.T) {
	cases := []struct {
		name    string
		mode    FailMode
		durable bool
	}{
		{"Closed", FailClosed, false},
		{"Closed/durable", FailClosed, true},
		{"Open", FailOpen, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := changingCluster(t)
			const limit, window = 1000, 20 * time.Second
			rule := Rule{ID: "ns/failover", Limit: limit, Window: window, FailMode: tc.mode, Durable: tc.durable}
			clients, hot := clientsInSlot("", rule.ID, 1)
			opts := Options{Prefix: uniquePrefix("fo"), Replicas: func() int { return 3 }, ReplicaWait: 4 * replicationLag}
			lims := clusterLimiters(t, c, 3, opts)
			load := &changeLoad{lims: lims, clients: clients, callers: 8, reqs: func(cl string) []Request {
				return []Request{{Rule: rule, Client: cl}}
			}}
			master, err := c.Owner(hot)
			if err != nil {
				t.Fatal(err)
			}
			proxy := c.ReplicationProxy(master)
			load.start()
			defer load.halt()
			// Half the limit before the kill, the rest after it.
			load.waitFor(t, 20*time.Second, limit/2, "admitted", (*changeRec).passed)
			kill := time.Now()
			if err := master.Kill(); err != nil {
				t.Fatal(err)
			}
			if _, ok := eventually(30*time.Second, func() bool { o, err := c.Owner(hot); return err == nil && o != master }); !ok {
				t.Fatal("no replica took over within 30 s")
			}
			promoted := time.Since(kill)
			if err := master.Restart(); err != nil {
				t.Fatal(err)
			}
			if err := c.WaitOK(30 * time.Second); err != nil {
				t.Fatal(err)
			}
			synced := time.Since(kill)
			load.waitFor(t, 15*time.Second, 1, "denied by redis after the failover", func(r *changeRec) bool {
				return r.sent.After(kill) && r.fromRedis() && !r.passed()
			})
			load.halt()
			res := load.result(kill, limit, window)
			lost := load.admittedBetween(proxy.LastDelivered(), kill)
			fallbackAdmits := load.count(func(r *changeRec) bool { return r.passed() && r.out[0].Source == SourceFallback })
			notReplicated := int64(0)
			for _, l := range lims {
				notReplicated += l.Stats().NotReplicated
			}
			t.Logf("replica promoted %v after the kill, old master back as its replica %v after; %v; admits acknowledged after the replica's last bytes: %d; fallback admits %d; durable admits taken back %d",
				promoted.Round(time.Millisecond), synced.Round(time.Millisecond), res, lost, fallbackAdmits, notReplicated)

			switch {
			case tc.durable:
				if res.excess > 0 {
					t.Errorf("durable admits: %d over the limit: %s", res.excess, res.where)
				}
			case tc.mode == FailClosed:
				if res.excess > lost {
					t.Errorf("%d admits over the limit, more than the %d the replica may have lacked: %s", res.excess, lost, res.where)
				}
				if res.excess == 0 {
					t.Errorf("nothing over the limit although the replica lacked up to %d admits: the test cannot see a loss", lost)
				}
			default:
				if bound := lost + fallbackAdmits; res.excess > bound {
					t.Errorf("%d admits over the limit, more than the %d the replica may have lacked and the fallback's %d: %s", res.excess, lost, fallbackAdmits, res.where)
				}
			}
			// A decision that began just before Redis was back may take its
			// timeout; the probe comes within its interval.
			back := promoted + defaultProbe + defaultTimeout
			if tc.durable {
				back = synced + opts.ReplicaWait + defaultTimeout
			}
			if res.back > back {
				t.Errorf("decisions Redis's again %v after the kill, want ≤ %v", res.back, back)
			}
		})
	}
}
