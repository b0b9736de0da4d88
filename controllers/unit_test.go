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
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/policystatus"
)

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
