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
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/clienthash"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/owned"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

var nsCounter atomic.Int32

// newNamespace creates a namespace for one test, labelled for injection
// (where the controller hands out Redis credentials).
func newNamespace(t *testing.T) string {
	t.Helper()
	return newNamespaceWith(t, map[string]string{v1alpha1.InjectionLabel: v1alpha1.InjectionEnabled})
}

// newNamespaceWith creates a namespace for one test with labels lbls.
func newNamespaceWith(t *testing.T, lbls map[string]string) string {
	t.Helper()
	// A DNS label: subtest names may hold any character.
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, fmt.Sprintf("t%d-%s", nsCounter.Add(1), strings.ToLower(t.Name())))
	name = strings.Join(strings.FieldsFunc(name, func(r rune) bool { return r == '-' }), "-")
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-")
	}
	if err := k.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}}); err != nil {
		t.Fatal(err)
	}
	return name
}

// newPolicy is testsupport.NewPolicy: 5 per 10 s by X-User-ID on app=checkout.
var newPolicy = testsupport.NewPolicy

func create(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := k.Create(context.Background(), o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
}

// newPod is a pod whose app serves port http (8080); injected, it is what
// the webhook admits: inject.Inject's sidecar in front of that port (the
// controller judges enforcement from the spec).
func newPod(ns, name string, lbls map[string]string, injected bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: lbls},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
	}
	if injected {
		if err := inject.Inject(p, inject.Options{}); err != nil {
			panic(err)
		}
	}
	return p
}

// TestRendersForTheOldestSidecar: while a pod injected by the first release
// (its injection status records no configMinor) runs in the namespace, the
// document is minor version 0, the one its sidecar reads; once it is gone,
// the newest. Its sidecar refused everything else, and with it every policy
// of the namespace. A terminating pod still runs its sidecar (it serves
// until the app has drained), so it counts until it is gone: on the real
// node the document went to the newest version as a rollout started
// terminating the old pods, and their sidecars refused it.
func TestRendersForTheOldestSidecar(t *testing.T) {
	ns := newNamespace(t)
	policy := newPolicy(ns, "p")
	create(t, policy, newPod(ns, "new", map[string]string{"app": "checkout"}, true))
	version := func(want string) func() error {
		return func() error {
			_, cfg, err := readConfig(ns)
			if err != nil {
				return err
			}
			if cfg.Version != want {
				return fmt.Errorf("version %q, want %q", cfg.Version, want)
			}
			return nil
		}
	}
	eventually(t, "the newest version", version(sidecarconfig.Version))
	old := newPod(ns, "old", map[string]string{"app": "checkout"}, false)
	old.Annotations = map[string]string{v1alpha1.InjectedAnnotation: `{"version":"v1","container":"slidegate-sidecar","targetPort":"http","appContainer":"app","appPort":8080}`}
	// The finalizer holds the pod terminating, as a kubelet does while it
	// stops the containers.
	old.Finalizers = []string{"test.slidegate.dev/hold"}
	create(t, old)
	eventually(t, "minor version 0 for the old sidecar", version(sidecarconfig.VersionOf(0)))
	if err := k.Delete(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	// The status no longer counts the terminating pod once the controller
	// has reconciled its deletion.
	eventually(t, "the terminating pod reconciled", func() error {
		if got := get(t, policy).Status.MatchedPods; got != 1 {
			return fmt.Errorf("matchedPods %d", got)
		}
		return controllerIdle()
	})
	if err := version(sidecarconfig.VersionOf(0))(); err != nil {
		t.Errorf("while the old pod terminates: %v", err)
	}
	if err := k.Patch(context.Background(), old, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the newest version once it is gone", version(sidecarconfig.Version))
}

// readConfig reads the namespace's rendered ConfigMap from the API server.
func readConfig(ns string) (*corev1.ConfigMap, *sidecarconfig.Config, error) {
	var cm corev1.ConfigMap
	if err := k.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: sidecarconfig.ConfigMapName}, &cm); err != nil {
		return nil, nil, err
	}
	cfg, err := sidecarconfig.Parse([]byte(cm.Data[sidecarconfig.FileName]))
	if err != nil {
		return &cm, nil, err
	}
	return &cm, cfg, nil
}

// policyRevision is the revision the named policy's status must report for
// the document cfg.
func policyRevision(t *testing.T, cfg *sidecarconfig.Config, name string) string {
	t.Helper()
	revs, err := render.PolicyRevisions(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return revs[name]
}

func policyNames(cfg *sidecarconfig.Config) []string {
	var out []string
	for _, p := range cfg.Policies {
		out = append(out, p.Name)
	}
	return out
}

func get(t *testing.T, p *v1alpha1.RateLimitPolicy) *v1alpha1.RateLimitPolicy {
	t.Helper()
	var got v1alpha1.RateLimitPolicy
	if err := k.Get(context.Background(), client.ObjectKeyFromObject(p), &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

// settled checks that a policy's status describes its current generation
// and has the wanted condition statuses.
func settled(p *v1alpha1.RateLimitPolicy, want map[v1alpha1.ConditionType]metav1.ConditionStatus) error {
	var got v1alpha1.RateLimitPolicy
	if err := k.Get(context.Background(), client.ObjectKeyFromObject(p), &got); err != nil {
		return err
	}
	if got.Status.ObservedGeneration != got.Generation {
		return fmt.Errorf("%s: observedGeneration %d, generation %d", p.Name, got.Status.ObservedGeneration, got.Generation)
	}
	for typ, st := range want {
		c := meta.FindStatusCondition(got.Status.Conditions, string(typ))
		if c == nil || c.Status != st || c.ObservedGeneration != got.Generation {
			return fmt.Errorf("%s: condition %s is %+v, want %s", p.Name, typ, c, st)
		}
	}
	return nil
}

var readyAccepted = map[v1alpha1.ConditionType]metav1.ConditionStatus{
	v1alpha1.ConditionReady:    metav1.ConditionTrue,
	v1alpha1.ConditionAccepted: metav1.ConditionTrue,
}

// The life of a namespace's policies, one behaviour per test, each in a
// namespace of its own: create, update, a second policy, deleting one,
// deleting the last.

// createReady creates policies and waits until each is Ready and Accepted.
func createReady(t *testing.T, policies ...*v1alpha1.RateLimitPolicy) {
	t.Helper()
	for _, p := range policies {
		create(t, p)
	}
	for _, p := range policies {
		eventually(t, "policy "+p.Name+" ready", func() error { return settled(p, readyAccepted) })
	}
}

// TestCreateRendersThePolicy: a new policy is rendered into the namespace's
// ConfigMap, applied by our field owner with our label and a non-controller
// owner reference, and its status names its own part's revision.
func TestCreateRendersThePolicy(t *testing.T) {
	ns := newNamespace(t)
	a := newPolicy(ns, "a")
	createReady(t, a)

	cm, cfg, err := readConfig(ns)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a"}, policyNames(cfg)); diff != "" {
		t.Errorf("policies in the ConfigMap (-want +got):\n%s", diff)
	}
	got := get(t, a)
	if rev := cm.Annotations[v1alpha1.RevisionAnnotation]; rev == "" || rev != render.Revision([]byte(cm.Data[sidecarconfig.FileName])) {
		t.Errorf("revision: annotation %q, content %q", rev, render.Revision([]byte(cm.Data[sidecarconfig.FileName])))
	}
	if want := policyRevision(t, cfg, "a"); got.Status.Revision != want {
		t.Errorf("status.revision %q, want %q (its part of the ConfigMap)", got.Status.Revision, want)
	}
	if cm.Labels[v1alpha1.ManagedByLabel] != v1alpha1.ManagedByValue {
		t.Errorf("ConfigMap labels %v lack %s=%s", cm.Labels, v1alpha1.ManagedByLabel, v1alpha1.ManagedByValue)
	}
	if len(cm.OwnerReferences) != 1 || cm.OwnerReferences[0].UID != got.UID || cm.OwnerReferences[0].Controller != nil {
		t.Errorf("owner references %+v, want one non-controller reference to policy a", cm.OwnerReferences)
	}
	if !slices.ContainsFunc(cm.ManagedFields, func(f metav1.ManagedFieldsEntry) bool {
		return f.Manager == owned.FieldOwner && f.Operation == metav1.ManagedFieldsOperationApply
	}) {
		t.Errorf("ConfigMap not applied by field owner %s: %+v", owned.FieldOwner, cm.ManagedFields)
	}
	if got.Status.ObservedGeneration != 1 {
		t.Errorf("observedGeneration %d, want 1", got.Status.ObservedGeneration)
	}
}

// TestUpdateRendersTheNewGeneration: a spec change reaches the ConfigMap,
// and the status describes the new generation with a new revision.
func TestUpdateRendersTheNewGeneration(t *testing.T) {
	ns := newNamespace(t)
	a := newPolicy(ns, "a")
	createReady(t, a)
	got := get(t, a)
	firstRevision := got.Status.Revision

	got.Spec.Limit = 50
	if err := k.Update(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	eventually(t, "policy a generation 2 rendered", func() error {
		if err := settled(a, readyAccepted); err != nil {
			return err
		}
		_, cfg, err := readConfig(ns)
		if err != nil {
			return err
		}
		if cfg.Policies[0].Limit != 50 {
			return fmt.Errorf("limit in the ConfigMap is %d", cfg.Policies[0].Limit)
		}
		return nil
	})
	got = get(t, a)
	if got.Status.ObservedGeneration != 2 || got.Status.Revision == firstRevision {
		t.Errorf("after the update: observedGeneration %d, revision %q (was %q)", got.Status.ObservedGeneration, got.Status.Revision, firstRevision)
	}
}

// TestSecondPolicyLeavesTheFirstAlone: a second policy joins the same
// document with an owner reference of its own; each policy reports its own
// part's revision, so the first one's status is not rewritten.
func TestSecondPolicyLeavesTheFirstAlone(t *testing.T) {
	ns := newNamespace(t)
	a := newPolicy(ns, "a")
	createReady(t, a)
	before := get(t, a)

	b := newPolicy(ns, "b", func(s *v1alpha1.RateLimitPolicySpec) { s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal} })
	create(t, b)
	eventually(t, "both policies rendered", func() error {
		if err := settled(b, readyAccepted); err != nil {
			return err
		}
		cm, cfg, err := readConfig(ns)
		if err != nil {
			return err
		}
		if names := policyNames(cfg); !slices.Equal(names, []string{"a", "b"}) {
			return fmt.Errorf("policies %v", names)
		}
		if len(cm.OwnerReferences) != 2 {
			return fmt.Errorf("owner references %+v", cm.OwnerReferences)
		}
		return nil
	})
	eventually(t, "own revisions", func() error {
		_, cfg, err := readConfig(ns)
		if err != nil {
			return err
		}
		for _, p := range []*v1alpha1.RateLimitPolicy{a, b} {
			if got, want := get(t, p).Status.Revision, policyRevision(t, cfg, p.Name); got != want {
				return fmt.Errorf("%s: status.revision %q, want %q", p.Name, got, want)
			}
		}
		return nil
	})
	if after := get(t, a); after.ResourceVersion != before.ResourceVersion {
		t.Errorf("policy a was rewritten when b came: status %+v", after.Status)
	}
}

// TestDeletingAPolicyRemovesItsPart: the others remain, alone in the
// document and the owner references, and the policies gauge follows.
func TestDeletingAPolicyRemovesItsPart(t *testing.T) {
	ns := newNamespace(t)
	a := newPolicy(ns, "a")
	b := newPolicy(ns, "b", func(s *v1alpha1.RateLimitPolicySpec) { s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal} })
	createReady(t, a, b)

	if err := k.Delete(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a removed from the ConfigMap", func() error {
		cm, cfg, err := readConfig(ns)
		if err != nil {
			return err
		}
		if names := policyNames(cfg); !slices.Equal(names, []string{"b"}) {
			return fmt.Errorf("policies %v", names)
		}
		if len(cm.OwnerReferences) != 1 || cm.OwnerReferences[0].Name != "b" {
			return fmt.Errorf("owner references %+v", cm.OwnerReferences)
		}
		return nil
	})
	waitGauge(t, policiesGauge.WithLabelValues(ns), 1)
}

// TestDeletingTheLastPolicyRemovesTheChildren: the ConfigMap and the
// mirrored credentials go with the last policy; the manager's own
// credentials Secret is never touched.
func TestDeletingTheLastPolicyRemovesTheChildren(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	a := newPolicy(ns, "a")
	createReady(t, a)
	mirrored := types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}
	eventually(t, "credentials mirrored", func() error {
		return k.Get(ctx, mirrored, &corev1.Secret{})
	})

	if err := k.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	eventually(t, "children removed with the last policy", func() error {
		if _, _, err := readConfig(ns); !apierrors.IsNotFound(err) {
			return fmt.Errorf("ConfigMap: %w", err)
		}
		if err := k.Get(ctx, mirrored, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Secret: %w", err)
		}
		return nil
	})
	if err := k.Get(ctx, redisSecret, &corev1.Secret{}); err != nil {
		t.Fatalf("the manager's credentials Secret: %v", err)
	}
}

// TestCredentialsMirror: the manager's credentials reach each namespace with
// policies, only the two credential keys, and follow rotation.
func TestCredentialsMirror(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	p := newPolicy(ns, "p")
	create(t, p)
	key := types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}
	mirrored := func(wantPassword string) func() error {
		return func() error {
			var s corev1.Secret
			if err := k.Get(ctx, key, &s); err != nil {
				return err
			}
			// Not sentinel-password: no sidecar of a Redis without
			// sentinels reads it (TestSentinelCredentials).
			want := map[string][]byte{"username": []byte("sidecar"), "password": []byte(wantPassword), "ca.crt": []byte(testCA),
				clienthash.SecretDataKey: []byte(clienthash.NamespaceKey(installKey(t), ns)),
				// The suite runs the shared mode with an administrative
				// identity: the namespace's own is prepared beside it.
				redisconn.SecretNamespaceUsernameKey: []byte("slidegate-ns-" + ns), redisconn.SecretNamespacePasswordKey: []byte(namespacePassword(t, ns))}
			if diff := cmp.Diff(want, s.Data); diff != "" {
				return fmt.Errorf("mirrored data (-want +got):\n%s", diff)
			}
			if s.Labels[v1alpha1.ManagedByLabel] != v1alpha1.ManagedByValue || s.Annotations[v1alpha1.SourceAnnotation] != redisSecret.String() {
				return fmt.Errorf("labels %v annotations %v", s.Labels, s.Annotations)
			}
			return nil
		}
	}
	eventually(t, "credentials mirrored", mirrored("s3cret"))

	// Rotation in the manager's namespace reaches the copy.
	setPassword(t, "r0tated")
	t.Cleanup(func() { setPassword(t, "s3cret") })
	eventually(t, "rotated credentials mirrored", mirrored("r0tated"))

	// Without the source, sidecars cannot authenticate: Ready says why.
	var src corev1.Secret
	if err := k.Get(ctx, redisSecret, &src); err != nil {
		t.Fatal(err)
	}
	if err := k.Delete(ctx, &src); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Ready False without credentials", func() error {
		return settled(p, map[v1alpha1.ConditionType]metav1.ConditionStatus{
			v1alpha1.ConditionReady:    metav1.ConditionFalse,
			v1alpha1.ConditionAccepted: metav1.ConditionTrue,
		})
	})
	if c := meta.FindStatusCondition(get(t, p).Status.Conditions, string(v1alpha1.ConditionReady)); c.Reason != string(v1alpha1.ReasonRedisCredentialsUnavailable) {
		t.Errorf("Ready reason %q, want %q", c.Reason, v1alpha1.ReasonRedisCredentialsUnavailable)
	}
	// After the grace (2 s here, a minute by default) it is a failure that
	// Flux and Argo CD report: Stalled, kstatus Failed.
	eventually(t, "Stalled once the grace has passed", func() error {
		c := meta.FindStatusCondition(get(t, p).Status.Conditions, string(v1alpha1.ConditionStalled))
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != string(v1alpha1.ReasonRedisCredentialsUnavailable) {
			return fmt.Errorf("Stalled %+v", c)
		}
		return nil
	})
	src.ResourceVersion = ""
	src.Data["password"] = []byte("s3cret")
	if err := k.Create(ctx, &src); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Ready again with credentials", func() error { return settled(p, readyAccepted) })
	if c := meta.FindStatusCondition(get(t, p).Status.Conditions, string(v1alpha1.ConditionStalled)); c != nil {
		t.Errorf("still Stalled with credentials: %+v", c)
	}
	events := recorder.about(ns, "p")
	if !slices.ContainsFunc(events, func(e string) bool {
		return strings.Contains(e, "Warning "+string(v1alpha1.ReasonRedisCredentialsUnavailable))
	}) {
		t.Errorf("no warning event for the missing credentials: %q", events)
	}
	for _, e := range events {
		if strings.Contains(e, "s3cret") || strings.Contains(e, "r0tated") {
			t.Errorf("an event contains a password: %q", e)
		}
	}
}

// TestClientHashKeys: each namespace with policies gets its own key for the
// hashes /debug shows, derived from the install key that the manager made
// (no one created the install Secret here); one namespace's key is not
// another's, and a key someone overwrote in the copy is repaired.
func TestClientHashKeys(t *testing.T) {
	ctx := context.Background()
	keyOf := func(ns string) func() (string, error) {
		return func() (string, error) {
			var s corev1.Secret
			if err := k.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}, &s); err != nil {
				return "", err
			}
			return string(s.Data[clienthash.SecretDataKey]), nil
		}
	}
	var keys []string
	for range 2 {
		ns := newNamespace(t)
		create(t, newPolicy(ns, "p"))
		var got string
		eventually(t, "client hash key mirrored into "+ns, func() error {
			var err error
			if got, err = keyOf(ns)(); err != nil {
				return err
			}
			if want := clienthash.NamespaceKey(installKey(t), ns); got != want {
				return fmt.Errorf("key %q, want %q", got, want)
			}
			return nil
		})
		keys = append(keys, got)
		if _, err := clienthash.New(got); err != nil {
			t.Errorf("%s: %v", ns, err)
		}
	}
	if keys[0] == keys[1] {
		t.Error("two namespaces share a client hash key")
	}
	// The last namespace's copy edited by hand: repaired.
	ns := newNamespace(t)
	create(t, newPolicy(ns, "p"))
	want := clienthash.NamespaceKey(installKey(t), ns)
	eventually(t, "key mirrored", func() error {
		if got, err := keyOf(ns)(); err != nil || got != want {
			return fmt.Errorf("key %q: %w", got, err)
		}
		return nil
	})
	var copied corev1.Secret
	if err := k.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}, &copied); err != nil {
		t.Fatal(err)
	}
	copied.Data[clienthash.SecretDataKey] = []byte(keys[0]) // another namespace's
	if err := k.Update(ctx, &copied); err != nil {
		t.Fatal(err)
	}
	eventually(t, "edited key repaired", func() error {
		if got, err := keyOf(ns)(); err != nil || got != want {
			return fmt.Errorf("key %q: %w", got, err)
		}
		return nil
	})
	var install corev1.Secret
	if err := k.Get(ctx, types.NamespacedName{Namespace: redisSecret.Namespace, Name: clienthash.InstallSecretName}, &install); err != nil {
		t.Fatal(err)
	}
	if install.Type != corev1.SecretTypeOpaque || install.Labels[v1alpha1.ManagedByLabel] != v1alpha1.ManagedByValue {
		t.Errorf("install Secret type %s labels %v", install.Type, install.Labels)
	}
}

// installKey is the install key the manager keeps.
func installKey(t *testing.T) []byte {
	t.Helper()
	var s corev1.Secret
	if err := k.Get(context.Background(), types.NamespacedName{Namespace: redisSecret.Namespace, Name: clienthash.InstallSecretName}, &s); err != nil {
		return nil // not made yet: the caller polls
	}
	return s.Data[clienthash.SecretDataKey]
}

func setPassword(t *testing.T, pw string) {
	t.Helper()
	var s corev1.Secret
	if err := k.Get(context.Background(), redisSecret, &s); err != nil {
		t.Fatal(err)
	}
	s.Data["password"] = []byte(pw)
	if err := k.Update(context.Background(), &s); err != nil {
		t.Fatal(err)
	}
}

// TestDriftRepair: edits to the children by anyone else are reverted.
func TestDriftRepair(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	p := newPolicy(ns, "p")
	create(t, p)
	eventually(t, "ready", func() error { return settled(p, readyAccepted) })
	cm, _, err := readConfig(ns)
	if err != nil {
		t.Fatal(err)
	}
	want := cm.Data[sidecarconfig.FileName]
	restored := func() error {
		cm, _, err := readConfig(ns)
		if err != nil {
			return err
		}
		if cm.Data[sidecarconfig.FileName] != want {
			return errors.New("config.json differs from the rendered document")
		}
		if cm.Labels[v1alpha1.ManagedByLabel] != v1alpha1.ManagedByValue {
			return fmt.Errorf("labels %v", cm.Labels)
		}
		return nil
	}

	// Someone edits the document.
	cm.Data[sidecarconfig.FileName] = `{"version":"slidegate.dev/sidecar-config/v1","namespace":"` + ns + `","policies":[]}`
	if err := k.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "edited ConfigMap repaired", restored)

	// Someone removes our label (the object leaves our filtered cache).
	cm, _, _ = readConfig(ns)
	delete(cm.Labels, v1alpha1.ManagedByLabel)
	if err := k.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "unlabelled ConfigMap repaired", restored)

	// Someone deletes it.
	cm, _, _ = readConfig(ns)
	if err := k.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "deleted ConfigMap recreated", restored)

	// Someone tampers with the credentials copy.
	key := types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}
	var s corev1.Secret
	eventually(t, "credentials mirrored", func() error { return k.Get(ctx, key, &s) })
	s.Data["password"] = []byte("wrong")
	if err := k.Update(ctx, &s); err != nil {
		t.Fatal(err)
	}
	eventually(t, "credentials repaired", func() error {
		var s corev1.Secret
		if err := k.Get(ctx, key, &s); err != nil {
			return err
		}
		if string(s.Data["password"]) != "s3cret" {
			return errors.New("password not repaired")
		}
		return nil
	})
}

// TestPodCounts: matchedPods, enforcedPods and the Enforced condition follow
// the pods.
func TestPodCounts(t *testing.T) {
	ctx := context.Background()
	ns := newNamespaceWith(t, nil) // not labelled for injection: the message says so
	p := newPolicy(ns, "p", func(s *v1alpha1.RateLimitPolicySpec) {
		s.TargetSelector = &v1alpha1.LabelSelector{
			MatchLabels:      map[string]v1alpha1.LabelValue{"app": "checkout"},
			MatchExpressions: []v1alpha1.LabelSelectorRequirement{{Key: "canary", Operator: metav1.LabelSelectorOpDoesNotExist}},
		}
	})
	create(t, p)
	counts := func(matched, enforced int32, cond metav1.ConditionStatus, reason v1alpha1.ConditionReason) func() error {
		return podCounts(t, p, matched, enforced, cond, reason)
	}
	eventually(t, "no pods", counts(0, 0, metav1.ConditionFalse, v1alpha1.ReasonNoPodsSelected))
	// The status is written under the controller's own field manager.
	var owners []string
	for _, mf := range get(t, p).ManagedFields {
		if mf.Subresource == "status" {
			owners = append(owners, mf.Manager)
		}
	}
	if !slices.Equal(owners, []string{owned.FieldOwner}) {
		t.Errorf("status field managers %v, want [%s]", owners, owned.FieldOwner)
	}
	// Zero is stored, not left out: `kubectl get -o wide` shows 0, not a blank.
	raw := &unstructured.Unstructured{}
	raw.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("RateLimitPolicy"))
	if err := k.Get(ctx, client.ObjectKeyFromObject(p), raw); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"matchedPods", "enforcedPods"} {
		if v, found, err := unstructured.NestedInt64(raw.Object, "status", f); !found || err != nil || v != 0 {
			t.Errorf("status.%s = %d (present %v, %v), want a stored 0", f, v, found, err)
		}
	}

	// Pod churn writes no ConfigMap: the fail-open divisor is counted by
	// the sidecars through Redis (internal/sidecar/peers.go), not rendered.
	cm, _, err := readConfig(ns)
	if err != nil {
		t.Fatal(err)
	}
	cmVersion := cm.ResourceVersion

	plain := newPod(ns, "plain", map[string]string{"app": "checkout"}, false)
	create(t,
		newPod(ns, "injected", map[string]string{"app": "checkout"}, true),
		plain,
		newPod(ns, "canary", map[string]string{"app": "checkout", "canary": "yes"}, false),
		newPod(ns, "other", map[string]string{"app": "other"}, false),
	)
	eventually(t, "one of two selected pods injected", counts(2, 1, metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced))
	// The test namespace has no injection label: the message says so and
	// names the pod, rather than guessing.
	if c := meta.FindStatusCondition(get(t, p).Status.Conditions, string(v1alpha1.ConditionEnforced)); !strings.Contains(c.Message, "namespace is not labelled") || !strings.Contains(c.Message, "plain") {
		t.Errorf("Enforced message %q does not name the cause and the pod", c.Message)
	}
	waitGauge(t, unprotectedPodsGauge.WithLabelValues(ns), 1)

	// The plain pod is replaced by an injected one.
	if err := k.Delete(ctx, plain); err != nil {
		t.Fatal(err)
	}
	create(t, newPod(ns, "plain-2", map[string]string{"app": "checkout"}, true))
	eventually(t, "all selected pods injected", counts(2, 2, metav1.ConditionTrue, v1alpha1.ReasonEnforced))

	// A relabelled pod leaves the selection.
	var canary corev1.Pod
	if err := k.Get(ctx, types.NamespacedName{Namespace: ns, Name: "injected"}, &canary); err != nil {
		t.Fatal(err)
	}
	canary.Labels["canary"] = "now"
	if err := k.Update(ctx, &canary); err != nil {
		t.Fatal(err)
	}
	eventually(t, "relabelled pod not counted", counts(1, 1, metav1.ConditionTrue, v1alpha1.ReasonEnforced))
	waitGauge(t, unprotectedPodsGauge.WithLabelValues(ns), 0)

	cm, cfg, err := readConfig(ns)
	if err != nil {
		t.Fatal(err)
	}
	if cm.ResourceVersion != cmVersion {
		t.Errorf("the ConfigMap was rewritten by pod churn (resourceVersion %s → %s)", cmVersion, cm.ResourceVersion)
	}
	if len(cfg.Policies) != 1 || cfg.Policies[0].Replicas != 0 {
		t.Errorf("rendered policies %+v, want one without replicas", cfg.Policies)
	}
}

// TestFinishedPodsNotCounted: a pod that finished (evicted: Failed; a
// completed Job's: Succeeded) runs nothing to protect, though it may stay as
// an object for long. It leaves the counts as a deleted pod does, and the
// policy is enforced by the running pods' sidecars.
func TestFinishedPodsNotCounted(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	p := newPolicy(ns, "p")
	create(t, p)
	counts := func(matched, enforced int32, cond metav1.ConditionStatus, reason v1alpha1.ConditionReason) func() error {
		return podCounts(t, p, matched, enforced, cond, reason)
	}
	setPhase := func(pod *corev1.Pod, phase corev1.PodPhase, reason string) {
		t.Helper()
		pod.Status.Phase, pod.Status.Reason = phase, reason
		if err := k.Status().Update(ctx, pod); err != nil {
			t.Fatalf("setting pod %s %s: %v", pod.Name, phase, err)
		}
	}
	running := newPod(ns, "running", map[string]string{"app": "checkout"}, true)
	evicted := newPod(ns, "evicted", map[string]string{"app": "checkout"}, false)
	create(t, running, evicted)
	setPhase(running, corev1.PodRunning, "")
	eventually(t, "the unprotected pod counted while it runs", counts(2, 1, metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced))
	waitGauge(t, unprotectedPodsGauge.WithLabelValues(ns), 1)

	setPhase(evicted, corev1.PodFailed, "Evicted")
	eventually(t, "the evicted pod not counted", counts(1, 1, metav1.ConditionTrue, v1alpha1.ReasonEnforced))
	waitGauge(t, unprotectedPodsGauge.WithLabelValues(ns), 0)

	// A completed Job's pod, never injected, is not counted either.
	done := newPod(ns, "job-done", map[string]string{"app": "checkout"}, false)
	create(t, done)
	eventually(t, "the Job's pod counted while it runs", counts(2, 1, metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced))
	setPhase(done, corev1.PodSucceeded, "")
	eventually(t, "the completed pod not counted", counts(1, 1, metav1.ConditionTrue, v1alpha1.ReasonEnforced))
}

// TestInvalidSelectorRefusedByTheAPI: a selector with a label the API
// server can check is refused at admission, and its neighbours are
// enforced.
func TestInvalidSelectorRefusedByTheAPI(t *testing.T) {
	// Label keys and values are checked by the API server (CEL format
	// rules); before, such a policy was stored and only the controller
	// found it (Accepted=False, Invalid), which is still how a policy
	// stored under an older schema is reported (unit tests of
	// policystatus.Desired). The error names the field.
	ns := newNamespace(t)
	good := newPolicy(ns, "good")
	bad := newPolicy(ns, "bad", func(s *v1alpha1.RateLimitPolicySpec) {
		s.TargetSelector.MatchLabels = map[string]v1alpha1.LabelValue{"app": "not a label value!"}
	})
	err := k.Create(context.Background(), bad)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.targetSelector.matchLabels[app]") {
		t.Fatalf("creating a policy with an invalid label value: %v, want Invalid naming spec.targetSelector.matchLabels[app]", err)
	}
	create(t, good)
	eventually(t, "good ready", func() error { return settled(good, readyAccepted) })
}

func kstatus(t *testing.T, p *v1alpha1.RateLimitPolicy) *status.Result {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("RateLimitPolicy"))
	if err := k.Get(context.Background(), client.ObjectKeyFromObject(p), u); err != nil {
		t.Fatal(err)
	}
	res, err := status.Compute(u)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestKstatus: kstatus (Flux, Argo CD) sees a policy in progress until the
// controller has reconciled its generation, then current.
func TestKstatus(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	p := newPolicy(ns, "p")

	// The object as stored before the controller got to it: the API server's
	// answer to the create, read without the Go types (whose zero
	// observedGeneration would hide a missing one). The schema defaults
	// status.observedGeneration to 0, so kstatus sees generation 1 not yet
	// observed; without that default it would say Current at once.
	u, err := toUnstructured(p)
	if err != nil {
		t.Fatal(err)
	}
	delete(u.Object, "status")
	if err := k.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
	if og, found, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration"); !found || og != 0 {
		t.Errorf("a new policy's status.observedGeneration: %d (found %v), want 0", og, found)
	}
	if res, err := status.Compute(u); err != nil || res.Status != status.InProgressStatus {
		t.Errorf("kstatus of a new policy: %v %v, want InProgress", res, err)
	}

	eventually(t, "ready", func() error { return settled(p, readyAccepted) })
	if res := kstatus(t, p); res.Status != status.CurrentStatus {
		t.Errorf("kstatus of a reconciled policy: %s (%s), want Current", res.Status, res.Message)
	}

	// A spec change: in progress again until reconciled.
	got := get(t, p)
	got.Spec.Window = "1m"
	if err := k.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	u, err = toUnstructured(got)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := status.Compute(u); err != nil || res.Status != status.InProgressStatus {
		t.Errorf("kstatus right after a spec change: %v %v, want InProgress", res, err)
	}
	eventually(t, "current again", func() error {
		if res := kstatus(t, p); res.Status != status.CurrentStatus {
			return fmt.Errorf("kstatus %s: %s", res.Status, res.Message)
		}
		return nil
	})
}

func toUnstructured(p *v1alpha1.RateLimitPolicy) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("RateLimitPolicy"))
	return u, nil
}

// TestIdempotence: once a namespace is reconciled, another reconcile makes
// no API write and emits no event; a real change makes exactly the writes it
// needs (so the counting can fail).
func TestIdempotence(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	a := newPolicy(ns, "a")
	b := newPolicy(ns, "b", func(s *v1alpha1.RateLimitPolicySpec) {
		s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceRemoteAddress}
		s.Match = &v1alpha1.RequestMatch{Methods: []v1alpha1.HTTPMethod{"POST"}}
	})
	create(t, a, b,
		newPod(ns, "one", map[string]string{"app": "checkout"}, true),
		newPod(ns, "two", map[string]string{"app": "checkout"}, false))
	waitQuiet(t, ns, []*v1alpha1.RateLimitPolicy{a, b}, 2)

	versions := resourceVersions(t, ns, a, b)
	w, e := writes.count(), recorder.count()
	for i := range 3 {
		if _, err := reconciler.Reconcile(ctx, namespaceRequest(ns)); err != nil {
			t.Fatalf("reconcile %d: %v", i, err)
		}
	}
	if got := writes.since(w); len(got) != 0 {
		t.Errorf("reconciles with nothing changed wrote to the API: %q", got)
	}
	if got := recorder.since(e); len(got) != 0 {
		t.Errorf("reconciles with nothing changed emitted events: %q", got)
	}
	if diff := cmp.Diff(versions, resourceVersions(t, ns, a, b)); diff != "" {
		t.Errorf("resourceVersions changed (-before +after):\n%s", diff)
	}

	// The counting can fail: a change to the document costs one apply.
	var cm corev1.ConfigMap
	if err := k.Get(ctx, types.NamespacedName{Namespace: ns, Name: sidecarconfig.ConfigMapName}, &cm); err != nil {
		t.Fatal(err)
	}
	cm.Data[sidecarconfig.FileName] = "{}"
	if err := k.Update(ctx, &cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "drift repaired", func() error {
		_, _, err := readConfig(ns)
		return err
	})
	if got := writes.since(w); len(got) == 0 || !strings.Contains(got[0], "apply") {
		t.Errorf("drift repair made no apply: %q", got)
	}
}

// TestAddingPoliciesOneAtATime: as a GitOps tool or a script adds policies
// to a namespace one by one, each costs about one status write of its own;
// the policies already there are not rewritten. (With the namespace-wide
// revision in every status, the n-th policy rewrote the n-1 before it: 474
// status writes for 30 policies in one run, 41 now.)
func TestAddingPoliciesOneAtATime(t *testing.T) {
	const n = 30
	ns := newNamespace(t)
	w := writes.count()
	for i := range n {
		p := newPolicy(ns, fmt.Sprintf("p%02d", i))
		create(t, p)
		eventually(t, p.Name+" ready", func() error { return settled(p, readyAccepted) })
	}
	var statusWrites, configWrites int
	for _, op := range writes.since(w) {
		switch {
		case !strings.Contains(op, " "+ns+"/"):
		case strings.HasPrefix(op, "status "):
			statusWrites++
		case strings.Contains(op, "ConfigMap"):
			configWrites++
		}
	}
	t.Logf("%d policies added one at a time: %d status writes, %d ConfigMap applies", n, statusWrites, configWrites)
	// One write per policy, and room for one conflict retry each; the
	// quadratic count is n(n+1)/2.
	if statusWrites > 2*n {
		t.Errorf("%d status writes for %d policies added one at a time; want at most %d", statusWrites, n, 2*n)
	}
}

// waitQuiet waits until the policies are reconciled at their generation, the
// manager's cache holds the results, and the controller is idle.
func waitQuiet(t *testing.T, ns string, policies []*v1alpha1.RateLimitPolicy, matched int32) {
	t.Helper()
	ctx := context.Background()
	eventually(t, "namespace reconciled and cache in sync", func() error {
		var cm corev1.ConfigMap
		if err := cached.Get(ctx, types.NamespacedName{Namespace: ns, Name: sidecarconfig.ConfigMapName}, &cm); err != nil {
			return err
		}
		var s corev1.Secret
		if err := cached.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}, &s); err != nil {
			return err
		}
		cfg, err := sidecarconfig.Parse([]byte(cm.Data[sidecarconfig.FileName]))
		if err != nil {
			return err
		}
		revs, err := render.PolicyRevisions(cfg)
		if err != nil {
			return err
		}
		for _, p := range policies {
			if err := settled(p, readyAccepted); err != nil {
				return err
			}
			var got v1alpha1.RateLimitPolicy
			if err := cached.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
				return err
			}
			if got.Status.ObservedGeneration != got.Generation || got.Status.MatchedPods != matched ||
				got.Status.Revision != revs[p.Name] {
				return fmt.Errorf("cached %s: observedGeneration %d/%d matched %d revision %q (ConfigMap %q)", p.Name,
					got.Status.ObservedGeneration, got.Generation, got.Status.MatchedPods, got.Status.Revision, revs[p.Name])
			}
		}
		return controllerIdle()
	})
}

func resourceVersions(t *testing.T, ns string, policies ...*v1alpha1.RateLimitPolicy) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for _, p := range policies {
		out["policy "+p.Name] = get(t, p).ResourceVersion
	}
	var cm corev1.ConfigMap
	if err := k.Get(ctx, types.NamespacedName{Namespace: ns, Name: sidecarconfig.ConfigMapName}, &cm); err != nil {
		t.Fatal(err)
	}
	out["configmap"] = cm.ResourceVersion
	var s corev1.Secret
	if err := k.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}, &s); err != nil {
		t.Fatal(err)
	}
	out["secret"] = s.ResourceVersion
	return out
}

// TestEventsOnTransitionsOnly: a policy gets one event per status change
// that changes conditions (naming each), not one per condition nor one per
// reconcile.
func TestEventsOnTransitionsOnly(t *testing.T) {
	ns := newNamespace(t)
	p := newPolicy(ns, "p")
	create(t, p)
	waitQuiet(t, ns, []*v1alpha1.RateLimitPolicy{p}, 0)
	want := []string{
		ns + "/p Normal Published Reconcile: Ready=True (Published): the configuration is published in ConfigMap slidegate-sidecar-config; " +
			"Enforced=False (NoPodsSelected): no pod of the namespace matches targetSelector; " +
			"Accepted=True (Accepted): rendered into ConfigMap slidegate-sidecar-config",
	}
	if diff := cmp.Diff(want, recorder.about(ns, "p")); diff != "" {
		t.Errorf("events at creation (-want +got):\n%s", diff)
	}

	create(t, newPod(ns, "web", map[string]string{"app": "checkout"}, true))
	waitQuiet(t, ns, []*v1alpha1.RateLimitPolicy{p}, 1)
	want = append(want, ns+"/p Normal Enforced Reconcile: Enforced=True (Enforced): all 1 selected pods carry the sidecar")
	if diff := cmp.Diff(want, recorder.about(ns, "p")); diff != "" {
		t.Errorf("events after a pod came (-want +got):\n%s", diff)
	}
}

// TestNoEventsWhileTheNamespaceTerminates: the API server refuses new
// events in a terminating namespace and client-go logs every refusal as an
// error, so the controller emits none there; status still follows.
// (envtest runs no namespace controller: the namespace stays Terminating.)
func TestNoEventsWhileTheNamespaceTerminates(t *testing.T) {
	ns := newNamespace(t)
	p := newPolicy(ns, "p")
	pod := newPod(ns, "web", map[string]string{"app": "checkout"}, true)
	create(t, p, pod)
	eventually(t, "policy enforced", func() error {
		return settled(p, map[v1alpha1.ConditionType]metav1.ConditionStatus{v1alpha1.ConditionEnforced: metav1.ConditionTrue})
	})
	var namespace corev1.Namespace
	if err := k.Get(context.Background(), client.ObjectKey{Name: ns}, &namespace); err != nil {
		t.Fatal(err)
	}
	if err := k.Delete(context.Background(), &namespace); err != nil {
		t.Fatal(err)
	}
	eventually(t, "namespace terminating in the manager's cache", func() error {
		var got corev1.Namespace
		if err := cached.Get(context.Background(), client.ObjectKey{Name: ns}, &got); err != nil || got.DeletionTimestamp == nil {
			return fmt.Errorf("not yet terminating (%w)", err)
		}
		return nil
	})
	before := len(recorder.about(ns, "p"))
	// Nothing can be created there any more; a pod can still change.
	if err := k.Get(context.Background(), client.ObjectKeyFromObject(pod), pod); err != nil {
		t.Fatal(err)
	}
	pod.Labels["app"] = "other"
	if err := k.Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, "status follows: no pod selected", func() error {
		return settled(p, map[v1alpha1.ConditionType]metav1.ConditionStatus{v1alpha1.ConditionEnforced: metav1.ConditionFalse})
	})
	if evs := recorder.about(ns, "p"); len(evs) != before {
		t.Errorf("events in a terminating namespace: %q", evs[before:])
	}
}

// waitGauge waits for a gauge of ours to reach want (it is set at the end of
// a reconcile, after the status writes a test may have seen).
func waitGauge(t *testing.T, g prometheus.Gauge, want float64) {
	t.Helper()
	eventually(t, fmt.Sprintf("%s = %v", g.Desc(), want), func() error {
		if v := testutil.ToFloat64(g); v != want {
			return fmt.Errorf("value %v", v)
		}
		return nil
	})
}

// TestServiceBypassWarning: a Service that reaches protected pods by port
// number, around the sidecar, turns Enforced False with a warning event;
// switching it to the port's name clears it.
func TestServiceBypassWarning(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	p := newPolicy(ns, "p")
	create(t, p, newPod(ns, "web", map[string]string{"app": "checkout"}, true))
	enforced := func(status metav1.ConditionStatus, reason v1alpha1.ConditionReason, msgPart string) func() error {
		return func() error {
			c := meta.FindStatusCondition(get(t, p).Status.Conditions, string(v1alpha1.ConditionEnforced))
			if c == nil || c.Status != status || c.Reason != string(reason) || !strings.Contains(c.Message, msgPart) {
				return fmt.Errorf("Enforced = %+v; want %s %s containing %q", c, status, reason, msgPart)
			}
			return nil
		}
	}
	eventually(t, "enforced", enforced(metav1.ConditionTrue, v1alpha1.ReasonEnforced, ""))

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "checkout"},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)},
				// A numeric port that is not the app's taken-over one is fine.
				{Name: "metrics", Port: 9090, TargetPort: intstr.FromInt32(9090)},
			},
		},
	}
	// A Service selecting other pods is no concern.
	other := svc.DeepCopy()
	other.Name, other.Spec.Selector = "other", map[string]string{"app": "other"}
	create(t, svc, other)
	eventually(t, "bypass reported", enforced(metav1.ConditionFalse, v1alpha1.ReasonServiceBypassesSidecar, "Service web port 80 targets the app's port number 8080"))
	waitGauge(t, notEnforcedGauge.WithLabelValues(ns, string(v1alpha1.ReasonServiceBypassesSidecar), targetSidecar), 1)
	if c := meta.FindStatusCondition(get(t, p).Status.Conditions, string(v1alpha1.ConditionEnforced)); strings.Contains(c.Message, "Service other") || strings.Contains(c.Message, "9090") {
		t.Errorf("a Service selecting other pods, or a port that is not the app's, is reported: %s", c.Message)
	}
	eventually(t, "warning event", func() error {
		for _, e := range recorder.about(ns, "p") {
			if strings.Contains(e, "Warning "+string(v1alpha1.ReasonServiceBypassesSidecar)) {
				return nil
			}
		}
		return fmt.Errorf("events: %v", recorder.about(ns, "p"))
	})

	if err := k.Get(ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
		t.Fatal(err)
	}
	svc.Spec.Ports[0].TargetPort = intstr.FromString("http")
	if err := k.Update(ctx, svc); err != nil {
		t.Fatal(err)
	}
	eventually(t, "bypass cleared", enforced(metav1.ConditionTrue, v1alpha1.ReasonEnforced, ""))
	waitGauge(t, notEnforcedGauge.WithLabelValues(ns, string(v1alpha1.ReasonServiceBypassesSidecar), targetSidecar), 0)
}

// TestTargetPortMismatch: a pod's sidecar guards one port name. A second
// policy selecting the same pod with another targetPort, which the app
// keeps, is not enforced there (its traffic bypasses the sidecar), and says
// so. Without such a port (the paired case) every Service reaches the pod
// through the sidecar, which enforces every policy selecting it.
func TestTargetPortMismatch(t *testing.T) {
	for _, tc := range []struct {
		name     string
		apiPort  bool
		enforced int32
	}{
		{"the app keeps port api", true, 0},
		{"the pod has no port api", false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t)
			web := newPolicy(ns, "web")
			api := newPolicy(ns, "api", func(s *v1alpha1.RateLimitPolicySpec) { s.TargetPort = "api" })
			pod := newPod(ns, "pod", map[string]string{"app": "checkout"}, false)
			if tc.apiPort {
				pod.Spec.Containers[0].Ports = append(pod.Spec.Containers[0].Ports, corev1.ContainerPort{Name: "api", ContainerPort: 9090})
			}
			if err := inject.Inject(pod, inject.Options{}); err != nil {
				t.Fatal(err)
			}
			create(t, web, api, pod)
			eventually(t, "web enforced", podCounts(t, web, 1, 1, metav1.ConditionTrue, v1alpha1.ReasonEnforced))
			if tc.enforced == 1 {
				eventually(t, "api enforced", podCounts(t, api, 1, 1, metav1.ConditionTrue, v1alpha1.ReasonEnforced))
				return
			}
			eventually(t, "api not enforced", podCounts(t, api, 1, 0, metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced))
			eventually(t, "api says why", enforcedIs(t, api, metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced, `port "api"`))
		})
	}
}

// podCounts checks p's pod counts and its Enforced condition, for
// eventually.
func podCounts(t *testing.T, p *v1alpha1.RateLimitPolicy, matched, enforced int32, cond metav1.ConditionStatus, reason v1alpha1.ConditionReason) func() error {
	return func() error {
		got := get(t, p)
		c := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionEnforced))
		if got.Status.MatchedPods != matched || got.Status.EnforcedPods != enforced || c == nil || c.Status != cond || c.Reason != string(reason) {
			return fmt.Errorf("matched %d enforced %d Enforced %+v; want %d %d %s %s",
				got.Status.MatchedPods, got.Status.EnforcedPods, c, matched, enforced, cond, reason)
		}
		return nil
	}
}
