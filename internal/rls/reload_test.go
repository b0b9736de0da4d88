package rls

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestReload: a changed file is picked up by the watch; a bad one keeps the
// last good config in force (and says why); a deleted one means no policies.
func TestReload(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	path := writeConfig(t, pol("p", 5, time.Minute, entry("generic_key", "a")))
	rep := startReplica(t, standaloneConfig(r.Addr), path, limiter.Options{Timeout: 5 * time.Second})
	rep.srv.opts.ResyncInterval = 50 * time.Millisecond // the fsnotify event is faster; the resync is the backstop
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go rep.srv.WatchConfig(ctx)

	limitOf := func(key string) uint32 {
		resp := ask(t, rep.client, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("generic_key", key)}})
		return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	write := func(data []byte) {
		t.Helper()
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil { // atomic, like the kubelet's swap
			t.Fatal(err)
		}
	}
	if got := limitOf("a"); got != 5 {
		t.Fatalf("initial limit %d", got)
	}

	data, err := rlsconfig.Marshal(&rlsconfig.Config{Version: rlsconfig.Version, Policies: []rlsconfig.Policy{pol("p", 7, time.Minute, entry("generic_key", "b"))}})
	if err != nil {
		t.Fatal(err)
	}
	write(data)
	testsupport.Eventually(t, 10*time.Second, 10*time.Millisecond, "new config in force", func() error {
		if got := limitOf("b"); got != 7 {
			return fmt.Errorf("limit of b %d", got)
		}
		return nil
	})

	write([]byte(`{"version":"v1","policies":[{"id":"broken"}]}`))
	if err := rep.srv.Reload(); err == nil {
		t.Fatal("a bad config loaded")
	}
	if got := limitOf("b"); got != 7 || !rep.srv.Ready() {
		t.Fatalf("after a bad config: limit %d, ready %v (the last good config must stay)", got, rep.srv.Ready())
	}
	if got := testMetric(t, rep.srv, "slidegate_rls_config_reloads_total", map[string]string{"result": "failure"}); got == 0 {
		t.Fatal("the failure is not counted")
	}
	if got := testMetric(t, rep.srv, "slidegate_rls_config_last_reload_successful", nil); got != 0 {
		t.Fatalf("last reload successful = %v after a bad file", got)
	}
	// The controller renders the config in force again, byte for byte: the
	// file is good again though nothing new is loaded, and the alert on
	// the gauge must clear.
	write(data)
	if err := rep.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := testMetric(t, rep.srv, "slidegate_rls_config_last_reload_successful", nil); got != 1 {
		t.Fatalf("last reload successful = %v once the file is the config in force again", got)
	}

	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 10*time.Second, 10*time.Millisecond, "no policies once the file is gone", func() error {
		if got := limitOf("b"); got != 0 {
			return fmt.Errorf("limit of b %d", got)
		}
		return nil
	})
}

// TestReloadDropsSeriesOfRemovedPolicies: a policy's request series go when
// a reload removes the policy (a gateway's policies come and go with its
// tenants; the series stayed until the server restarted), and the series
// of the policies that stay keep counting.
func TestReloadDropsSeriesOfRemovedPolicies(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	path := writeConfig(t, pol("goes", 5, time.Minute, entry("generic_key", "b")), pol("stays", 5, time.Minute, entry("generic_key", "a")))
	rep := startReplica(t, standaloneConfig(r.Addr), path, limiter.Options{Timeout: 5 * time.Second})
	for _, key := range []string{"a", "b"} {
		ask(t, rep.client, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("generic_key", key)}})
	}
	series := func(policy string) float64 {
		return testMetric(t, rep.srv, "slidegate_rls_requests_total", map[string]string{"policy": rlsconfig.PolicyID("t", policy), "decision": enforce.Allowed.String()})
	}
	if series("stays") != 1 || series("goes") != 1 {
		t.Fatalf("before the reload: stays %v, goes %v; want 1 and 1", series("stays"), series("goes"))
	}
	data, err := rlsconfig.Marshal(&rlsconfig.Config{Version: rlsconfig.Version, Policies: []rlsconfig.Policy{pol("stays", 5, time.Minute, entry("generic_key", "a"))}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := rep.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	ask(t, rep.client, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("generic_key", "a")}})
	if got := series("goes"); got != 0 {
		t.Errorf("the removed policy's series is still there (%v)", got)
	}
	if got := series("stays"); got != 2 {
		t.Errorf("the remaining policy's series counts %v, want 2", got)
	}
}
