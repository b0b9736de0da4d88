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
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// TestAdmitsIngress: which NetworkPolicies let a client reach the app's
// port 8080 of an injected pod (the sidecar holds port name http).
func TestAdmitsIngress(t *testing.T) {
	pod := specPod(t, "pod", map[string]string{"app": "checkout"}, "http")
	pod.Spec.Containers = slices.Clone(pod.Spec.Containers)
	pod.Spec.Containers[0].Ports = append(pod.Spec.Containers[0].Ports, corev1.ContainerPort{Name: "raw", ContainerPort: 8080})
	port := func(p intstr.IntOrString) networkingv1.NetworkPolicyPort {
		return networkingv1.NetworkPolicyPort{Port: &p}
	}
	udp := networkingv1.NetworkPolicyPort{Protocol: ptr.To(corev1.ProtocolUDP)}
	rule := func(ports ...networkingv1.NetworkPolicyPort) []networkingv1.NetworkPolicyIngressRule {
		return []networkingv1.NetworkPolicyIngressRule{{Ports: ports}}
	}
	ingress := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egress := []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	for _, tc := range []struct {
		name string
		spec networkingv1.NetworkPolicySpec
		want bool
	}{
		{"deny all", networkingv1.NetworkPolicySpec{PolicyTypes: ingress}, false},
		{"all ports, every pod", networkingv1.NetworkPolicySpec{Ingress: rule()}, true},
		{"all ports, another app", networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "other"}}, Ingress: rule()}, false},
		{"egress only", networkingv1.NetworkPolicySpec{PolicyTypes: egress, Ingress: rule()}, false},
		{"the app's port number", networkingv1.NetworkPolicySpec{Ingress: rule(port(intstr.FromInt32(8080)))}, true},
		{"another port number", networkingv1.NetworkPolicySpec{Ingress: rule(port(intstr.FromInt32(9100)))}, false},
		{"a range holding it", networkingv1.NetworkPolicySpec{Ingress: rule(networkingv1.NetworkPolicyPort{
			Port: ptr.To(intstr.FromInt32(8000)), EndPort: ptr.To[int32](9000)})}, true},
		{"a range below it", networkingv1.NetworkPolicySpec{Ingress: rule(networkingv1.NetworkPolicyPort{
			Port: ptr.To(intstr.FromInt32(7000)), EndPort: ptr.To[int32](8079)})}, false},
		{"port name http: the sidecar's", networkingv1.NetworkPolicySpec{Ingress: rule(port(intstr.FromString("http")))}, false},
		{"another name of the app's port", networkingv1.NetworkPolicySpec{Ingress: rule(port(intstr.FromString("raw")))}, true},
		{"every TCP port", networkingv1.NetworkPolicySpec{Ingress: rule(networkingv1.NetworkPolicyPort{Protocol: ptr.To(corev1.ProtocolTCP)})}, true},
		{"every UDP port", networkingv1.NetworkPolicySpec{Ingress: rule(udp)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "np"}, Spec: tc.spec}
			if got := admitsIngress(np, &pod, 8080); got != tc.want {
				t.Errorf("admitsIngress = %t, want %t", got, tc.want)
			}
		})
	}
}
