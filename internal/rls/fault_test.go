package rls

import (
	"context"
	"fmt"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestFailModes: with Redis paused (SIGSTOP: nothing answers) and then
// killed (connections refused), a fail-open policy enforces its local share
// ceil(limit/replicas), the replicas having counted themselves through
// Redis, and a fail-closed policy answers OVER_LIMIT with Retry-After.
func TestFailModes(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	closed := pol("closed", 10, time.Minute, entry("generic_key", "closed"))
	closed.FailMode = string(limiter.FailClosed)
	cfg := writeConfig(t, closed, pol("open", 10, time.Minute, entry("remote_address")))
	// A short timeout: each decision before the breaker opens waits it.
	lo := limiter.Options{Timeout: 200 * time.Millisecond, ProbeInterval: 50 * time.Millisecond}
	var reps []*replica
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 3 {
		rep := startReplica(t, standaloneConfig(r.Addr), cfg, lo)
		go rep.srv.AnnounceLoop(ctx)
		reps = append(reps, rep)
	}
	testsupport.Eventually(t, 10*time.Second, 10*time.Millisecond, "replicas count each other", func() error {
		for i, rep := range reps {
			if n := rep.srv.peers.Load(); n != 3 {
				return fmt.Errorf("replica %d counts %d", i, n)
			}
		}
		return nil
	})
	c := reps[0].client
	openReq := func(ip string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", ip)}}
	}
	closedReq := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("generic_key", "closed")}}

	check := func(phase, ip string) {
		t.Helper()
		// The share of 3 replicas: ceil(10/3) = 4 admits, then denials.
		for i := range 5 {
			resp := ask(t, c, openReq(ip))
			want := rlsv3.RateLimitResponse_OK
			if i == 4 {
				want = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if resp.GetOverallCode() != want {
				t.Fatalf("%s: fail-open request %d: %v, want %v", phase, i+1, resp.GetOverallCode(), want)
			}
		}
		resp := ask(t, c, closedReq)
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || headerMap(resp)["Retry-After"] != "1" {
			t.Fatalf("%s: fail-closed: %v", phase, resp)
		}
		if got := testMetric(t, reps[0].srv, "slidegate_rls_requests_total", map[string]string{"policy": rlsconfig.PolicyID("t", "closed"), "decision": enforce.FailedClosed.String()}); got == 0 {
			t.Fatalf("%s: no failed_closed decision counted", phase)
		}
	}
	back := func() {
		t.Helper()
		testsupport.Eventually(t, 10*time.Second, 20*time.Millisecond, "decisions from Redis again", func() error {
			if resp := ask(t, c, closedReq); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				return fmt.Errorf("fail-closed policy answers %v", resp.GetOverallCode())
			}
			return nil
		})
	}

	if err := r.Pause(); err != nil {
		t.Fatal(err)
	}
	check("paused", "192.0.2.1")
	if err := r.Resume(); err != nil {
		t.Fatal(err)
	}
	back()
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	check("killed", "192.0.2.2")
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	back()
}
