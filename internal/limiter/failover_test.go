package limiter

import (
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// failoverPace paces the callers of the failover tests: 24 callers, one
// request each per 20 ms, offer at most 1200 requests a second, so that
// half the limit takes about half a second to admit and admits keep
// coming when the master fails.
const failoverPace = 20 * time.Millisecond

// behind is how many requests are decided after the replica stopped
// receiving and before the master fails (changeLoad.fallBehind): without
// durable admits, that many admits at least are lost.
const behind = 5

// failoverOptions are the limiters' options in the failover tests. No
// deny cache: a key the old master reported exhausted is then asked about
// again at once, so the new master's count shows within the test rather
// than when the cached denial expires (the same excess, later). A
// replica acknowledges within replicationLag and a round trip; four times
// that is its ReplicaWait.
func failoverOptions() Options {
	return Options{Replicas: func() int { return 3 }, DenyCacheMax: -1, ReplicaWait: max(4*replicationLag, defaultReplicaWait)}
}

// TestClusterFailover kills (-9) the master that serves a fleet's hot key
// while three limiters drive it, on a cluster whose replicas lag by
// replicationLag (a replica across a slow link) and, at the kill, has
// fallen behind by a few requests (changeLoad.fallBehind); the replica
// takes over after the node timeout, and the killed node comes back as its
// replica.
//
// What the replica never received is lost. The new master admits that
// budget again, so the fleet goes over the limit by at most the admits
// acknowledged after the last replication bytes the replica got (measured
// at the proxy: testsupport.Proxy.LastDelivered), and by at least one,
// which shows the judge sees the loss. With durable admits (Rule.Durable)
// an admit counts only once a replica has it: nothing over the limit.
// Fail-open adds the fallback's admits during the failover on top of the
// loss.
//
// Decisions are Redis's again within the probe interval (and a decision's
// timeout) of the replica's promotion: the breaker's probe reloads the
// slot map. With durable admits, only once the new master has a replica.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
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
			opts := failoverOptions()
			opts.Prefix = uniquePrefix("fo")
			lims := clusterLimiters(t, c, 3, opts)
			load := &changeLoad{lims: lims, clients: clients, callers: 8, pace: failoverPace, reqs: func(cl string) []Request {
				return []Request{{Rule: rule, Client: cl}}
			}}
			master, err := c.Owner(hot)
			if err != nil {
				t.Fatal(err)
			}
			link := c.ReplicationProxy(master)
			lastBytes := lastReplicated(link)
			load.start()
			defer load.halt()
			// Half the limit before the kill, the rest after it.
			load.waitFor(t, 20*time.Second, limit/2, "admitted", (*changeRec).passed)
			load.fallBehind(t, link, behind)
			kill := time.Now()
			if err := master.Kill(); err != nil {
				t.Fatal(err)
			}
			if link != nil {
				link.Hold(false)
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
			// The new master, with a replica again, says the limit is reached.
			load.waitFor(t, 30*time.Second, 1, "denied by redis after the failover", func(r *changeRec) bool {
				return r.sent.After(kill.Add(synced)) && r.fromRedis() && !r.passed()
			})
			load.halt()
			res := load.result(kill, limit, window)
			lost := load.admittedBetween(lastBytes(), kill)
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
				if res.excess == 0 && replicationLag > 0 {
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
			if res.back < 0 || res.back > back {
				t.Errorf("decisions Redis's again %v after the kill, want ≤ %v", res.back, back)
			}
		})
	}
}

// TestSentinelFailover fails a Sentinel's master over while three
// limiters (Sentinel clients, as three sidecars) drive a hot key; its one
// replica lags by replicationLag and, at the fault, has fallen behind by a
// few requests (changeLoad.fallBehind). SENTINEL FAILOVER promotes the replica
// while the old master still takes writes until the sentinel demotes it;
// kill -9 loses what the replica had not received, and the sentinel
// promotes it after down-after-milliseconds. Either way the fleet goes
// over the limit by at most the admits acknowledged after the replica's
// last replication bytes (and before the old master stopped taking
// writes), and by nothing with durable admits.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	// Short, but not so short that a starved sentinel or master on a busy
	// machine fails over a master that is alive.
	const downAfter = 2 * time.Second
	cases := []struct {
		name    string
		kill    bool
		durable bool
	}{
		{"SENTINEL-FAILOVER", false, false},
		{"SENTINEL-FAILOVER/durable", false, true},
		{"kill-9", true, false},
		{"kill-9/durable", true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each has its own Redis and sentinel
			master := testsupport.StartRedis(t)
			replica := testsupport.StartReplica(t, master, replicationLag)
			s := testsupport.StartSentinelWith(t, master, "m", testsupport.SentinelOptions{DownAfter: downAfter})
			if err := s.WaitReplicas("m", 1, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			const limit, window = 1000, 20 * time.Second
			rule := Rule{ID: "ns/sentinel", Limit: limit, Window: window, FailMode: FailClosed, Durable: tc.durable}
			opts := failoverOptions()
			var lims []*Limiter
			for range 3 {
				lims = append(lims, newLimiter(t, client(t, redisconn.Config{Mode: redisconn.Sentinel, Addrs: []string{s.Addr}, MasterName: "m"}), opts))
			}
			load := &changeLoad{lims: lims, clients: []string{"hot"}, callers: 8, pace: failoverPace, reqs: func(cl string) []Request {
				return []Request{{Rule: rule, Client: cl}}
			}}
			load.start()
			defer load.halt()
			load.waitFor(t, 20*time.Second, limit/2, "admitted", (*changeRec).passed)
			load.fallBehind(t, replica.Link, behind)
			fault := time.Now()
			if tc.kill {
				if err := master.Kill(); err != nil {
					t.Fatal(err)
				}
			} else if _, err := s.Do("SENTINEL", "FAILOVER", "m"); err != nil {
				t.Fatal(err)
			}
			// Not counted: time the sentinel spends in TILT (Sentinel.Await).
			tiltPromote, ok := s.Await(30*time.Second, func() bool { a, err := s.Master("m"); return err == nil && a == replica.Addr })
			if !ok {
				t.Fatalf("the sentinel did not promote the replica within 30 s (and %v in TILT)", tiltPromote)
			}
			promoted := time.Since(fault)
			if tc.kill {
				// Back, it starts as a replica of the master the sentinel
				// names, as a Redis pod's start script does.
				host, port, _ := strings.Cut(replica.Addr, ":")
				if err := master.RestartWith("--replicaof", host, port); err != nil {
					t.Fatal(err)
				}
			}
			// SENTINEL FAILOVER leaves the old master up: it takes writes
			// until the sentinel makes it a replica of the new one.
			tiltDemote, ok := s.Await(30*time.Second, func() bool {
				info, err := master.Do("INFO", "replication")
				return err == nil && strings.Contains(info, "role:slave") && strings.Contains(info, "master_link_status:up")
			})
			if !ok {
				t.Fatalf("the old master did not become a replica in sync within 30 s (and %v in TILT)", tiltDemote)
			}
			if tilt := tiltPromote + tiltDemote; tilt > 0 {
				t.Logf("the sentinel was in TILT for %v (its event loop stalled for more than 2 s); that time was not counted", tilt.Round(time.Millisecond))
			}
			demoted := time.Since(fault)
			// Only the new master takes writes now: it says the limit is
			// reached.
			load.waitFor(t, 20*time.Second, 1, "denied by redis after the failover", func(r *changeRec) bool {
				return r.sent.After(fault.Add(demoted)) && r.fromRedis() && !r.passed()
			})
			load.halt()
			res := load.result(fault, limit, window)
			// Sent before the old master stopped taking writes: a bound
			// that also counts what the new master decided meanwhile.
			writable := fault
			if !tc.kill {
				writable = fault.Add(demoted)
			}
			lost := load.admittedBetween(lastReplicated(replica.Link)(), writable)
			t.Logf("replica promoted %v after the fault, old master its replica in sync %v after; %v; admits acknowledged after the replica's last bytes: %d",
				promoted.Round(time.Millisecond), demoted.Round(time.Millisecond), res, lost)
			if tc.durable {
				if res.excess > 0 {
					t.Errorf("durable admits: %d over the limit: %s", res.excess, res.where)
				}
				return
			}
			if res.excess > lost {
				t.Errorf("%d admits over the limit, more than the %d the replica may have lacked: %s", res.excess, lost, res.where)
			}
			if res.excess == 0 && replicationLag > 0 {
				t.Errorf("nothing over the limit although the replica lacked up to %d admits: the test cannot see a loss", lost)
			}
			// The client asks the sentinels for the master on each dial.
			if back := promoted + defaultProbe + defaultTimeout; res.back < 0 || res.back > back {
				t.Errorf("decisions Redis's again %v after the fault, want ≤ %v", res.back, back)
			}
		})
	}
}

// lastReplicated returns when the master behind link sent the newest
// replication bytes the replica got, for the bound on what a failover
// loses. Without a link (replicationLag 0) nothing is measured: it returns
// the zero time, and every admit counts towards the bound.
func lastReplicated(link *testsupport.Proxy) func() time.Time {
	return func() time.Time {
		if link == nil {
			return time.Time{}
		}
		return link.LastDelivered()
	}
}
