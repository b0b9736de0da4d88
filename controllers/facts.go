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
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
)

// namespaceInput is what one reconcile of a namespace works from, read
// once by gather and not changed afterwards.
type namespaceInput struct {
	// policies are the live ones, sorted by name; none: the namespace's
	// children go.
	policies []v1alpha1.RateLimitPolicy
	// running are the pods not finished, the terminating ones included:
	// their sidecars serve until the kubelet stops them, after the app has
	// drained (and on a rollout's old pods, for seconds to the whole grace
	// period), and read the ConfigMap and the credentials meanwhile.
	running []corev1.Pod
	// keySets are the policies' verification keys, by policy name.
	keySets map[string][]byte
	facts   namespaceFacts
}

// gather reads what a reconcile of namespace ns works from: its policies
// and, when it has any, its pods, the policies' key sets and the facts
// their statuses depend on.
func (r *RateLimitPolicyReconciler) gather(ctx context.Context, ns string) (namespaceInput, error) {
	policies, err := livePolicies(ctx, r.Client, false, client.InNamespace(ns))
	if err != nil || len(policies) == 0 {
		if err != nil {
			err = fmt.Errorf("listing the policies of namespace %s: %w", ns, err)
		}
		return namespaceInput{}, err
	}
	slices.SortFunc(policies, func(a, b v1alpha1.RateLimitPolicy) int { return strings.Compare(a.Name, b.Name) })
	in := namespaceInput{policies: policies}
	if in.running, err = r.runningPods(ctx, ns); err != nil {
		return namespaceInput{}, err
	}
	keySets, keyProblems, keyNotes, err := r.keySets(ctx, ns, policies)
	if err != nil {
		return namespaceInput{}, err
	}
	in.keySets = keySets
	if in.facts, err = r.namespaceFacts(ctx, ns, in.running); err != nil {
		return namespaceInput{}, err
	}
	in.facts.keys, in.facts.keyNotes = keyProblems, keyNotes
	return in, nil
}

// namespaceFacts is what the statuses of a namespace's policies depend on
// besides the policies, their render and the credentials.
type namespaceFacts struct {
	// pods are trimmed to what the status reads (trimPod).
	pods     []corev1.Pod
	services []corev1.Service
	// guards reads the pods' sidecars.
	guards guards
	// networkPolicies are all of the namespace's, ours and others'.
	networkPolicies []networkingv1.NetworkPolicy
	// optedIn: the namespace is labelled for injection (credentials go
	// only there) and not being deleted; a namespace the cache does not
	// hold is not opted in.
	optedIn bool
	// terminating: the namespace is being deleted; no events then (the API
	// server refuses new events there and client-go logs each refusal as an
	// error).
	terminating bool
	// legacySidecars names the pods whose sidecars read only minor version
	// 0 of the configuration (injected by the first release).
	legacySidecars []string
	// keys says, by policy name, why a policy that verifies tokens has no
	// keys; keyNotes, that its keys are an older fetch.
	keys     map[string]*problem
	keyNotes map[string]string
}

// namespaceFacts gathers the Services, the Namespace and the
// NetworkPolicies for the statuses, beside the pods already known (running,
// of which the statuses count the live ones).
func (r *RateLimitPolicyReconciler) namespaceFacts(ctx context.Context, ns string, running []corev1.Pod) (namespaceFacts, error) {
	facts := namespaceFacts{pods: live(running), legacySidecars: legacySidecars(running), guards: guards{repo: inject.ImageRepositoryOf(r.SidecarImage)}}
	var services corev1.ServiceList
	if err := r.Client.List(ctx, &services, client.InNamespace(ns)); err != nil {
		return facts, fmt.Errorf("listing the services of namespace %s: %w", ns, err)
	}
	facts.services = services.Items
	// A namespace that cannot be read is not taken as opted in: that
	// would hand it credentials on a guess. Gone: not opted in; any other
	// error: try again.
	var namespace corev1.Namespace
	switch err := r.Client.Get(ctx, types.NamespacedName{Name: ns}, &namespace); {
	case apierrors.IsNotFound(err):
		facts.terminating = true
	case err != nil:
		return facts, fmt.Errorf("reading namespace %s: %w", ns, err)
	default:
		facts.optedIn = inject.NamespaceOptedIn(namespace.Labels)
		facts.terminating = namespace.DeletionTimestamp != nil
	}
	// Every NetworkPolicy of the namespace, not only ours: they add up, so
	// any of them can admit the app's port again (reopeningPolicies).
	var nps networkingv1.NetworkPolicyList
	if err := r.Client.List(ctx, &nps, client.InNamespace(ns)); err != nil {
		return facts, fmt.Errorf("listing the NetworkPolicies of namespace %s: %w", ns, err)
	}
	facts.networkPolicies = nps.Items
	return facts, nil
}

// policyStatuses computes each policy's desired status, in the order of
// policies, and the pods that a policy selects but no sidecar in front of
// its port protects (for the unprotected pods gauge). credentials is why
// the sidecars cannot get Redis credentials (nil: fine).
func policyStatuses(policies []v1alpha1.RateLimitPolicy, desired namespaceRender, facts namespaceFacts, credentials *problem, now time.Time, grace time.Duration) (want []v1alpha1.RateLimitPolicyStatus, unprotected map[types.UID]bool) {
	unprotected = map[types.UID]bool{}
	want = make([]v1alpha1.RateLimitPolicyStatus, len(policies))
	for i := range policies {
		p := &policies[i]
		in := statusInput{
			notAccepted: desired.notAccepted[p.Name],
			heldBack:    heldBackProblem(desired.heldBack[p.Name], facts.legacySidecars, p.Namespace),
			skipped:     skippedProblem(desired.minors[p.Name], skippingSidecars(p, facts.pods, desired.minors[p.Name]), p.Namespace),
			revision:    desired.revisions[p.Name],
			credentials: credentials,
			keys:        facts.keys[p.Name],
			keysNote:    facts.keyNotes[p.Name],
			now:         now,
			grace:       grace,
		}
		gs := facts.guards
		in.matched, in.enforced = gs.countPods(p, facts.pods, unprotected)
		in.bypass = gs.bypassingServices(p, facts.pods, facts.services)
		in.reopened = gs.reopeningPolicies(p, facts.pods, facts.networkPolicies)
		if in.enforced < in.matched {
			in.unprotected = gs.unprotectedWhy(p, facts.pods, facts.optedIn)
		}
		want[i] = desiredStatus(p, in)
	}
	return want, unprotected
}
