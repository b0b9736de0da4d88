package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// The install with the rate limit service requiring client certificates
// (config/rls-mtls), the image and Redis as in installKustomization.
func rlsMTLSKustomization() string { return overlayKustomization("../rls-mtls") }

// testRateLimitServiceMTLS switches the rate limit service to client
// certificates (config/rls-mtls, with the Secret slidegate-rls-tls a user
// creates) and asks each server as a gateway would: with a certificate of
// the client CA it is answered; without one, with one of another CA, or in
// plaintext, it is refused (issue 22: before, any pod could spend any
// client's budget). It ends back on config/rls.
func testRateLimitServiceMTLS(ctx context.Context, t *testing.T, n *node) {
	pki, other := testsupport.NewPKI(t), testsupport.NewPKI(t)
	mustKubectl(ctx, t, "-n", system, "create", "secret", "generic", "slidegate-rls-tls",
		"--from-file=tls.crt="+pki.ServerCert, "--from-file=tls.key="+pki.ServerKey, "--from-file=ca.crt="+pki.CA)
	t.Cleanup(func() {
		_, _ = kubectl(context.WithoutCancel(ctx), "", "-n", system, "delete", "secret", "slidegate-rls-tls", "--ignore-not-found")
	})
	mustKubectl(ctx, t, "apply", "--server-side", "-k", n.overlay(t, rlsMTLSKustomization()))
	mustKubectl(ctx, t, "-n", system, "rollout", "status", "deployment/slidegate-rls", "--timeout=3m")
	defer func() {
		mustKubectl(ctx, t, "apply", "--server-side", "-k", n.overlay(t, rlsKustomization()))
		mustKubectl(ctx, t, "-n", system, "rollout", "status", "deployment/slidegate-rls", "--timeout=3m")
	}()

	caPEM, err := os.ReadFile(pki.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	cert := func(p testsupport.PKI) []tls.Certificate {
		c, err := tls.LoadX509KeyPair(p.ClientCert, p.ClientKey)
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{c}
	}
	// The server's certificate names localhost; the test dials pod IPs.
	withTLS := func(certs []tls.Certificate) grpc.DialOption {
		return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "localhost", Certificates: certs, MinVersion: tls.VersionTLS12}))
	}
	callers := []struct {
		name   string
		opt    grpc.DialOption
		served bool
	}{
		{"a certificate of the client CA", withTLS(cert(pki)), true},
		{"no certificate", withTLS(nil), false},
		{"a certificate of another CA", withTLS(cert(other)), false},
		{"plaintext", grpc.WithTransportCredentials(insecure.NewCredentials()), false},
	}
	var pods corev1.PodList
	getJSON(ctx, t, &pods, "-n", system, "get", "pods", "-l", "app.kubernetes.io/component=rls", "--field-selector=status.phase=Running")
	ready := 0
	for _, pod := range pods.Items {
		if !podReady(&pod) || pod.DeletionTimestamp != nil {
			continue
		}
		ready++
		for _, c := range callers {
			err := askRLS(ctx, net.JoinHostPort(pod.Status.PodIP, "8081"), c.opt)
			switch {
			case c.served && err != nil:
				t.Errorf("%s: %s refused: %v", pod.Name, c.name, err)
			case !c.served && err == nil:
				t.Errorf("%s: %s answered", pod.Name, c.name)
			default:
				t.Logf("%s: %s: served %v (%v)", pod.Name, c.name, err == nil, err)
			}
		}
	}
	if ready == 0 {
		t.Fatal("no ready RLS server")
	}
}

// askRLS sends one ShouldRateLimit to addr.
func askRLS(ctx context.Context, addr string, opt grpc.DialOption) error {
	conn, err := grpc.NewClient(addr, opt)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{
		Domain: "node-test",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
			{Key: "generic_key", Value: "mtls"},
		}}},
	})
	if err != nil {
		return fmt.Errorf("ShouldRateLimit: %w", err)
	}
	return nil
}
