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
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/go-logr/logr"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/policystatus"
	"github.com/slidegate/slidegate/internal/redisadmin"
)

// A namespace's memory budget (docs/security.md, "Memory"). A namespace's
// Redis user may run the commands the library's functions call on its own
// keys, so its credentials can write large members or keys that never
// expire. With --redis-namespace-memory-budget the leader measures every
// --redis-memory-check-interval what each namespace's keys hold
// (redisadmin.MemoryUsage, under the administrative identity) and switches
// the user of a namespace over the budget off, closing its connections:
// its sidecars then follow their fail mode, and its policies say
// RedisMemoryBudgetExceeded. The user is switched on again once the
// namespace's keys hold at most memoryBudgetResume of the budget: the
// windows expire by themselves; keys written around the library (no
// expiry) stay until the platform team deletes them.

// DefaultMemoryCheckInterval is --redis-memory-check-interval's default.
const DefaultMemoryCheckInterval = time.Minute

// memoryBudgetResume is the share of the budget under which a namespace
// switched off is switched on again: below the budget, so that a
// namespace near it is not switched on and off at every check.
const memoryBudgetResume = 0.9

func (ri *Identities) memoryInterval() time.Duration {
	if ri.MemoryInterval > 0 {
		return ri.MemoryInterval
	}
	return DefaultMemoryCheckInterval
}

// overBudget reports whether namespace ns's user is switched off for its
// memory, and what its keys held at the last check.
func (ri *Identities) overBudget(ns string) (bytes int64, off bool) {
	ri.mu.Lock()
	defer ri.mu.Unlock()
	bytes, off = ri.over[ns]
	return bytes, off
}

// budgetProblem is the problem of namespace ns's policies while its user
// is switched off.
func (ri *Identities) budgetProblem(ns string, bytes int64) *policystatus.Problem {
	return policystatus.New(v1alpha1.ReasonRedisMemoryBudgetExceeded, fmt.Sprintf(
		"the namespace's keys hold %s in Redis, over its budget of %s (the manager's --redis-namespace-memory-budget): its Redis user %s is switched off, so its sidecars follow their fail mode; "+
			"it is switched on again once they hold at most %s (windows expire by themselves; keys written around slidegate, without expiry, stay until the platform team deletes them)",
		quantity(bytes), quantity(ri.MemoryBudget), redisadmin.NamespaceUser(ns), quantity(int64(float64(ri.MemoryBudget)*memoryBudgetResume))))
}

func quantity(b int64) string { return resource.NewQuantity(b, resource.BinarySI).String() }

// runMemoryChecks checks the namespaces' memory every interval until ctx
// ends.
func (ri *Identities) runMemoryChecks(ctx context.Context) {
	t := time.NewTicker(ri.memoryInterval())
	defer t.Stop()
	for {
		ri.CheckMemory(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// CheckMemory measures what each namespace's keys hold and switches the
// users of those over the budget off, and back on below the resume mark.
// A measure that failed on some master is a lower bound: it may switch a
// namespace off, never on.
func (ri *Identities) CheckMemory(ctx context.Context) {
	log := logf.FromContext(ctx).WithName("redis-memory")
	ctx, cancel := context.WithTimeout(ctx, ri.memoryInterval())
	defer cancel()
	users, err := ri.desiredUsers(ctx)
	if err != nil {
		memoryCheckErrorsCounter.Inc()
		log.Error(err, "the namespaces' Redis users are not known; memory not checked")
		return
	}
	usage, err := ri.Admin.MemoryUsage(ctx, users)
	partial := err != nil
	if partial {
		memoryCheckErrorsCounter.Inc()
		log.Error(err, "measuring the namespaces' Redis memory (the administrative identity needs SCAN, MEMORY USAGE and %R~ on slidegate's keys: redisadmin.AdminACLRules); what was measured is a lower bound")
	}
	changed := ri.switchesFor(users, usage, partial)
	if len(changed) == 0 {
		return
	}
	if _, err := ri.Admin.Apply(ctx, changed, nil); err != nil {
		log.Error(err, "switching namespaces' Redis users for their memory; the next periodic pass retries")
	}
	for _, u := range changed {
		ri.reportMemorySwitch(log, u, usage.Bytes[u.Name])
		// The namespace's policies say it (namespaceIdentity).
		if ri.Wake != nil {
			obj := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: strings.TrimPrefix(u.Name, redisadmin.NamespaceUserPrefix)}}
			select {
			case ri.Wake <- event.TypedGenericEvent[client.Object]{Object: obj}:
			case <-ctx.Done():
				return
			}
		}
	}
}

// switchesFor updates which namespaces are over the budget from what
// their users' keys hold (usage) and the gauges that say it, and returns
// the users to switch: off when over the budget, on again when at most
// memoryBudgetResume of it and the measure is complete.
func (ri *Identities) switchesFor(users []redisadmin.User, usage redisadmin.Usage, partial bool) (changed []redisadmin.User) {
	ri.mu.Lock()
	defer ri.mu.Unlock()
	if ri.over == nil {
		ri.over = map[string]int64{}
	}
	measured := map[string]bool{}
	for _, u := range users {
		ns, ok := strings.CutPrefix(u.Name, redisadmin.NamespaceUserPrefix)
		if !ok {
			continue
		}
		measured[ns] = true
		bytes := usage.Bytes[u.Name]
		_, off := ri.over[ns]
		switch {
		case !off && bytes > ri.MemoryBudget:
			ri.over[ns] = bytes
			u.Off = true
			changed = append(changed, u)
		case off && !partial && float64(bytes) <= float64(ri.MemoryBudget)*memoryBudgetResume:
			delete(ri.over, ns)
			u.Off = false
			changed = append(changed, u)
		case off:
			ri.over[ns] = bytes
		}
	}
	for ns := range ri.over {
		if !measured[ns] {
			// No user any more (unlabelled, no policy, deleted).
			delete(ri.over, ns)
		}
	}
	overBudgetGauge.Reset()
	for ns := range ri.over {
		overBudgetGauge.WithLabelValues(ns).Set(1)
	}
	// Only the namespaces that have a user now: a deleted one's series goes.
	namespaceMemoryGauge.Reset()
	for ns := range measured {
		namespaceMemoryGauge.WithLabelValues(ns).Set(float64(usage.Bytes[redisadmin.NamespaceUser(ns)]))
	}
	return changed
}

// reportMemorySwitch logs, counts and records as an event on the manager
// that user u was switched off (or on) for its keys' bytes.
func (ri *Identities) reportMemorySwitch(log logr.Logger, u redisadmin.User, bytes int64) {
	ns := strings.TrimPrefix(u.Name, redisadmin.NamespaceUserPrefix)
	if u.Off {
		memoryBudgetExceededCounter.Inc()
		log.Info("namespace over its Redis memory budget: its user is switched off", "namespace", ns, "bytes", bytes, "budget", ri.MemoryBudget)
		ri.eventOnManager(corev1.EventTypeWarning, string(v1alpha1.ReasonRedisMemoryBudgetExceeded), "CheckRedisMemory",
			fmt.Sprintf("namespace %s: its keys hold %s in Redis, over the budget of %s; its Redis user %s is switched off", ns, quantity(bytes), quantity(ri.MemoryBudget), u.Name))
		return
	}
	log.Info("namespace back under its Redis memory budget: its user is switched on", "namespace", ns, "bytes", bytes, "budget", ri.MemoryBudget)
	ri.eventOnManager(corev1.EventTypeNormal, "RedisMemoryBudgetRestored", "CheckRedisMemory",
		fmt.Sprintf("namespace %s: its keys hold %s in Redis, under the budget of %s; its Redis user %s is switched on", ns, quantity(bytes), quantity(ri.MemoryBudget), u.Name))
}

// SetMemoryBudget changes MemoryBudget while the manager runs, and forgets
// which namespaces were over the last one (tests).
func (ri *Identities) SetMemoryBudget(b int64) {
	ri.mu.Lock()
	defer ri.mu.Unlock()
	ri.MemoryBudget = b
	ri.over = nil
}
