package sidecar

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// startRun runs the sidecar process (Run, as cmd/sidecar does) with o on
// free ports until the test ends, and returns its proxied and admin URLs
// once it is ready.
func startRun(t *testing.T, o Options, log *slog.Logger) (front, admin string) {
	t.Helper()
	o.ListenAddress, o.AdminAddress = freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o, log) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	eventually(t, 10*time.Second, "/readyz", func() bool {
		resp, err := http.Get("http://" + o.AdminAddress + "/readyz")
		if err != nil {
			return false
		}
		drain(resp)
		return resp.StatusCode == 200
	})
	return "http://" + o.ListenAddress, "http://" + o.AdminAddress
}

// statuses sends n GETs to front, one after the other, and returns their
// status codes separated by spaces.
func statuses(t *testing.T, front string, n int) string {
	t.Helper()
	var codes []string
	for range n {
		resp, err := http.Get(front + "/")
		if err != nil {
			t.Fatal(err)
		}
		drain(resp)
		codes = append(codes, strconv.Itoa(resp.StatusCode))
	}
	return strings.Join(codes, " ")
}

func scrape(t *testing.T, admin string) string {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// syncBuffer is a bytes.Buffer that several goroutines may log into.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// assertRedisDecides sends three requests to a sidecar whose one policy, p,
// admits two: 200 200 429, two entries in Redis (entries reads them) and
// three decisions made by Redis.
func assertRedisDecides(t *testing.T, front, admin string, entries func() (string, error)) {
	t.Helper()
	if got := statuses(t, front, 3); got != "200 200 429" {
		t.Fatalf("statuses %q, want 200 200 429", got)
	}
	if n, err := entries(); err != nil || n != "2" {
		t.Errorf("entries in Redis = %q (%v), want 2", n, err)
	}
	if m := scrape(t, admin); !strings.Contains(m, `slidegate_sidecar_limiter_decisions_total{source="redis"} 3`) {
		t.Errorf("want 3 decisions by Redis in the metrics:\n%s", grepLines(m, "limiter_decisions_total"))
	}
}

// assertFallsBackQuietly sends one request to a sidecar that Redis refuses:
// its fail-open policy admits it by the fallback, the log says why (reason)
// and holds none of the secrets.
func assertFallsBackQuietly(t *testing.T, front, admin string, logs *syncBuffer, reason string, secrets ...string) {
	t.Helper()
	if got := statuses(t, front, 1); got != "200" {
		t.Errorf("fail-open policy, Redis refusing the sidecar: status %q, want 200", got)
	}
	if m := scrape(t, admin); !strings.Contains(m, `slidegate_sidecar_limiter_decisions_total{source="fallback"} 1`) {
		t.Errorf("want the decision made by the fallback:\n%s", grepLines(m, "limiter_decisions_total"))
	}
	out := logs.String()
	if l := grepLines(out, "Redis did not decide"); !strings.Contains(l, reason) {
		t.Errorf("the log does not say why Redis did not decide (%s):\n%s", reason, out)
	}
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("a secret reached the log:\n%s", out)
		}
	}
}
