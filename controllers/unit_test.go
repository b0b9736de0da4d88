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
	"errors"
	"flag"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
)

func TestRedisFlags(t *testing.T) {
	tests := []struct {
		args      []string
		namespace string
		wantErr   string
	}{
		{args: []string{"--redis-addrs=redis:6379"}},
		{args: []string{"--redis-addrs=redis:6379", "--redis-secret-name=redis-auth"}, namespace: "slidegate-system"},
		{args: []string{"--redis-mode=cluster", "--redis-addrs=a:7000, b:7001,c:7002", "--redis-tls"}},
		{args: []string{"--redis-mode=cluster", "--redis-addrs=a:7000", "--redis-tls", "--redis-tls-server-name=redis.data.svc"}},
		{args: []string{"--redis-addrs=a:1", "--redis-tls-server-name=redis.data.svc"}, wantErr: "--redis-tls-server-name needs --redis-tls"},
		{args: []string{"--redis-mode=sentinel", "--redis-addrs=s1:26379,s2:26379", "--redis-master-name=mymaster"}},
		{args: nil, wantErr: "--redis-addrs is required"},
		{args: []string{"--redis-addrs=redis"}, wantErr: `"redis" is not host:port`},
		{args: []string{"--redis-addrs=a:1,b:2"}, wantErr: "standalone takes one address"},
		{args: []string{"--redis-mode=sentinel", "--redis-addrs=s:26379"}, wantErr: "needs --redis-master-name"},
		{args: []string{"--redis-mode=cluster", "--redis-addrs=a:1", "--redis-master-name=m"}, wantErr: "only for --redis-mode=sentinel"},
		{args: []string{"--redis-mode=replica", "--redis-addrs=a:1"}, wantErr: `"replica" is not standalone, cluster or sentinel`},
		{args: []string{"--redis-addrs=a:1", "--redis-secret-name=Bad_Name"}, namespace: "ns", wantErr: "--redis-secret-name"},
		{args: []string{"--redis-addrs=a:1", "--redis-secret-name=redis-auth"}, wantErr: "set POD_NAMESPACE"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var c RedisConnection
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			c.BindFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			err := c.Complete(tt.namespace)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if c.CredentialsSecret.Name != "" && c.CredentialsSecret.Namespace != tt.namespace {
					t.Errorf("credentials Secret %s not in the manager's namespace %s", c.CredentialsSecret, tt.namespace)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestSelectorKeysIndex: a pod can only match a selector if it has the label
// key the index files the selector under (or the selector is filed under
// anyLabelKey) — the property the pod map function relies on.
func TestSelectorKeysIndex(t *testing.T) {
	selectors := []v1alpha1.LabelSelector{
		{},
		{MatchLabels: map[string]v1alpha1.LabelValue{"app": "a"}},
		{MatchLabels: map[string]v1alpha1.LabelValue{"b": "1", "a": "2"}},
		{MatchExpressions: []v1alpha1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"web"}}}},
		{MatchExpressions: []v1alpha1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpExists}}},
		{MatchExpressions: []v1alpha1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"web"}}}},
		{MatchExpressions: []v1alpha1.LabelSelectorRequirement{{Key: "canary", Operator: metav1.LabelSelectorOpDoesNotExist}}},
		{
			MatchLabels:      map[string]v1alpha1.LabelValue{"z": "1"},
			MatchExpressions: []v1alpha1.LabelSelectorRequirement{{Key: "canary", Operator: metav1.LabelSelectorOpDoesNotExist}},
		},
	}
	pods := []map[string]string{
		nil,
		{"app": "a"},
		{"a": "2", "b": "1"},
		{"tier": "web"},
		{"tier": "db"},
		{"z": "1"},
		{"z": "1", "canary": "yes"},
		{"other": "x"},
	}
	for i := range selectors {
		p := &v1alpha1.RateLimitPolicy{Spec: v1alpha1.RateLimitPolicySpec{TargetSelector: &selectors[i]}}
		keys := selectorKeys(p)
		if len(keys) != 1 {
			t.Fatalf("selector %d filed under %v, want one key", i, keys)
		}
		sel, err := metav1.LabelSelectorAsSelector(selectors[i].AsMeta())
		if err != nil {
			t.Fatal(err)
		}
		for _, pod := range pods {
			if !sel.Matches(labels.Set(pod)) {
				continue
			}
			if _, has := pod[keys[0]]; !has && keys[0] != anyLabelKey {
				t.Errorf("selector %d (filed under %q) matches pod %v, which lacks that key: the map function would miss it", i, keys[0], pod)
			}
		}
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

// TestNotAcceptedStatus: a policy left out of the configuration says why in
// Accepted, Ready and Stalled, with the reason of its kind of problem, and
// reports no revision.
func TestNotAcceptedStatus(t *testing.T) {
	p := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "shop", Generation: 3}}
	tooLarge := &render.ConfigTooLargeError{Namespace: "shop", Name: "p", PolicyBytes: 40_000, TotalBytes: 1_010_000, MaxBytes: 1_000_000, Ahead: 29}
	for _, tc := range []struct {
		name       string
		err        error
		wantReason string
		wantMsg    []string
	}{
		{"invalid", &render.InvalidPolicyError{Namespace: "shop", Name: "p", Err: errors.New("limit 0 is not from 1 to 1000000")},
			v1alpha1.ReasonInvalid, []string{"the spec cannot be enforced: policy shop/p: limit 0"}},
		{"too large", tooLarge, v1alpha1.ReasonConfigTooLarge,
			[]string{"not published: policy shop/p (40,000 bytes) does not fit", "would be 1,010,000 bytes", "1,000,000-byte budget", "make room"}},
		{"too large, wrapped", fmt.Errorf("namespace shop: %w", tooLarge), v1alpha1.ReasonConfigTooLarge, []string{"not published"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := p.DeepCopy()
			p.Status.Revision = "0123456789abcdef"
			st := desiredStatus(p, statusInput{notAccepted: notAcceptedProblem(tc.err), revision: "fedcba9876543210", matched: 2, enforced: 2})
			for typ, want := range map[string]metav1.ConditionStatus{
				v1alpha1.ConditionAccepted: metav1.ConditionFalse,
				v1alpha1.ConditionReady:    metav1.ConditionFalse,
				ConditionStalled:           metav1.ConditionTrue,
			} {
				c := meta.FindStatusCondition(st.Conditions, typ)
				if c == nil || c.Status != want || c.Reason != tc.wantReason || c.ObservedGeneration != 3 {
					t.Errorf("%s: %+v, want %s with reason %s", typ, c, want, tc.wantReason)
					continue
				}
				for _, w := range tc.wantMsg {
					if !strings.Contains(c.Message, w) {
						t.Errorf("%s message %q lacks %q", typ, c.Message, w)
					}
				}
			}
			if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionEnforced); c == nil || c.Reason != v1alpha1.ReasonNotAccepted {
				t.Errorf("Enforced: %+v, want reason %s", c, v1alpha1.ReasonNotAccepted)
			}
			if st.Revision != "" || st.ObservedGeneration != 3 {
				t.Errorf("revision %q, observedGeneration %d; want none, 3", st.Revision, st.ObservedGeneration)
			}
		})
	}
}

// TestTruncateNote: an event note stays within the API server's 1024 bytes,
// cut on a rune boundary; a longer note would be refused and the event lost.
func TestTruncateNote(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
	}{
		{"short", "Ready=True"},
		{"exactly the limit", strings.Repeat("a", maxNoteBytes)},
		{"ascii over", strings.Repeat("a", 3*maxNoteBytes)},
		{"multi-byte runes across the cut", strings.Repeat("é", maxNoteBytes)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := truncateNote(tc.in)
			if len(got) > maxNoteBytes || !utf8.ValidString(got) {
				t.Fatalf("%d bytes, valid UTF-8 %t", len(got), utf8.ValidString(got))
			}
			if len(tc.in) <= maxNoteBytes && got != tc.in {
				t.Errorf("a note within the limit changed: %q", got)
			}
			if len(tc.in) > maxNoteBytes && (!strings.HasSuffix(got, "…") || len(got) < maxNoteBytes-4) {
				t.Errorf("cut to %d bytes, ending %q", len(got), got[len(got)-4:])
			}
		})
	}
}
