package sidecar

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestPeersDivideTheFallback: three sidecars count themselves through
// Redis (no replica count in their config), so when Redis dies each admits
// ceil(30/3) = 10 of a fail-open limit of 30, and a sidecar that stops
// announcing drops out of the count. Without the count (the naive case)
// each admits the whole limit: 90.
func TestPeersDivideTheFallback(t *testing.T) {
	const limit = 30
	run := func(t *testing.T, announce bool) (admitted int) {
		r := testsupport.StartRedis(t)
		f := newFleet(t, []enforce.Decider{
			redisLimiter(t, r, 1, exactTimeout), redisLimiter(t, r, 1, exactTimeout), redisLimiter(t, r, 1, exactTimeout),
		}, testConfig(nil, testPolicy("global", limit)))
		if announce {
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			for _, s := range f.sidecars {
				s.opts.PeerInterval = 100 * time.Millisecond
				go s.announceLoop(ctx, s.lim.(announcer))
			}
			eventually(t, 5*time.Second, "each sidecar counting 3", func() bool {
				for _, s := range f.sidecars {
					if s.peerCount(testNamespace+"/global") != 3 {
						return false
					}
				}
				return true
			})
		}
		// The metric says the share each sidecar falls back to.
		want := 1 // --fallback-replicas
		if announce {
			want = 3
		}
		for _, s := range f.sidecars {
			exp := fmt.Sprintf("# HELP %[1]s %[2]s\n# TYPE %[1]s gauge\n%[1]s{policy=\"global\"} %[3]d\n", replicasMetric, replicasHelp(t, s), want)
			if err := testutil.GatherAndCompare(s.metrics.reg, strings.NewReader(exp), replicasMetric); err != nil {
				t.Error(err)
			}
		}
		if err := r.Kill(); err != nil {
			t.Fatal(err)
		}
		for _, n := range f.admitEach(t, 2*limit) {
			admitted += n
		}
		return admitted
	}
	t.Run("counted through Redis", func(t *testing.T) {
		admitted := run(t, true)
		if admitted != limit {
			t.Errorf("three sidecars admitted %d on their own, want ceil(%d/3) each = %d", admitted, limit, limit)
		}
	})
	t.Run("naive: no count", func(t *testing.T) {
		if admitted := run(t, false); admitted != 3*limit {
			t.Errorf("uncounted sidecars admitted %d, want %d: this case cannot fail", admitted, 3*limit)
		}
	})
}

// TestPeerCountFollowsTheFleet: a sidecar that stops announcing (its pod
// is gone) leaves the others' count within three intervals.
func TestPeerCountFollowsTheFleet(t *testing.T) {
	r := testsupport.StartRedis(t)
	f := newFleet(t, []enforce.Decider{redisLimiter(t, r, 1, exactTimeout), redisLimiter(t, r, 1, exactTimeout)},
		testConfig(nil, testPolicy("global", 10)))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	gone, goneCancel := context.WithCancel(ctx)
	for i, s := range f.sidecars {
		s.opts.PeerInterval = 100 * time.Millisecond
		c := ctx
		if i == 1 {
			c = gone
		}
		go s.announceLoop(c, s.lim.(announcer))
	}
	id := testNamespace + "/global"
	eventually(t, 5*time.Second, "two sidecars counted", func() bool { return f.sidecars[0].peerCount(id) == 2 })
	goneCancel()
	start := time.Now()
	eventually(t, 5*time.Second, "the gone sidecar dropped", func() bool { return f.sidecars[0].peerCount(id) == 1 })
	t.Logf("count went from 2 to 1 %v after a sidecar stopped announcing (ttl 300 ms)", time.Since(start).Round(time.Millisecond))
}

const replicasMetric = "slidegate_sidecar_policy_replicas"

// replicasHelp is the help text of replicasMetric as s registers it.
func replicasHelp(t *testing.T, s *Sidecar) string {
	t.Helper()
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == replicasMetric {
			return mf.GetHelp()
		}
	}
	t.Fatalf("%s not registered", replicasMetric)
	return ""
}

// TestFleetStartingTogether: three sidecars that start 300 ms apart, and
// Redis dies a second after the last one started, well before the steady
// PeerInterval (3 s here, 5 s by default) has come round. Each must then
// divide its fail-open share by three, 10 each of 30. Reading the count
// only every PeerInterval, each kept the count it read when it started
// (1, 2, 3) and they admitted 30, 15 and 10 (55 of a limit of 30): a
// sidecar reads the count often while the fleet is settling.
func TestFleetStartingTogether(t *testing.T) {
	const limit = 30
	r := testsupport.StartRedis(t)
	f := newFleet(t, []enforce.Decider{
		redisLimiter(t, r, 1, exactTimeout), redisLimiter(t, r, 1, exactTimeout), redisLimiter(t, r, 1, exactTimeout),
	}, testConfig(nil, testPolicy("global", limit)))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	const interval = 3 * time.Second
	for _, s := range f.sidecars {
		s.opts.PeerInterval = interval
		go s.announceLoop(ctx, s.lim.(announcer))
		time.Sleep(300 * time.Millisecond)
	}
	id := testNamespace + "/global"
	// The last sidecar counts all three once it has announced.
	eventually(t, 5*time.Second, "the last sidecar counting 3", func() bool { return f.sidecars[2].peerCount(id) == 3 })
	time.Sleep(time.Second)
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	admitted := f.admitEach(t, 2*limit)
	total := 0
	for _, n := range admitted {
		total += n
	}
	t.Logf("admitted on their own after Redis died: %v (counts %d %d %d)", admitted,
		f.sidecars[0].peerCount(id), f.sidecars[1].peerCount(id), f.sidecars[2].peerCount(id))
	if total != limit {
		t.Errorf("three sidecars started together admitted %v = %d on their own, want ceil(%d/3) each = %d", admitted, total, limit, limit)
	}
}

// admitEach sends n requests through each sidecar of the fleet in turn and
// returns how many each admitted.
func (f *fleet) admitEach(t *testing.T, n int) []int {
	t.Helper()
	admitted := make([]int, len(f.fronts))
	for i := range f.fronts {
		for range n {
			resp, err := f.client.Get(f.fronts[i] + "/")
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode == 200 {
				admitted[i]++
			}
			drain(resp)
		}
	}
	return admitted
}
