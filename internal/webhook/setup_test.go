package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// TestSelfSignedCertificates runs Setup in CertModeSelf against the API
// server: the rotator fills the Secret and the webhook configuration's
// caBundle, /readyz stays false until the certificate is on disk, and the
// server then presents a certificate that the caBundle verifies for the
// Service's DNS name — what the API server itself checks.
func TestSelfSignedCertificates(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns, secretName, svc, whName = "slidegate-system", "wh-cert", "wh-svc", "rotation-test"
	namespace(t, ns, false)
	certSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: ns}}
	if err := k8s.Create(ctx, certSecret); err != nil {
		t.Fatal(err)
	}
	// envtest outlives one run (-count=2).
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), certSecret) })
	wh := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: whName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "inject.rotation-test.slidegate.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: svc, Path: ptr.To(Path)}},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			// Matches nothing: this configuration only carries the caBundle.
			ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"never": "matches"}},
		}},
	}
	if err := k8s.Create(ctx, wh); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), wh) })

	certDir := t.TempDir()
	// What a kubelet mounts first from the install's empty Secret
	// (config/default/webhook_cert_secret.yaml): the files, empty. A server
	// started on them stopped the manager (seen on the real node).
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.WriteFile(filepath.Join(certDir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	mgr, err := manager.New(testEnvConfig, manager.Options{
		Scheme:        scheme,
		Metrics:       metricsserver.Options{BindAddress: "0"},
		WebhookServer: webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: certDir}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ready, err := Setup(mgr, Options{CertMode: CertModeSelf, CertDir: certDir, Namespace: ns, SecretName: secretName, ServiceName: svc, ConfigurationName: whName})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()

	var secret corev1.Secret
	eventually(t, 30*time.Second, "the rotator fills the Secret", func() bool {
		return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: secretName}, &secret) == nil && len(secret.Data["tls.crt"]) > 0 && len(secret.Data["ca.crt"]) > 0
	})
	eventually(t, 30*time.Second, "the rotator writes the caBundle", func() bool {
		return k8s.Get(ctx, client.ObjectKey{Name: whName}, wh) == nil && bytes.Equal(wh.Webhooks[0].ClientConfig.CABundle, secret.Data["ca.crt"])
	})
	req, _ := http.NewRequest(http.MethodGet, "/readyz", nil)
	if ready(req) == nil {
		t.Fatal("/readyz is true before the certificate is mounted")
	}
	// The rotator declares itself ready at most 2 s after injecting the
	// caBundle (its first backoff step, 1 s with jitter 1); give it that.
	time.Sleep(3 * time.Second)
	select {
	case err := <-done:
		done <- nil // for the deferred wait
		t.Fatalf("the manager stopped on the empty certificate files: %v", err)
	default:
	}
	// What the kubelet does with the Secret volume at its next sync.
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.WriteFile(filepath.Join(certDir, f), secret.Data[f], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "/readyz turns true once the certificate is on disk", func() bool { return ready(req) == nil })

	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(wh.Webhooks[0].ClientConfig.CABundle) {
		t.Fatal("caBundle holds no certificate")
	}
	conn, err := tls.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), &tls.Config{RootCAs: pool, ServerName: svc + "." + ns + ".svc", MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("the webhook's certificate does not verify against its caBundle: %v", err)
	}
	_ = conn.Close()
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
