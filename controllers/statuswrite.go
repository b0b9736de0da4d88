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
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/owned"
)

// emitTransitions emits one event for the conditions whose status or reason
// changed between old and updated: events on transitions only, and one per
// status write rather than one per condition (a new policy changes three
// conditions at once; three events each made events the largest write load
// of the controller at scale). The event carries the reason of the first
// abnormal change, else of the first change, in the order Ready, Enforced,
// Accepted, and its note names every change.
func emitTransitions(rec events.EventRecorder, old, updated *v1alpha1.RateLimitPolicy) {
	if rec == nil {
		return
	}
	var reason string
	var notes []string
	kind := corev1.EventTypeNormal
	for _, typ := range []v1alpha1.ConditionType{v1alpha1.ConditionReady, v1alpha1.ConditionEnforced, v1alpha1.ConditionAccepted} {
		c := meta.FindStatusCondition(updated.Status.Conditions, string(typ))
		if c == nil {
			continue
		}
		if prev := meta.FindStatusCondition(old.Status.Conditions, string(typ)); prev != nil && prev.Status == c.Status && prev.Reason == c.Reason {
			continue
		}
		// An unverified token policy is accepted, and still warned about.
		abnormal := c.Status != metav1.ConditionTrue && c.Reason != string(v1alpha1.ReasonNoPodsSelected) || c.Reason == string(v1alpha1.ReasonUnverifiedJWT)
		if reason == "" || (abnormal && kind == corev1.EventTypeNormal) {
			reason = c.Reason
		}
		if abnormal {
			kind = corev1.EventTypeWarning
		}
		notes = append(notes, fmt.Sprintf("%s=%s (%s): %s", typ, c.Status, c.Reason, c.Message))
	}
	if len(notes) == 0 {
		return
	}
	rec.Eventf(updated, nil, kind, reason, "Reconcile", "%s", truncateNote(strings.Join(notes, "; ")))
}

// maxNoteBytes is the API server's limit on an event's note.
const maxNoteBytes = 1024

// truncateNote cuts a note to what the API server accepts, on a rune
// boundary: a longer one is refused and the event lost.
func truncateNote(s string) string {
	if len(s) <= maxNoteBytes {
		return s
	}
	const ellipsis = "…"
	cut := maxNoteBytes - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// writeStatuses writes want[i] as policies[i]'s status where it differs
// (writeStatus). A policy deleted meanwhile is skipped: its delete event
// brings the controller back. On a conflict our cache is behind the policy
// (typically our own last status write): conflicted asks the caller to try
// again once it has caught up; it is not an error worth a log line.
func writeStatuses(ctx context.Context, c client.Client, rec events.EventRecorder, policies []v1alpha1.RateLimitPolicy, want []v1alpha1.RateLimitPolicyStatus, quiet bool) (conflicted bool, err error) {
	for i := range policies {
		p := &policies[i]
		err := writeStatus(ctx, c, rec, p, want[i], quiet)
		switch {
		case err == nil, apierrors.IsNotFound(err):
		case apierrors.IsConflict(err):
			logf.FromContext(ctx).V(1).Info("status conflict, retrying", "policy", klog.KObj(p))
			conflicted = true
		default:
			return conflicted, err
		}
	}
	return conflicted, nil
}

// writeStatus writes want as p's status if it differs, then emits one
// event for the conditions that changed (none when quiet).
func writeStatus(ctx context.Context, c client.Client, rec events.EventRecorder, p *v1alpha1.RateLimitPolicy, want v1alpha1.RateLimitPolicyStatus, quiet bool) error {
	if equality.Semantic.DeepEqual(p.Status, want) {
		return nil
	}
	orig := p.DeepCopy()
	p.Status = want
	// Under our own field manager, like the applied children: managedFields
	// then name slidegate, not the binary ("manager").
	patch := client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})
	if err := c.Status().Patch(ctx, p, patch, client.FieldOwner(owned.FieldOwner)); err != nil {
		return fmt.Errorf("writing the status of %s: %w", klog.KObj(p), err)
	}
	owned.Wrote("ratelimitpolicies/status", "patch")
	if !quiet {
		emitTransitions(rec, orig, p)
	}
	return nil
}
