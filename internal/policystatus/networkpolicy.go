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
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/selection"
)

// ReopeningPolicies names, for a policy that asks for a NetworkPolicy, the
// namespace's NetworkPolicies (its own included, through spec's ports) that
// admit the app's port of a pod it selects and protects: NetworkPolicies
// add up, so any one of them admitting that port lets a client that dials
// the pod's address reach the app around the sidecar. "": none. A policy
// without spec.networkPolicy claims nothing about the pod's other ports.
func (gs Guards) ReopeningPolicies(p *v1alpha1.RateLimitPolicy, pods []corev1.Pod, nps []networkingv1.NetworkPolicy) string {
	if p.Spec.NetworkPolicy == nil || p.Spec.TargetSelector == nil || len(nps) == 0 {
		return ""
	}
	sel := selection.Selector(p)
	found := map[string]bool{}
	for i := range pods {
		pod := &pods[i]
		if !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		g, err := gs.Read(&pod.Spec)
		if err != nil {
			continue // no working sidecar: reported as unprotected
		}
		for j := range nps {
			if admitsIngress(&nps[j], pod, g.AppPort) {
				found[fmt.Sprintf("NetworkPolicy %s admits the app's port %d", nps[j].Name, g.AppPort)] = true
			}
		}
	}
	return strings.Join(slices.Sorted(maps.Keys(found)), "; ")
}

// admitsIngress reports whether np lets some client reach TCP port port of
// pod: it selects the pod, governs ingress, and one of its ingress rules
// names the port (no ports: all of them; a range; a name the pod's
// containers give that port number). Its peers are not weighed: admitting
// some clients is enough to go around the sidecar.
func admitsIngress(np *networkingv1.NetworkPolicy, pod *corev1.Pod, port int32) bool {
	podSel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil || !podSel.Matches(labels.Set(pod.Labels)) {
		return false
	}
	// No policyTypes: ingress always, as the API server defaults it.
	if len(np.Spec.PolicyTypes) > 0 && !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		return false
	}
	for _, rule := range np.Spec.Ingress {
		if len(rule.Ports) == 0 {
			return true
		}
		for _, pp := range rule.Ports {
			if admitsPort(pp, pod, port) {
				return true
			}
		}
	}
	return false
}

// admitsPort reports whether one port entry of an ingress rule names TCP
// port port of pod.
func admitsPort(pp networkingv1.NetworkPolicyPort, pod *corev1.Pod, port int32) bool {
	if pp.Protocol != nil && *pp.Protocol != corev1.ProtocolTCP {
		return false
	}
	switch {
	case pp.Port == nil:
		return true // every port of the protocol
	case pp.Port.Type == intstr.String:
		_, num := inject.PortHolder(&pod.Spec, pp.Port.StrVal)
		return num == port
	case pp.EndPort != nil:
		return pp.Port.IntVal <= port && port <= *pp.EndPort
	default:
		return pp.Port.IntVal == port
	}
}
