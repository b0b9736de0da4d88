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
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// problem is why a condition is not True: Reason is the condition's reason
// (for machines: kstatus, alerts, event reasons), Message its message (for
// people). Conditions are built from problems, never from a loose error or
// string, so a reason cannot travel without its message or the other way
// round. A nil *problem is no problem.
type problem struct {
	reason  v1alpha1.ConditionReason
	message string
}

// Reason is the condition reason the problem is reported with.
func (p *problem) Reason() v1alpha1.ConditionReason { return p.reason }

// Message says what is wrong and, where we know it, what to do.
func (p *problem) Message() string { return p.message }

// notAcceptedProblem is the problem of a policy the renderer left out of the
// configuration: err is a *render.InvalidPolicyError, a
// *render.ConfigTooLargeError or a *render.DomainNotAllowedError (possibly
// wrapped).
func notAcceptedProblem(err error) *problem {
	if notAllowed, ok := errors.AsType[*render.DomainNotAllowedError](err); ok {
		return &problem{v1alpha1.ReasonDomainNotAllowed, "not published: " + notAllowed.Error()}
	}
	if footprint, ok := errors.AsType[*render.FootprintTooLargeError](err); ok {
		return &problem{v1alpha1.ReasonFootprintTooLarge, "not published: " + footprint.Error()}
	}
	if tooLarge, ok := errors.AsType[*render.ConfigTooLargeError](err); ok {
		hint := "; make room by deleting or shrinking policies of this namespace (fewer or shorter pathPrefixes, smaller selectors)"
		if tooLarge.RateLimitService {
			hint = "; make room by deleting or shrinking this namespace's policies for the rate limit service (fewer descriptor entries, shorter keys and values)"
		}
		return &problem{v1alpha1.ReasonConfigTooLarge, "not published: " + tooLarge.Error() + hint}
	}
	return &problem{v1alpha1.ReasonInvalid, "the spec cannot be enforced: " + err.Error()}
}

// heldBackProblem is the problem of a valid policy that needs minor version
// minor of the sidecar configuration while the pods legacy of namespace ns
// run sidecars that read only minor version 0; nil for minor 0.
func heldBackProblem(minor int, legacy []string, ns string) *problem {
	if minor == 0 {
		return nil
	}
	return &problem{v1alpha1.ReasonSidecarsOutdated, fmt.Sprintf(
		"not published yet: the policy needs sidecar configuration %s, and pods %s run sidecars of an earlier slidegate, which read %s only and would refuse the whole configuration; "+
			"restart them to update their sidecars (kubectl -n %s rollout restart ...)",
		sidecarconfig.VersionOf(minor), listOf(legacy), sidecarconfig.VersionOf(0), ns)}
}

// skippedProblem is the problem of a published policy that the sidecars of
// pods skip: they read minor versions older than minor, which the policy
// needs (skippingSidecars); nil when there are none.
func skippedProblem(minor int, pods []string, ns string) *problem {
	if len(pods) == 0 {
		return nil
	}
	return &problem{v1alpha1.ReasonSidecarsOutdated, fmt.Sprintf(
		"pods %s run sidecars of an earlier slidegate, which leave this policy out (it needs sidecar configuration %s) and so do not enforce it; "+
			"restart them to update their sidecars (kubectl -n %s rollout restart ...)",
		listOf(pods), sidecarconfig.VersionOf(minor), ns)}
}

// credentialsProblem is the problem of sidecars that cannot get their Redis
// credentials; why says what is wrong with the manager's Secret.
func credentialsProblem(why string) *problem {
	return &problem{v1alpha1.ReasonRedisCredentialsUnavailable, why}
}

// statusInput is what the reconcile learned about one policy.
type statusInput struct {
	// notAccepted is why the policy is left out of the configuration
	// (notAcceptedProblem); nil: accepted.
	notAccepted *problem
	// heldBack is why a valid policy is left out of the configuration for
	// the namespace's legacy sidecars (heldBackProblem); nil: it is in.
	heldBack *problem
	// skipped is why pods the policy selects do not enforce it although it
	// is published: their sidecars are of an older minor version
	// (skippedProblem); nil: none.
	skipped  *problem
	revision string // the policy's revision in the namespace's configuration
	// credentials is why sidecars cannot get Redis credentials; nil: fine.
	credentials *problem
	// keys is why a policy that verifies tokens has no keys (keysProblem);
	// keysNote says that its keys are those of an older fetch.
	keys     *problem
	keysNote string
	// now and grace: credentials missing since grace before now are Stalled.
	now               time.Time
	grace             time.Duration
	matched, enforced int32
	// bypass names the Services that reach the selected pods by a port
	// number, around the sidecar; "": none.
	bypass string
	// reopened names the NetworkPolicies that admit the app's port of the
	// selected pods although the policy asks for a NetworkPolicy
	// (reopeningPolicies); "": none.
	reopened string
	// unprotected says why selected pods lack the sidecar (unprotectedWhy);
	// "" while every selected pod has it.
	unprotected string
}

// conditionSetter sets the conditions of one status for one generation.
type conditionSetter struct {
	status     *v1alpha1.RateLimitPolicyStatus
	generation int64
}

// set sets one condition, keeping its lastTransitionTime if its status
// does not change.
func (c conditionSetter) set(typ v1alpha1.ConditionType, status metav1.ConditionStatus, reason v1alpha1.ConditionReason, msg string) {
	meta.SetStatusCondition(&c.status.Conditions, metav1.Condition{
		Type: string(typ), Status: status, Reason: string(reason), Message: msg, ObservedGeneration: c.generation,
	})
}

// failed sets typ False for the problem.
func (c conditionSetter) failed(typ v1alpha1.ConditionType, p *problem) {
	c.set(typ, metav1.ConditionFalse, p.Reason(), p.Message())
}

// failedSince sets typ False for the problem, like failed, and returns the
// condition. Its lastTransitionTime is kept only if it already was False for
// the same reason; otherwise it is now (the clock, as for any transition),
// even if typ was False for another reason: it then says since when the
// problem is this one.
func (c conditionSetter) failedSince(typ v1alpha1.ConditionType, p *problem) *metav1.Condition {
	prev := meta.FindStatusCondition(c.status.Conditions, string(typ))
	same := prev != nil && prev.Status == metav1.ConditionFalse && prev.Reason == string(p.Reason())
	c.failed(typ, p)
	cond := meta.FindStatusCondition(c.status.Conditions, string(typ))
	if !same {
		cond.LastTransitionTime = metav1.Now()
	}
	return cond
}

// stalled sets Stalled True for the problem: nothing the controller does
// clears it, so kstatus tools should report it at once.
func (c conditionSetter) stalled(p *problem) {
	c.set(v1alpha1.ConditionStalled, metav1.ConditionTrue, p.Reason(), p.Message())
}

// notAccepted reports a policy left out of the configuration, for both
// controllers: Accepted, Ready and Stalled carry its problem (Stalled for
// both kinds: neither clears without someone changing policies), Enforced
// says enforcedMsg, and the status names no revision.
func (c conditionSetter) notAccepted(p *problem, enforcedMsg string) {
	c.status.Revision = ""
	c.failed(v1alpha1.ConditionAccepted, p)
	c.failed(v1alpha1.ConditionReady, p)
	c.stalled(p)
	c.set(v1alpha1.ConditionEnforced, metav1.ConditionFalse, v1alpha1.ReasonNotAccepted, enforcedMsg)
}

// accepted reports a policy rendered at revision into ConfigMap cm (Accepted
// True) and clears Stalled; Ready and Enforced are the caller's.
func (c conditionSetter) accepted(revision, cm string) {
	c.status.Revision = revision
	meta.RemoveStatusCondition(&c.status.Conditions, string(v1alpha1.ConditionStalled))
	c.set(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted, "rendered into ConfigMap "+cm)
}

// newStatus starts the policy's next status from its current one, so that
// conditions whose status does not change keep their lastTransitionTime
// and a reconcile with nothing new computes an identical status.
func newStatus(p *v1alpha1.RateLimitPolicy) (*v1alpha1.RateLimitPolicyStatus, conditionSetter) {
	st := p.Status.DeepCopy()
	st.ObservedGeneration = p.Generation
	return st, conditionSetter{status: st, generation: p.Generation}
}

// desiredStatus is the policy's status after this reconcile, started from
// its current one (newStatus).
func desiredStatus(p *v1alpha1.RateLimitPolicy, in statusInput) v1alpha1.RateLimitPolicyStatus {
	st, c := newStatus(p)
	st.MatchedPods, st.EnforcedPods = in.matched, in.enforced
	if in.notAccepted != nil {
		c.notAccepted(in.notAccepted, fmt.Sprintf("not enforced: the policy is not accepted (%d pods selected)", in.matched))
		return *st
	}
	if in.heldBack != nil {
		// Valid, and progress (kstatus InProgress, Argo CD Progressing):
		// it is published once the legacy sidecars are restarted.
		c.status.Revision = ""
		meta.RemoveStatusCondition(&c.status.Conditions, string(v1alpha1.ConditionStalled))
		c.set(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted, "valid; "+in.heldBack.Message())
		c.failed(v1alpha1.ConditionReady, in.heldBack)
		c.failed(v1alpha1.ConditionEnforced, in.heldBack)
		return *st
	}
	c.accepted(in.revision, sidecarconfig.ConfigMapName)
	if render.LegacyUnverified(p) {
		u := unverifiedProblem()
		c.set(v1alpha1.ConditionAccepted, metav1.ConditionTrue, u.Reason(), u.Message())
	}
	switch {
	case in.credentials != nil:
		ready := c.failedSince(v1alpha1.ConditionReady, in.credentials)
		// Stalled (kstatus: Failed) once the credentials have been missing
		// for the grace (a minute): nothing the controller does brings them, so
		// Flux and Argo CD should say so rather than wait until their own
		// timeout. Not at once: a Secret delivered by another tool
		// (External Secrets, Sealed Secrets) often lands seconds after the
		// policies of the same sync, and that sync must not fail for it.
		// The grace runs from when Ready took this reason (failedSince), not
		// from when it turned False: a policy fixed (it was Invalid, say)
		// while the Secret is still on its way gets the whole grace.
		if !in.now.IsZero() && !in.now.Before(ready.LastTransitionTime.Add(in.grace)) {
			c.stalled(in.credentials)
		}
	case in.keys != nil:
		c.failed(v1alpha1.ConditionReady, in.keys)
	default:
		c.set(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonPublished,
			fmt.Sprintf("the configuration is published in ConfigMap %s%s", sidecarconfig.ConfigMapName, in.keysNote))
	}
	if prob := enforcementProblem(p, in); prob != nil {
		c.failed(v1alpha1.ConditionEnforced, prob)
	} else {
		c.set(v1alpha1.ConditionEnforced, metav1.ConditionTrue, v1alpha1.ReasonEnforced,
			fmt.Sprintf("all %d selected pods carry the sidecar", in.matched))
	}
	return *st
}

// enforcementProblem is why an accepted policy is not enforced on every pod
// it selects; nil when it is.
func enforcementProblem(p *v1alpha1.RateLimitPolicy, in statusInput) *problem {
	switch {
	case in.matched == 0:
		return &problem{v1alpha1.ReasonNoPodsSelected, "no pod of the namespace matches targetSelector"}
	case in.skipped != nil:
		return in.skipped
	case in.enforced == in.matched && in.bypass != "":
		return &problem{v1alpha1.ReasonServiceBypassesSidecar,
			fmt.Sprintf("all %d selected pods carry the sidecar, but %s: such traffic reaches the app unlimited; set targetPort to the port's name (%s)",
				in.matched, in.bypass, targetPort(p))}
	case in.enforced == in.matched && in.reopened != "":
		return &problem{v1alpha1.ReasonNetworkPolicyAdmitsApp,
			fmt.Sprintf("all %d selected pods carry the sidecar, but %s: NetworkPolicies add up, so a client dialing a pod's address reaches the app unlimited; take the port out of that policy or its podSelector",
				in.matched, in.reopened)}
	case in.enforced < in.matched:
		// The pods come first: a Service's bypass is named after them.
		msg := fmt.Sprintf("%d of %d selected pods carry the sidecar in front of port %q; %s",
			in.enforced, in.matched, targetPort(p), in.unprotected)
		for _, around := range []string{in.bypass, in.reopened} {
			if around != "" {
				msg += "; and " + around
			}
		}
		return &problem{v1alpha1.ReasonPartiallyEnforced, msg}
	}
	return nil
}
