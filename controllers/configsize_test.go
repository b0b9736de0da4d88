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
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// bigPolicy is a valid policy with 32 path prefixes of 1,000 bytes each,
// within the schema's bounds (32 items of at most 1,024): about 32 KB
// rendered.
func bigPolicy(ns, name string) *v1alpha1.RateLimitPolicy {
	return newPolicy(ns, name, func(s *v1alpha1.RateLimitPolicySpec) {
		m := &v1alpha1.RequestMatch{}
		for j := range 32 {
			head := fmt.Sprintf("/%s/%02d/", name, j)
			m.PathPrefixes = append(m.PathPrefixes, v1alpha1.PathPrefix(head+strings.Repeat("x", 1000-len(head))))
		}
		s.Match = m
	})
}

// TestConfigTooLarge (issue 13): 40 valid policies of one namespace that
// render to more than the 1 MiB a ConfigMap holds. The namespace converges:
// the policies that fit (oldest first, then by name) are published and
// Ready, the others are Accepted=False with reason ConfigTooLarge and the
// sizes in the message, with a Warning event. Once nothing changes, a
// reconcile writes nothing; when room frees up, the left-out policies join.
// Before the budget, the apply failed with "Too long: may not be more than
// 1048576 bytes" forever and most policies kept observedGeneration 0.
func TestConfigTooLarge(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	var policies []*v1alpha1.RateLimitPolicy
	for i := range 40 {
		p := bigPolicy(ns, fmt.Sprintf("p%02d", i))
		create(t, p)
		policies = append(policies, p)
	}

	// Every policy converges one way or the other.
	tooLarge := map[v1alpha1.ConditionType]metav1.ConditionStatus{
		v1alpha1.ConditionAccepted: metav1.ConditionFalse,
		v1alpha1.ConditionReady:    metav1.ConditionFalse,
		v1alpha1.ConditionEnforced: metav1.ConditionFalse,
	}
	var published, left []string
	eventually(t, "every policy reconciled", func() error {
		published, left = nil, nil
		for _, p := range policies {
			got := get(t, p)
			if got.Status.ObservedGeneration != got.Generation {
				return fmt.Errorf("%s: observedGeneration %d, generation %d", p.Name, got.Status.ObservedGeneration, got.Generation)
			}
			c := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionAccepted))
			switch {
			case c != nil && c.Status == metav1.ConditionTrue:
				if err := settled(p, readyAccepted); err != nil {
					return err
				}
				published = append(published, p.Name)
			case c != nil && c.Reason == string(v1alpha1.ReasonConfigTooLarge):
				if err := settled(p, tooLarge); err != nil {
					return err
				}
				left = append(left, p.Name)
			default:
				return fmt.Errorf("%s: Accepted is %+v", p.Name, c)
			}
		}
		return nil
	})
	if len(published) == 0 || len(left) == 0 {
		t.Fatalf("published %v, left out %v: the case does not exercise the budget", published, left)
	}

	// The ConfigMap holds exactly the published policies, within the budget.
	cm, cfg, err := readConfig(ns)
	if err != nil {
		t.Fatal(err)
	}
	size := len(cm.Data[sidecarconfig.FileName])
	t.Logf("%d policies published in %d bytes, %d left out", len(published), size, len(left))
	if size > render.DefaultMaxBytes {
		t.Errorf("the ConfigMap holds %d bytes, over the budget of %d", size, render.DefaultMaxBytes)
	}
	if names := policyNames(cfg); !slices.Equal(names, published) {
		t.Errorf("policies in the ConfigMap %v, want the published ones %v", names, published)
	}
	// The policies are alike, so the ones published are the first in the
	// order of precedence: oldest first, then by name.
	order := slices.Clone(policies)
	for i, p := range order {
		order[i] = get(t, p)
	}
	slices.SortStableFunc(order, func(a, b *v1alpha1.RateLimitPolicy) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	for i, p := range order {
		if want := i < len(published); slices.Contains(published, p.Name) != want {
			t.Errorf("%s (created %s) published: %v, want %v", p.Name, p.CreationTimestamp, !want, want)
		}
	}

	// Each left-out policy says why, with the sizes, and got a Warning.
	for _, name := range left {
		got := get(t, newPolicy(ns, name))
		c := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionAccepted))
		for _, want := range []string{"1,000,000-byte budget", "bytes", sidecarconfig.ConfigMapName} {
			if !strings.Contains(c.Message, want) {
				t.Errorf("%s: Accepted message %q does not contain %q", name, c.Message, want)
			}
		}
		if got.Status.Revision != "" {
			t.Errorf("%s: a policy left out reports revision %q", name, got.Status.Revision)
		}
		if !slices.ContainsFunc(recorder.about(ns, name), func(e string) bool {
			return strings.Contains(e, " Warning "+string(v1alpha1.ReasonConfigTooLarge)+" ")
		}) {
			t.Errorf("%s: no Warning event %s; events %q", name, v1alpha1.ReasonConfigTooLarge, recorder.about(ns, name))
		}
	}
	waitGauge(t, rejectedPoliciesGauge.WithLabelValues(ns), float64(len(left)))

	// Nothing changes: nothing is written, nothing is said.
	eventually(t, "controller idle", controllerIdle)
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

	// Room frees up: the policies left out join the published ones.
	for _, p := range policies[:15] {
		if err := k.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the remaining 25 policies published", func() error {
		for _, p := range policies[15:] {
			if err := settled(p, readyAccepted); err != nil {
				return err
			}
		}
		_, cfg, err := readConfig(ns)
		if err != nil {
			return err
		}
		if n := len(cfg.Policies); n != 25 {
			return fmt.Errorf("%d policies in the ConfigMap", n)
		}
		return nil
	})
}
