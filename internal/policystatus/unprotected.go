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
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/selection"
)

// UnprotectedWhy names why the selected pods that the policy's sidecar does
// not protect lack it, from what the controller sees: the pods' specs (is
// there a working sidecar, and a way around it: inject.ReadGuard), their
// metadata (opt-out, age) and whether the namespace opted in. A pod
// created after the policy in an opted-in namespace without any sidecar was
// admitted so by the webhook itself; only the warning at its creation holds
// the reason.
func (gs Guards) UnprotectedWhy(p *v1alpha1.RateLimitPolicy, pods []corev1.Pod, nsOptedIn bool) string {
	sel := selection.Selector(p)
	var names [numCauses][]string
	details := [numCauses]map[string]bool{}
	for i := range pods {
		pod := &pods[i]
		if !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		g, err := gs.Read(&pod.Spec)
		var c unprotectedCause
		var detail string
		switch {
		case err == nil && g.Covers(&pod.Spec, TargetPort(p)):
			continue
		case err == nil:
			c, detail = otherPort, g.Port
		case errors.Is(err, inject.ErrAround):
			c, detail = around, detailOf(err)
		case errors.Is(err, inject.ErrNotSidecar):
			c, detail = lookAlike, detailOf(err)
		default:
			c = causeOf(p, pod, nsOptedIn)
		}
		names[c] = append(names[c], pod.Name)
		if detail != "" {
			if details[c] == nil {
				details[c] = map[string]bool{}
			}
			details[c][detail] = true
		}
	}
	var sorted [numCauses]string
	for c := range details {
		sorted[c] = strings.Join(slices.Sorted(maps.Keys(details[c])), "; ")
	}
	return describeUnprotected(p, names, sorted)
}

// detailOf is what an inject.ReadGuard error says after its kind.
func detailOf(err error) string {
	msg := err.Error()
	if _, after, ok := strings.Cut(msg, ": "); ok {
		return after
	}
	return msg
}

// unprotectedCause is why a selected pod is not protected by the policy's
// sidecar, as far as the controller can see.
type unprotectedCause int

const (
	optedOut       unprotectedCause = iota // the pod opted out
	otherPort                              // a sidecar in front of another port, while a container keeps the policy's
	nsNotOptedIn                           // the namespace is not labelled for injection
	beforePolicy                           // created before the policy
	lookAlike                              // a container named like the sidecar that is none
	around                                 // the sidecar is there, traffic reaches the app around it
	webhookSkipped                         // the webhook admitted it without (its warning says why)
	numCauses
)

// causeOf is why pod, which p selects and which has no sidecar, has none.
func causeOf(p *v1alpha1.RateLimitPolicy, pod *corev1.Pod, nsOptedIn bool) unprotectedCause {
	switch {
	case inject.OptedOut(pod.Annotations, pod.Labels):
		return optedOut
	case !nsOptedIn:
		return nsNotOptedIn
	case pod.CreationTimestamp.Before(&p.CreationTimestamp):
		return beforePolicy
	}
	return webhookSkipped
}

// describeUnprotected is the message of UnprotectedWhy: the pods of each
// cause, with what to do, in a fixed order; details holds what the pods'
// specs say for otherPort (the ports the sidecars hold), lookAlike and
// around.
func describeUnprotected(p *v1alpha1.RateLimitPolicy, names [numCauses][]string, details [numCauses]string) string {
	list := func(n []string) string {
		slices.Sort(n)
		return ListOf(n)
	}
	var why []string
	if n := names[nsNotOptedIn]; len(n) > 0 {
		why = append(why, fmt.Sprintf("the namespace is not labelled %s=%s (pods %s): label it, then restart them (kubectl -n %s rollout restart ...)",
			v1alpha1.InjectionLabel, v1alpha1.InjectionEnabled, list(n), p.Namespace))
	}
	if n := names[beforePolicy]; len(n) > 0 {
		why = append(why, fmt.Sprintf("pods %s were created before the policy: restart them (kubectl -n %s rollout restart ...)", list(n), p.Namespace))
	}
	if n := names[otherPort]; len(n) > 0 {
		why = append(why, fmt.Sprintf("pods %s carry the sidecar in front of port %s, while a container keeps port %q: its traffic passes around the sidecar",
			list(n), details[otherPort], TargetPort(p)))
	}
	if n := names[optedOut]; len(n) > 0 {
		why = append(why, fmt.Sprintf("pods %s opted out with %s=false", list(n), inject.OptOutAnnotation))
	}
	if n := names[lookAlike]; len(n) > 0 {
		why = append(why, fmt.Sprintf("pods %s carry a container named %s that is not a working sidecar (%s): the webhook did not inject them; recreate them",
			list(n), inject.ContainerName, details[lookAlike]))
	}
	if n := names[around]; len(n) > 0 {
		why = append(why, fmt.Sprintf("in pods %s traffic reaches the app around the sidecar (%s)", list(n), details[around]))
	}
	if n := names[webhookSkipped]; len(n) > 0 {
		why = append(why, fmt.Sprintf("the webhook admitted pods %s without the sidecar (the warning at their creation says why, e.g. no container port named %q)", list(n), TargetPort(p)))
	}
	return strings.Join(why, "; ")
}
