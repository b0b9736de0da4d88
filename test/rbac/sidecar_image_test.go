package rbac_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestSidecarImageCannotChangeInPlace: a pod's containers' images are the
// one part of its spec that may change after it is created (`kubectl set
// image`). In a namespace opted in to injection, the install's admission
// policy refuses another image for the sidecar (it would stop enforcing
// while the policy's status counts the pod as enforced), and admits the
// application's. The same change in a namespace that has not opted in,
// where the policy does not apply, is admitted: without the policy, the
// sidecar could be swapped.
func TestSidecarImageCannotChangeInPlace(t *testing.T) {
	ctx := context.Background()
	newPod := func(t *testing.T, labelled bool) *corev1.Pod {
		t.Helper()
		// Created before the namespace is labelled: the install's webhook,
		// which has no server here, is asked about opted-in namespaces only.
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "set-image-"}}
		if err := admin.Create(ctx, ns); err != nil {
			t.Fatal(err)
		}
		always := corev1.ContainerRestartPolicyAlways
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: ns.Name},
			Spec: corev1.PodSpec{
				InitContainers: []corev1.Container{{Name: v1alpha1.SidecarContainerName, Image: "ghcr.io/slidegate/slidegate:v0.2.0", RestartPolicy: &always}},
				Containers:     []corev1.Container{{Name: "app", Image: "app:v1"}},
			},
		}
		if err := admin.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		if labelled {
			ns.Labels = map[string]string{v1alpha1.InjectionLabel: v1alpha1.InjectionRequired}
			if err := admin.Update(ctx, ns); err != nil {
				t.Fatal(err)
			}
		}
		return pod
	}
	setImage := func(pod *corev1.Pod, init bool, image string) error {
		var cur corev1.Pod
		if err := admin.Get(ctx, client.ObjectKeyFromObject(pod), &cur); err != nil {
			return err
		}
		if init {
			cur.Spec.InitContainers[0].Image = image
		} else {
			cur.Spec.Containers[0].Image = image
		}
		return admin.Update(ctx, &cur)
	}

	opted := newPod(t, true)
	// The API server loads a new policy, and a namespace's new label,
	// asynchronously: an attempt before may pass, so each sets an image
	// of its own (the same image again is no change).
	attempt := 0
	testsupport.Eventually(t, 30*time.Second, 100*time.Millisecond, "the policy refuses another sidecar image", func() error {
		attempt++
		err := setImage(opted, true, fmt.Sprintf("registry.example/not-a-limiter:v%d", attempt))
		switch {
		case err == nil:
			return errors.New("admitted")
		case !strings.Contains(err.Error(), "slidegate-sidecar container's image is set when the pod is created"):
			return fmt.Errorf("refused, but not by the policy: %w", err)
		}
		return nil
	})
	// Not overbroad: the application's own image may change.
	if err := setImage(opted, false, "app:v2"); err != nil {
		t.Errorf("the application's image in an opted-in namespace: %v", err)
	}
	// The pair: where the policy does not apply, the same change succeeds.
	if err := setImage(newPod(t, false), true, "registry.example/not-a-limiter:v1"); err != nil {
		t.Errorf("the sidecar's image in a namespace not opted in: %v", err)
	}
}

// TestSelectedLabelsCannotChangeInPlace: a running pod that carries the
// sidecar cannot leave a policy by a label change (issue 36, item 7). The
// sidecar reads its pod's labels and enforces the policies that select
// them, so before the install's ValidatingAdmissionPolicy
// slidegate-selected-labels, `kubectl label pod app app=other` stopped the
// limit while the pod kept running with its sidecar, and the policy's
// status no longer counted it. The API server evaluates the policy against
// each RateLimitPolicy of the namespace: matchLabels and matchExpressions.
// Not overbroad: a change that keeps the selection passes, as does any
// change on a pod without the sidecar or in a namespace not opted in.
func TestSelectedLabelsCannotChangeInPlace(t *testing.T) {
	ctx := context.Background()
	newNS := func(t *testing.T) string {
		t.Helper()
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "relabel-"}}
		if err := admin.Create(ctx, ns); err != nil {
			t.Fatal(err)
		}
		for _, p := range []*v1alpha1.RateLimitPolicy{
			{ObjectMeta: metav1.ObjectMeta{Name: "by-label", Namespace: ns.Name}, Spec: v1alpha1.RateLimitPolicySpec{
				TargetSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "checkout"}},
				Window:         "10s", Limit: 5, Key: v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User-ID"}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "not-canary", Namespace: ns.Name}, Spec: v1alpha1.RateLimitPolicySpec{
				TargetSelector: &v1alpha1.LabelSelector{MatchExpressions: []v1alpha1.LabelSelectorRequirement{
					{Key: "track", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"canary"}}}},
				Window: "10s", Limit: 5, Key: v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User-ID"}}},
		} {
			if err := admin.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		return ns.Name
	}
	newPod := func(t *testing.T, ns, name string, sidecar bool) *corev1.Pod {
		t.Helper()
		always := corev1.ContainerRestartPolicyAlways
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "checkout", "track": "stable"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:v1"}}},
		}
		if sidecar {
			pod.Spec.InitContainers = []corev1.Container{{Name: v1alpha1.SidecarContainerName, Image: "ghcr.io/slidegate/slidegate:v0.2.0", RestartPolicy: &always}}
		}
		if err := admin.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		return pod
	}
	optIn := func(t *testing.T, name string) {
		t.Helper()
		var ns corev1.Namespace
		if err := admin.Get(ctx, client.ObjectKey{Name: name}, &ns); err != nil {
			t.Fatal(err)
		}
		ns.Labels = map[string]string{v1alpha1.InjectionLabel: v1alpha1.InjectionEnabled}
		if err := admin.Update(ctx, &ns); err != nil {
			t.Fatal(err)
		}
	}
	relabel := func(pod *corev1.Pod, key, value string) error {
		var cur corev1.Pod
		if err := admin.Get(ctx, client.ObjectKeyFromObject(pod), &cur); err != nil {
			return err
		}
		cur.Labels[key] = value
		return admin.Update(ctx, &cur)
	}
	const refusal = "carries the slidegate sidecar and RateLimitPolicy"

	ns := newNS(t)
	withSidecar, plain := newPod(t, ns, "with-sidecar", true), newPod(t, ns, "plain", false)
	optIn(t, ns)
	// The API server loads a new policy, its parameters and a namespace's
	// new label asynchronously: an attempt before may pass, so each
	// attempt takes the pod out with a value of its own.
	attempt := 0
	testsupport.Eventually(t, 30*time.Second, 100*time.Millisecond, "a label change out of by-label is refused", func() error {
		attempt++
		err := relabel(withSidecar, "app", fmt.Sprintf("other-%d", attempt))
		switch {
		case err == nil:
			return errors.New("admitted")
		case !strings.Contains(err.Error(), refusal+" by-label selects it"):
			return fmt.Errorf("refused, but not by the policy: %w", err)
		}
		return nil
	})
	if err := relabel(withSidecar, "track", "canary"); err == nil || !strings.Contains(err.Error(), refusal+" not-canary selects it") {
		t.Errorf("a label change out of not-canary (matchExpressions NotIn): %v", err)
	}
	// Not overbroad: a change that keeps both selections, and any change
	// on a pod without the sidecar.
	if err := relabel(withSidecar, "tier", "web"); err != nil {
		t.Errorf("a label that keeps every selection: %v", err)
	}
	if err := relabel(plain, "app", "other"); err != nil {
		t.Errorf("a pod without the sidecar: %v", err)
	}
	// The pair: where the policy does not apply, the same change succeeds.
	elsewhere := newNS(t)
	if err := relabel(newPod(t, elsewhere, "with-sidecar", true), "app", "other"); err != nil {
		t.Errorf("a namespace not opted in: %v", err)
	}
}
