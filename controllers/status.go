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
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// ConditionStalled is kstatus's "abnormal-true" condition: True (with Ready
// False) when the spec is invalid, so that Flux and Argo CD (kstatus) report
// the policy as Failed at once instead of waiting for it to become Ready.
// It is absent otherwise.
const ConditionStalled = "Stalled"

// statusInput is what the reconcile learned about one policy.
type statusInput struct {
	invalid            error  // why the renderer rejected the policy; nil: accepted
	revision           string // revision of the namespace's configuration
	credentialsProblem string // why sidecars cannot get Redis credentials; "": fine
	matched, enforced  int32
	// bypass names the Services that reach the selected pods by a port
	// number, around the sidecar; "": none.
	bypass string
}

// desiredStatus is the policy's status after this reconcile. It keeps the
// lastTransitionTime of conditions whose status does not change, so that a
// reconcile with nothing new computes an identical status.
func desiredStatus(p *v1alpha1.RateLimitPolicy, in statusInput) v1alpha1.RateLimitPolicyStatus {
	st := *p.Status.DeepCopy()
	st.ObservedGeneration = p.Generation
	st.MatchedPods, st.EnforcedPods = in.matched, in.enforced
	set := func(typ string, status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: p.Generation,
		})
	}

	if in.invalid != nil {
		msg := "the spec cannot be enforced: " + in.invalid.Error()
		st.Revision = ""
		set(v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonInvalid, msg)
		set(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonInvalid, msg)
		set(ConditionStalled, metav1.ConditionTrue, v1alpha1.ReasonInvalid, msg)
		set(v1alpha1.ConditionEnforced, metav1.ConditionFalse, v1alpha1.ReasonNotAccepted,
			fmt.Sprintf("not enforced: the policy is not accepted (%d pods selected)", in.matched))
		return st
	}

	st.Revision = in.revision
	meta.RemoveStatusCondition(&st.Conditions, ConditionStalled)
	set(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted,
		fmt.Sprintf("rendered into ConfigMap %s", sidecarconfig.ConfigMapName))
	if in.credentialsProblem != "" {
		set(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonRedisCredentialsUnavailable, in.credentialsProblem)
	} else {
		set(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonPublished,
			fmt.Sprintf("the configuration is published in ConfigMap %s", sidecarconfig.ConfigMapName))
	}
	switch {
	case in.matched == 0:
		set(v1alpha1.ConditionEnforced, metav1.ConditionFalse, v1alpha1.ReasonNoPodsSelected,
			"no pod of the namespace matches targetSelector")
	case in.enforced == in.matched && in.bypass != "":
		set(v1alpha1.ConditionEnforced, metav1.ConditionFalse, v1alpha1.ReasonServiceBypassesSidecar,
			fmt.Sprintf("all %d selected pods carry the sidecar, but %s: such traffic reaches the app unlimited; set targetPort to the port's name (%s)",
				in.matched, in.bypass, targetPort(p)))
	case in.enforced < in.matched:
		set(v1alpha1.ConditionEnforced, metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced,
			fmt.Sprintf("%d of %d selected pods carry the sidecar in front of port %q; the others were created without it (is the namespace labelled %s=%s? restart them) "+
				"or with the sidecar on another port (another policy selecting them names a different targetPort)",
				in.enforced, in.matched, targetPort(p), v1alpha1.InjectionLabel, v1alpha1.InjectionEnabled))
	default:
		set(v1alpha1.ConditionEnforced, metav1.ConditionTrue, v1alpha1.ReasonEnforced,
			fmt.Sprintf("all %d selected pods carry the sidecar", in.matched))
	}
	return st
}

// emitTransitions emits one event per condition whose status or reason
// changed between old and updated: events on transitions only.
func (r *RateLimitPolicyReconciler) emitTransitions(old, updated *v1alpha1.RateLimitPolicy) {
	if r.Recorder == nil {
		return
	}
	for _, typ := range []string{v1alpha1.ConditionAccepted, v1alpha1.ConditionReady, v1alpha1.ConditionEnforced} {
		c := meta.FindStatusCondition(updated.Status.Conditions, typ)
		if c == nil {
			continue
		}
		if prev := meta.FindStatusCondition(old.Status.Conditions, typ); prev != nil && prev.Status == c.Status && prev.Reason == c.Reason {
			continue
		}
		kind := corev1.EventTypeNormal
		if c.Status != metav1.ConditionTrue && c.Reason != v1alpha1.ReasonNoPodsSelected {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(updated, nil, kind, c.Reason, "Reconcile", "%s=%s: %s", typ, c.Status, c.Message)
	}
}
