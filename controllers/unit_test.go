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
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/policystatus"
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
		{args: []string{"--redis-addrs=a:1", "--redis-identity=shared", "--redis-password-rotation=24h"}},
		{args: []string{"--redis-addrs=a:1", "--redis-password-rotation=1m"}, wantErr: "at least 10m"},
		{args: []string{"--redis-addrs=a:1", "--redis-identity-interval=-1s"}, wantErr: "must not be negative"},
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

// TestRedisIdentitiesAdministered: the manager administers Redis in the
// namespace mode, with or without an administrative identity (a Redis
// whose default user needs none), and in the shared mode only with one:
// a managed Redis that refuses ACL SETUSER runs the shared mode without
// it, and every periodic pass would fail there.
func TestRedisIdentitiesAdministered(t *testing.T) {
	for _, tt := range []struct {
		mode IdentityMode
		dir  string
		want bool
	}{
		{IdentityNamespace, "", true},
		{IdentityNamespace, "/etc/slidegate/redis-admin", true},
		{IdentityShared, "/etc/slidegate/redis-admin", true},
		{IdentityShared, "", false},
	} {
		c := RedisConnection{Identity: tt.mode, AdminCredentialsDir: tt.dir}
		c.Config.Addrs = []string{"127.0.0.1:1"}
		ri, err := c.Identities("slidegate-system", types.NamespacedName{})
		if err != nil {
			t.Fatal(err)
		}
		if got := ri.Admin != nil; got != tt.want || ri.Mode != tt.mode {
			t.Errorf("mode %s, admin dir %q: administered %v (mode %s), want %v", tt.mode, tt.dir, got, ri.Mode, tt.want)
		}
		if ri.Admin != nil {
			ri.Admin.Close()
		}
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

// TestTrimPodKeepsWhatTheStatusReads: the cache holds pods trimmed by
// policystatus.TrimPod, and the status must read from them what it would read from the
// whole pod: the sidecar's guard (or why there is none) for each of the
// injector's golden pods and each of its input pods, the labels and the
// opt-out annotation. And the trimmed pod is much smaller.
func TestTrimPodKeepsWhatTheStatusReads(t *testing.T) {
	files, err := filepath.Glob("../internal/inject/testdata/*.*")
	if err != nil || len(files) < 10 {
		t.Fatalf("the injector's testdata: %v (%d files)", err, len(files))
	}
	var full, kept int
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var pod corev1.Pod
		if err := yaml.Unmarshal(raw, &pod); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		pod.Labels[inject.OptOutAnnotation] = "false"
		pod.Annotations = map[string]string{inject.OptOutAnnotation: "false", "kubectl.kubernetes.io/last-applied-configuration": string(raw)}
		out, err := policystatus.TrimPod(pod.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		trimmed := out.(*corev1.Pod)
		wantGuard, wantErr := inject.ReadGuard(&pod.Spec)
		gotGuard, gotErr := inject.ReadGuard(&trimmed.Spec)
		if wantGuard != gotGuard || fmt.Sprint(wantErr) != fmt.Sprint(gotErr) {
			t.Errorf("%s: ReadGuard of the trimmed pod %+v, %v; of the pod %+v, %v", f, gotGuard, gotErr, wantGuard, wantErr)
		}
		if !inject.OptedOut(trimmed.Annotations, nil) || !maps.Equal(pod.Labels, trimmed.Labels) || trimmed.Name != pod.Name {
			t.Errorf("%s: the trimmed pod lost its metadata: %+v", f, trimmed.ObjectMeta)
		}
		a, _ := json.Marshal(&pod)
		b, _ := json.Marshal(trimmed)
		full, kept = full+len(a), kept+len(b)
	}
	t.Logf("the trimmed pods are %d of %d bytes as JSON (%.0f%%)", kept, full, 100*float64(kept)/float64(full))
	if kept*3 > full {
		t.Errorf("the trimmed pods keep %d of %d bytes: more than a third", kept, full)
	}
}
