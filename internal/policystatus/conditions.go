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
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

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
func (c conditionSetter) failed(typ v1alpha1.ConditionType, p *Problem) {
	c.set(typ, metav1.ConditionFalse, p.Reason(), p.Message())
}

// failedSince sets typ False for the Problem, like failed, and returns the
// condition. Its lastTransitionTime is kept only if it already was False for
// the same reason; otherwise it is now (the clock, as for any transition),
// even if typ was False for another reason: it then says since when the
// Problem is this one.
func (c conditionSetter) failedSince(typ v1alpha1.ConditionType, p *Problem) *metav1.Condition {
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
func (c conditionSetter) stalled(p *Problem) {
	c.set(v1alpha1.ConditionStalled, metav1.ConditionTrue, p.Reason(), p.Message())
}

// notAccepted reports a policy left out of the configuration, for both
// controllers: Accepted, Ready and Stalled carry its Problem (Stalled for
// both kinds: neither clears without someone changing policies), Enforced
// says enforcedMsg, and the status names no revision.
func (c conditionSetter) notAccepted(p *Problem, enforcedMsg string) {
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
