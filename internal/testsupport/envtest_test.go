package testsupport

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestControlPlaneSmoke starts the envtest control plane and creates a
// Namespace through the real API server, then reads it back.
func TestControlPlaneSmoke(t *testing.T) {
	env, err := NewEnvironment()
	if err != nil {
		Missing(t, "envtest control plane", EnvtestUnavailable(err))
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "smoke"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatalf("creating a Namespace: %v", err)
	}
	var got corev1.Namespace
	if err := c.Get(ctx, client.ObjectKey{Name: "smoke"}, &got); err != nil {
		t.Fatalf("reading the Namespace back: %v", err)
	}
	if got.UID == "" || got.Status.Phase != corev1.NamespaceActive {
		t.Fatalf("namespace not stored by the API server: uid=%q phase=%q", got.UID, got.Status.Phase)
	}
}
