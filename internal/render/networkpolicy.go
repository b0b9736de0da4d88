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

package render

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// NetworkPolicyOptions are what the rendered NetworkPolicies need besides
// the policy: the sidecar's two ports (the manager's --sidecar-listen-port
// and --sidecar-admin-port, the same the injector gives the sidecar).
type NetworkPolicyOptions struct {
	ListenPort, AdminPort int32
}

// networkPolicyPrefix starts the name of every NetworkPolicy the
// controller keeps, so that one is told apart from the namespace's own.
const networkPolicyPrefix = "slidegate-"

// maxNameLength is the longest object name (a DNS subdomain).
const maxNameLength = 253

// NetworkPolicyName is the name of the NetworkPolicy kept for the policy of
// that name: slidegate-<name>, or, when that would be longer than an object
// name may be, its first part and a hash of the whole name.
func NetworkPolicyName(policy string) string {
	name := networkPolicyPrefix + policy
	if len(name) <= maxNameLength {
		return name
	}
	sum := sha256.Sum256([]byte(policy))
	hash := hex.EncodeToString(sum[:])[:10]
	keep := strings.TrimRight(name[:maxNameLength-len(hash)-1], ".-")
	return keep + "-" + hash
}

// NetworkPolicy renders the NetworkPolicy that the policy asks for with
// spec.networkPolicy, or nil when it asks for none: ingress to the pods its
// targetSelector selects, from anywhere, on the sidecar's listen and admin
// ports and on the ports the policy lists, and on no other port. The
// sidecar reaches the app over the loopback interface, which NetworkPolicy
// does not filter; the kubelet's probes come from the node, which
// NetworkPolicy always admits. Labels and owner are the caller's.
func NetworkPolicy(p *v1alpha1.RateLimitPolicy, o NetworkPolicyOptions) *networkingv1.NetworkPolicy {
	if p.Spec.NetworkPolicy == nil || p.Spec.TargetSelector == nil {
		return nil
	}
	port := func(n int32, proto corev1.Protocol) networkingv1.NetworkPolicyPort {
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		num := intstr.FromInt32(n)
		return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &num}
	}
	ports := []networkingv1.NetworkPolicyPort{port(o.ListenPort, corev1.ProtocolTCP), port(o.AdminPort, corev1.ProtocolTCP)}
	for _, pp := range p.Spec.NetworkPolicy.Ports {
		ports = append(ports, port(pp.Port, pp.Protocol))
	}
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: networkingv1.SchemeGroupVersion.String(), Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: NetworkPolicyName(p.Name), Namespace: p.Namespace},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *p.Spec.TargetSelector.AsMeta(),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: ports}},
		},
	}
}
