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

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/rlsconfig"
)

// rlsPolicyIDs are the IDs of the policies in the rate limit service's
// ConfigMap.
func rlsPolicyIDs() ([]string, string, error) {
	var cm corev1.ConfigMap
	if err := k.Get(context.Background(), types.NamespacedName{Namespace: redisSecret.Namespace, Name: rlsconfig.ConfigMapName}, &cm); err != nil {
		return nil, "", err
	}
	cfg, err := rlsconfig.Parse([]byte(cm.Data[rlsconfig.FileName]))
	if err != nil {
		return nil, "", err
	}
	var ids []string
	for _, p := range cfg.Policies {
		ids = append(ids, p.ID)
	}
	return ids, cm.Annotations[v1alpha1.RevisionAnnotation], nil
}

// accepted waits until p's Accepted condition has the status and reason
// (for its current generation) and its message contains (or, with !has,
// lacks) text.
func acceptedIs(p *v1alpha1.RateLimitPolicy, status metav1.ConditionStatus, reason v1alpha1.ConditionReason, text string, has bool) func() error {
	return func() error {
		got := &v1alpha1.RateLimitPolicy{}
		if err := k.Get(context.Background(), client.ObjectKeyFromObject(p), got); err != nil {
			return err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionAccepted))
		if got.Status.ObservedGeneration != got.Generation || c == nil || c.Status != status || c.Reason != string(reason) ||
			strings.Contains(c.Message, text) != has {
			return fmt.Errorf("%s: Accepted %+v, want %s/%s with %q %v", p.Name, c, status, reason, text, has)
		}
		return nil
	}
}

// TestRLSDomainOwnership (issue 22): the platform team's ConfigMap says
// which namespaces may use which domain. A policy of another namespace on
// a claimed domain is refused with reason DomainNotAllowed and left out of
// the rate limit service's document; with unclaimedDomains: Deny an
// unlisted domain is refused too; without the ConfigMap (every install
// before it) every domain stays open, and the policies say so and are
// counted. An invalid list changes nothing and is reported on the
// ConfigMap. Before, any namespace could put policies on any domain.
func TestRLSDomainOwnership(t *testing.T) {
	ctx := context.Background()
	owner, other := newNamespace(t), newNamespace(t)
	// Unique in the suite, and not naming the owner (the refusal must not).
	domain := fmt.Sprintf("tenancy-%d", nsCounter.Load())
	rlsPolicy := func(ns, name, domain string) *v1alpha1.RateLimitPolicy {
		p := newRLSPolicy(ns, name)
		p.Spec.RateLimitService.Domain = domain
		return p
	}
	const openText = "claimed by no namespace"

	// No list: open, as before, and said.
	mine := rlsPolicy(owner, "mine", domain)
	unclaimedBefore := testutil.ToFloat64(unclaimedDomainPoliciesGauge)
	create(t, mine)
	eventually(t, "accepted on an open domain", acceptedIs(mine, metav1.ConditionTrue, v1alpha1.ReasonAccepted, openText, true))
	waitGauge(t, unclaimedDomainPoliciesGauge, unclaimedBefore+1)

	// The platform team claims the domain for owner.
	list := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: redisSecret.Namespace, Name: render.RLSDomainsConfigMapName},
		Data:       map[string]string{render.RLSDomainsKey: fmt.Sprintf("domains:\n  - domain: %s\n    namespaces: [%s]\n", domain, owner)},
	}
	create(t, list)
	t.Cleanup(func() { _ = k.Delete(context.Background(), list) })
	eventually(t, "accepted on its own domain", acceptedIs(mine, metav1.ConditionTrue, v1alpha1.ReasonAccepted, openText, false))
	waitGauge(t, unclaimedDomainPoliciesGauge, unclaimedBefore)

	theirs := rlsPolicy(other, "theirs", domain)
	create(t, theirs)
	eventually(t, "refused on another namespace's domain", acceptedIs(theirs, metav1.ConditionFalse, v1alpha1.ReasonDomainNotAllowed, render.RLSDomainsConfigMapName, true))
	if err := settled(theirs, map[v1alpha1.ConditionType]metav1.ConditionStatus{v1alpha1.ConditionReady: metav1.ConditionFalse, v1alpha1.ConditionStalled: metav1.ConditionTrue}); err != nil {
		t.Error(err)
	}
	if c := meta.FindStatusCondition(get(t, theirs).Status.Conditions, string(v1alpha1.ConditionAccepted)); strings.Contains(c.Message, owner) {
		t.Errorf("the refusal names the owner: %s", c.Message)
	}
	ids, _, err := rlsPolicyIDs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ids, rlsconfig.PolicyID(owner, "mine")) || slices.Contains(ids, rlsconfig.PolicyID(other, "theirs")) {
		t.Errorf("the rate limit service's document holds %v", ids)
	}

	// Unlisted domains closed: a policy on one is refused, the owner's
	// policy on its listed domain stays.
	list.Data[render.RLSDomainsKey] += "unclaimedDomains: Deny\n"
	if err := k.Update(ctx, list); err != nil {
		t.Fatal(err)
	}
	stray := rlsPolicy(other, "stray", "unlisted-"+other)
	create(t, stray)
	eventually(t, "refused on an unlisted domain", acceptedIs(stray, metav1.ConditionFalse, v1alpha1.ReasonDomainNotAllowed, "unclaimedDomains: Deny", true))
	eventually(t, "the owner's policy stays", acceptedIs(mine, metav1.ConditionTrue, v1alpha1.ReasonAccepted, openText, false))

	// A broken list changes nothing, and says so on the ConfigMap.
	_, revision, err := rlsPolicyIDs()
	if err != nil {
		t.Fatal(err)
	}
	list.Data[render.RLSDomainsKey] = "domains: ["
	if err := k.Update(ctx, list); err != nil {
		t.Fatal(err)
	}
	warnings := func() int {
		n := 0
		for _, ev := range recorder.about(list.Namespace, list.Name) {
			if strings.Contains(ev, "Warning InvalidDomainOwners") {
				n++
			}
		}
		return n
	}
	eventually(t, "a warning on the ConfigMap", func() error {
		if warnings() == 0 {
			return fmt.Errorf("events %v", recorder.about(list.Namespace, list.Name))
		}
		return nil
	})
	// A policy deleted meanwhile: the reconcile it brings fails too, and
	// changes nothing.
	seen := warnings()
	if err := k.Delete(ctx, mine); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deletion's reconcile", func() error {
		if warnings() == seen {
			return fmt.Errorf("%d warnings", seen)
		}
		return nil
	})
	if _, now, err := rlsPolicyIDs(); err != nil || now != revision {
		t.Errorf("with a broken list the document changed: %v %s → %s", err, revision, now)
	}
	if err := acceptedIs(theirs, metav1.ConditionFalse, v1alpha1.ReasonDomainNotAllowed, "", true)(); err != nil {
		t.Errorf("with a broken list: %v", err)
	}

	// The list removed: every domain open again.
	if err := k.Delete(ctx, list); err != nil {
		t.Fatal(err)
	}
	eventually(t, "accepted once the list is gone", acceptedIs(theirs, metav1.ConditionTrue, v1alpha1.ReasonAccepted, openText, true))
	eventually(t, "the stray one too", acceptedIs(stray, metav1.ConditionTrue, v1alpha1.ReasonAccepted, openText, true))
	for _, p := range []*v1alpha1.RateLimitPolicy{theirs, stray} {
		if err := k.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
}

// rlsTestMaxBytes is the suite's budget for the rate limit service's
// document: about 75 policies of newRLSPolicy.
const rlsTestMaxBytes = 30_000

// TestRLSFloodKeepsOthers (issue 22): one namespace that creates policies
// for the rate limit service until the shared document is full pushes out
// neither another namespace's policy nor its later ones; the flood's own
// newest policies get ConfigTooLarge, with the shares in the message.
// Before, the flood's older policies took the budget and the other
// namespace's later policy got ConfigTooLarge.
func TestRLSFloodKeepsOthers(t *testing.T) {
	ctx := context.Background()
	victim, flood := newNamespace(t), newNamespace(t)
	before := newRLSPolicy(victim, "before")
	create(t, before)
	eventually(t, "the victim's first policy", acceptedIs(before, metav1.ConditionTrue, v1alpha1.ReasonAccepted, "", true))

	var flooded []*v1alpha1.RateLimitPolicy
	for i := range 100 {
		p := newRLSPolicy(flood, fmt.Sprintf("flood-%03d", i))
		create(t, p)
		flooded = append(flooded, p)
	}
	t.Cleanup(func() {
		for _, p := range flooded {
			_ = k.Delete(context.Background(), p)
		}
	})
	last := flooded[len(flooded)-1]
	eventually(t, "the flood overflows its share", acceptedIs(last, metav1.ConditionFalse, v1alpha1.ReasonConfigTooLarge, "shared by the", true))

	after := newRLSPolicy(victim, "after")
	create(t, after)
	eventually(t, "the victim's later policy", acceptedIs(after, metav1.ConditionTrue, v1alpha1.ReasonAccepted, "", true))
	if err := acceptedIs(before, metav1.ConditionTrue, v1alpha1.ReasonAccepted, "", true)(); err != nil {
		t.Error(err)
	}
	ids, _, err := rlsPolicyIDs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ids, rlsconfig.PolicyID(victim, "before")) || !slices.Contains(ids, rlsconfig.PolicyID(victim, "after")) {
		t.Errorf("the victim's policies are not in the document: %d policies", len(ids))
	}
	for _, p := range []*v1alpha1.RateLimitPolicy{before, after} {
		if err := k.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
}
