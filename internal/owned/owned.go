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

// Package owned marks what the manager writes into the cluster as its own:
// the labels every object it creates carries, the server-side apply field
// owner of everything it writes, and the count of its writes
// (slidegate_controller_writes_total). The reconcilers and the Redis
// identities (internal/redisidentity) write through it alike.
package owned

import (
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// FieldOwner is the server-side apply field manager of everything the
// manager writes.
const FieldOwner = "slidegate-controller"

// Labels are the labels of every object the manager creates; component
// names what the object is for.
func Labels(component string) map[string]string {
	return map[string]string{
		v1alpha1.ManagedByLabel:       v1alpha1.ManagedByValue,
		"app.kubernetes.io/name":      "slidegate",
		"app.kubernetes.io/component": component,
	}
}

var writes = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "slidegate_controller_writes_total",
	Help: "API writes by the RateLimitPolicy controller, by resource and operation; flat when nothing changes.",
}, []string{"resource", "operation"})

func init() { ctrlmetrics.Registry.MustRegister(writes) }

// Wrote counts one write of operation (apply, create, delete, patch) on
// resource.
func Wrote(resource, operation string) { writes.WithLabelValues(resource, operation).Inc() }
