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

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/policystatus"
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
	facts   policystatus.Facts
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
	in.facts.Keys, in.facts.KeyNotes = keyProblems, keyNotes
	return in, nil
}

// namespaceFacts gathers the Services, the Namespace and the
// NetworkPolicies for the statuses, beside the pods already known (running,
// of which the statuses count the live ones).
func (r *RateLimitPolicyReconciler) namespaceFacts(ctx context.Context, ns string, running []corev1.Pod) (policystatus.Facts, error) {
	facts := policystatus.Facts{Pods: policystatus.Live(running), LegacySidecars: policystatus.LegacySidecars(running),
		Guards: policystatus.Guards{Repo: inject.ImageRepositoryOf(r.SidecarImage)}}
	var services corev1.ServiceList
	if err := r.Client.List(ctx, &services, client.InNamespace(ns)); err != nil {
		return facts, fmt.Errorf("listing the services of namespace %s: %w", ns, err)
	}
	facts.Services = services.Items
	// A namespace that cannot be read is not taken as opted in: that
	// would hand it credentials on a guess. Gone: not opted in; any other
	// error: try again.
	var namespace corev1.Namespace
	switch err := r.Client.Get(ctx, types.NamespacedName{Name: ns}, &namespace); {
	case apierrors.IsNotFound(err):
		facts.Terminating = true
	case err != nil:
		return facts, fmt.Errorf("reading namespace %s: %w", ns, err)
	default:
		facts.OptedIn = inject.NamespaceOptedIn(namespace.Labels)
		facts.Terminating = namespace.DeletionTimestamp != nil
	}
	// Every NetworkPolicy of the namespace, not only ours: they add up, so
	// any of them can admit the app's port again (policystatus.Guards.ReopeningPolicies).
	var nps networkingv1.NetworkPolicyList
	if err := r.Client.List(ctx, &nps, client.InNamespace(ns)); err != nil {
		return facts, fmt.Errorf("listing the NetworkPolicies of namespace %s: %w", ns, err)
	}
	facts.NetworkPolicies = nps.Items
	return facts, nil
}

// runningPods lists the namespace's pods as the cache holds them (TrimPod),
// terminating ones included. Finished pods (Succeeded, Failed) are not in
// the cache at all (CacheOptions): they run no container a sidecar could
// guard.
func (r *RateLimitPolicyReconciler) runningPods(ctx context.Context, ns string) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("listing the pods of namespace %s: %w", ns, err)
	}
	return pods.Items, nil
}
