package sidecar

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startRun runs the sidecar process (Run, as cmd/sidecar does) with o on
// free ports until the test ends, and returns its proxied and admin URLs
// once it is ready. Run binds its own addresses, so a port found free can be
// taken by another process before Run binds it; a few tries make that race
// harmless.
func startRun(t *testing.T, o Options, log *slog.Logger) (front, admin string) {
	t.Helper()
	front, admin, _ = startRunDebug(t, o, log)
	return front, admin
}

// startRunDebug is startRun, with the debug port's address too.
func startRunDebug(t *testing.T, o Options, log *slog.Logger) (front, admin, debug string) {
	t.Helper()
	for try := 1; ; try++ {
		addrs := freeAddrs(t, 3)
		o.ListenAddress, o.AdminAddress, o.DebugAddress = addrs[0], addrs[1], addrs[2]
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Run(ctx, o, log) }()
		err := waitReady(o.AdminAddress, done, 10*time.Second)
		if err == nil {
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			})
			return "http://" + o.ListenAddress, "http://" + o.AdminAddress, o.DebugAddress
		}
		cancel()
		if !errors.Is(err, syscall.EADDRINUSE) || try == 3 {
			t.Fatalf("sidecar not ready: %v", err)
		}
	}
}

// waitReady waits until the admin address answers /readyz with 200, or Run
// returns (its error), or the timeout passes.
func waitReady(admin string, done <-chan error, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		select {
		case err := <-done:
			return fmt.Errorf("Run returned before ready: %w", err)
		default:
		}
		if resp, err := http.Get("http://" + admin + "/readyz"); err == nil {
			drain(resp)
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for /readyz", timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// freeAddrs returns n distinct loopback addresses that were free a moment
// ago: all n are held open together, so the kernel cannot hand out one port
// twice (it did: "--listen-address and --admin-address must differ").
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ln.Close() }()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs
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
