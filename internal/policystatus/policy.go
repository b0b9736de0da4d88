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

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// Input is what the reconcile learned about one policy of a namespace's
// sidecars (Statuses builds it from the namespace's facts).
type Input struct {
	// NotAccepted is why the policy is left out of the configuration
	// (NotAccepted); nil: accepted.
	NotAccepted *Problem
	// HeldBack is why a valid policy is left out of the configuration for
	// the namespace's legacy sidecars (HeldBack); nil: it is in.
	HeldBack *Problem
	// Skipped is why pods the policy selects do not enforce it although it
	// is published: their sidecars are of an older minor version
	// (Skipped); nil: none.
	Skipped  *Problem
	Revision string // the policy's revision in the namespace's configuration
	// Credentials is why sidecars cannot get Redis credentials; nil: fine.
	Credentials *Problem
	// Keys is why a policy that verifies tokens has no keys (Keys);
	// KeysNote says that its keys are those of an older fetch.
	Keys     *Problem
	KeysNote string
	// Now and Grace: credentials missing since Grace before Now are
	// Stalled.
	Now               time.Time
	Grace             time.Duration
	Matched, Enforced int32
	// Bypass names the Services that reach the selected pods by a port
	// number, around the sidecar; "": none.
	Bypass string
	// Reopened names the NetworkPolicies that admit the app's port of the
	// selected pods although the policy asks for a NetworkPolicy
	// (Guards.ReopeningPolicies); "": none.
	Reopened string
	// Unprotected says why selected pods lack the sidecar
	// (Guards.UnprotectedWhy); "" while every selected pod has it.
	Unprotected string
}

// A check is one named reason why a condition is not True: the problem, or
// nil when the reason does not apply. A condition's checks run in order and
// the first problem is the condition's; none: it is True.
type check func(p *v1alpha1.RateLimitPolicy, in Input) *Problem

// readyChecks are Ready's, for an accepted policy that is published.
var readyChecks = []check{credentialsMissing, keysMissing}

// enforcedChecks are Enforced's, for an accepted policy that is published.
// The order is the order of what to fix first: pods before the ways around
// them.
var enforcedChecks = []check{noPodsSelected, sidecarsSkipIt, serviceBypasses, networkPolicyReopens, partiallyEnforced}

func first(checks []check, p *v1alpha1.RateLimitPolicy, in Input) *Problem {
	for _, c := range checks {
		if prob := c(p, in); prob != nil {
			return prob
		}
	}
	return nil
}

// Desired is the policy's status after this reconcile, started from its
// current one (newStatus). Accepted says whether it is in the
// configuration; Ready, whether the configuration is published and usable
// (readyChecks); Enforced, whether every pod it selects enforces it
// (enforcedChecks); Stalled, that nothing the controller does fixes it.
func Desired(p *v1alpha1.RateLimitPolicy, in Input) v1alpha1.RateLimitPolicyStatus {
	st, c := newStatus(p)
	st.MatchedPods, st.EnforcedPods = in.Matched, in.Enforced
	if in.NotAccepted != nil {
		c.notAccepted(in.NotAccepted, fmt.Sprintf("not enforced: the policy is not accepted (%d pods selected)", in.Matched))
		return *st
	}
	if in.HeldBack != nil {
		// Valid, and progress (kstatus InProgress, Argo CD Progressing):
		// it is published once the legacy sidecars are restarted.
		c.status.Revision = ""
		meta.RemoveStatusCondition(&c.status.Conditions, string(v1alpha1.ConditionStalled))
		c.set(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted, "valid; "+in.HeldBack.Message())
		c.failed(v1alpha1.ConditionReady, in.HeldBack)
		c.failed(v1alpha1.ConditionEnforced, in.HeldBack)
		return *st
	}
	c.accepted(in.Revision, sidecarconfig.ConfigMapName)
	if render.LegacyUnverified(p) {
		u := Unverified()
		c.set(v1alpha1.ConditionAccepted, metav1.ConditionTrue, u.Reason(), u.Message())
	}
	switch prob := first(readyChecks, p, in); prob {
	case nil:
		c.set(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonPublished,
			fmt.Sprintf("the configuration is published in ConfigMap %s%s", sidecarconfig.ConfigMapName, in.KeysNote))
	case in.Credentials:
		ready := c.failedSince(v1alpha1.ConditionReady, prob)
		// Stalled (kstatus: Failed) once the credentials have been missing
		// for the grace (a minute): nothing the controller does brings them, so
		// Flux and Argo CD should say so rather than wait until their own
		// timeout. Not at once: a Secret delivered by another tool
		// (External Secrets, Sealed Secrets) often lands seconds after the
		// policies of the same sync, and that sync must not fail for it.
		// The grace runs from when Ready took this reason (failedSince), not
		// from when it turned False: a policy fixed (it was Invalid, say)
		// while the Secret is still on its way gets the whole grace.
		if !in.Now.IsZero() && !in.Now.Before(ready.LastTransitionTime.Add(in.Grace)) {
			c.stalled(prob)
		}
	default:
		c.failed(v1alpha1.ConditionReady, prob)
	}
	if prob := first(enforcedChecks, p, in); prob != nil {
		c.failed(v1alpha1.ConditionEnforced, prob)
	} else {
		c.set(v1alpha1.ConditionEnforced, metav1.ConditionTrue, v1alpha1.ReasonEnforced,
			fmt.Sprintf("all %d selected pods carry the sidecar", in.Matched))
	}
	return *st
}

// credentialsMissing: the sidecars cannot get their Redis credentials
// (ReasonRedisCredentialsUnavailable, or ReasonRedisMemoryBudgetExceeded
// while the namespace's Redis user is switched off).
func credentialsMissing(_ *v1alpha1.RateLimitPolicy, in Input) *Problem { return in.Credentials }

// keysMissing: the policy verifies tokens and has no keys
// (ReasonJWTKeysUnavailable).
func keysMissing(_ *v1alpha1.RateLimitPolicy, in Input) *Problem { return in.Keys }

// noPodsSelected: targetSelector matches no pod (ReasonNoPodsSelected).
func noPodsSelected(_ *v1alpha1.RateLimitPolicy, in Input) *Problem {
	if in.Matched == 0 {
		return New(v1alpha1.ReasonNoPodsSelected, "no pod of the namespace matches targetSelector")
	}
	return nil
}

// sidecarsSkipIt: pods run sidecars too old for the policy
// (ReasonSidecarsOutdated).
func sidecarsSkipIt(_ *v1alpha1.RateLimitPolicy, in Input) *Problem { return in.Skipped }

// serviceBypasses: every selected pod carries the sidecar, but a Service
// reaches the app around it (ReasonServiceBypassesSidecar).
func serviceBypasses(p *v1alpha1.RateLimitPolicy, in Input) *Problem {
	if in.Enforced != in.Matched || in.Bypass == "" {
		return nil
	}
	return New(v1alpha1.ReasonServiceBypassesSidecar,
		fmt.Sprintf("all %d selected pods carry the sidecar, but %s: such traffic reaches the app unlimited; set targetPort to the port's name (%s)",
			in.Matched, in.Bypass, TargetPort(p)))
}

// networkPolicyReopens: every selected pod carries the sidecar, but a
// NetworkPolicy admits the app's port (ReasonNetworkPolicyAdmitsApp).
func networkPolicyReopens(_ *v1alpha1.RateLimitPolicy, in Input) *Problem {
	if in.Enforced != in.Matched || in.Reopened == "" {
		return nil
	}
	return New(v1alpha1.ReasonNetworkPolicyAdmitsApp,
		fmt.Sprintf("all %d selected pods carry the sidecar, but %s: NetworkPolicies add up, so a client dialing a pod's address reaches the app unlimited; take the port out of that policy or its podSelector",
			in.Matched, in.Reopened))
}

// partiallyEnforced: some selected pods lack the sidecar
// (ReasonPartiallyEnforced); the ways around the others follow them.
func partiallyEnforced(p *v1alpha1.RateLimitPolicy, in Input) *Problem {
	if in.Enforced >= in.Matched {
		return nil
	}
	msg := fmt.Sprintf("%d of %d selected pods carry the sidecar in front of port %q; %s",
		in.Enforced, in.Matched, TargetPort(p), in.Unprotected)
	for _, around := range []string{in.Bypass, in.Reopened} {
		if around != "" {
			msg += "; and " + around
		}
	}
	return New(v1alpha1.ReasonPartiallyEnforced, msg)
}
