package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// serve runs s.Serve on loopback listeners until the test ends and returns
// the proxied and admin base URLs.
func serve(t *testing.T, s *Sidecar) (front, admin string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	debugLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln, adminLn, debugLn) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String(), "http://" + adminLn.Addr().String()
}

func configFile(t testing.TB, limit int64) map[string][]byte {
	return map[string][]byte{sidecarconfig.FileName: marshalConfig(t, testConfig(nil,
		testPolicy("per-user", limit, withKey("Header", "X-User", "Allow"))))}
}

func TestReloadUnderLoad(t *testing.T) {
	r := testsupport.StartRedis(t)
	up := newUpstream(t)
	cfg := newVolume(t)
	cfg.write(t, configFile(t, 1_000_000))
	o := testOptions(up.URL, cfg, nil)
	o.ConfigResyncInterval = time.Hour // file events only
	s, err := New(o, redisLimiter(t, r, 1, exactTimeout), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	front, _ := serve(t, s)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer client.CloseIdleConnections()
	get := func(user string) (int, error) {
		req, _ := http.NewRequest("GET", front+"/", nil)
		req.Header.Set("X-User", user)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		drain(resp)
		return resp.StatusCode, nil
	}

	// Traffic from 6 clients for the whole test.
	var sent, failed atomic.Int64
	var firstFailure atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				code, err := get(fmt.Sprintf("load-%d", w))
				sent.Add(1)
				if err != nil || (code != 200 && code != 429) {
					failed.Add(1)
					firstFailure.CompareAndSwap(nil, fmt.Sprintf("status %d, error %v", code, err))
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()

	reload := func(files map[string][]byte) {
		t.Helper()
		before := s.Revision()
		cfg.write(t, files)
		eventually(t, 10*time.Second, "the new config in force", func() bool { return s.Revision() != before })
	}
	for i := range 5 {
		reload(configFile(t, 1_000_000-int64(i)-1))
	}
	// An invalid config is reported and changes nothing.
	failures := func() float64 { return testutil.ToFloat64(s.metrics.reloads.Reloads.WithLabelValues("failure")) }
	rev := s.Revision()
	cfg.write(t, map[string][]byte{sidecarconfig.FileName: []byte(`{"version":"v0"}`)})
	eventually(t, 10*time.Second, "the invalid config reported", func() bool { return failures() == 1 })
	if s.Revision() != rev || !s.Ready() {
		t.Fatalf("an invalid config replaced the good one or made the sidecar unready")
	}

	// A client that used 30 under the big limit is over the new limit of 10
	// from the first request after the reload: the counts survive (same
	// policy id) and the new limit holds at once.
	for i := range 30 {
		if code, err := get("hot"); code != 200 {
			t.Fatalf("hot request %d: %d %v", i, code, err)
		}
	}
	reload(configFile(t, 10))
	if code, err := get("hot"); code != 429 {
		t.Fatalf("first request after the reload to limit 10: %d %v, want 429", code, err)
	}
	admitted := 0
	for range 12 {
		if code, _ := get("fresh"); code == 200 {
			admitted++
		}
	}
	if admitted != 10 {
		t.Errorf("a new client got %d admits under the new limit of 10", admitted)
	}

	close(stop)
	wg.Wait()
	stop = make(chan struct{})
	if failed.Load() != 0 || sent.Load() < 50 {
		t.Errorf("%d of %d requests failed during the reloads (first: %v)", failed.Load(), sent.Load(), firstFailure.Load())
	}
	t.Logf("%d requests during 7 reloads, none failed", sent.Load())
}

func TestInvalidConfigKeepsLastGood(t *testing.T) {
	h := newHarness(t, newMemLimiter(), testConfig(nil, testPolicy("p", 1)))
	rev := h.s.Revision()
	for _, bad := range []string{
		"{not json",
		`{"version":"slidegate.dev/sidecar-config/v1","namespace":"shop","policies":[],"extra":1}`,
		string(marshalConfig(t, testConfig(nil, testPolicy("p", 1))))[:40],
	} {
		h.cfg.write(t, map[string][]byte{sidecarconfig.FileName: []byte(bad)})
		if err := h.s.Reload(); err == nil {
			t.Fatalf("config %q loaded", bad)
		}
		if h.s.Revision() != rev || !h.s.Ready() {
			t.Fatal("the last good config is no longer in force")
		}
	}
	if got := testutil.ToFloat64(h.s.metrics.reloads.Reloads.WithLabelValues("failure")); got != 3 {
		t.Errorf("failures = %v, want 3", got)
	}
	if got := testutil.ToFloat64(h.s.metrics.reloads.LastOK); got != 0 {
		t.Errorf("last_reload_successful = %v", got)
	}
	// The same bad file again is not a new failure (no log flood on resync).
	_ = h.s.Reload()
	if got := testutil.ToFloat64(h.s.metrics.reloads.Reloads.WithLabelValues("failure")); got != 3 {
		t.Errorf("failures = %v after re-reading the same bad file", got)
	}
	// The old limit of 1 is still enforced.
	if resp, _ := h.do(t, "GET", "/", nil); resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	if resp, _ := h.do(t, "GET", "/", nil); resp.StatusCode != 429 {
		t.Fatal(resp.Status)
	}
	h.cfg.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t, testConfig(nil, testPolicy("p", 5)))})
	if err := h.s.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(h.s.metrics.reloads.LastOK); got != 1 || h.s.Revision() == rev {
		t.Errorf("good config not loaded: last_reload_successful %v", got)
	}
}

func TestConfigAppearsAndLabelsChange(t *testing.T) {
	up := newUpstream(t)
	cfg, labels := newVolume(t), newVolume(t)
	labels.write(t, map[string][]byte{"labels": []byte("app=\"shop\"\n")})
	o := testOptions(up.URL, cfg, labels)
	o.ConfigResyncInterval = time.Hour // file events only
	s, err := New(o, newMemLimiter(), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	_, admin := serve(t, s)
	readyz := func() int {
		resp, err := http.Get(admin + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		drain(resp)
		return resp.StatusCode
	}
	if s.Ready() || readyz() != 503 {
		t.Fatal("ready without a config")
	}
	cfg.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t, testConfig(nil,
		testPolicy("billing-only", 1, func(p *sidecarconfig.Policy) { p.Selector.MatchLabels = map[string]string{"app": "billing"} })))})
	eventually(t, 10*time.Second, "ready once the config appears", func() bool { return readyz() == 200 })
	if n := len(s.state.Load().policies); n != 0 {
		t.Fatalf("%d policies apply to app=shop", n)
	}
	labels.write(t, map[string][]byte{"labels": []byte("app=\"billing\"\n")})
	eventually(t, 10*time.Second, "the policy applying after the pod's labels changed", func() bool {
		return len(s.state.Load().policies) == 1
	})
	// A broken labels file keeps the last good state too.
	labels.write(t, map[string][]byte{"labels": []byte("app=billing\n")})
	if err := s.Reload(); err == nil || len(s.state.Load().policies) != 1 {
		t.Errorf("broken labels: err %v, %d policies", err, len(s.state.Load().policies))
	}
}

func TestMetricsEndpoint(t *testing.T) {
	h := newHarness(t, newMemLimiter(), testConfig(nil, testPolicy("p", 1, withKey("Header", "X-User", "Deny"))))
	h.do(t, "GET", "/", map[string]string{"X-User": "alice-secret"})
	h.do(t, "GET", "/", map[string]string{"X-User": "alice-secret"})
	admin := newTestServer(t, h.s.AdminHandler())
	resp, err := http.Get(admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	for _, want := range []string{
		`slidegate_sidecar_requests_total{decision="allowed",policy="p"} 1`,
		`slidegate_sidecar_requests_total{decision="rejected",policy="p"} 1`,
		"slidegate_sidecar_decision_duration_seconds_bucket",
		"slidegate_sidecar_redis_errors_total 0",
		"slidegate_sidecar_fallback_active 0",
		`slidegate_sidecar_config_reloads_total{result="success"} 1`,
		`slidegate_sidecar_config_revision_info{revision="` + h.s.Revision() + `"} 1`,
		"slidegate_sidecar_config_last_reload_successful 1",
		`slidegate_sidecar_responses_total{outcome="rejected"} 1`,
		"slidegate_sidecar_policies_active 1",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(string(body), "alice") {
		t.Error("/metrics mentions a client")
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(admin.URL + path)
		if err != nil || resp.StatusCode != 200 {
			t.Errorf("%s: %v %v", path, resp.Status, err)
		}
		drain(resp)
	}
}

// TestDeletedConfigMeansNoPolicies: when the namespace's last policy goes,
// the controller deletes the ConfigMap and the kubelet empties the volume.
// The sidecar must stop enforcing (forward everything), not keep the
// deleted policies as "the last good config" forever. Before any config,
// a missing file keeps the sidecar unready.
func TestDeletedConfigMeansNoPolicies(t *testing.T) {
	h := newHarness(t, newMemLimiter(), testConfig(nil, testPolicy("p", 1)))
	if resp, _ := h.do(t, "GET", "/", nil); resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	if resp, _ := h.do(t, "GET", "/", nil); resp.StatusCode != 429 {
		t.Fatalf("limit 1 not enforced: %s", resp.Status)
	}
	h.cfg.write(t, map[string][]byte{}) // the ConfigMap is gone: config.json dangles
	if err := h.s.Reload(); err != nil {
		t.Fatalf("reload after the ConfigMap was deleted: %v", err)
	}
	if !h.s.Ready() {
		t.Fatal("not ready with an empty policy set")
	}
	for range 3 {
		if resp, _ := h.do(t, "GET", "/", nil); resp.StatusCode != 200 {
			t.Fatalf("a deleted policy is still enforced: %s", resp.Status)
		}
	}

	// A sidecar that never had a config is not ready without one at first
	// (the ConfigMap may be on its way) ...
	fresh := newVolume(t)
	o := testOptions("http://127.0.0.1:1", fresh, h.labels)
	o.ConfigResyncInterval = 200 * time.Millisecond
	s, err := New(o, newMemLimiter(), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); err == nil || s.Ready() {
		t.Fatalf("reload without a config file: err %v, ready %v; want an error and not ready", err, s.Ready())
	}
	// ... but a sidecar restarted after the last policy went becomes ready
	// with no policies once a resync interval has passed, instead of
	// answering 503 forever.
	time.Sleep(o.ConfigResyncInterval)
	if err := s.Reload(); err != nil || !s.Ready() {
		t.Fatalf("reload a resync interval later: err %v, ready %v; want no policies and ready", err, s.Ready())
	}
}

// TestSnapshotWithoutConfigFile: a ..data snapshot without config.json means
// "no policies" only when it is empty, the kubelet's rendering of a deleted
// ConfigMap. One with other keys is a ConfigMap without its config: a failed
// reload that keeps the last good config, and, before any config, keeps the
// sidecar unready even after the start-up grace.
func TestSnapshotWithoutConfigFile(t *testing.T) {
	tests := []struct {
		name       string
		loaded     bool // a config (policy p, limit 1) was in force before
		files      map[string][]byte
		wantErr    bool
		wantStatus []int // nil: not ready
	}{
		{name: "empty snapshot after a config: ConfigMap deleted, no policies",
			loaded: true, files: map[string][]byte{}, wantStatus: []int{200, 200, 200}},
		{name: "other keys after a config: failed reload, limit 1 still enforced",
			loaded: true, files: map[string][]byte{"config.yaml": []byte("policies: []")}, wantErr: true, wantStatus: []int{200, 429, 429}},
		// files nil: ..data dangles, as when the snapshot is swapped and
		// removed while the sidecar looks. Not proof that the ConfigMap is
		// gone; the swap's own event brings the next reload.
		{name: "..data dangling after a config: failed reload, limit 1 still enforced",
			loaded: true, wantErr: true, wantStatus: []int{200, 429, 429}},
		{name: "empty snapshot at start, after the grace: no policies",
			files: map[string][]byte{}, wantStatus: []int{200, 200, 200}},
		{name: "other keys at start, after the grace: not ready",
			files: map[string][]byte{"config.yaml": []byte("policies: []")}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cfg *sidecarconfig.Config
			if tt.loaded {
				cfg = testConfig(nil, testPolicy("p", 1))
			}
			h := newHarness(t, newMemLimiter(), cfg)
			// Past the start-up grace without waiting for it.
			h.s.created = time.Now().Add(-2 * h.s.opts.ConfigResyncInterval)
			rev := h.s.Revision()
			failures := testutil.ToFloat64(h.s.metrics.reloads.Reloads.WithLabelValues("failure"))

			if tt.files != nil {
				h.cfg.write(t, tt.files)
			} else {
				data := h.cfg.path("..data")
				if err := os.Remove(data); err != nil {
					t.Fatal(err)
				}
				mustSymlink(t, "..removed", data)
			}
			err := h.s.Reload()
			if (err != nil) != tt.wantErr {
				t.Fatalf("reload: %v, want error %v", err, tt.wantErr)
			}
			gotFailures := testutil.ToFloat64(h.s.metrics.reloads.Reloads.WithLabelValues("failure")) - failures
			if tt.wantErr && (gotFailures != 1 || testutil.ToFloat64(h.s.metrics.reloads.LastOK) != 0) {
				t.Errorf("failures counted %v, last_reload_successful %v; want 1 and 0",
					gotFailures, testutil.ToFloat64(h.s.metrics.reloads.LastOK))
			}
			if tt.wantErr && tt.loaded && h.s.Revision() != rev {
				t.Errorf("revision %q, want the last good %q", h.s.Revision(), rev)
			}
			if h.s.Ready() != (tt.wantStatus != nil) {
				t.Fatalf("ready = %v, want %v", h.s.Ready(), tt.wantStatus != nil)
			}
			var got []int
			for range tt.wantStatus {
				resp, _ := h.do(t, "GET", "/", nil)
				got = append(got, resp.StatusCode)
			}
			if !slices.Equal(got, tt.wantStatus) {
				t.Errorf("statuses %v, want %v", got, tt.wantStatus)
			}
		})
	}
}

func TestConfigMapGone(t *testing.T) {
	tests := []struct {
		name     string
		layout   func(t *testing.T, dir string)
		wantGone bool
	}{
		{name: "plain directory, no ..data", layout: func(*testing.T, string) {}, wantGone: true},
		{name: "empty snapshot", layout: func(t *testing.T, dir string) {
			mustSymlink(t, mkdir(t, dir, "..2026_01_01"), filepath.Join(dir, "..data"))
		}, wantGone: true},
		{name: "snapshot with other keys", layout: func(t *testing.T, dir string) {
			snap := mkdir(t, dir, "..2026_01_01")
			if err := os.WriteFile(filepath.Join(snap, "other"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			mustSymlink(t, snap, filepath.Join(dir, "..data"))
		}},
		// Swapped and removed while we looked: not proof that the ConfigMap
		// is gone.
		{name: "..data dangling", layout: func(t *testing.T, dir string) {
			mustSymlink(t, filepath.Join(dir, "..2026_01_01"), filepath.Join(dir, "..data"))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.layout(t, dir)
			if err := configMapGone(filepath.Join(dir, sidecarconfig.FileName)); (err == nil) != tt.wantGone {
				t.Errorf("configMapGone = %v, want gone %v", err, tt.wantGone)
			}
		})
	}
}

func mkdir(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// TestNewerMinorConfig: a document of a newer minor version (a newer
// controller) with a policy that has a field this sidecar does not know.
// The sidecar enforces the policies it understands and skips that one,
// saying so in its metrics; the first release refused the whole document
// (unknown field, and any version but "v1"), leaving every policy of the
// namespace unenforced until the sidecar was restarted. A top-level field it
// does not know, or another major version, is still refused.
func TestNewerMinorConfig(t *testing.T) {
	h := newHarness(t, newMemLimiter(), testConfig(nil, testPolicy("p", 100)))
	rev := h.s.Revision()
	known, err := json.Marshal(testPolicy("known", 1))
	if err != nil {
		t.Fatal(err)
	}
	newer := `{"version":"slidegate.dev/sidecar-config/v1.99","namespace":"` + testNamespace + `","policies":[` +
		string(known) + `,` +
		`{"name":"tokens","id":"` + testNamespace + `/tokens","selector":{},"windowMillis":60000,"limit":1000,"algorithm":"SlidingLog","failMode":"Open","mode":"Enforce",` +
		`"key":{"source":"Global","onMissing":"RemoteAddress"},"match":{"costFrom":"response"},"cost":{"header":"X-Tokens"}}]}`
	h.cfg.write(t, map[string][]byte{sidecarconfig.FileName: []byte(newer)})
	if err := h.s.Reload(); err != nil {
		t.Fatalf("a newer minor version was refused: %v", err)
	}
	if h.s.Revision() == rev {
		t.Fatal("the newer document is not in force")
	}
	// "known" (limit 1) is enforced; "tokens" is not.
	if resp, _ := h.do(t, "GET", "/", nil); resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	if resp, _ := h.do(t, "GET", "/", nil); resp.StatusCode != 429 || !strings.Contains(resp.Header.Get("RateLimit-Policy"), `"known"`) {
		t.Fatalf("second request: %s %q, want 429 from known", resp.Status, resp.Header.Get("RateLimit-Policy"))
	}
	if got := testutil.ToFloat64(h.s.metrics.reloads.Skipped); got != 1 {
		t.Errorf("config_policies_skipped = %v, want 1", got)
	}
	if got := testutil.ToFloat64(h.s.metrics.policiesActive); got != 1 {
		t.Errorf("policies_active = %v, want 1", got)
	}
	rev = h.s.Revision()
	for _, bad := range []string{
		strings.Replace(newer, `"namespace"`, `"quota":{},"namespace"`, 1),       // a top-level field it does not know
		strings.Replace(newer, "sidecar-config/v1.99", "sidecar-config/v2.0", 1), // another major version
		strings.Replace(newer, "sidecar-config/v1.99", "sidecar-config/v1.1", 1), // its own minor: strict
	} {
		h.cfg.write(t, map[string][]byte{sidecarconfig.FileName: []byte(bad)})
		if err := h.s.Reload(); err == nil {
			t.Errorf("loaded %s", bad[:80])
		}
		if h.s.Revision() != rev {
			t.Fatal("the last good config is no longer in force")
		}
	}
}
