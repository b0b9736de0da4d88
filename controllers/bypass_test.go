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
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
)

// enforcedIs checks p's Enforced condition, for eventually.
func enforcedIs(t *testing.T, p *v1alpha1.RateLimitPolicy, status metav1.ConditionStatus, reason v1alpha1.ConditionReason, msgParts ...string) func() error {
	return func() error {
		c := meta.FindStatusCondition(get(t, p).Status.Conditions, string(v1alpha1.ConditionEnforced))
		if c == nil || c.Status != status || c.Reason != string(reason) {
			return fmt.Errorf("Enforced = %+v; want %s %s", c, status, reason)
		}
		for _, part := range msgParts {
			if !strings.Contains(c.Message, part) {
				return fmt.Errorf("Enforced message %q lacks %q", c.Message, part)
			}
		}
		return nil
	}
}

// TestEnforcementFromTheSpec: a pod counts as enforced by what its spec
// shows, not by its injection annotation, which any pod author can write
// (issue 23). Each pod below carries a valid injection status; none but
// the paired case has a sidecar that limits its traffic, and before the
// controller read the spec each counted as enforced.
func TestEnforcementFromTheSpec(t *testing.T) {
	for _, tc := range []struct {
		name     string
		pod      func(ns string) *corev1.Pod
		enforced bool
		msg      string
	}{
		{"injected (the paired case)", func(ns string) *corev1.Pod { return newPod(ns, "pod", checkoutLabels(), true) }, true, ""},
		{"a forged status and a dummy init container; the app keeps port http", func(ns string) *corev1.Pod {
			pod := newPod(ns, "pod", checkoutLabels(), false)
			pod.Annotations = map[string]string{v1alpha1.InjectedAnnotation: `{"version":"v1","container":"slidegate-sidecar","targetPort":"http","appContainer":"app","appPort":8080}`}
			pod.Spec.InitContainers = []corev1.Container{{Name: inject.ContainerName, Image: "example.com/busybox:1", Command: []string{"sleep", "infinity"}}}
			return pod
		}, false, "pods pod carry a container named slidegate-sidecar that is not a working sidecar"},
		{"injected, and a second container holds port http", func(ns string) *corev1.Pod {
			pod := newPod(ns, "pod", checkoutLabels(), true)
			pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "admin", Image: "admin:1",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8081}}})
			return pod
		}, false, "container admin holds port name \"http\""},
		{"injected, and the app's port on the node", func(ns string) *corev1.Pod {
			pod := newPod(ns, "pod", checkoutLabels(), true)
			pod.Spec.Containers[0].Ports = append(pod.Spec.Containers[0].Ports, corev1.ContainerPort{ContainerPort: 8080, HostPort: 30080})
			return pod
		}, false, "publishes the app's port 8080 on the node (hostPort 30080)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t)
			p := newPolicy(ns, "p")
			create(t, p, tc.pod(ns))
			if tc.enforced {
				eventually(t, "enforced", podCounts(t, p, 1, 1, metav1.ConditionTrue, v1alpha1.ReasonEnforced))
				return
			}
			eventually(t, "not enforced", podCounts(t, p, 1, 0, metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced))
			eventually(t, "the message says why", enforcedIs(t, p, metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced, tc.msg))
		})
	}
}

// TestTargetPortAnnotationBypass: a pod whose target-port annotation gave
// the sidecar another port, while the app keeps port http that the policy
// names and a Service targets by name, is reported (issue 23): the pod is
// not enforced for the policy, and the Service's traffic reaches the app
// around the sidecar. Pointing the Service at the port the sidecar holds
// takes the Service out of the message; the pod stays unprotected for port
// http, which its app still holds.
func TestTargetPortAnnotationBypass(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	p := newPolicy(ns, "p") // targetPort http
	pod := newPod(ns, "pod", checkoutLabels(), false)
	pod.Annotations = map[string]string{inject.TargetPortAnnotation: "grpc"}
	pod.Spec.Containers[0].Ports = append(pod.Spec.Containers[0].Ports, corev1.ContainerPort{Name: "grpc", ContainerPort: 9090})
	if err := inject.Inject(pod, inject.Options{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: checkoutLabels(),
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}},
	}
	create(t, p, pod, svc)
	keeps := `pods pod carry the sidecar in front of port grpc, while a container keeps port "http": its traffic passes around the sidecar`
	eventually(t, "bypass reported", enforcedIs(t, p, metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced,
		keeps, `; and Service web port 80 targets port name "http", which container app holds, not the sidecar`))

	svc.Spec.Ports[0].TargetPort = intstr.FromString("grpc")
	if err := k.Update(ctx, svc); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Service no longer named", func() error {
		if err := enforcedIs(t, p, metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced, keeps)(); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(get(t, p).Status.Conditions, string(v1alpha1.ConditionEnforced)); strings.Contains(c.Message, "Service web") {
			return fmt.Errorf("still names the Service: %s", c.Message)
		}
		return nil
	})
}

// TestRequiredNamespaceCountsAsOptedIn: a namespace labelled required has
// its pods injected, so a pod without the sidecar there is not blamed on a
// missing label.
func TestRequiredNamespaceCountsAsOptedIn(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	var namespace corev1.Namespace
	if err := k.Get(ctx, types.NamespacedName{Name: ns}, &namespace); err != nil {
		t.Fatal(err)
	}
	if namespace.Labels == nil {
		namespace.Labels = map[string]string{}
	}
	namespace.Labels[v1alpha1.InjectionLabel] = "required"
	if err := k.Update(ctx, &namespace); err != nil {
		t.Fatal(err)
	}
	p := newPolicy(ns, "p")
	create(t, p)
	eventually(t, "the policy is seen", podCounts(t, p, 0, 0, metav1.ConditionFalse, v1alpha1.ReasonNoPodsSelected))
	create(t, newPod(ns, "plain", checkoutLabels(), false))
	eventually(t, "named as admitted without the sidecar", enforcedIs(t, p, metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced,
		"the webhook admitted pods plain without the sidecar"))
}

func checkoutLabels() map[string]string { return map[string]string{"app": "checkout"} }
