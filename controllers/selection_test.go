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
	"encoding/json"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/policystatus"
	"github.com/slidegate/slidegate/internal/webhook"
)

// TestWebhookAndStatusAgree: for each selector and pod, the webhook injects
// the pod exactly when the status counts it as selected and the pod event
// handler wakes the namespace up for it. If they disagreed, a policy would
// report pods the webhook never protected (or miss pods it did), or miss
// their changes. New selector shapes go into the table of
// internal/selection; new places that ask the question go here.
func TestWebhookAndStatusAgree(t *testing.T) {
	const ns = "shop"
	selectors := map[string]*v1alpha1.LabelSelector{
		"matchLabels":  {MatchLabels: map[string]v1alpha1.LabelValue{"app": "web"}},
		"In":           {MatchExpressions: []v1alpha1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"front"}}}},
		"NotIn":        {MatchExpressions: []v1alpha1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"front"}}}},
		"DoesNotExist": {MatchExpressions: []v1alpha1.LabelSelectorRequirement{{Key: "canary", Operator: metav1.LabelSelectorOpDoesNotExist}}},
		"empty":        {},
		"invalid":      {MatchExpressions: []v1alpha1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn}}},
	}
	pods := map[string]map[string]string{
		"web front":  {"app": "web", "tier": "front"},
		"web canary": {"app": "web", "canary": "yes"},
		"db back":    {"app": "db", "tier": "back"},
		"unlabelled": nil,
	}
	var outcomes [2]int // not injected, injected: both must occur
	for selName, sel := range selectors {
		for podName, podLabels := range pods {
			t.Run(selName+"/"+podName, func(t *testing.T) {
				p := v1alpha1.RateLimitPolicy{
					ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns},
					Spec:       v1alpha1.RateLimitPolicySpec{TargetSelector: sel, TargetPort: "http"},
				}
				pod := &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: "pod", Namespace: ns, Labels: podLabels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{
						Name: "app", Image: "app:1", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
					}}},
				}
				c := fake.NewClientBuilder().WithScheme(scheme).
					WithIndex(&v1alpha1.RateLimitPolicy{}, policySelectorKeysIndex, selectorKeys).
					WithObjects(&p, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
						Name: ns, Labels: map[string]string{v1alpha1.InjectionLabel: v1alpha1.InjectionEnabled},
					}}).Build()

				matched, _ := policystatus.Guards{}.CountPods(&p, []corev1.Pod{*pod}, map[types.UID]bool{})
				counted := matched == 1
				watched := (&podHandler{c: c}).selected(context.Background(), pod)
				injected := webhookInjects(t, c, pod)
				outcomes[b2i(injected)]++
				if counted != injected || watched != injected {
					t.Errorf("webhook injects: %t; status counts: %t; pod handler enqueues: %t", injected, counted, watched)
				}
			})
		}
	}
	if outcomes[0] == 0 || outcomes[1] == 0 {
		t.Errorf("pods not injected, injected: %v; the table must hold both", outcomes)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// webhookInjects asks the webhook's handler, reading the objects of c,
// whether it injects pod.
func webhookInjects(t *testing.T, c client.Reader, pod *corev1.Pod) bool {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	injector := &webhook.PodInjector{Reader: c, Decoder: admission.NewDecoder(scheme), Options: inject.Options{Image: "sidecar:1"}}
	resp := injector.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "u1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Create,
		Namespace: pod.Namespace, Object: runtime.RawExtension{Raw: raw},
	}})
	if !resp.Allowed {
		t.Fatalf("the webhook refused the pod: %+v", resp.Result)
	}
	return len(resp.Patches) > 0
}
