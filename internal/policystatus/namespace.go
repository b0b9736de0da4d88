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
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
)

// DefaultCredentialsGrace is how long missing Redis credentials are
// progress (InProgress) before they are a failure (Stalled).
const DefaultCredentialsGrace = time.Minute

// Facts is what the statuses of a namespace's policies depend on besides
// the policies, their render and the credentials: read once by the
// controller, never changed afterwards.
type Facts struct {
	// Pods are the live ones (Live), trimmed to what the status reads.
	Pods     []corev1.Pod
	Services []corev1.Service
	// Guards reads the pods' sidecars.
	Guards Guards
	// NetworkPolicies are all of the namespace's, ours and others'.
	NetworkPolicies []networkingv1.NetworkPolicy
	// OptedIn: the namespace is labelled for injection (credentials go
	// only there) and not being deleted; a namespace the cache does not
	// hold is not opted in.
	OptedIn bool
	// Terminating: the namespace is being deleted; no events then (the API
	// server refuses new events there and client-go logs each refusal as an
	// error).
	Terminating bool
	// LegacySidecars names the pods whose sidecars read only minor version
	// 0 of the configuration (injected by the first release).
	LegacySidecars []string
	// Keys says, by policy name, why a policy that verifies tokens has no
	// keys; KeyNotes, that its keys are an older fetch.
	Keys     map[string]*Problem
	KeyNotes map[string]string
}

// Statuses computes each policy's desired status, in the order of
// policies, and the pods that a policy selects but no sidecar in front of
// its port protects (for the unprotected pods gauge). credentials is why
// the sidecars cannot get Redis credentials (nil: fine).
func Statuses(policies []v1alpha1.RateLimitPolicy, rendered render.NamespaceResult, facts Facts, credentials *Problem, now time.Time, grace time.Duration) (want []v1alpha1.RateLimitPolicyStatus, unprotected map[types.UID]bool) {
	unprotected = map[types.UID]bool{}
	want = make([]v1alpha1.RateLimitPolicyStatus, len(policies))
	for i := range policies {
		p := &policies[i]
		in := Input{
			HeldBack:    HeldBack(rendered.HeldBack[p.Name], facts.LegacySidecars, p.Namespace),
			Skipped:     Skipped(rendered.Minors[p.Name], SkippingSidecars(p, facts.Pods, rendered.Minors[p.Name]), p.Namespace),
			Revision:    rendered.Revisions[p.Name],
			Credentials: credentials,
			Keys:        facts.Keys[p.Name],
			KeysNote:    facts.KeyNotes[p.Name],
			Now:         now,
			Grace:       grace,
		}
		if err := rendered.NotAccepted[p.Name]; err != nil {
			in.NotAccepted = NotAccepted(err)
		}
		gs := facts.Guards
		in.Matched, in.Enforced = gs.CountPods(p, facts.Pods, unprotected)
		in.Bypass = gs.BypassingServices(p, facts.Pods, facts.Services)
		in.Reopened = gs.ReopeningPolicies(p, facts.Pods, facts.NetworkPolicies)
		if in.Enforced < in.Matched {
			in.Unprotected = gs.UnprotectedWhy(p, facts.Pods, facts.OptedIn)
		}
		want[i] = Desired(p, in)
	}
	return want, unprotected
}
