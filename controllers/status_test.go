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

// The status logic as tables of plain Go values, no API server: one table
// per function (desiredStatus, countPods, bypassingServices, unprotectedWhy,
// rlsDesiredStatus). A new status behaviour gets a row in the table of the
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
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/rlsconfig"
)

// cond is a condition as a table states it: its status, reason and exact
// message.
type cond struct {
	status  metav1.ConditionStatus
	reason  string
	message string
}

// conditionsOf keys a status's conditions by type, as tables state them,
// and fails if a condition does not describe generation.
func conditionsOf(t *testing.T, st v1alpha1.RateLimitPolicyStatus, generation int64) map[string]cond {
	t.Helper()
	out := map[string]cond{}
	for _, c := range st.Conditions {
		if c.ObservedGeneration != generation {
			t.Errorf("%s: observedGeneration %d, want %d", c.Type, c.ObservedGeneration, generation)
		}
		out[c.Type] = cond{c.Status, c.Reason, c.Message}
	}
	return out
}

// notAcceptedConds are the conditions of a policy left out of the
// configuration for reason, with message msg, whose Enforced says
// enforcedMsg.
func notAcceptedConds(reason, msg, enforcedMsg string) map[string]cond {
	return map[string]cond{
		v1alpha1.ConditionAccepted: {metav1.ConditionFalse, reason, msg},
		v1alpha1.ConditionReady:    {metav1.ConditionFalse, reason, msg},
		ConditionStalled:           {metav1.ConditionTrue, reason, msg},
		v1alpha1.ConditionEnforced: {metav1.ConditionFalse, v1alpha1.ReasonNotAccepted, enforcedMsg},
	}
}

// conds are the conditions of an accepted policy, without Stalled.
func conds(accepted, ready, enforced cond) map[string]cond {
	return map[string]cond{v1alpha1.ConditionAccepted: accepted, v1alpha1.ConditionReady: ready, v1alpha1.ConditionEnforced: enforced}
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

	for _, tc := range []struct {
		name         string
		before       v1alpha1.RateLimitPolicyStatus
		in           statusInput
		want         map[string]cond
		wantRevision string
	}{
		{
			name:         "every selected pod carries the sidecar",
			in:           statusInput{revision: "r1", matched: 3, enforced: 3},
			want:         conds(accepted, published, cond{metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 3 selected pods carry the sidecar"}),
			wantRevision: "r1",
		},
		{
			name: "invalid spec: not accepted, stalled, no revision",
			in:   statusInput{notAccepted: notAcceptedProblem(invalid), revision: "r1", matched: 2, enforced: 2},
			want: notAcceptedConds(v1alpha1.ReasonInvalid, invalidMsg, "not enforced: the policy is not accepted (2 pods selected)"),
		},
		{
			name: "no room in the ConfigMap",
			in:   statusInput{notAccepted: notAcceptedProblem(tooLarge), revision: "r1", matched: 1},
			want: notAcceptedConds(v1alpha1.ReasonConfigTooLarge, tooLargeMsg, "not enforced: the policy is not accepted (1 pods selected)"),
		},
		{
			name:   "no room in the ConfigMap (wrapped): not accepted, stalled, the old revision dropped",
			before: previously(metav1.Condition{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAccepted}),
			in:     statusInput{notAccepted: notAcceptedProblem(fmt.Errorf("namespace shop: %w", tooLarge)), matched: 1},
			want:   notAcceptedConds(v1alpha1.ReasonConfigTooLarge, tooLargeMsg, "not enforced: the policy is not accepted (1 pods selected)"),
		},
		{
			name:         "accepted again: Stalled goes",
			before:       previously(metav1.Condition{Type: ConditionStalled, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonInvalid}),
			in:           statusInput{revision: "r2", matched: 1, enforced: 1},
			want:         conds(accepted, published, cond{metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 1 selected pods carry the sidecar"}),
			wantRevision: "r2",
		},
		{
			name:         "no pod selected",
			in:           statusInput{revision: "r1"},
			want:         conds(accepted, published, cond{metav1.ConditionFalse, v1alpha1.ReasonNoPodsSelected, "no pod of the namespace matches targetSelector"}),
			wantRevision: "r1",
		},
		{
			name: "some selected pods without the sidecar",
			in:   statusInput{revision: "r1", matched: 3, enforced: 1, unprotected: "pods b, c were created before the policy"},
			want: conds(accepted, published, cond{metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced,
				`1 of 3 selected pods carry the sidecar in front of port "http"; pods b, c were created before the policy`}),
			wantRevision: "r1",
		},
		{
			name: "every pod protected, but a Service bypasses the sidecar",
			in:   statusInput{revision: "r1", matched: 2, enforced: 2, bypass: "Service web port 80 targets the app's port number 8080"},
			want: conds(accepted, published, cond{metav1.ConditionFalse, v1alpha1.ReasonServiceBypassesSidecar,
				"all 2 selected pods carry the sidecar, but Service web port 80 targets the app's port number 8080: such traffic reaches the app unlimited; set targetPort to the port's name (http)"}),
			wantRevision: "r1",
		},
		{
			name: "a bypass is not reported while pods lack the sidecar: that is the first thing to fix",
			in:   statusInput{revision: "r1", matched: 2, enforced: 1, bypass: "Service web port 80 targets the app's port number 8080", unprotected: "pods b opted out"},
			want: conds(accepted, published, cond{metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced,
				`1 of 2 selected pods carry the sidecar in front of port "http"; pods b opted out`}),
			wantRevision: "r1",
		},
		{
			name: "held back for sidecars of an earlier release: accepted, not ready, not stalled, no revision",
			before: previously(metav1.Condition{Type: ConditionStalled, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonInvalid},
				metav1.Condition{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAccepted}),
			in: statusInput{heldBack: heldBackProblem(1, []string{"web-1", "web-2", "web-3", "web-4"}, "shop"), revision: "r1", matched: 4, enforced: 4},
			want: map[string]cond{
				v1alpha1.ConditionAccepted: {metav1.ConditionTrue, v1alpha1.ReasonAccepted, "valid; " + heldBackMsg},
				v1alpha1.ConditionReady:    {metav1.ConditionFalse, v1alpha1.ReasonSidecarsOutdated, heldBackMsg},
				v1alpha1.ConditionEnforced: {metav1.ConditionFalse, v1alpha1.ReasonSidecarsOutdated, heldBackMsg},
			},
		},
		{
			name: "credentials missing just now: not ready, not yet stalled",
			in:   statusInput{revision: "r1", matched: 1, enforced: 1, credentials: credentialsProblem(noCredentials), now: time.Now(), grace: time.Minute},
			want: map[string]cond{
				v1alpha1.ConditionAccepted: accepted,
				v1alpha1.ConditionReady:    {metav1.ConditionFalse, v1alpha1.ReasonRedisCredentialsUnavailable, noCredentials},
				v1alpha1.ConditionEnforced: {metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 1 selected pods carry the sidecar"},
			},
			wantRevision: "r1",
		},
		{
			name: "credentials missing for longer than the grace: stalled",
			before: previously(metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse,
				Reason: v1alpha1.ReasonRedisCredentialsUnavailable, Message: noCredentials}),
			in: statusInput{revision: "r1", matched: 1, enforced: 1, credentials: credentialsProblem(noCredentials), now: time.Now(), grace: time.Minute},
			want: map[string]cond{
				v1alpha1.ConditionAccepted: accepted,
				v1alpha1.ConditionReady:    {metav1.ConditionFalse, v1alpha1.ReasonRedisCredentialsUnavailable, noCredentials},
				ConditionStalled:           {metav1.ConditionTrue, v1alpha1.ReasonRedisCredentialsUnavailable, noCredentials},
				v1alpha1.ConditionEnforced: {metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 1 selected pods carry the sidecar"},
			},
			wantRevision: "r1",
		},
		{
			name: "fixed while the credentials are missing: Ready was False (Invalid) long ago, the grace starts now",
			before: previously(
				metav1.Condition{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonInvalid, Message: invalidMsg},
				metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonInvalid, Message: invalidMsg},
				metav1.Condition{Type: ConditionStalled, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonInvalid, Message: invalidMsg},
				metav1.Condition{Type: v1alpha1.ConditionEnforced, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNotAccepted}),
			in: statusInput{revision: "r1", matched: 1, enforced: 1, credentials: credentialsProblem(noCredentials), now: time.Now(), grace: time.Minute},
			want: map[string]cond{
				v1alpha1.ConditionAccepted: accepted,
				v1alpha1.ConditionReady:    {metav1.ConditionFalse, v1alpha1.ReasonRedisCredentialsUnavailable, noCredentials},
				v1alpha1.ConditionEnforced: {metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 1 selected pods carry the sidecar"},
			},
			wantRevision: "r1",
		},
		{
			name: "room made while the credentials are missing: Ready was False (ConfigTooLarge) long ago, the grace starts now",
			before: previously(
				metav1.Condition{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonConfigTooLarge, Message: tooLargeMsg},
				metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonConfigTooLarge, Message: tooLargeMsg}),
			in: statusInput{revision: "r1", matched: 1, enforced: 1, credentials: credentialsProblem(noCredentials), now: time.Now(), grace: time.Minute},
			want: map[string]cond{
				v1alpha1.ConditionAccepted: accepted,
				v1alpha1.ConditionReady:    {metav1.ConditionFalse, v1alpha1.ReasonRedisCredentialsUnavailable, noCredentials},
				v1alpha1.ConditionEnforced: {metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 1 selected pods carry the sidecar"},
			},
			wantRevision: "r1",
		},
		{
			name: "credentials missing, no clock (now unset): never stalled",
			before: previously(metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse,
				Reason: v1alpha1.ReasonRedisCredentialsUnavailable, Message: noCredentials}),
			in: statusInput{revision: "r1", matched: 1, enforced: 1, credentials: credentialsProblem(noCredentials), grace: time.Minute},
			want: map[string]cond{
				v1alpha1.ConditionAccepted: accepted,
				v1alpha1.ConditionReady:    {metav1.ConditionFalse, v1alpha1.ReasonRedisCredentialsUnavailable, noCredentials},
				v1alpha1.ConditionEnforced: {metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 1 selected pods carry the sidecar"},
			},
			wantRevision: "r1",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", Generation: 2}, Status: tc.before}
			st := desiredStatus(p, tc.in)
			if diff := cmp.Diff(tc.want, conditionsOf(t, st, 2), condOpt); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
			if st.Revision != tc.wantRevision || st.ObservedGeneration != 2 || st.MatchedPods != tc.in.matched || st.EnforcedPods != tc.in.enforced {
				t.Errorf("revision %q, observedGeneration %d, pods %d/%d; want %q, 2, %d/%d",
					st.Revision, st.ObservedGeneration, st.EnforcedPods, st.MatchedPods, tc.wantRevision, tc.in.enforced, tc.in.matched)
			}
		})
	}
}

// TestDesiredStatusIsStable: a reconcile with nothing new computes the
// status it computed before, transition times included, so nothing is
// written. The naive way (conditions built afresh) would move them.
func TestDesiredStatusIsStable(t *testing.T) {
	p := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", Generation: 1}}
	in := statusInput{revision: "r1", matched: 2, enforced: 1, unprotected: "pods b opted out"}
	p.Status = desiredStatus(p, in)
	for i := range p.Status.Conditions {
		p.Status.Conditions[i].LastTransitionTime = metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	}
	if again := desiredStatus(p, in); !cmp.Equal(p.Status, again) {
		t.Errorf("status changed without news:\n%s", cmp.Diff(p.Status, again))
	}
}

// metaPod is a pod's metadata as the controller's cache holds it; injected
// is its injection annotation ("" for none).
func metaPod(name string, labels map[string]string, injected string) metav1.PartialObjectMetadata {
	pod := metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Labels: labels}}
	if injected != "" {
		pod.Annotations = map[string]string{v1alpha1.InjectedAnnotation: injected}
	}
	return pod
}

// withAnnotation sets one more annotation on pod.
func withAnnotation(pod metav1.PartialObjectMetadata, key, value string) metav1.PartialObjectMetadata {
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[key] = value
	return pod
}

// injectedStatus is the injection annotation of a sidecar in front of port
// name (taken from the app's port number appPort).
func injectedStatus(port string, appPort int32) string {
	return fmt.Sprintf(`{"version":"v1","container":"slidegate-sidecar","targetPort":%q,"appContainer":"app","appPort":%d}`, port, appPort)
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

func TestCountPods(t *testing.T) {
	for _, tc := range []struct {
		name              string
		policy            *v1alpha1.RateLimitPolicy
		pods              []metav1.PartialObjectMetadata
		matched, enforced int32
		unprotected       []string // pod names
	}{
		{"no pods", webPolicy(""), nil, 0, 0, nil},
		{"unselected pods are not counted, sidecar or not", webPolicy(""), []metav1.PartialObjectMetadata{
			metaPod("db", map[string]string{"app": "db"}, injectedStatus("http", 8080)), metaPod("bare", nil, "")}, 0, 0, nil},
		{"a sidecar in front of the policy's port protects", webPolicy("http"), []metav1.PartialObjectMetadata{
			metaPod("a", webLabels, injectedStatus("http", 8080))}, 1, 1, nil},
		{"unset targetPort means http", webPolicy(""), []metav1.PartialObjectMetadata{
			metaPod("a", webLabels, injectedStatus("http", 8080))}, 1, 1, nil},
		{"a sidecar in front of another port does not protect", webPolicy("http"), []metav1.PartialObjectMetadata{
			metaPod("a", webLabels, injectedStatus("api", 9090))}, 1, 0, []string{"a"}},
		{"no sidecar", webPolicy("http"), []metav1.PartialObjectMetadata{
			metaPod("a", webLabels, ""), metaPod("b", webLabels, injectedStatus("http", 8080))}, 2, 1, []string{"a"}},
		{"an injection status naming no port guards any", webPolicy("api"), []metav1.PartialObjectMetadata{
			metaPod("a", webLabels, `{"version":"v1"}`)}, 1, 1, nil},
		{"an unreadable injection status counts as a sidecar on any port", webPolicy("api"), []metav1.PartialObjectMetadata{
			metaPod("a", webLabels, "not json")}, 1, 1, nil},
		{"the pod chose the port (target-port annotation): its sidecar enforces every policy selecting it", webPolicy("http"), []metav1.PartialObjectMetadata{
			withAnnotation(metaPod("a", webLabels, injectedStatus("grpc", 9090)), inject.TargetPortAnnotation, "grpc")}, 1, 1, nil},
		{"a target-port annotation added after injection does not move the sidecar", webPolicy("http"), []metav1.PartialObjectMetadata{
			withAnnotation(metaPod("a", webLabels, injectedStatus("api", 9090)), inject.TargetPortAnnotation, "grpc")}, 1, 0, []string{"a"}},
		{"a target-port annotation without the sidecar protects nothing", webPolicy("http"), []metav1.PartialObjectMetadata{
			withAnnotation(metaPod("a", webLabels, ""), inject.TargetPortAnnotation, "grpc")}, 1, 0, []string{"a"}},
		{"a policy without targetSelector (rate limit service) selects no pod", &v1alpha1.RateLimitPolicy{}, []metav1.PartialObjectMetadata{
			metaPod("a", webLabels, "")}, 0, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unprotected := map[types.UID]bool{}
			matched, enforced := countPods(tc.policy, tc.pods, unprotected)
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
	protected := []metav1.PartialObjectMetadata{metaPod("a", webLabels, injectedStatus("http", 8080))}
	for _, tc := range []struct {
		name     string
		pods     []metav1.PartialObjectMetadata
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
		{"UDP is not limited by the sidecar anyway", protected,
			[]corev1.Service{service("web", webLabels, corev1.ServicePort{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolUDP})}, ""},
		{"a Service selecting other pods", protected,
			[]corev1.Service{service("db", map[string]string{"app": "db"}, port(80, intstr.FromInt32(8080)))}, ""},
		{"a Service without selector (endpoints by hand)", protected,
			[]corev1.Service{service("manual", nil, port(80, intstr.FromInt32(8080)))}, ""},
		{"pods without the sidecar are reported as unprotected, not as bypassed", []metav1.PartialObjectMetadata{metaPod("a", webLabels, "")},
			[]corev1.Service{service("web", webLabels, port(80, intstr.FromInt32(8080)))}, ""},
		{"a protected pod the policy does not select", []metav1.PartialObjectMetadata{metaPod("a", map[string]string{"app": "web2"}, injectedStatus("http", 8080))},
			[]corev1.Service{service("web", map[string]string{"app": "web2"}, port(80, intstr.FromInt32(8080)))}, ""},
		{"several, sorted", protected,
			[]corev1.Service{service("web-b", webLabels, port(80, intstr.FromInt32(8080))), service("web-a", webLabels, port(81, intstr.FromInt32(8080)))},
			"Service web-a port 81 targets the app's port number 8080; Service web-b port 80 targets the app's port number 8080"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := bypassingServices(webPolicy("http"), tc.pods, tc.services); got != tc.want {
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
	pod := func(name string, created metav1.Time, labels, annotations map[string]string) metav1.PartialObjectMetadata {
		l := map[string]string{"app": "web"}
		maps.Copy(l, labels)
		return metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: created, Labels: l, Annotations: annotations}}
	}
	injectedOn := func(port string) map[string]string {
		return map[string]string{v1alpha1.InjectedAnnotation: `{"version":"v1","targetPort":"` + port + `"}`}
	}
	for _, tc := range []struct {
		name      string
		pods      []metav1.PartialObjectMetadata
		optedIn   bool
		want, not []string
	}{
		{"namespace not opted in", []metav1.PartialObjectMetadata{pod("a", after, nil, nil)}, false,
			[]string{"namespace is not labelled ratelimit.slidegate.dev/injection=enabled (pods a)"}, []string{"before the policy", "webhook"}},
		{"created before the policy", []metav1.PartialObjectMetadata{pod("b", before, nil, nil)}, true,
			[]string{"pods b were created before the policy: restart them (kubectl -n shop rollout restart"}, []string{"not labelled"}},
		{"the webhook admitted it without", []metav1.PartialObjectMetadata{pod("c", after, nil, nil)}, true,
			[]string{"the webhook admitted pods c without the sidecar", `no container port named "http"`}, []string{"before the policy"}},
		{"opted out", []metav1.PartialObjectMetadata{pod("d", before, map[string]string{"ratelimit.slidegate.dev/inject": "false"}, nil)}, true,
			[]string{"pods d opted out with ratelimit.slidegate.dev/inject=false"}, []string{"before the policy"}},
		{"sidecar on another port", []metav1.PartialObjectMetadata{pod("e", after, nil, injectedOn("api"))}, true,
			[]string{"pods e carry the sidecar in front of port api"}, nil},
		{"protected and unselected pods are not named", []metav1.PartialObjectMetadata{
			pod("ok", before, nil, injectedOn("http")), {ObjectMeta: metav1.ObjectMeta{Name: "other", Labels: map[string]string{"app": "db"}}},
			pod("f", before, nil, nil), pod("g", before, nil, nil), pod("h", before, nil, nil), pod("i", before, nil, nil)}, true,
			[]string{"pods f, g, h and 1 more were created before the policy"}, []string{"ok", "other"}},
		{"every cause at once, in a fixed order", []metav1.PartialObjectMetadata{
			pod("w", after, nil, nil), pod("o", after, map[string]string{"ratelimit.slidegate.dev/inject": "false"}, nil),
			pod("p", after, nil, injectedOn("api")), pod("b", before, nil, nil)}, true,
			[]string{"pods b were created before the policy: restart them (kubectl -n shop rollout restart ...); " +
				"pods p carry the sidecar in front of port api, which another policy selecting them names; " +
				"pods o opted out with ratelimit.slidegate.dev/inject=false; " +
				`the webhook admitted pods w without the sidecar (the warning at their creation says why, e.g. no container port named "http")`}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := unprotectedWhy(p, tc.pods, tc.optedIn)
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
	id := rlsconfig.PolicyID("shop", "login")
	server := func(addr, rev string) serverState {
		return serverState{addr: addr, policies: map[string]string{id: rev}}
	}
	down := serverState{addr: "10.0.0.9:8082", err: errors.New("connection refused")}
	invalid := &render.InvalidPolicyError{Namespace: "shop", Name: "login", Err: errors.New("window 0s")}
	const invalidMsg = "the spec cannot be enforced: policy shop/login: window 0s"
	accepted := cond{metav1.ConditionTrue, v1alpha1.ReasonAccepted, "rendered into ConfigMap slidegate-system/slidegate-rls-config"}
	published := cond{metav1.ConditionTrue, v1alpha1.ReasonPublished,
		"the configuration is published in ConfigMap slidegate-system/slidegate-rls-config for the rate limit service"}
	for _, tc := range []struct {
		name              string
		before            v1alpha1.RateLimitPolicyStatus
		in                rlsStatusInput
		want              map[string]cond
		matched, enforced int32
		// recheck: the reconcile asks to come back after Recheck (a server
		// may yet load the policy; nothing watched says when).
		recheck bool
	}{
		{
			name:    "every ready server loaded the revision",
			in:      rlsStatusInput{revision: "r1", servers: []serverState{server("10.0.0.1:8082", "r1"), server("10.0.0.2:8082", "r1")}},
			matched: 2, enforced: 2,
			want: conds(accepted, published, cond{metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 2 rate limit service servers loaded revision r1"}),
		},
		{
			name: "not accepted",
			in:   rlsStatusInput{notAccepted: notAcceptedProblem(invalid), servers: []serverState{server("10.0.0.1:8082", "r1")}},
			// In effect on no server: nothing matched, nothing to wait for
			// (only an event can change it), so no recheck.
			matched: 0, enforced: 0,
			want: notAcceptedConds(v1alpha1.ReasonInvalid, invalidMsg, "not enforced: the policy is not accepted"),
		},
		{
			name: "not accepted, after it was enforced: counts drop, no recheck",
			before: v1alpha1.RateLimitPolicyStatus{MatchedPods: 2, EnforcedPods: 2, Conditions: []metav1.Condition{
				{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAccepted, ObservedGeneration: 3},
			}},
			in:      rlsStatusInput{notAccepted: notAcceptedProblem(invalid), servers: []serverState{server("10.0.0.1:8082", "r1"), server("10.0.0.2:8082", "r1")}},
			matched: 0, enforced: 0,
			want: notAcceptedConds(v1alpha1.ReasonInvalid, invalidMsg, "not enforced: the policy is not accepted"),
		},
		{
			name: "no ready server",
			in:   rlsStatusInput{revision: "r1"},
			want: conds(accepted, published, cond{metav1.ConditionFalse, v1alpha1.ReasonNoRateLimitService,
				`no ready endpoint of Service slidegate-system/slidegate-rls with a port named "admin": install the rate limit service (config/components/rls, docs/rls.md)`}),
		},
		{
			name:    "a server still serving an older revision",
			in:      rlsStatusInput{revision: "r2", servers: []serverState{server("10.0.0.1:8082", "r2"), server("10.0.0.2:8082", "r1")}},
			matched: 2, enforced: 1, recheck: true,
			want: conds(accepted, published, cond{metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced,
				"1 of 2 rate limit service servers loaded revision r2; 10.0.0.2:8082 serve an older configuration (the kubelet refreshes the mounted ConfigMap within about a minute)"}),
		},
		{
			name:    "a server that could not be asked, one behind, one without the policy",
			in:      rlsStatusInput{revision: "r2", servers: []serverState{server("10.0.0.1:8082", "r1"), down, {addr: "10.0.0.3:8082"}}},
			matched: 3, enforced: 0, recheck: true,
			want: map[string]cond{
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
			tc.in.namespace, tc.in.service = "slidegate-system", DefaultRLSServiceName
			st := rlsDesiredStatus(p, tc.in)
			if diff := cmp.Diff(tc.want, conditionsOf(t, st, 4), condOpt); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
			if st.MatchedPods != tc.matched || st.EnforcedPods != tc.enforced {
				t.Errorf("pods %d/%d, want %d/%d", st.EnforcedPods, st.MatchedPods, tc.enforced, tc.matched)
			}
			wantResult := ctrl.Result{}
			if tc.recheck {
				wantResult.RequeueAfter = defaultRLSRecheck
			}
			if got := (&RateLimitServiceReconciler{}).requeue(false, []v1alpha1.RateLimitPolicyStatus{st}); got != wantResult {
				t.Errorf("requeue %+v, want %+v", got, wantResult)
			}
			if wantRev := tc.in.revision; tc.in.notAccepted != nil && st.Revision != "" || tc.in.notAccepted == nil && st.Revision != wantRev {
				t.Errorf("revision %q", st.Revision)
			}
		})
	}
}
