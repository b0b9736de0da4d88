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

package policystatus

// The status logic as tables of plain Go values, no API server: one table
// per function (Desired, CountPods, BypassingServices, UnprotectedWhy,
// DesiredService). A new status behaviour gets a row in the table of the
// function that decides it; the envtest tests only check that the reconcile
// wires these functions to the cluster.

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/render"
)

// cond is a condition as a table states it: its status, reason and exact
// message.
type cond struct {
	status  metav1.ConditionStatus
	reason  v1alpha1.ConditionReason
	message string
}

// conditionsOf keys a status's conditions by type, as tables state them,
// and fails if a condition does not describe generation.
func conditionsOf(t *testing.T, st v1alpha1.RateLimitPolicyStatus, generation int64) map[v1alpha1.ConditionType]cond {
	t.Helper()
	out := map[v1alpha1.ConditionType]cond{}
	for _, c := range st.Conditions {
		if c.ObservedGeneration != generation {
			t.Errorf("%s: observedGeneration %d, want %d", c.Type, c.ObservedGeneration, generation)
		}
		out[v1alpha1.ConditionType(c.Type)] = cond{c.Status, v1alpha1.ConditionReason(c.Reason), c.Message}
	}
	return out
}

// notAcceptedConds are the conditions of a policy left out of the
// configuration for reason, with message msg, whose Enforced says
// enforcedMsg.
func notAcceptedConds(reason v1alpha1.ConditionReason, msg, enforcedMsg string) map[v1alpha1.ConditionType]cond {
	return map[v1alpha1.ConditionType]cond{
		v1alpha1.ConditionAccepted: {metav1.ConditionFalse, reason, msg},
		v1alpha1.ConditionReady:    {metav1.ConditionFalse, reason, msg},
		v1alpha1.ConditionStalled:  {metav1.ConditionTrue, reason, msg},
		v1alpha1.ConditionEnforced: {metav1.ConditionFalse, v1alpha1.ReasonNotAccepted, enforcedMsg},
	}
}

// conds are the conditions of an accepted policy, without Stalled.
func conds(accepted, ready, enforced cond) map[v1alpha1.ConditionType]cond {
	return map[v1alpha1.ConditionType]cond{v1alpha1.ConditionAccepted: accepted, v1alpha1.ConditionReady: ready, v1alpha1.ConditionEnforced: enforced}
}

var condOpt = cmp.AllowUnexported(cond{})

const (
	heldBackMsg = "not published yet: the policy needs sidecar configuration slidegate.dev/sidecar-config/v1.1, and pods web-1, web-2, web-3 and 1 more run sidecars of an earlier slidegate, " +
		"which read slidegate.dev/sidecar-config/v1 only and would refuse the whole configuration; restart them to update their sidecars (kubectl -n shop rollout restart ...)"
	acceptedMsg  = "rendered into ConfigMap slidegate-sidecar-config"
	publishedMsg = "the configuration is published in ConfigMap slidegate-sidecar-config"
)

func TestDesiredStatus(t *testing.T) {
	invalid := &render.InvalidPolicyError{Namespace: "shop", Name: "web", Err: errors.New("limit 0 is not from 1 to 1000000")}
	tooLarge := &render.ConfigTooLargeError{Namespace: "shop", Name: "web", PolicyBytes: 40_000, TotalBytes: 1_010_000, MaxBytes: 1_000_000, Ahead: 29}
	const invalidMsg = "the spec cannot be enforced: policy shop/web: limit 0 is not from 1 to 1000000"
	const tooLargeMsg = "not published: policy shop/web (40,000 bytes) does not fit: with it the sidecar configuration would be 1,010,000 bytes, " +
		"over the 1,000,000-byte budget of ConfigMap slidegate-sidecar-config (the API server refuses more than 1 MiB); " +
		"the 29 policies that come before it (created earlier, or at the same second and earlier by name) fill 970,000 bytes" +
		"; make room by deleting or shrinking policies of this namespace (fewer or shorter pathPrefixes, smaller selectors)"
	const noCredentials = "the Redis credentials Secret slidegate-system/redis does not exist"
	longAgo := metav1.NewTime(time.Now().Add(-time.Hour))
	// previously is a status an earlier reconcile wrote.
	previously := func(conds ...metav1.Condition) v1alpha1.RateLimitPolicyStatus {
		for i := range conds {
			conds[i].LastTransitionTime = longAgo
			conds[i].ObservedGeneration = 1
		}
		return v1alpha1.RateLimitPolicyStatus{Revision: "old", Conditions: conds}
	}
	accepted := cond{metav1.ConditionTrue, v1alpha1.ReasonAccepted, acceptedMsg}
	published := cond{metav1.ConditionTrue, v1alpha1.ReasonPublished, publishedMsg}

	const noKeysMsg = "no keys to verify bearer tokens with: ConfigMap slidegate-jwks does not exist in namespace shop (create it with the key set under the key \"auth.json\"); " +
		"until there are, no token verifies and onMissing RemoteAddress decides every request"
	noKeys := Keys(`ConfigMap slidegate-jwks does not exist in namespace shop (create it with the key set under the key "auth.json")`, &v1alpha1.RateLimitPolicy{})
	legacyJWT := &v1alpha1.RateLimitPolicySpec{TargetSelector: &v1alpha1.LabelSelector{}, Key: v1alpha1.ClientKey{Source: v1alpha1.KeySourceJWTClaim, Name: "sub"}}
	optedOut := legacyJWT.DeepCopy()
	optedOut.Key.JWT = &v1alpha1.JWTVerification{InsecureSkipVerification: v1alpha1.InsecureSkipVerificationVerifiedUpstream}
	enforced1 := cond{metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 1 selected pods carry the sidecar"}

	for _, tc := range []struct {
		name         string
		spec         *v1alpha1.RateLimitPolicySpec
		before       v1alpha1.RateLimitPolicyStatus
		in           Input
		want         map[v1alpha1.ConditionType]cond
		wantRevision string
	}{
		// Verified tokens (issue 23).
		{
			name:         "no keys to verify tokens with: accepted and enforced (onMissing decides), not ready",
			in:           Input{Revision: "r1", Matched: 1, Enforced: 1, Keys: noKeys},
			want:         conds(accepted, cond{metav1.ConditionFalse, v1alpha1.ReasonJWTKeysUnavailable, noKeysMsg}, enforced1),
			wantRevision: "r1",
		},
		{
			name: "keys of an older fetch: ready, and says so",
			in:   Input{Revision: "r1", Matched: 1, Enforced: 1, KeysNote: "; the keys are those last fetched from https://a.example/k, whose refresh fails: GET: HTTP status 503"},
			want: conds(accepted, cond{metav1.ConditionTrue, v1alpha1.ReasonPublished,
				publishedMsg + "; the keys are those last fetched from https://a.example/k, whose refresh fails: GET: HTTP status 503"}, enforced1),
			wantRevision: "r1",
		},
		{
			name:         "credentials and keys missing: the credentials first",
			in:           Input{Revision: "r1", Matched: 1, Enforced: 1, Keys: noKeys, Credentials: Credentials(noCredentials), Now: time.Now(), Grace: time.Minute},
			want:         conds(accepted, cond{metav1.ConditionFalse, v1alpha1.ReasonRedisCredentialsUnavailable, noCredentials}, enforced1),
			wantRevision: "r1",
		},
		{
			name:         "a JWTClaim policy stored before key.jwt: accepted, with a warning",
			spec:         legacyJWT,
			in:           Input{Revision: "r1", Matched: 1, Enforced: 1},
			want:         conds(cond{metav1.ConditionTrue, v1alpha1.ReasonUnverifiedJWT, Unverified().Message()}, published, enforced1),
			wantRevision: "r1",
		},
		{
			name:         "the explicit opt-out: accepted as any policy",
			spec:         optedOut,
			in:           Input{Revision: "r1", Matched: 1, Enforced: 1},
			want:         conds(accepted, published, enforced1),
			wantRevision: "r1",
		},
		{
			name:         "every selected pod carries the sidecar",
			in:           Input{Revision: "r1", Matched: 3, Enforced: 3},
			want:         conds(accepted, published, cond{metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 3 selected pods carry the sidecar"}),
			wantRevision: "r1",
		},
		{
			name: "invalid spec: not accepted, stalled, no revision",
			in:   Input{NotAccepted: NotAccepted(invalid), Revision: "r1", Matched: 2, Enforced: 2},
			want: notAcceptedConds(v1alpha1.ReasonInvalid, invalidMsg, "not enforced: the policy is not accepted (2 pods selected)"),
		},
		{
			name: "no room in the ConfigMap",
			in:   Input{NotAccepted: NotAccepted(tooLarge), Revision: "r1", Matched: 1},
			want: notAcceptedConds(v1alpha1.ReasonConfigTooLarge, tooLargeMsg, "not enforced: the policy is not accepted (1 pods selected)"),
		},
		{
			name:   "no room in the ConfigMap (wrapped): not accepted, stalled, the old revision dropped",
			before: previously(metav1.Condition{Type: string(v1alpha1.ConditionAccepted), Status: metav1.ConditionTrue, Reason: string(v1alpha1.ReasonAccepted)}),
			in:     Input{NotAccepted: NotAccepted(fmt.Errorf("namespace shop: %w", tooLarge)), Matched: 1},
			want:   notAcceptedConds(v1alpha1.ReasonConfigTooLarge, tooLargeMsg, "not enforced: the policy is not accepted (1 pods selected)"),
		},
		{
			name:         "accepted again: Stalled goes",
			before:       previously(metav1.Condition{Type: string(v1alpha1.ConditionStalled), Status: metav1.ConditionTrue, Reason: string(v1alpha1.ReasonInvalid)}),
			in:           Input{Revision: "r2", Matched: 1, Enforced: 1},
			want:         conds(accepted, published, cond{metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 1 selected pods carry the sidecar"}),
			wantRevision: "r2",
		},
		{
			name:         "no pod selected",
			in:           Input{Revision: "r1"},
			want:         conds(accepted, published, cond{metav1.ConditionFalse, v1alpha1.ReasonNoPodsSelected, "no pod of the namespace matches targetSelector"}),
			wantRevision: "r1",
		},
		{
			name: "some selected pods without the sidecar",
			in:   Input{Revision: "r1", Matched: 3, Enforced: 1, Unprotected: "pods b, c were created before the policy"},
			want: conds(accepted, published, cond{metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced,
				`1 of 3 selected pods carry the sidecar in front of port "http"; pods b, c were created before the policy`}),
			wantRevision: "r1",
		},
		{
			name: "every pod protected, but a Service bypasses the sidecar",
			in:   Input{Revision: "r1", Matched: 2, Enforced: 2, Bypass: "Service web port 80 targets the app's port number 8080"},
			want: conds(accepted, published, cond{metav1.ConditionFalse, v1alpha1.ReasonServiceBypassesSidecar,
				"all 2 selected pods carry the sidecar, but Service web port 80 targets the app's port number 8080: such traffic reaches the app unlimited; set targetPort to the port's name (http)"}),
			wantRevision: "r1",
		},
		{
			name: "a bypass is named after the pods that lack the sidecar: those are the first thing to fix",
			in:   Input{Revision: "r1", Matched: 2, Enforced: 1, Bypass: "Service web port 80 targets the app's port number 8080", Unprotected: "pods b opted out"},
			want: conds(accepted, published, cond{metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced,
				`1 of 2 selected pods carry the sidecar in front of port "http"; pods b opted out; and Service web port 80 targets the app's port number 8080`}),
			wantRevision: "r1",
		},
		{
			name: "held back for sidecars of an earlier release: accepted, not ready, not stalled, no revision",
			before: previously(metav1.Condition{Type: string(v1alpha1.ConditionStalled), Status: metav1.ConditionTrue, Reason: string(v1alpha1.ReasonInvalid)},
				metav1.Condition{Type: string(v1alpha1.ConditionAccepted), Status: metav1.ConditionTrue, Reason: string(v1alpha1.ReasonAccepted)}),
			in: Input{HeldBack: HeldBack(1, []string{"web-1", "web-2", "web-3", "web-4"}, "shop"), Revision: "r1", Matched: 4, Enforced: 4},
			want: map[v1alpha1.ConditionType]cond{
				v1alpha1.ConditionAccepted: {metav1.ConditionTrue, v1alpha1.ReasonAccepted, "valid; " + heldBackMsg},
				v1alpha1.ConditionReady:    {metav1.ConditionFalse, v1alpha1.ReasonSidecarsOutdated, heldBackMsg},
				v1alpha1.ConditionEnforced: {metav1.ConditionFalse, v1alpha1.ReasonSidecarsOutdated, heldBackMsg},
			},
		},
		{
			name: "credentials missing just now: not ready, not yet stalled",
			in:   Input{Revision: "r1", Matched: 1, Enforced: 1, Credentials: Credentials(noCredentials), Now: time.Now(), Grace: time.Minute},
			want: map[v1alpha1.ConditionType]cond{
				v1alpha1.ConditionAccepted: accepted,
				v1alpha1.ConditionReady:    {metav1.ConditionFalse, v1alpha1.ReasonRedisCredentialsUnavailable, noCredentials},
				v1alpha1.ConditionEnforced: {metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 1 selected pods carry the sidecar"},
			},
			wantRevision: "r1",
		},
		{
			name: "credentials missing for longer than the grace: stalled",
			before: previously(metav1.Condition{Type: string(v1alpha1.ConditionReady), Status: metav1.ConditionFalse,
				Reason: string(v1alpha1.ReasonRedisCredentialsUnavailable), Message: noCredentials}),
			in: Input{Revision: "r1", Matched: 1, Enforced: 1, Credentials: Credentials(noCredentials), Now: time.Now(), Grace: time.Minute},
			want: map[v1alpha1.ConditionType]cond{
				v1alpha1.ConditionAccepted: accepted,
				v1alpha1.ConditionReady:    {metav1.ConditionFalse, v1alpha1.ReasonRedisCredentialsUnavailable, noCredentials},
				v1alpha1.ConditionStalled:  {metav1.ConditionTrue, v1alpha1.ReasonRedisCredentialsUnavailable, noCredentials},
				v1alpha1.ConditionEnforced: {metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 1 selected pods carry the sidecar"},
			},
			wantRevision: "r1",
		},
		{
			name: "fixed while the credentials are missing: Ready was False (Invalid) long ago, the grace starts now",
			before: previously(
				metav1.Condition{Type: string(v1alpha1.ConditionAccepted), Status: metav1.ConditionFalse, Reason: string(v1alpha1.ReasonInvalid), Message: invalidMsg},
				metav1.Condition{Type: string(v1alpha1.ConditionReady), Status: metav1.ConditionFalse, Reason: string(v1alpha1.ReasonInvalid), Message: invalidMsg},
				metav1.Condition{Type: string(v1alpha1.ConditionStalled), Status: metav1.ConditionTrue, Reason: string(v1alpha1.ReasonInvalid), Message: invalidMsg},
				metav1.Condition{Type: string(v1alpha1.ConditionEnforced), Status: metav1.ConditionFalse, Reason: string(v1alpha1.ReasonNotAccepted)}),
			in: Input{Revision: "r1", Matched: 1, Enforced: 1, Credentials: Credentials(noCredentials), Now: time.Now(), Grace: time.Minute},
			want: map[v1alpha1.ConditionType]cond{
				v1alpha1.ConditionAccepted: accepted,
				v1alpha1.ConditionReady:    {metav1.ConditionFalse, v1alpha1.ReasonRedisCredentialsUnavailable, noCredentials},
				v1alpha1.ConditionEnforced: {metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 1 selected pods carry the sidecar"},
			},
			wantRevision: "r1",
		},
		{
			name: "room made while the credentials are missing: Ready was False (ConfigTooLarge) long ago, the grace starts now",
			before: previously(
				metav1.Condition{Type: string(v1alpha1.ConditionAccepted), Status: metav1.ConditionFalse, Reason: string(v1alpha1.ReasonConfigTooLarge), Message: tooLargeMsg},
				metav1.Condition{Type: string(v1alpha1.ConditionReady), Status: metav1.ConditionFalse, Reason: string(v1alpha1.ReasonConfigTooLarge), Message: tooLargeMsg}),
			in: Input{Revision: "r1", Matched: 1, Enforced: 1, Credentials: Credentials(noCredentials), Now: time.Now(), Grace: time.Minute},
			want: map[v1alpha1.ConditionType]cond{
				v1alpha1.ConditionAccepted: accepted,
				v1alpha1.ConditionReady:    {metav1.ConditionFalse, v1alpha1.ReasonRedisCredentialsUnavailable, noCredentials},
				v1alpha1.ConditionEnforced: {metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 1 selected pods carry the sidecar"},
			},
			wantRevision: "r1",
		},
		{
			name: "credentials missing, no clock (now unset): never stalled",
			before: previously(metav1.Condition{Type: string(v1alpha1.ConditionReady), Status: metav1.ConditionFalse,
				Reason: string(v1alpha1.ReasonRedisCredentialsUnavailable), Message: noCredentials}),
			in: Input{Revision: "r1", Matched: 1, Enforced: 1, Credentials: Credentials(noCredentials), Grace: time.Minute},
			want: map[v1alpha1.ConditionType]cond{
				v1alpha1.ConditionAccepted: accepted,
				v1alpha1.ConditionReady:    {metav1.ConditionFalse, v1alpha1.ReasonRedisCredentialsUnavailable, noCredentials},
				v1alpha1.ConditionEnforced: {metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 1 selected pods carry the sidecar"},
			},
			wantRevision: "r1",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", Generation: 2}, Status: tc.before}
			if tc.spec != nil {
				p.Spec = *tc.spec
			}
			st := Desired(p, tc.in)
			if diff := cmp.Diff(tc.want, conditionsOf(t, st, 2), condOpt); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
			if st.Revision != tc.wantRevision || st.ObservedGeneration != 2 || st.MatchedPods != tc.in.Matched || st.EnforcedPods != tc.in.Enforced {
				t.Errorf("revision %q, observedGeneration %d, pods %d/%d; want %q, 2, %d/%d",
					st.Revision, st.ObservedGeneration, st.EnforcedPods, st.MatchedPods, tc.wantRevision, tc.in.Enforced, tc.in.Matched)
			}
		})
	}
}

// TestDesiredStatusIsStable: a reconcile with nothing new computes the
// status it computed before, transition times included, so nothing is
// written. The naive way (conditions built afresh) would move them.
func TestDesiredStatusIsStable(t *testing.T) {
	p := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", Generation: 1}}
	in := Input{Revision: "r1", Matched: 2, Enforced: 1, Unprotected: "pods b opted out"}
	p.Status = Desired(p, in)
	for i := range p.Status.Conditions {
		p.Status.Conditions[i].LastTransitionTime = metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	}
	if again := Desired(p, in); !cmp.Equal(p.Status, again) {
		t.Errorf("status changed without news:\n%s", cmp.Diff(p.Status, again))
	}
}

// specPod is a pod of an app serving ports http (8080) and grpc (9090),
// as the controller's cache holds it (TrimPod); sidecar is the port name
// its injected sidecar takes over (inject.Inject, as the webhook does), ""
// for none.
func specPod(t *testing.T, name string, labels map[string]string, sidecar string) corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "grpc", ContainerPort: 9090}}}}},
	}
	if sidecar != "" {
		if err := inject.Inject(pod, inject.Options{TargetPort: sidecar}); err != nil {
			t.Fatal(err)
		}
	}
	trimmed, err := TrimPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	return *trimmed.(*corev1.Pod)
}

// with changes a pod.
func with(pod corev1.Pod, mutate func(*corev1.Pod)) corev1.Pod {
	mutate(&pod)
	return pod
}

// forgedStatus is an injection status a pod author writes by hand.
const forgedStatus = `{"version":"v1","container":"slidegate-sidecar","targetPort":"http","appContainer":"app","appPort":8080}`

// forged gives a pod issue 23's forgery: a status and a dummy init
// container named like the sidecar.
func forged(p *corev1.Pod) {
	p.Annotations = map[string]string{v1alpha1.InjectedAnnotation: forgedStatus}
	p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: inject.ContainerName})
}

// dropPort removes the app's port of that name.
func dropPort(name string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Ports = slices.DeleteFunc(p.Spec.Containers[0].Ports, func(cp corev1.ContainerPort) bool { return cp.Name == name })
	}
}

func webPolicy(targetPort string) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "web"}},
			TargetPort:     targetPort,
		},
	}
}

var webLabels = map[string]string{"app": "web"}

// TestCountPods: enforcedPods counts the pods whose spec shows a sidecar
// that protects the policy's port; the injection status annotation counts
// for nothing (issue 23).
func TestCountPods(t *testing.T) {
	for _, tc := range []struct {
		name              string
		policy            *v1alpha1.RateLimitPolicy
		pods              []corev1.Pod
		matched, enforced int32
		unprotected       []string // pod names
	}{
		{"no pods", webPolicy(""), nil, 0, 0, nil},
		{"unselected pods are not counted, sidecar or not", webPolicy(""), []corev1.Pod{
			specPod(t, "db", map[string]string{"app": "db"}, "http"), specPod(t, "bare", nil, "")}, 0, 0, nil},
		{"a sidecar in front of the policy's port protects", webPolicy("http"), []corev1.Pod{
			specPod(t, "a", webLabels, "http")}, 1, 1, nil},
		{"unset targetPort means http", webPolicy(""), []corev1.Pod{
			specPod(t, "a", webLabels, "http")}, 1, 1, nil},
		{"a sidecar in front of another port, while the app keeps the policy's, does not protect", webPolicy("http"), []corev1.Pod{
			specPod(t, "a", webLabels, "grpc")}, 1, 0, []string{"a"}},
		{"a sidecar in front of another port protects a policy whose port no container has", webPolicy("http"), []corev1.Pod{
			with(specPod(t, "a", webLabels, "grpc"), dropPort("http"))}, 1, 1, nil},
		{"no sidecar", webPolicy("http"), []corev1.Pod{
			specPod(t, "a", webLabels, ""), specPod(t, "b", webLabels, "http")}, 2, 1, []string{"a"}},
		{"a forged status and a dummy sidecar protect nothing", webPolicy("http"), []corev1.Pod{
			with(specPod(t, "a", webLabels, ""), forged)}, 1, 0, []string{"a"}},
		{"an injected pod that lost its status is still protected", webPolicy("http"), []corev1.Pod{
			with(specPod(t, "a", webLabels, "http"), func(p *corev1.Pod) { p.Annotations = nil })}, 1, 1, nil},
		{"a second container holding the port name: not protected", webPolicy("http"), []corev1.Pod{
			with(specPod(t, "a", webLabels, "http"), func(p *corev1.Pod) {
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "admin", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8081}}})
			})}, 1, 0, []string{"a"}},
		{"the app's port on the node: not protected", webPolicy("http"), []corev1.Pod{
			with(specPod(t, "a", webLabels, "http"), func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].HostPort = 30080 })}, 1, 0, []string{"a"}},
		{"a policy without targetSelector (rate limit service) selects no pod", &v1alpha1.RateLimitPolicy{}, []corev1.Pod{
			specPod(t, "a", webLabels, "")}, 0, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unprotected := map[types.UID]bool{}
			matched, enforced := Guards{}.CountPods(tc.policy, tc.pods, unprotected)
			if matched != tc.matched || enforced != tc.enforced {
				t.Errorf("matched %d, enforced %d; want %d, %d", matched, enforced, tc.matched, tc.enforced)
			}
			var want []types.UID
			for _, n := range tc.unprotected {
				want = append(want, types.UID("uid-"+n))
			}
			if got := slices.Sorted(maps.Keys(unprotected)); !slices.Equal(got, want) {
				t.Errorf("unprotected %v, want %v", got, want)
			}
		})
	}
}

func TestBypassingServices(t *testing.T) {
	service := func(name string, selector map[string]string, ports ...corev1.ServicePort) corev1.Service {
		return corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{Selector: selector, Ports: ports}}
	}
	port := func(port int32, target intstr.IntOrString) corev1.ServicePort {
		return corev1.ServicePort{Port: port, TargetPort: target}
	}
	protected := []corev1.Pod{specPod(t, "a", webLabels, "http")}
	for _, tc := range []struct {
		name     string
		pods     []corev1.Pod
		services []corev1.Service
		want     string
	}{
		{"the port's name: through the sidecar", protected,
			[]corev1.Service{service("web", webLabels, port(80, intstr.FromString("http")))}, ""},
		{"the app's port number: around the sidecar", protected,
			[]corev1.Service{service("web", webLabels, port(80, intstr.FromInt32(8080)))},
			"Service web port 80 targets the app's port number 8080"},
		{"no targetPort: the port number itself", protected,
			[]corev1.Service{service("web", webLabels, port(8080, intstr.IntOrString{}))},
			"Service web port 8080 targets the app's port number 8080"},
		{"another port number (metrics) is none of our business", protected,
			[]corev1.Service{service("web", webLabels, port(9100, intstr.FromInt32(9100)))}, ""},
		{"another port's name (grpc) is none of our business", protected,
			[]corev1.Service{service("web", webLabels, port(9090, intstr.FromString("grpc")))}, ""},
		{"another name of the app's port number: around the sidecar", []corev1.Pod{with(specPod(t, "a", webLabels, "http"), func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{Name: "web", ContainerPort: 8080})
		})}, []corev1.Service{service("web", webLabels, port(80, intstr.FromString("web")))},
			`Service web port 80 targets port name "web", which container app holds, not the sidecar`},
		{"the policy's port, kept by the app when the pod chose another (target-port annotation)", []corev1.Pod{specPod(t, "a", webLabels, "grpc")},
			[]corev1.Service{service("web", webLabels, port(80, intstr.FromString("http")), port(81, intstr.FromString("grpc")))},
			`Service web port 80 targets port name "http", which container app holds, not the sidecar`},
		{"UDP is not limited by the sidecar anyway", protected,
			[]corev1.Service{service("web", webLabels, corev1.ServicePort{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolUDP})}, ""},
		{"a Service selecting other pods", protected,
			[]corev1.Service{service("db", map[string]string{"app": "db"}, port(80, intstr.FromInt32(8080)))}, ""},
		{"a Service without selector (endpoints by hand)", protected,
			[]corev1.Service{service("manual", nil, port(80, intstr.FromInt32(8080)))}, ""},
		{"pods without the sidecar are reported as unprotected, not as bypassed", []corev1.Pod{specPod(t, "a", webLabels, "")},
			[]corev1.Service{service("web", webLabels, port(80, intstr.FromInt32(8080)))}, ""},
		{"a forged status is not a sidecar to bypass", []corev1.Pod{with(specPod(t, "a", webLabels, ""), forged)},
			[]corev1.Service{service("web", webLabels, port(80, intstr.FromInt32(8080)))}, ""},
		{"a protected pod the policy does not select", []corev1.Pod{specPod(t, "a", map[string]string{"app": "web2"}, "http")},
			[]corev1.Service{service("web", map[string]string{"app": "web2"}, port(80, intstr.FromInt32(8080)))}, ""},
		{"several, sorted, each once", append(protected, specPod(t, "b", webLabels, "http")),
			[]corev1.Service{service("web-b", webLabels, port(80, intstr.FromInt32(8080))), service("web-a", webLabels, port(81, intstr.FromInt32(8080)))},
			"Service web-a port 81 targets the app's port number 8080; Service web-b port 80 targets the app's port number 8080"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := (Guards{}).BypassingServices(webPolicy("http"), tc.pods, tc.services); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestUnprotectedWhy: the Enforced message names the cause the controller
// can see for each selected pod without the sidecar, instead of guessing.
func TestUnprotectedWhy(t *testing.T) {
	policyTime := metav1.NewTime(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	before, after := metav1.NewTime(policyTime.Add(-time.Hour)), metav1.NewTime(policyTime.Add(time.Hour))
	p := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", CreationTimestamp: policyTime}}
	p.Spec.TargetSelector = &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "web"}}
	pod := func(name string, created metav1.Time, labels map[string]string, sidecar string, mutate ...func(*corev1.Pod)) corev1.Pod {
		l := map[string]string{"app": "web"}
		maps.Copy(l, labels)
		out := specPod(t, name, l, sidecar)
		out.CreationTimestamp = created
		for _, m := range mutate {
			m(&out)
		}
		return out
	}
	optOut := map[string]string{"ratelimit.slidegate.dev/inject": "false"}
	for _, tc := range []struct {
		name      string
		pods      []corev1.Pod
		optedIn   bool
		want, not []string
	}{
		{"namespace not opted in", []corev1.Pod{pod("a", after, nil, "")}, false,
			[]string{"namespace is not labelled ratelimit.slidegate.dev/injection=enabled (pods a)"}, []string{"before the policy", "webhook"}},
		{"created before the policy", []corev1.Pod{pod("b", before, nil, "")}, true,
			[]string{"pods b were created before the policy: restart them (kubectl -n shop rollout restart"}, []string{"not labelled"}},
		{"the webhook admitted it without", []corev1.Pod{pod("c", after, nil, "")}, true,
			[]string{"the webhook admitted pods c without the sidecar", `no container port named "http"`}, []string{"before the policy"}},
		{"opted out", []corev1.Pod{pod("d", before, optOut, "")}, true,
			[]string{"pods d opted out with ratelimit.slidegate.dev/inject=false"}, []string{"before the policy"}},
		{"sidecar on another port, the app keeping the policy's", []corev1.Pod{pod("e", after, nil, "grpc")}, true,
			[]string{`pods e carry the sidecar in front of port grpc, while a container keeps port "http": its traffic passes around the sidecar`}, nil},
		{"a forged status and a dummy sidecar", []corev1.Pod{pod("f", after, nil, "", forged)}, true,
			[]string{"pods f carry a container named slidegate-sidecar that is not a working sidecar (it is not a native sidecar (restartPolicy Always))"}, []string{"webhook admitted"}},
		{"a way around the sidecar", []corev1.Pod{pod("g", after, nil, "http", func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].HostPort = 30080 })}, true,
			[]string{"in pods g traffic reaches the app around the sidecar (container app publishes the app's port 8080 on the node (hostPort 30080))"}, nil},
		{"protected and unselected pods are not named", []corev1.Pod{
			pod("ok", before, nil, "http"), specPod(t, "other", map[string]string{"app": "db"}, ""),
			pod("f", before, nil, ""), pod("g", before, nil, ""), pod("h", before, nil, ""), pod("i", before, nil, "")}, true,
			[]string{"pods f, g, h and 1 more were created before the policy"}, []string{"ok", "other"}},
		{"every cause at once, in a fixed order", []corev1.Pod{
			pod("w", after, nil, ""), pod("o", after, optOut, ""),
			pod("p", after, nil, "grpc"), pod("b", before, nil, ""), pod("l", after, nil, "", forged),
			pod("r", after, nil, "http", func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].HostPort = 30080 })}, true,
			[]string{"pods b were created before the policy: restart them (kubectl -n shop rollout restart ...); " +
				`pods p carry the sidecar in front of port grpc, while a container keeps port "http": its traffic passes around the sidecar; ` +
				"pods o opted out with ratelimit.slidegate.dev/inject=false; " +
				"pods l carry a container named slidegate-sidecar that is not a working sidecar (it is not a native sidecar (restartPolicy Always)): the webhook did not inject them; recreate them; " +
				"in pods r traffic reaches the app around the sidecar (container app publishes the app's port 8080 on the node (hostPort 30080)); " +
				`the webhook admitted pods w without the sidecar (the warning at their creation says why, e.g. no container port named "http")`}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Guards{}.UnprotectedWhy(p, tc.pods, tc.optedIn)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("%q\nlacks %q", got, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(got, n) {
					t.Errorf("%q\nnames %q", got, n)
				}
			}
		})
	}
}

func TestRLSDesiredStatus(t *testing.T) {
	server := func(addr, rev string) Server {
		return Server{Addr: addr, Loaded: map[string]bool{rev: true}}
	}
	down := Server{Addr: "10.0.0.9:8082", Err: errors.New("connection refused")}
	invalid := &render.InvalidPolicyError{Namespace: "shop", Name: "login", Err: errors.New("window 0s")}
	const invalidMsg = "the spec cannot be enforced: policy shop/login: window 0s"
	accepted := cond{metav1.ConditionTrue, v1alpha1.ReasonAccepted, "rendered into ConfigMap slidegate-system/slidegate-rls-config"}
	published := cond{metav1.ConditionTrue, v1alpha1.ReasonPublished,
		"the configuration is published in ConfigMap slidegate-system/slidegate-rls-config for the rate limit service"}
	for _, tc := range []struct {
		name              string
		before            v1alpha1.RateLimitPolicyStatus
		in                ServiceInput
		want              map[v1alpha1.ConditionType]cond
		matched, enforced int32
		// recheck: the reconcile asks to come back after Recheck (a server
		// may yet load the policy; nothing watched says when).
		recheck bool
	}{
		{
			name:    "every ready server loaded the revision",
			in:      ServiceInput{Revision: "r1", Servers: []Server{server("10.0.0.1:8082", "r1"), server("10.0.0.2:8082", "r1")}},
			matched: 2, enforced: 2,
			want: conds(accepted, published, cond{metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 2 rate limit service servers loaded revision r1"}),
		},
		{
			name: "not accepted",
			in:   ServiceInput{NotAccepted: NotAccepted(invalid), Servers: []Server{server("10.0.0.1:8082", "r1")}},
			// In effect on no server: nothing matched, nothing to wait for
			// (only an event can change it), so no recheck.
			matched: 0, enforced: 0,
			want: notAcceptedConds(v1alpha1.ReasonInvalid, invalidMsg, "not enforced: the policy is not accepted"),
		},
		{
			name: "not accepted, after it was enforced: counts drop, no recheck",
			before: v1alpha1.RateLimitPolicyStatus{MatchedPods: 2, EnforcedPods: 2, Conditions: []metav1.Condition{
				{Type: string(v1alpha1.ConditionAccepted), Status: metav1.ConditionTrue, Reason: string(v1alpha1.ReasonAccepted), ObservedGeneration: 3},
			}},
			in:      ServiceInput{NotAccepted: NotAccepted(invalid), Servers: []Server{server("10.0.0.1:8082", "r1"), server("10.0.0.2:8082", "r1")}},
			matched: 0, enforced: 0,
			want: notAcceptedConds(v1alpha1.ReasonInvalid, invalidMsg, "not enforced: the policy is not accepted"),
		},
		{
			name: "no ready server",
			in:   ServiceInput{Revision: "r1"},
			want: conds(accepted, published, cond{metav1.ConditionFalse, v1alpha1.ReasonNoRateLimitService,
				`no ready endpoint of Service slidegate-system/slidegate-rls with a port named "admin": install the rate limit service (config/components/rls, docs/rls.md)`}),
		},
		{
			name:    "a server still serving an older revision",
			in:      ServiceInput{Revision: "r2", Servers: []Server{server("10.0.0.1:8082", "r2"), server("10.0.0.2:8082", "r1")}},
			matched: 2, enforced: 1, recheck: true,
			want: conds(accepted, published, cond{metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced,
				"1 of 2 rate limit service servers loaded revision r2; 10.0.0.2:8082 serve an older configuration (the kubelet refreshes the mounted ConfigMap within about a minute)"}),
		},
		{
			name:    "a server that could not be asked, one behind, one without the policy",
			in:      ServiceInput{Revision: "r2", Servers: []Server{server("10.0.0.1:8082", "r1"), down, {Addr: "10.0.0.3:8082"}}},
			matched: 3, enforced: 0, recheck: true,
			want: map[v1alpha1.ConditionType]cond{
				v1alpha1.ConditionAccepted: accepted, v1alpha1.ConditionReady: published,
				v1alpha1.ConditionEnforced: {metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced,
					"0 of 3 rate limit service servers loaded revision r2; 10.0.0.1:8082, 10.0.0.3:8082 serve an older configuration (the kubelet refreshes the mounted ConfigMap within about a minute); " +
						"10.0.0.9:8082 (connection refused) could not be asked"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newRLSPolicy("shop", "login")
			p.Generation = 4
			p.Status = tc.before
			tc.in.Namespace, tc.in.Service, tc.in.AdminPort = "slidegate-system", "slidegate-rls", "admin"
			st := DesiredService(p, tc.in)
			if diff := cmp.Diff(tc.want, conditionsOf(t, st, 4), condOpt); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
			if st.MatchedPods != tc.matched || st.EnforcedPods != tc.enforced {
				t.Errorf("pods %d/%d, want %d/%d", st.EnforcedPods, st.MatchedPods, tc.enforced, tc.matched)
			}
			if got := ServersBehind(st); got != tc.recheck {
				t.Errorf("servers behind: %v, want %v (the reconcile comes back after its recheck then)", got, tc.recheck)
			}
			if wantRev := tc.in.Revision; tc.in.NotAccepted != nil && st.Revision != "" || tc.in.NotAccepted == nil && st.Revision != wantRev {
				t.Errorf("revision %q", st.Revision)
			}
		})
	}
}

// TestSidecarImageChecked: a pod whose sidecar runs an image of another
// repository than the manager's --sidecar-image (changed after admission:
// before the admission policy slidegate-sidecar-image, or while its
// namespace was not opted in) is not enforced, and the message says which
// image; any tag of slidegate's repository is (sidecars of earlier
// releases). Its pair: read without the image (the status before), the
// swapped pod counts as enforced.
func TestSidecarImageChecked(t *testing.T) {
	swap := func(image string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			for i := range p.Spec.InitContainers {
				if p.Spec.InitContainers[i].Name == inject.ContainerName {
					p.Spec.InitContainers[i].Image = image
				}
			}
		}
	}
	gs := Guards{Repo: inject.ImageRepository}
	for _, tc := range []struct {
		name     string
		pod      corev1.Pod
		enforced int32
	}{
		{"as injected", specPod(t, "a", webLabels, "http"), 1},
		{"an earlier release's tag", with(specPod(t, "a", webLabels, "http"), swap(inject.ImageRepository+":v0.1.0")), 1},
		{"pinned by digest", with(specPod(t, "a", webLabels, "http"), swap(inject.ImageRepository+":v0.2.0@sha256:"+strings.Repeat("ab", 32))), 1},
		{"another repository", with(specPod(t, "a", webLabels, "http"), swap("evil.example/proxy:1")), 0},
		{"a registry with a port, same path", with(specPod(t, "a", webLabels, "http"), swap("localhost:5000/slidegate/slidegate:v0.2.0")), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, enforced := gs.CountPods(webPolicy("http"), []corev1.Pod{tc.pod}, map[types.UID]bool{})
			if enforced != tc.enforced {
				t.Errorf("enforced %d, want %d", enforced, tc.enforced)
			}
		})
	}
	swapped := []corev1.Pod{with(specPod(t, "a", webLabels, "http"), swap("evil.example/proxy:1"))}
	if got := gs.UnprotectedWhy(webPolicy("http"), swapped, true); !strings.Contains(got, `pods a carry a container named slidegate-sidecar that is not a working sidecar (it runs image "evil.example/proxy:1", not one of slidegate's sidecar (ghcr.io/slidegate/slidegate))`) {
		t.Errorf("why: %q", got)
	}
	if _, enforced := (Guards{}).CountPods(webPolicy("http"), swapped, map[types.UID]bool{}); enforced != 1 {
		t.Errorf("read without the image, the swapped pod counts %d enforced: the pair no longer shows the naive status", enforced)
	}
}
