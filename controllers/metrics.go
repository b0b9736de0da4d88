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
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
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

	writesCounter = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "slidegate_controller_writes_total",
		Help: "API writes by the RateLimitPolicy controller, by resource and operation; flat when nothing changes.",
	}, []string{"resource", "operation"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(policiesGauge, rejectedPoliciesGauge, unprotectedPodsGauge, writesCounter)
}

func forgetNamespaceMetrics(ns string) {
	policiesGauge.DeleteLabelValues(ns)
	rejectedPoliciesGauge.DeleteLabelValues(ns)
	unprotectedPodsGauge.DeleteLabelValues(ns)
}
