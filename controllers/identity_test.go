/*
Copyright 2026 The slidegate Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisadmin"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisidentity"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// namespacePassword is the password the manager derives for ns's user.
func namespacePassword(t *testing.T, ns string) string {
	t.Helper()
	key := installKey(t)
	if key == nil {
		return "" // not made yet: the caller polls
	}
	var n corev1.Namespace
	if err := k.Get(context.Background(), types.NamespacedName{Name: ns}, &n); err != nil {
		t.Fatal(err)
	}
	p, _ := redisadmin.Passwords(key, redisadmin.NamespaceUser(ns), string(n.UID), 0, time.Now())
	return p
}

// credentialsOf reads ns's slidegate-redis-credentials.
func credentialsOf(ns string) (map[string][]byte, error) {
	var s corev1.Secret
	err := k.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}, &s)
	return s.Data, err
}

// redisUser reports whether the test Redis has user name.
func redisUser(name string) bool {
	got, err := redisServer.Do("ACL", "GETUSER", name)
	return err == nil && got != ""
}

// inNamespaceMode runs the rest of the test with the namespace identity
// mode, the default of a new install.
func inNamespaceMode(t *testing.T) {
	identities.SetMode(redisidentity.Namespace)
	t.Cleanup(func() { identities.SetMode(redisidentity.Shared) })
}

// TestNoCredentialsWithoutInjectionLabel: a namespace that is not labelled
// for injection gets no Redis credentials and no Redis user, even with a
// sidecar policy (no sidecar of slidegate's runs there to need them);
// labelling it hands them out, and removing the label takes them back.
// Before, every namespace with a policy got the credentials.
func TestNoCredentialsWithoutInjectionLabel(t *testing.T) {
	ctx := context.Background()
	ns := newNamespaceWith(t, nil)
	p := newPolicy(ns, "p")
	create(t, p)
	eventually(t, "the policy reconciled", func() error { return settled(p, readyAccepted) })
	// A reconcile that mirrored would have done it by now; a few more
	// passes of the identity loop too.
	time.Sleep(3 * identities.Interval)
	if _, err := credentialsOf(ns); !apierrors.IsNotFound(err) {
		t.Fatalf("a namespace without the injection label has credentials: %v", err)
	}
	if redisUser(redisadmin.NamespaceUser(ns)) {
		t.Fatal("a namespace without the injection label has a Redis user")
	}

	setInjectionLabel(t, ns, v1alpha1.InjectionEnabled)
	eventually(t, "credentials once labelled", func() error {
		_, err := credentialsOf(ns)
		if err == nil && !redisUser(redisadmin.NamespaceUser(ns)) {
			err = errors.New("no Redis user")
		}
		return err
	})
	setInjectionLabel(t, ns, "")
	eventually(t, "credentials gone with the label", func() error {
		if _, err := credentialsOf(ns); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the Secret: %w", err)
		}
		if redisUser(redisadmin.NamespaceUser(ns)) {
			return errors.New("the Redis user is still there")
		}
		return nil
	})
	_ = ctx
}

func setInjectionLabel(t *testing.T, ns, value string) {
	t.Helper()
	var n corev1.Namespace
	if err := k.Get(context.Background(), types.NamespacedName{Name: ns}, &n); err != nil {
		t.Fatal(err)
	}
	orig := n.DeepCopy()
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	if value == "" {
		delete(n.Labels, v1alpha1.InjectionLabel)
	} else {
		n.Labels[v1alpha1.InjectionLabel] = value
	}
	if err := k.Patch(context.Background(), &n, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
}

// TestNamespaceIdentity: in the namespace mode a namespace's Secret holds
// its own Redis identity and not the shared one; that identity decides
// through the Functions library on the namespace's keys and is refused
// another's; the last policy takes the Secret and the user away.
func TestNamespaceIdentity(t *testing.T) {
	inNamespaceMode(t)
	ctx := context.Background()
	ns := newNamespace(t)
	p := newPolicy(ns, "p")
	create(t, p)
	var data map[string][]byte
	eventually(t, "the namespace's identity, alone", func() error {
		var err error
		if data, err = credentialsOf(ns); err != nil {
			return err
		}
		if _, ok := data[redisconn.SecretPasswordKey]; ok {
			return errors.New("the shared identity is still in the Secret")
		}
		if string(data[redisconn.SecretNamespaceUsernameKey]) != redisadmin.NamespaceUser(ns) || string(data[redisconn.SecretNamespacePasswordKey]) != namespacePassword(t, ns) {
			return fmt.Errorf("namespace keys %q", data[redisconn.SecretNamespaceUsernameKey])
		}
		return nil
	})
	eventually(t, "Ready", func() error { return settled(p, readyAccepted) })

	// The credentials work, for this namespace's keys only.
	rdb, err := redisconn.NewClient(redisconn.Config{Addrs: []string{redisServer.Addr},
		Username: string(data[redisconn.SecretNamespaceUsernameKey]), Password: string(data[redisconn.SecretNamespacePasswordKey])})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rdb.Close() }()
	l, err := limiter.New(rdb, limiter.Options{Functions: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	decide := func(id string) limiter.Decision {
		return l.Decide(ctx, []limiter.Request{{Rule: limiter.Rule{ID: id, Limit: 5, Window: time.Minute}, Client: "c"}})[0]
	}
	if d := decide(ns + "/p"); d.Source != limiter.SourceRedis {
		t.Fatalf("a decision with the namespace's identity: %+v", d)
	}
	if d := decide("other/p"); d.Source == limiter.SourceRedis || d.Err == nil || !strings.Contains(d.Err.Error(), "NOPERM") {
		t.Fatalf("another namespace's key with this namespace's identity: %+v", d)
	}

	if err := k.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Secret and the user gone with the last policy", func() error {
		if _, err := credentialsOf(ns); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the Secret: %w", err)
		}
		if redisUser(redisadmin.NamespaceUser(ns)) {
			return errors.New("the Redis user is still there")
		}
		return nil
	})
	// Its connections went with it (ACL DELUSER).
	if err := rdb.Ping(ctx).Err(); err == nil {
		if err := rdb.Ping(ctx).Err(); err == nil {
			t.Error("a connection of the deleted user still works")
		}
	}
}

// legacyPod is a pod whose injection status is that of the first
// release's sidecar (no configMinor, no redisIdentity): it reads the shared
// identity from the environment.
func legacyPod(ns, name string) *corev1.Pod {
	p := newPod(ns, name, map[string]string{"app": "checkout"}, false)
	p.Annotations = map[string]string{v1alpha1.InjectedAnnotation: `{"version":"v1","container":"slidegate-sidecar","targetPort":"http","appContainer":"app","appPort":8080}`}
	return p
}

// TestSharedIdentityKeptForEarlierSidecars walks the upgrade of a
// namespace: while a sidecar of an earlier release runs there, its Secret
// keeps the shared identity it held beside the namespace's own; once the
// last such pod is gone the shared identity goes. A pod that merely claims
// to be such a sidecar (its status is an annotation the pod author can
// write) never brings the shared identity back: it reaches every
// namespace's keys.
func TestSharedIdentityKeptForEarlierSidecars(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	p := newPolicy(ns, "p")
	old := legacyPod(ns, "old")
	create(t, p, old)
	hasShared := func(want bool) func() error {
		return func() error {
			data, err := credentialsOf(ns)
			if err != nil {
				return err
			}
			if got := string(data[redisconn.SecretPasswordKey]) == "s3cret"; got != want {
				return fmt.Errorf("shared identity %v, want %v (keys %v)", got, want, keysOf(data))
			}
			if data[redisconn.SecretNamespacePasswordKey] == nil {
				return fmt.Errorf("no namespace identity (keys %v)", keysOf(data))
			}
			return nil
		}
	}
	eventually(t, "the shared identity (shared mode)", hasShared(true))

	// The manager moves to the namespace mode; a new pod triggers a pass.
	inNamespaceMode(t)
	current := newPod(ns, "new", map[string]string{"app": "checkout"}, false)
	if err := inject.Inject(current, inject.Options{RedisIdentity: v1alpha1.RedisIdentityNamespace}); err != nil {
		t.Fatal(err)
	}
	create(t, current)
	eventually(t, "the new pod reconciled", func() error {
		if got := get(t, p).Status.MatchedPods; got != 2 {
			return fmt.Errorf("matchedPods %d", got)
		}
		return controllerIdle()
	})
	if err := hasShared(true)(); err != nil {
		t.Fatalf("while the earlier sidecar runs: %v", err)
	}
	if err := k.Delete(ctx, old, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the shared identity gone with the last sidecar using it", hasShared(false))

	// A forged status: the configuration goes to minor 0 for it (harmless:
	// older fields only), the shared identity stays away.
	create(t, legacyPod(ns, "forged"))
	eventually(t, "the forged pod reconciled", func() error {
		_, cfg, err := readConfig(ns)
		if err == nil && cfg.Version != sidecarconfig.VersionOf(0) {
			err = fmt.Errorf("version %q", cfg.Version)
		}
		if err == nil {
			err = controllerIdle()
		}
		return err
	})
	if err := hasShared(false)(); err != nil {
		t.Errorf("a forged earlier sidecar: %v", err)
	}
}

func keysOf(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestRLSNamespaceGetsNoIdentity: a namespace named like the rate limit
// service's scope would get the pattern of its keys; it gets no identity,
// and its policies say why.
func TestRLSNamespaceGetsNoIdentity(t *testing.T) {
	inNamespaceMode(t)
	ns := redisadmin.RLSScope
	if err := k.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{v1alpha1.InjectionLabel: v1alpha1.InjectionEnabled}}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	p := newPolicy(ns, "p")
	create(t, p)
	t.Cleanup(func() { _ = k.Delete(context.Background(), p) })
	eventually(t, "Ready False", func() error {
		c := meta.FindStatusCondition(get(t, p).Status.Conditions, string(v1alpha1.ConditionReady))
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != string(v1alpha1.ReasonRedisCredentialsUnavailable) || !strings.Contains(c.Message, "rate limit service") {
			return fmt.Errorf("Ready %+v", c)
		}
		return nil
	})
	if redisUser(redisadmin.NamespaceUser(ns)) {
		t.Error("namespace rls has a Redis user")
	}
}

// TestOpenRedisReported: the suite's Redis needs no AUTH: the metric
// counts it and an event on the manager's Pod says so.
func TestOpenRedisReported(t *testing.T) {
	eventually(t, "the open node counted", func() error {
		if v := gathered(t, "slidegate_redis_unauthenticated", ""); v != 1 {
			return fmt.Errorf("slidegate_redis_unauthenticated = %v", v)
		}
		return nil
	})
	events := recorder.about(managerPod.Namespace, managerPod.Name)
	if !slices.ContainsFunc(events, func(e string) bool {
		return strings.Contains(e, "Warning RedisUnauthenticated") && strings.Contains(e, redisServer.Addr)
	}) {
		t.Errorf("no event about the open Redis: %q", events)
	}
}

// TestRLSCredentials: the rate limit service's Secret holds its user,
// which decides on the rls/ keys and nothing else.
func TestRLSCredentials(t *testing.T) {
	var s corev1.Secret
	eventually(t, "the rate limit service's Secret", func() error {
		return k.Get(context.Background(), identities.RLSSecret, &s)
	})
	rdb, err := redisconn.NewClient(redisconn.Config{Addrs: []string{redisServer.Addr},
		Username: string(s.Data[redisconn.SecretUsernameKey]), Password: string(s.Data[redisconn.SecretPasswordKey])})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rdb.Close() }()
	l, err := limiter.New(rdb, limiter.Options{Functions: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	for id, want := range map[string]bool{"rls/shop/p": true, "shop/p": false} {
		d := l.Decide(context.Background(), []limiter.Request{{Rule: limiter.Rule{ID: id, Limit: 5, Window: time.Minute}, Client: "c"}})[0]
		if (d.Source == limiter.SourceRedis) != want {
			t.Errorf("%s as the rate limit service: %+v", id, d)
		}
	}
	if _, err := l.Announce(context.Background(), []string{"rls"}, time.Minute); err != nil {
		t.Errorf("the rate limit service's presence key: %v", err)
	}
}
