package sidecar

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestRunOverTLSAsACLUser runs the sidecar process (Run) against a real
// redis-server that serves mutual TLS with a private CA, as an injected
// sidecar does it: the CA and client certificate in the mounted Secret's
// directory (--redis-tls-dir), logging in as an ACL user confined to the
// key prefix. The decisions must come from Redis, and neither password may
// reach a log line, not even when the login fails.
func TestRunOverTLSAsACLUser(t *testing.T) {
	pki := testsupport.NewPKI(t)
	tlsPort := testsupport.FreePort(t)
	r := testsupport.StartRedis(t, pki.RedisTLSArgs(tlsPort, true)...)
	secret := t.TempDir() // the files under the Secret's keys
	for name, src := range map[string]string{limiter.TLSCAFile: pki.CA, limiter.TLSCertFile: pki.ClientCert, limiter.TLSKeyFile: pki.ClientKey} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(secret, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const prefix, good, wrong = "tls:", "pw-9f3b7c1e-good", "pw-2d6a0e84-wrong"
	if _, err := r.Do(append([]string{"ACL", "SETUSER", "sidecar", "on", ">" + good}, limiter.ACLRules(prefix)...)...); err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t)
	cfg := newVolume(t)
	cfg.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t, testConfig(nil, testPolicy("p", 2)))})

	var logs syncBuffer
	run := func(password string) (front, admin string) {
		o := testOptions(up.URL, cfg, nil)
		o.ListenAddress, o.AdminAddress = freeAddr(t), freeAddr(t)
		o.Redis.Addrs = []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))}
		o.Redis.TLS, o.Redis.TLSDir, o.Redis.TLSServerName = true, secret, "localhost"
		o.Redis.Username, o.Redis.Password = "sidecar", password
		o.KeyPrefix = prefix
		o.DecisionTimeout = 2 * time.Second
		log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
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
	statuses := func(front string, n int) string {
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

	front, admin := run(good)
	if got := statuses(front, 3); got != "200 200 429" {
		t.Fatalf("statuses %q, want 200 200 429", got)
	}
	if n, err := r.Do("ZCARD", limiter.Key(prefix, testNamespace+"/p", keyGlobal)); err != nil || n != "2" {
		t.Errorf("entries in Redis under the ACL user's prefix = %q (%v), want 2", n, err)
	}
	if m := scrape(t, admin); !strings.Contains(m, `slidegate_sidecar_limiter_decisions_total{source="redis"} 3`) {
		t.Errorf("want 3 decisions by Redis in the metrics:\n%s", grepLines(m, "limiter_decisions_total"))
	}

	// A wrong password: the sidecar stays up, decides by the fail mode, and
	// says why in its log, without either password.
	front, admin = run(wrong)
	if got := statuses(front, 1); got != "200" {
		t.Errorf("fail-open policy with Redis refusing the login: status %q, want 200", got)
	}
	if m := scrape(t, admin); !strings.Contains(m, `slidegate_sidecar_limiter_decisions_total{source="fallback"} 1`) {
		t.Errorf("want the decision made by the fallback:\n%s", grepLines(m, "limiter_decisions_total"))
	}
	out := logs.String()
	t.Log(grepLines(out, "Redis did not decide"))
	if !strings.Contains(out, "WRONGPASS") {
		t.Errorf("the log does not say why Redis refused the sidecar:\n%s", out)
	}
	for _, secret := range []string{good, wrong} {
		if strings.Contains(out, secret) {
			t.Errorf("a password reached the log:\n%s", out)
		}
	}
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
