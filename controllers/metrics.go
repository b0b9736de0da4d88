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
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/buildinfo"
)

// slidegate's own controller metrics, next to controller-runtime's. Labels
// are bounded: namespaces that have policies, resource kinds and operations;
// never clients, pods or policy names.
var (
	policiesGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "slidegate_policies",
		Help: "RateLimitPolicies per namespace (not being deleted).",
	}, []string{"namespace"})

	rejectedPoliciesGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "slidegate_policies_rejected",
		Help: "RateLimitPolicies per namespace that are not accepted (an invalid spec, or no room left in the namespace's ConfigMap), so not enforced.",
	}, []string{"namespace"})

	unprotectedPodsGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "slidegate_unprotected_pods",
		Help: "Pods selected by at least one RateLimitPolicy that do not carry the sidecar, per namespace.",
	}, []string{"namespace"})

	notEnforcedGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "slidegate_policies_not_enforced",
		Help: "RateLimitPolicies per namespace whose Enforced condition is False, by its reason (NotAccepted, NoPodsSelected, PartiallyEnforced, ServiceBypassesSidecar, NoRateLimitService) and target (sidecar: policies with targetSelector; rate-limit-service: policies with rateLimitService).",
	}, []string{"namespace", "reason", "target"})

	unclaimedDomainPoliciesGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "slidegate_rls_unclaimed_domain_policies",
		Help: "Accepted policies for the rate limit service on a domain that no namespace claims in ConfigMap slidegate-rls-domains, so that policies of any namespace may limit that domain.",
	})
)

func init() {
	ctrlmetrics.Registry.MustRegister(policiesGauge, rejectedPoliciesGauge, unprotectedPodsGauge, notEnforcedGauge,
		unclaimedDomainPoliciesGauge,
		buildinfo.Collector("manager"))
}

// forgetNamespaceMetrics drops the series of a namespace without policies,
// so that a deleted namespace does not report its last values forever.
func forgetNamespaceMetrics(ns string) {
	policiesGauge.DeleteLabelValues(ns)
	rejectedPoliciesGauge.DeleteLabelValues(ns)
	unprotectedPodsGauge.DeleteLabelValues(ns)
	notEnforcedGauge.DeletePartialMatch(prometheus.Labels{"namespace": ns, "target": targetSidecar})
}

// Targets of slidegate_policies_not_enforced.
const (
	targetSidecar          = "sidecar"
	targetRateLimitService = "rate-limit-service"
)

// notEnforcedReasons are the reasons of a False Enforced condition, by
// target: each is set every reconcile (0 included), so an alert's `for` is
// not reset by a series that comes and goes.
var notEnforcedReasons = map[string][]v1alpha1.ConditionReason{
	targetSidecar: {v1alpha1.ReasonNotAccepted, v1alpha1.ReasonNoPodsSelected,
		v1alpha1.ReasonPartiallyEnforced, v1alpha1.ReasonServiceBypassesSidecar, v1alpha1.ReasonNetworkPolicyAdmitsApp},
	targetRateLimitService: {v1alpha1.ReasonNotAccepted, v1alpha1.ReasonNoRateLimitService, v1alpha1.ReasonPartiallyEnforced},
}

// recordEnforcement counts the sidecar policies of ns whose Enforced
// condition is False (as their status now says), by reason.
func recordEnforcement(ns string, policies []v1alpha1.RateLimitPolicy) {
	for reason, n := range notEnforced(targetSidecar, policies) {
		notEnforcedGauge.WithLabelValues(ns, string(reason), targetSidecar).Set(float64(n))
	}
}

// recordRLSEnforcement does the same for every policy for the rate limit
// service, by namespace, and forgets the namespaces that have none left.
func recordRLSEnforcement(byNamespace map[string][]v1alpha1.RateLimitPolicy, before map[string]bool) {
	for ns := range before {
		if _, ok := byNamespace[ns]; !ok {
			notEnforcedGauge.DeletePartialMatch(prometheus.Labels{"namespace": ns, "target": targetRateLimitService})
		}
	}
	for ns, policies := range byNamespace {
		for reason, n := range notEnforced(targetRateLimitService, policies) {
			notEnforcedGauge.WithLabelValues(ns, string(reason), targetRateLimitService).Set(float64(n))
		}
	}
}

// notEnforced counts the policies whose Enforced condition is False, by
// reason; every reason the target can report is present (0 if none), so
// that a count going back to zero is seen.
func notEnforced(target string, policies []v1alpha1.RateLimitPolicy) map[v1alpha1.ConditionReason]int {
	counts := map[v1alpha1.ConditionReason]int{}
	for _, r := range notEnforcedReasons[target] {
		counts[r] = 0
	}
	for i := range policies {
		if c := meta.FindStatusCondition(policies[i].Status.Conditions, string(v1alpha1.ConditionEnforced)); c != nil && c.Status == metav1.ConditionFalse {
			counts[v1alpha1.ConditionReason(c.Reason)]++
		}
	}
	return counts
}
