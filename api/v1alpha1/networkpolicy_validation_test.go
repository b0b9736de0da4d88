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

package v1alpha1_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// TestValidationNetworkPolicy: spec.networkPolicy (issue 23, traffic to the
// pods' IPs) against the real API server. New cases for networkPolicy go
// here, the rest of the spec's in TestValidation.
func TestValidationNetworkPolicy(t *testing.T) {
	ports := func(ps ...v1alpha1.NetworkPolicyPort) func(*v1alpha1.RateLimitPolicySpec) {
		return func(s *v1alpha1.RateLimitPolicySpec) { s.NetworkPolicy = &v1alpha1.PodNetworkPolicy{Ports: ps} }
	}
	for i, tt := range []struct {
		name    string
		mutate  func(*v1alpha1.RateLimitPolicySpec)
		wantErr []string
	}{
		{name: "only the sidecar's ports", mutate: ports()},
		{name: "a metrics port and a UDP port", mutate: ports(v1alpha1.NetworkPolicyPort{Port: 9100}, v1alpha1.NetworkPolicyPort{Port: 9100, Protocol: corev1.ProtocolUDP})},
		{name: "with rateLimitService", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			rls(s)
			s.NetworkPolicy = &v1alpha1.PodNetworkPolicy{}
		}, wantErr: []string{"networkPolicy applies only with targetSelector"}},
		{name: "port 0", mutate: ports(v1alpha1.NetworkPolicyPort{Port: 0}),
			wantErr: []string{"spec.networkPolicy.ports[0].port", "should be greater than or equal to 1"}},
		{name: "port 65536", mutate: ports(v1alpha1.NetworkPolicyPort{Port: 65536}),
			wantErr: []string{"spec.networkPolicy.ports[0].port", "should be less than or equal to 65535"}},
		{name: "protocol ICMP", mutate: ports(v1alpha1.NetworkPolicyPort{Port: 80, Protocol: "ICMP"}),
			wantErr: []string{"spec.networkPolicy.ports[0].protocol", `supported values: "TCP", "UDP", "SCTP"`}},
		{name: "a port twice (TCP by default)", mutate: ports(v1alpha1.NetworkPolicyPort{Port: 9100}, v1alpha1.NetworkPolicyPort{Port: 9100, Protocol: corev1.ProtocolTCP}),
			wantErr: []string{"spec.networkPolicy.ports[1]", "Duplicate value"}},
		{name: "17 ports", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			var ps []v1alpha1.NetworkPolicyPort
			for p := range int32(17) {
				ps = append(ps, v1alpha1.NetworkPolicyPort{Port: 9000 + p})
			}
			ports(ps...)(s)
		}, wantErr: []string{"spec.networkPolicy.ports", "must have at most 16 items"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := &v1alpha1.RateLimitPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("np-case-%d", i), Namespace: "default"},
				Spec:       validSpec(),
			}
			tt.mutate(&p.Spec)
			err := k.Create(context.Background(), p, client.DryRunAll)
			if err != nil {
				t.Log(err)
			}
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("valid policy rejected: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("invalid policy accepted, want an error containing %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
