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
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/slidegate/slidegate/internal/owned"
	"github.com/slidegate/slidegate/internal/redisadmin"
	"github.com/slidegate/slidegate/internal/redisconn"
)

// NeedLeaderElection is true: one manager administers Redis.
func (ri *Identities) NeedLeaderElection() bool { return true }

// Start runs the periodic pass (and the memory checks, with a budget)
// until the manager stops; the manager runs it when Administered.
func (ri *Identities) Start(ctx context.Context) error {
	if ri.MemoryBudget > 0 {
		go ri.runMemoryChecks(ctx)
	}
	ri.Admin.Run(ctx, ri.interval(), ri.desiredUsers, func(st redisadmin.Status, err error) {
		ri.reportSync(ctx, st, err)
	})
	return nil
}

// reportSync records what a pass found: the metrics, a log line and an
// event when a node starts or stops accepting unauthenticated commands,
// and the rate limit service's credentials once its user is set up.
func (ri *Identities) reportSync(ctx context.Context, st redisadmin.Status, err error) {
	log := logf.FromContext(ctx).WithName("redis-identities")
	open := st.Unauthenticated()
	unauthenticatedGauge.Set(float64(len(open)))
	for _, n := range st.Nodes {
		if n.Library == "loaded" {
			libraryLoadsCounter.Inc()
			log.Info("loaded the slidegate Functions library", "node", n.Addr, "restarted", n.Restarted)
		}
	}
	if err != nil {
		identitySyncErrorsCounter.Inc()
		log.Error(err, "the Redis identities could not be brought up to date on every node; retrying", "interval", ri.interval())
	} else {
		identitySyncCounter.Inc()
	}
	ri.mu.Lock()
	changed := !slices.Equal(ri.open, open)
	ri.open = open
	ri.mu.Unlock()
	if changed {
		ri.reportOpen(ctx, open)
	}
	if err == nil {
		ri.writeRLSSecret(ctx)
	}
}

// reportOpen says, on a change, which nodes accept commands without AUTH.
func (ri *Identities) reportOpen(ctx context.Context, open []string) {
	log := logf.FromContext(ctx).WithName("redis-identities")
	if len(open) == 0 {
		log.Info("every Redis node requires AUTH")
		ri.eventOnManager(corev1.EventTypeNormal, "RedisAuthenticated", "CheckRedis", "every Redis node requires AUTH")
		return
	}
	msg := fmt.Sprintf("Redis nodes %s accept commands without AUTH: any pod that reaches them can read, reset and fill every namespace's limits and block the server, whatever identities slidegate hands out; "+
		"require AUTH (disable the default user or set requirepass) and admit only slidegate's pods with a NetworkPolicy (docs/operations.md, SlidegateRedisOpen)", strings.Join(open, ", "))
	log.Error(nil, msg)
	ri.eventOnManager(corev1.EventTypeWarning, "RedisUnauthenticated", "CheckRedis", msg)
}

// writeRLSSecret writes the rate limit service's credentials into its
// Secret when its current password changed (first pass, rotation).
func (ri *Identities) writeRLSSecret(ctx context.Context) {
	if ri.RLSSecret.Name == "" {
		return
	}
	install, err := ri.Key.Get(ctx)
	if err != nil || install == nil {
		return
	}
	current, _ := redisadmin.Passwords(install, redisadmin.RLSUser, "", ri.Rotation, time.Now())
	ri.mu.Lock()
	done := ri.rlsWritten == current
	ri.mu.Unlock()
	if done {
		return
	}
	ac := corev1ac.Secret(ri.RLSSecret.Name, ri.RLSSecret.Namespace).
		WithLabels(owned.Labels("rls-redis-credentials")).
		WithType(corev1.SecretTypeOpaque).
		WithData(map[string][]byte{redisconn.SecretUsernameKey: []byte(redisadmin.RLSUser), redisconn.SecretPasswordKey: []byte(current)})
	if err := ri.Client.Apply(ctx, ac, client.FieldOwner(owned.FieldOwner), client.ForceOwnership); err != nil {
		logf.FromContext(ctx).Error(err, "writing the rate limit service's Redis credentials", "secret", klog.KRef(ri.RLSSecret.Namespace, ri.RLSSecret.Name))
		return
	}
	owned.Wrote("secret", "apply")
	ri.mu.Lock()
	ri.rlsWritten = current
	ri.mu.Unlock()
}

// eventOnManager records an event about Redis itself on the manager's Pod,
// where the platform team looks (none without a Pod name).
func (ri *Identities) eventOnManager(eventType, reason, action, msg string) {
	if ri.Pod.Name == "" || ri.Recorder == nil {
		return
	}
	regarding := &corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{Name: ri.Pod.Name, Namespace: ri.Pod.Namespace}}
	ri.Recorder.Eventf(regarding, nil, eventType, reason, action, "%s", msg)
}
