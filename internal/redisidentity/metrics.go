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

package redisidentity

import (
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The identities' metrics, next to the controller's. Labels are bounded:
// namespaces with a Redis user of their own, and the two modes.
var (
	unauthenticatedGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "slidegate_redis_unauthenticated",
		Help: "Redis nodes that answered a command sent without AUTH at the manager's last check: anything that reaches them bypasses every identity (alert SlidegateRedisOpen).",
	})
	libraryLoadsCounter = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "slidegate_redis_library_loads_total",
		Help: "Times the manager loaded the slidegate Functions library on a Redis master that lacked it (the first time, after a restart without persistence, an empty replica promoted).",
	})
	identitySyncCounter = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "slidegate_redis_identity_syncs_total",
		Help: "Periodic passes that brought every Redis node to the desired library and identities.",
	})
	identitySyncErrorsCounter = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "slidegate_redis_identity_sync_errors_total",
		Help: "Periodic passes that could not bring every Redis node to the desired library and identities (see the manager's log).",
	})
	identityModeGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "slidegate_redis_identity_mode",
		Help: "1 for the Redis identity mode new sidecars get (--redis-identity): namespace, or shared, which isolates nothing inside Redis.",
	}, []string{"mode"})

	namespaceMemoryGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "slidegate_redis_namespace_memory_bytes",
		Help: "Memory the keys of a namespace's Redis user hold, summed over the masters, at the manager's last check (with --redis-namespace-memory-budget).",
	}, []string{"namespace"})
	overBudgetGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "slidegate_redis_namespace_over_memory_budget",
		Help: "1 for a namespace whose Redis user is switched off because its keys held more than --redis-namespace-memory-budget (its sidecars follow their fail mode); absent otherwise.",
	}, []string{"namespace"})
	memoryBudgetExceededCounter = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "slidegate_redis_memory_budget_exceeded_total",
		Help: "Times a namespace's Redis user was switched off for its memory.",
	})
	memoryCheckErrorsCounter = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "slidegate_redis_memory_check_errors_total",
		Help: "Checks of the namespaces' Redis memory that failed in part or whole (see the manager's log).",
	})
)

func init() {
	ctrlmetrics.Registry.MustRegister(unauthenticatedGauge, libraryLoadsCounter, identitySyncCounter, identitySyncErrorsCounter, identityModeGauge,
		namespaceMemoryGauge, overBudgetGauge, memoryBudgetExceededCounter, memoryCheckErrorsCounter)
}

// RecordMode sets slidegate_redis_identity_mode to the mode of new
// sidecars.
func (ri *Identities) RecordMode() {
	identityModeGauge.Reset()
	identityModeGauge.WithLabelValues(string(ri.CurrentMode())).Set(1)
}
