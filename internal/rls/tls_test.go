package rls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// tlsServer serves s over TLS with o on loopback until the test ends and
// returns the gRPC address.
func tlsServer(t *testing.T, s *Server, o TLSOptions) string {
	t.Helper()
	creds, err := s.TLSCreds(o)
	if err != nil {
		t.Fatal(err)
	}
	grpcLn, adminLn := listenLoopback(t), listenLoopback(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx, grpcLn, adminLn, 0, time.Second, creds); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return grpcLn.Addr().String()
}

// caller is how a client dials: its transport credentials.
type caller struct {
	name  string
	creds credentials.TransportCredentials
}

// tlsCaller trusts the server's CA file and presents cert/key, if given.
func tlsCaller(t *testing.T, name, serverCA, cert, key string) caller {
	t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: x509.NewCertPool()}
	pem, err := os.ReadFile(serverCA)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RootCAs.AppendCertsFromPEM(pem)
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return caller{name, credentials.NewTLS(cfg)}
}

// call sends one ShouldRateLimit for client ip of the per-ip policy, on a
// connection of its own (a new handshake).
func call(addr string, c caller, ip string) (*rlsv3.RateLimitResponse, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(c.creds))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx,
		&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", ip)}})
}

// TestClientAuthentication (issue 22): with a client CA, only callers
// with a certificate it signed (and, with ClientNames, one of those names)
// reach the limiter; the others are refused in the handshake and spend
// nobody's budget. Before, the listener served anyone: plaintext, or TLS
// without asking for a certificate.
func TestClientAuthentication(t *testing.T) {
	t.Parallel()
	pki, other := testsupport.NewPKI(t), testsupport.NewPKI(t)
	gateway := "spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account"
	gwCert, gwKey := pki.IssueClient(t, "gateway", gateway)
	tenantCert, tenantKey := pki.IssueClient(t, "tenant", "spiffe://cluster.local/ns/tenant/sa/default")
	r := testsupport.StartRedis(t)

	for _, tc := range []struct {
		name  string
		names []string
		ok    []caller
		no    []caller
	}{
		{
			name: "client CA",
			ok: []caller{
				tlsCaller(t, "certificate of the client CA", pki.CA, pki.ClientCert, pki.ClientKey),
				tlsCaller(t, "another certificate of the client CA", pki.CA, tenantCert, tenantKey),
			},
			no: []caller{
				{"plaintext", insecure.NewCredentials()},
				tlsCaller(t, "TLS without a client certificate", pki.CA, "", ""),
				tlsCaller(t, "certificate of another CA", pki.CA, other.ClientCert, other.ClientKey),
				// A server certificate of the right CA lacks the client-auth
				// extended key usage.
				tlsCaller(t, "server certificate of the client CA", pki.CA, pki.ServerCert, pki.ServerKey),
			},
		},
		{
			name:  "client CA and names",
			names: []string{gateway},
			ok:    []caller{tlsCaller(t, "the gateway's identity", pki.CA, gwCert, gwKey)},
			no: []caller{
				tlsCaller(t, "certificate of the client CA without a name", pki.CA, pki.ClientCert, pki.ClientKey),
				tlsCaller(t, "another workload of the CA", pki.CA, tenantCert, tenantKey),
				tlsCaller(t, "certificate of another CA", pki.CA, other.ClientCert, other.ClientKey),
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := writeConfig(t, pol("per-ip", 100, time.Minute, entry("remote_address")))
			s := loadedServer(t, r.Addr, cfg)
			addr := tlsServer(t, s, TLSOptions{CertFile: pki.ServerCert, KeyFile: pki.ServerKey, ClientCAFile: pki.CA, ClientNames: tc.names})
			victim := "10.0.0.1-" + strings.ReplaceAll(tc.name, " ", "-")
			for _, c := range tc.no {
				if resp, err := call(addr, c, victim); err == nil {
					t.Errorf("%s: served (%v)", c.name, resp.GetStatuses())
				}
			}
			for i, c := range tc.ok {
				resp, err := call(addr, c, victim)
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				// Nothing the refused callers sent was counted.
				if got, want := resp.GetStatuses()[0].GetLimitRemaining(), uint32(100-1-i); got != want {
					t.Errorf("%s: remaining %d, want %d", c.name, got, want)
				}
			}
			if got := testMetric(t, s, "slidegate_rls_tls_handshake_failures_total", nil); got < float64(len(tc.no)) {
				t.Errorf("handshake failures counted %v, want at least %d", got, len(tc.no))
			}
		})
	}
}

// TestTLSFilesRotate: the key pair and the client CA are read again for
// new connections, from one version of the mounted Secret (its ..data
// link, swapped atomically by the kubelet): after a rotation to a new CA,
// callers of the new CA are served and verify the new server certificate,
// callers of the old one are refused, without a restart. A connection
// open before keeps working.
func TestTLSFilesRotate(t *testing.T) {
	t.Parallel()
	before, after := testsupport.NewPKI(t), testsupport.NewPKI(t)
	dir := t.TempDir()
	mount := func(version string, p testsupport.PKI) {
		t.Helper()
		data := filepath.Join(dir, version)
		if err := os.Mkdir(data, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, src := range map[string]string{"ca.crt": p.CA, "tls.crt": p.ServerCert, "tls.key": p.ServerKey} {
			b, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(data, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		// As the kubelet's atomic writer: a new ..data link renamed over
		// the old one; the files are links through ..data.
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(version, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"ca.crt", "tls.crt", "tls.key"} {
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrExist) {
				t.Fatal(err)
			}
		}
	}
	mount("..2026_01_01", before)
	r := testsupport.StartRedis(t)
	s := loadedServer(t, r.Addr, writeConfig(t, pol("per-ip", 100, time.Minute, entry("remote_address"))))
	addr := tlsServer(t, s, TLSOptions{
		CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), ClientCAFile: filepath.Join(dir, "ca.crt"),
	})
	oldCaller := tlsCaller(t, "caller of the old CA", before.CA, before.ClientCert, before.ClientKey)
	newCaller := tlsCaller(t, "caller of the new CA", after.CA, after.ClientCert, after.ClientKey)
	if _, err := call(addr, oldCaller, "10.0.0.1"); err != nil {
		t.Fatalf("before the rotation: %v", err)
	}
	if _, err := call(addr, newCaller, "10.0.0.1"); err == nil {
		t.Fatal("before the rotation, a caller of the new CA was served")
	}
	// A long-lived connection, as a gateway keeps, opened before.
	open, err := grpc.NewClient(addr, grpc.WithTransportCredentials(oldCaller.creds))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = open.Close() }()
	ask(t, rlsv3.NewRateLimitServiceClient(open), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "10.0.0.2")}})

	mount("..2026_02_01", after)
	if _, err := call(addr, newCaller, "10.0.0.1"); err != nil {
		t.Fatalf("after the rotation, the new CA's caller: %v", err)
	}
	if _, err := call(addr, oldCaller, "10.0.0.1"); err == nil {
		t.Fatal("after the rotation, a caller of the old CA was served")
	}
	ask(t, rlsv3.NewRateLimitServiceClient(open), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "10.0.0.2")}})

	// A rotation half done by hand (a key that does not match the
	// certificate) keeps the last good pair in use.
	b, err := os.ReadFile(before.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "..2026_02_01", "tls.key"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := call(addr, newCaller, "10.0.0.1"); err != nil {
		t.Fatalf("with a bad key file, the last good pair: %v", err)
	}
}

// TestTLSOptionsValidate: a client CA without a TLS listener (callers
// would be "authenticated" on plaintext), names without a CA, half a key
// pair are refused at start, and so are files that cannot be read.
func TestTLSOptionsValidate(t *testing.T) {
	t.Parallel()
	pki := testsupport.NewPKI(t)
	for _, tc := range []struct {
		name string
		o    TLSOptions
		want string // "" valid
	}{
		{"plaintext", TLSOptions{}, ""},
		{"server TLS", TLSOptions{CertFile: "c", KeyFile: "k"}, ""},
		{"mTLS with names", TLSOptions{CertFile: "c", KeyFile: "k", ClientCAFile: "ca", ClientNames: []string{"spiffe://x/y"}}, ""},
		{"client CA on plaintext", TLSOptions{ClientCAFile: "ca"}, "--tls-client-ca-file needs --tls-cert-file"},
		{"names without CA", TLSOptions{CertFile: "c", KeyFile: "k", ClientNames: []string{"a"}}, "--tls-client-names needs --tls-client-ca-file"},
		{"half a pair", TLSOptions{CertFile: "c"}, "go together"},
		{"empty name", TLSOptions{CertFile: "c", KeyFile: "k", ClientCAFile: "ca", ClientNames: []string{""}}, "is not a name"},
	} {
		err := tc.o.Validate()
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	s := New(nil, Options{})
	for _, o := range []TLSOptions{
		{CertFile: pki.ServerCert, KeyFile: pki.ServerKey, ClientCAFile: filepath.Join(t.TempDir(), "missing.pem")},
		{CertFile: pki.ServerCert, KeyFile: pki.ServerKey, ClientCAFile: pki.ServerKey}, // no certificate in it
		{CertFile: pki.ServerCert, KeyFile: pki.ClientKey},                              // not its key
	} {
		if _, err := s.TLSCreds(o); err == nil {
			t.Errorf("%+v: served", o)
		}
	}
}

// TestTLSNeedsALPN: the gRPC server refuses a TLS client that negotiates
// no ALPN protocol (grpc-go enforces it), which is why docs/rls.md has
// gateways offer "h2"; the same bytes over a connection that negotiated h2
// get the server's HTTP/2 SETTINGS.
func TestTLSNeedsALPN(t *testing.T) {
	t.Parallel()
	pki := testsupport.NewPKI(t)
	r := testsupport.StartRedis(t)
	s := loadedServer(t, r.Addr, writeConfig(t, pol("per-ip", 1, time.Minute, entry("remote_address"))))
	addr := tlsServer(t, s, TLSOptions{CertFile: pki.ServerCert, KeyFile: pki.ServerKey, ClientCAFile: pki.CA})
	pair, err := tls.LoadX509KeyPair(pki.ClientCert, pki.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	pem, _ := os.ReadFile(pki.CA)
	roots.AppendCertsFromPEM(pem)
	answer := func(protos []string) ([]byte, error) {
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: &tls.Config{
			MinVersion: tls.VersionTLS12, RootCAs: roots, Certificates: []tls.Certificate{pair}, NextProtos: protos, ServerName: "127.0.0.1",
		}}
		conn, err := d.DialContext(context.Background(), "tcp", addr)
		if err != nil {
			return nil, err
		}
		defer func() { _ = conn.Close() }()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		// The HTTP/2 client preface and an empty SETTINGS frame.
		if _, err := conn.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)); err != nil {
			return nil, err
		}
		buf := make([]byte, 9)
		_, err = io.ReadFull(conn, buf)
		return buf, err
	}
	if frame, err := answer([]string{"h2"}); err != nil || frame[3] != 4 {
		t.Fatalf("with ALPN h2: frame % x, %v; want the server's SETTINGS", frame, err)
	}
	if frame, err := answer(nil); err == nil {
		t.Fatalf("without ALPN: the server answered HTTP/2 (% x)", frame)
	}
}
