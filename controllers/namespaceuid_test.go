package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/redisadmin"
	"github.com/slidegate/slidegate/internal/redisconn"
)

// TestNamespaceCreatedAgain: a namespace's Redis password is bound to the
// Namespace's UID. Whoever held team-x's credentials (its former admin, a
// copy of its Secret) holds nothing once team-x is deleted: its user goes
// while the namespace terminates, and the next namespace named team-x gets
// another password, which the old one does not open. Before, the password
// was derived from the name alone: the new team-x got the same one.
func TestNamespaceCreatedAgain(t *testing.T) {
	ctx := context.Background()
	inNamespaceMode(t)
	ns := newNamespace(t)
	user := redisadmin.NamespaceUser(ns)
	auth := func(password string) error {
		c := redis.NewClient(&redis.Options{Addr: redisServer.Addr, Username: user, Password: password, MaxRetries: -1, DisableIdentity: true})
		defer func() { _ = c.Close() }()
		return c.Ping(ctx).Err()
	}
	handedOut := func(not string) (string, error) {
		data, err := credentialsOf(ns)
		if err != nil {
			return "", err
		}
		pw := string(data[redisconn.SecretNamespacePasswordKey])
		if pw == "" || pw == not {
			return "", fmt.Errorf("the namespace's password is %q", pw)
		}
		return pw, auth(pw)
	}
	p := newPolicy(ns, "p")
	create(t, p)
	var first string
	eventually(t, "the first namespace's credentials", func() (err error) {
		first, err = handedOut("")
		return err
	})

	// Deleted: while it terminates its user goes. (envtest runs no
	// namespace controller: the test deletes the content and finalizes.)
	var n corev1.Namespace
	if err := k.Get(ctx, types.NamespacedName{Name: ns}, &n); err != nil {
		t.Fatal(err)
	}
	firstUID := n.UID
	if err := k.Delete(ctx, &n); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the user gone while the namespace terminates", func() error {
		if redisUser(user) {
			return errors.New("the Redis user is still there")
		}
		return nil
	})
	if err := auth(first); err == nil {
		t.Fatal("the deleted namespace's password still opens Redis")
	}
	if err := k.Delete(ctx, p); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	eventually(t, "the content gone", func() error {
		if err := k.Get(ctx, types.NamespacedName{Namespace: ns, Name: p.Name}, &v1alpha1.RateLimitPolicy{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the policy: %w", err)
		}
		if _, err := credentialsOf(ns); !apierrors.IsNotFound(err) {
			var s corev1.Secret
			s.Name, s.Namespace = v1alpha1.RedisCredentialsSecretName, ns
			_ = k.Delete(ctx, &s)
			return fmt.Errorf("the Secret: %w", err)
		}
		return nil
	})
	if err := k.Get(ctx, types.NamespacedName{Name: ns}, &n); err != nil {
		t.Fatal(err)
	}
	n.Spec.Finalizers = nil
	if err := k.SubResource("finalize").Update(ctx, &n); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the namespace gone", func() error {
		if err := k.Get(ctx, types.NamespacedName{Name: ns}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %w", err)
		}
		return nil
	})

	// Created again under the name.
	if err := k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{v1alpha1.InjectionLabel: v1alpha1.InjectionEnabled}}}); err != nil {
		t.Fatal(err)
	}
	create(t, newPolicy(ns, "p"))
	eventually(t, "the second namespace's credentials, which open Redis", func() error {
		_, err := handedOut(first)
		return err
	})
	if err := k.Get(ctx, types.NamespacedName{Name: ns}, &n); err != nil || n.UID == firstUID {
		t.Fatalf("the namespace created again: UID %s (the first %s), %v", n.UID, firstUID, err)
	}
	if err := auth(first); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("the first namespace's password against the second: %v, want WRONGPASS", err)
	}
	t.Logf("the first namespace's password is refused (WRONGPASS); the second's opens Redis")
}

// TestLegacyPasswordKept: a namespace upgraded from a release that derived
// its password from the name keeps that password valid for the grace
// (LegacyPasswordGrace; 10 s here) beside the new one, so that its running
// sidecars connect until the kubelet brings them the new Secret; then it
// is refused. Without the grace, the upgrade would send every new
// connection to the fail mode for a minute or two.
func TestLegacyPasswordKept(t *testing.T) {
	ctx := context.Background()
	inNamespaceMode(t)
	const grace = 10 * time.Second
	identities.SetLegacyGrace(grace)
	t.Cleanup(func() { identities.SetLegacyGrace(0) })
	ns := newNamespace(t)
	user := redisadmin.NamespaceUser(ns)
	auth := func(password string) error {
		c := redis.NewClient(&redis.Options{Addr: redisServer.Addr, Username: user, Password: password, MaxRetries: -1, DisableIdentity: true})
		defer func() { _ = c.Close() }()
		return c.Ping(ctx).Err()
	}
	create(t, newPolicy(ns, "p"))
	var current string
	eventually(t, "the namespace's password handed out", func() error {
		data, err := credentialsOf(ns)
		if err != nil {
			return err
		}
		current = string(data[redisconn.SecretNamespacePasswordKey])
		return auth(current)
	})
	// The Secret as the earlier release wrote it: the name's password.
	// (The controller wrote the Secret first: one of ours created in a
	// namespace without a policy yet is deleted before the policy comes.)
	legacy, _ := redisadmin.Passwords(installKey(t), user, "", 0, time.Now())
	var written time.Time
	writeLegacy := func() {
		var sec corev1.Secret
		if err := k.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}, &sec); err != nil {
			t.Fatal(err)
		}
		sec.Data[redisconn.SecretNamespacePasswordKey] = []byte(legacy)
		written = time.Now()
		if err := k.Update(ctx, &sec); err != nil && !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
	}
	writeLegacy()
	eventually(t, "the new password back in the Secret, the earlier one kept", func() error {
		data, err := credentialsOf(ns)
		if err != nil {
			return err
		}
		if got := string(data[redisconn.SecretNamespacePasswordKey]); got != current {
			return fmt.Errorf("the Secret holds %q", got)
		}
		if err := auth(legacy); err != nil {
			// The controller keeps the earlier password before it writes
			// the Secret, so it never saw it: a reconcile that began before
			// the write put the current one back, and the one the write
			// caused read that from the cache. (An upgraded namespace holds
			// the earlier password from the start.) Write it again.
			writeLegacy()
			return err
		}
		return nil
	})
	eventually(t, "the earlier password refused after the grace", func() error {
		if err := auth(legacy); err == nil {
			return errors.New("it still opens Redis")
		}
		return nil
	})
	// The grace starts when the controller sees the earlier password,
	// after it was written: it cannot end sooner than grace after that.
	if took := time.Since(written); took < grace {
		t.Errorf("the earlier password was refused %v after it was written, within the grace of %v", took, grace)
	}
	if err := auth(current); err != nil {
		t.Fatalf("the new password: %v", err)
	}
}
