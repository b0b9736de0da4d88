package sidecar

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

const testNamespace = "shop"

// testPolicy is an enforced, fail-open, exact policy over a minute with a
// global key; mods adjust it.
func testPolicy(name string, limit int64, mods ...func(*sidecarconfig.Policy)) sidecarconfig.Policy {
	p := sidecarconfig.Policy{
		Name:         name,
		ID:           testNamespace + "/" + name,
		WindowMillis: 60_000,
		Limit:        limit,
		Algorithm:    "SlidingLog",
		FailMode:     "Open",
		Mode:         "Enforce",
		Key:          sidecarconfig.Key{Source: sidecarconfig.SourceGlobal, OnMissing: sidecarconfig.MissingRemoteAddress},
	}
	for _, m := range mods {
		m(&p)
	}
	return p
}

func withKey(source, name, onMissing string) func(*sidecarconfig.Policy) {
	return func(p *sidecarconfig.Policy) {
		p.Key = sidecarconfig.Key{Source: source, Name: name, OnMissing: onMissing}
	}
}

// withHashKey gives the sidecar a client hash key file holding key.
func withHashKey(t testing.TB, key string) func(*Options) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "client-hash-key")
	if err := os.WriteFile(p, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return func(o *Options) { o.ClientHashKeyFile = p }
}

func dryRun(p *sidecarconfig.Policy)     { p.Mode = "DryRun" }
func failClosed(p *sidecarconfig.Policy) { p.FailMode = "Closed" }

func testConfig(trusted []string, policies ...sidecarconfig.Policy) *sidecarconfig.Config {
	slices.SortFunc(policies, func(a, b sidecarconfig.Policy) int { return strings.Compare(a.Name, b.Name) })
	return &sidecarconfig.Config{
		Version:        sidecarconfig.Version,
		Namespace:      testNamespace,
		TrustedProxies: trusted,
		Policies:       policies,
	}
}

func marshalConfig(t testing.TB, c *sidecarconfig.Config) []byte {
	t.Helper()
	b, err := sidecarconfig.Marshal(c)
	if err != nil {
		t.Fatalf("marshal config: %v", err)
	}
	return b
}

// volume is a directory laid out like a Kubernetes ConfigMap or downward-API
// volume: the files are symlinks into ..data, itself a symlink to a
// timestamped directory, and an update swaps ..data atomically.
type volume struct {
	dir string
	n   int
}

func newVolume(t testing.TB) *volume {
	t.Helper()
	return &volume{dir: t.TempDir()}
}

func (v *volume) path(name string) string { return filepath.Join(v.dir, name) }

// write swaps in a new version holding files, the way kubelet's atomic
// writer does.
func (v *volume) write(t testing.TB, files map[string][]byte) {
	t.Helper()
	v.n++
	ts := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", v.n%60, v.n)
	if err := os.Mkdir(filepath.Join(v.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(v.dir, ts, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(v.dir, "..data"))
	tmp := filepath.Join(v.dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(v.dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		_ = os.RemoveAll(filepath.Join(v.dir, old))
	}
}

// testOptions are options for a sidecar on files in t's temp directories.
func testOptions(upstream string, cfgVol, labelsVol *volume) Options {
	o := DefaultOptions()
	o.ListenAddress = "127.0.0.1:0"
	o.AdminAddress = "127.0.0.1:1"
	o.Upstream = upstream
	o.ConfigFile = cfgVol.path(sidecarconfig.FileName)
	o.PodLabelsFile = ""
	if labelsVol != nil {
		o.PodLabelsFile = labelsVol.path("labels")
	}
	o.Redis.Addrs = []string{"127.0.0.1:1"}
	return o
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// upstream is an httptest application that counts what reaches it.
type upstream struct {
	*httptest.Server
	hits atomic.Int64

	mu       sync.Mutex
	arrivals map[string]time.Time // by X-Request-Id, when one is sent
}

func newUpstream(t testing.TB) *upstream {
	t.Helper()
	u := &upstream{arrivals: map[string]time.Time{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		if id := r.Header.Get("X-Request-Id"); id != "" {
			u.mu.Lock()
			u.arrivals[id] = time.Now()
			u.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Upstream", "yes")
		_, _ = io.WriteString(w, "hello from the app\n")
	}))
	t.Cleanup(u.Close)
	return u
}

// memLimiter is an in-memory, exact limiter with the contract of package
// limiter (all rules of a request together; a rejected request's admits are
// undone). It stands in for the real limiter in tests of the handler's own
// logic; everything about Redis is tested against the real limiter and a
// real redis-server.
type memLimiter struct {
	mu      sync.Mutex
	logs    map[string][]time.Time
	healthy atomic.Bool
	calls   atomic.Int64
	// decide, when set, replaces the in-memory decision.
	decide func([]limiter.Request) []limiter.Decision
}

func newMemLimiter() *memLimiter {
	m := &memLimiter{logs: map[string][]time.Time{}}
	m.healthy.Store(true)
	return m
}

func (m *memLimiter) Healthy() bool { return m.healthy.Load() }

func (m *memLimiter) Decide(_ context.Context, reqs []limiter.Request) []limiter.Decision {
	m.calls.Add(1)
	if m.decide != nil {
		return m.decide(reqs)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	out := make([]limiter.Decision, len(reqs))
	admitted := make([]string, 0, len(reqs))
	pass := true
	for i, r := range reqs {
		k := r.Rule.ID + "|" + r.Client
		log := m.logs[k]
		for len(log) > 0 && now.Sub(log[0]) >= r.Rule.Window {
			log = log[1:]
		}
		d := limiter.Decision{Limit: r.Rule.Limit, Source: limiter.SourceRedis}
		if int64(len(log)) < r.Rule.Limit {
			log = append(log, now)
			admitted = append(admitted, k)
			d.Allowed = true
		} else {
			d.RetryAfter = log[0].Add(r.Rule.Window).Sub(now)
			if !r.DryRun {
				pass = false
			}
		}
		d.Remaining = r.Rule.Limit - int64(len(log))
		d.ResetAfter = log[len(log)-1].Add(r.Rule.Window).Sub(now)
		m.logs[k] = log
		out[i] = d
	}
	if !pass {
		for _, k := range admitted {
			m.logs[k] = m.logs[k][:len(m.logs[k])-1]
		}
	}
	return out
}

// counter reads one series of slidegate_sidecar_requests_total.
func requestsCount(s *Sidecar, policy string, o enforce.Outcome) float64 {
	return testutil.ToFloat64(s.metrics.decisions.Requests.WithLabelValues(policy, o.String()))
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testutilCounter(c interface{ Desc() *prometheus.Desc }) float64 {
	return testutil.ToFloat64(c.(prometheus.Collector))
}

func newTestServer(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
}

// gaugeValue reads an unlabelled gauge from the sidecar's registry.
func gaugeValue(t testing.TB, s *Sidecar, name string) float64 {
	t.Helper()
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}
