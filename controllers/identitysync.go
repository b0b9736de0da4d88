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
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/slidegate/slidegate/internal/redisadmin"
	"github.com/slidegate/slidegate/internal/redisconn"
)

// identityRunnable runs the periodic Sync on the leader.
type identityRunnable struct{ r *RateLimitPolicyReconciler }

// NeedLeaderElection: one manager administers Redis.
func (identityRunnable) NeedLeaderElection() bool { return true }

// Start runs until the manager stops.
func (i identityRunnable) Start(ctx context.Context) error {
	r := i.r
	if r.Identities.MemoryBudget > 0 {
		go r.runMemoryChecks(ctx)
	}
	r.Identities.Admin.Run(ctx, r.Identities.interval(), r.desiredUsers, func(st redisadmin.Status, err error) {
		r.reportSync(ctx, st, err)
	})
	return nil
}

// reportSync records what a Sync found: the metrics, a log line and an
// event when a node starts or stops accepting unauthenticated commands,
// and the rate limit service's credentials once its user is set up.
func (r *RateLimitPolicyReconciler) reportSync(ctx context.Context, st redisadmin.Status, err error) {
	log := logf.FromContext(ctx).WithName("redis-identities")
	ri := r.Identities
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
		r.reportOpen(ctx, open)
	}
	if err == nil {
		r.writeRLSSecret(ctx)
	}
}

// reportOpen says, on a change, which nodes accept commands without AUTH.
func (r *RateLimitPolicyReconciler) reportOpen(ctx context.Context, open []string) {
	log := logf.FromContext(ctx).WithName("redis-identities")
	if len(open) == 0 {
		log.Info("every Redis node requires AUTH")
		r.eventOnManager(corev1.EventTypeNormal, "RedisAuthenticated", "CheckRedis", "every Redis node requires AUTH")
		return
	}
	msg := fmt.Sprintf("Redis nodes %s accept commands without AUTH: any pod that reaches them can read, reset and fill every namespace's limits and block the server, whatever identities slidegate hands out; "+
		"require AUTH (disable the default user or set requirepass) and admit only slidegate's pods with a NetworkPolicy (docs/operations.md, SlidegateRedisOpen)", strings.Join(open, ", "))
	log.Error(nil, msg)
	r.eventOnManager(corev1.EventTypeWarning, "RedisUnauthenticated", "CheckRedis", msg)
}

// writeRLSSecret writes the rate limit service's credentials into its
// Secret when its current password changed (first pass, rotation).
func (r *RateLimitPolicyReconciler) writeRLSSecret(ctx context.Context) {
	ri := r.Identities
	if ri.RLSSecret.Name == "" {
		return
	}
	install, err := r.installKey(ctx)
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
		WithLabels(childLabels("rls-redis-credentials")).
		WithType(corev1.SecretTypeOpaque).
		WithData(map[string][]byte{redisconn.SecretUsernameKey: []byte(redisadmin.RLSUser), redisconn.SecretPasswordKey: []byte(current)})
	if err := r.Client.Apply(ctx, ac, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		logf.FromContext(ctx).Error(err, "writing the rate limit service's Redis credentials", "secret", klog.KRef(ri.RLSSecret.Namespace, ri.RLSSecret.Name))
		return
	}
	writesCounter.WithLabelValues("secret", "apply").Inc()
	ri.mu.Lock()
	ri.rlsWritten = current
	ri.mu.Unlock()
}
