package rls

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestServeAndCheck runs the process path: Serve with its health service
// and admin endpoints, the quick check client against it, and a graceful
// stop when the context ends.
func TestServeAndCheck(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	cfg := writeConfig(t, pol("per-ip", 1, time.Minute, entry("remote_address")))
	s := loadedServer(t, r.Addr, cfg)
	grpcLn, adminLn := listenLoopback(t), listenLoopback(t)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, grpcLn, adminLn, 0, 5*time.Second) }()

	var out bytes.Buffer
	o := CheckOptions{Target: grpcLn.Addr().String(), Domain: "edge", Descriptors: []string{"remote_address=10.0.0.1"}}
	resp, err := Check(ctx, o, &out)
	// protojson varies its spacing on purpose: look for the field name only.
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || !strings.Contains(out.String(), `"requestsPerUnit"`) {
		t.Fatalf("check: %v %v\n%s", err, resp, out.String())
	}
	if resp, err = Check(ctx, o, io.Discard); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second check: %v %v", err, resp)
	}

	conn, err := grpc.NewClient(grpcLn.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	testsupport.Eventually(t, 5*time.Second, 20*time.Millisecond, "health SERVING", func() error {
		h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
		if err != nil {
			return err
		}
		if h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return io.EOF
		}
		return nil
	})
	// What the controller reads to report the policy Enforced.
	res, err := http.Get("http://" + adminLn.Addr().String() + rlsconfig.LoadedPath)
	if err != nil {
		t.Fatal(err)
	}
	var loaded rlsconfig.Loaded
	err = json.NewDecoder(res.Body).Decode(&loaded)
	_ = res.Body.Close()
	data, _ := os.ReadFile(cfg)
	parsed, _ := rlsconfig.Parse(data)
	if err != nil || loaded.Revision != rlsconfig.Revision(data) || !loaded.Revisions()[rlsconfig.PolicyRevisions(parsed)["rls/t/per-ip"]] {
		t.Fatalf("%s: %+v, %v", rlsconfig.LoadedPath, loaded, err)
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		res, err := http.Get("http://" + adminLn.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if res.StatusCode != http.StatusOK || (path == "/metrics" && !strings.Contains(string(body), "slidegate_rls_requests_total")) {
			t.Fatalf("%s: %d %s", path, res.StatusCode, body)
		}
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after the context ended")
	}
}

// TestTLSListener: with TLSCreds (no client CA) the gRPC listener speaks TLS, verified by
// the quick check against the CA; a plaintext client is refused.
func TestTLSListener(t *testing.T) {
	t.Parallel()
	pki := testsupport.NewPKI(t)
	r := testsupport.StartRedis(t)
	cfg := writeConfig(t, pol("per-ip", 5, time.Minute, entry("remote_address")))
	s := loadedServer(t, r.Addr, cfg)
	grpcLn, adminLn := listenLoopback(t), listenLoopback(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	creds, err := s.TLSCreds(TLSOptions{CertFile: pki.ServerCert, KeyFile: pki.ServerKey})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ctx, grpcLn, adminLn, 0, time.Second, creds) }()

	o := CheckOptions{Target: grpcLn.Addr().String(), TLS: true, CAFile: pki.CA, Domain: "edge", Descriptors: []string{"remote_address=10.0.0.1"}}
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	if resp, err := Check(cctx, o, io.Discard); err != nil || resp.GetStatuses()[0].GetLimitRemaining() != 4 {
		t.Fatalf("over TLS: %v %v", err, resp)
	}
	o.TLS = false
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	defer pcancel()
	if _, err := Check(pctx, o, io.Discard); err == nil {
		t.Fatal("a plaintext call to the TLS listener succeeded")
	}
}

// loadedServer is a Server on its own Redis client and limiter, with the
// config file loaded.
func loadedServer(t *testing.T, redisAddr, configFile string) *Server {
	t.Helper()
	rdb, err := redisconn.NewClient(standaloneConfig(redisAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := limiter.New(rdb, limiter.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	s := New(lim, Options{ConfigFile: configFile})
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	return s
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// TestConnectionBounds: a connection that never completes its handshake
// (gRPC: the HTTP/2 preface, and TLS when served) is closed after
// HandshakeTimeout, and one that never completes its request headers on
// the admin port after the admin server's header timeout. Before,
// gRPC-go's default held such a connection for 120 s.
func TestConnectionBounds(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	s := loadedServer(t, r.Addr, writeConfig(t, pol("per-ip", 1, time.Minute, entry("remote_address"))))
	grpcLn, adminLn := listenLoopback(t), listenLoopback(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx, grpcLn, adminLn, 0, time.Second); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	for _, tc := range []struct {
		name  string
		addr  string
		send  string
		bound time.Duration
	}{
		{"gRPC, nothing sent", grpcLn.Addr().String(), "", HandshakeTimeout},
		{"admin, half a request", adminLn.Addr().String(), "GET /metrics HTTP/1.1\r\nHost: x\r\n", adminReadHeaderTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			conn, err := net.Dial("tcp", tc.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			start := time.Now()
			if _, err := conn.Write([]byte(tc.send)); err != nil {
				t.Fatal(err)
			}
			// The margin covers a busy machine; the default it replaces
			// (120 s, or none) is far beyond it.
			_ = conn.SetReadDeadline(start.Add(tc.bound + 10*time.Second))
			_, err = io.Copy(io.Discard, conn)
			took := time.Since(start)
			if err != nil {
				t.Fatalf("still open after %v (bound %v): %v", took.Round(time.Millisecond), tc.bound, err)
			}
			if took < tc.bound-time.Second {
				t.Errorf("closed after %v, before the bound %v", took, tc.bound)
			}
		})
	}
}

// TestLoadedLeaksNothing (issue 22): the admin port's LoadedPath reports
// the revisions the controller compares, and no namespace, policy name,
// domain or descriptor: anyone on the pod network may reach the port.
// Before, it listed every policy by "rls/<namespace>/<name>".
func TestLoadedLeaksNothing(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	a := pol("login-limit", 5, time.Minute, entry("generic_key", "secret-route"), entry("x-api-key"))
	a.Namespace, a.ID, a.Domain = "payments", rlsconfig.PolicyID("payments", "login-limit"), "internal-billing"
	b := pol("per-ip", 5, time.Minute, entry("remote_address"))
	cfg := writeConfig(t, a, b)
	s := loadedServer(t, r.Addr, cfg)
	grpcLn, adminLn := listenLoopback(t), listenLoopback(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx, grpcLn, adminLn, 0, time.Second); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	res, err := http.Get("http://" + adminLn.Addr().String() + rlsconfig.LoadedPath)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"payments", "login-limit", "internal-billing", "secret-route", "x-api-key", "generic_key", "per-ip", "remote_address", "edge", "rls/"} {
		if strings.Contains(string(body), secret) {
			t.Errorf("%s reveals %q: %s", rlsconfig.LoadedPath, secret, body)
		}
	}
	var loaded rlsconfig.Loaded
	if err := json.Unmarshal(body, &loaded); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(cfg)
	parsed, _ := rlsconfig.Parse(data)
	for id, rev := range rlsconfig.PolicyRevisions(parsed) {
		if !loaded.Revisions()[rev] {
			t.Errorf("%s: revision %s of %s missing: %s", rlsconfig.LoadedPath, rev, id, body)
		}
	}
}
