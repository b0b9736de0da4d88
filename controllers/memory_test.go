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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/redisadmin"
	"github.com/slidegate/slidegate/internal/redisconn"
)

// TestMemoryBudget: a tenant that fills Redis with its own credentials
// (issue 36, item 4) is switched off by the manager once its keys hold more
// than the budget, and only it: its connection is closed, its password
// refused, its policies say RedisMemoryBudgetExceeded, the manager's Pod
// gets an event and the metrics say it; the periodic identity pass keeps
// it off. Once the platform team deletes the keys, the next check switches
// it on again with the same password. The tenant writes large members
// behind small ones, which Redis's sampled MEMORY USAGE (the naive
// measure, redisadmin.TestMemoryUsage) would not see.
func TestMemoryBudget(t *testing.T) {
	ctx := context.Background()
	inNamespaceMode(t)
	const budget = 256 << 10
	identities.SetMemoryBudget(budget)
	t.Cleanup(func() { identities.SetMemoryBudget(0) })
	tenant, bystander := newNamespace(t), newNamespace(t)
	p := newPolicy(tenant, "p")
	create(t, p)
	create(t, newPolicy(bystander, "p"))
	user := redisadmin.NamespaceUser(tenant)
	conn := func(ns string) (*redis.Client, error) {
		data, err := credentialsOf(ns)
		if err != nil {
			return nil, err
		}
		c := redis.NewClient(&redis.Options{Addr: redisServer.Addr, Username: string(data[redisconn.SecretNamespaceUsernameKey]),
			Password: string(data[redisconn.SecretNamespacePasswordKey]), MaxRetries: -1, PoolSize: 1, DisableIdentity: true})
		if err := c.Ping(ctx).Err(); err != nil {
			_ = c.Close()
			return nil, err
		}
		return c, nil
	}
	var rdb, other *redis.Client
	eventually(t, "both namespaces' credentials open Redis", func() (err error) {
		if rdb == nil {
			rdb, err = conn(tenant)
		}
		if err == nil && other == nil {
			other, err = conn(bystander)
		}
		return err
	})
	t.Cleanup(func() { _ = rdb.Close(); _ = other.Close() })

	junk := "slidegate:{" + tenant + "/junk}"
	for i := range 100 {
		m := strconv.Itoa(i)
		if i >= 20 {
			m += strings.Repeat("x", 8<<10) // 80 of 8 KiB: 640 KiB behind 20 small ones
		}
		if err := rdb.ZAdd(ctx, junk, redis.Z{Score: float64(i), Member: m}).Err(); err != nil {
			t.Fatalf("the tenant's ZADD: %v", err)
		}
	}
	if err := other.ZAdd(ctx, "slidegate:{"+bystander+"/small}", redis.Z{Score: 1, Member: "m"}).Err(); err != nil {
		t.Fatal(err)
	}
	events := recorder.count()
	exceeded := gathered(t, "slidegate_redis_memory_budget_exceeded_total", "")

	identities.CheckMemory(ctx)

	measured := gathered(t, "slidegate_redis_namespace_memory_bytes", tenant)
	if measured < 640<<10 {
		t.Errorf("slidegate_redis_namespace_memory_bytes{namespace=%s} = %v, want at least the 640 KiB written", tenant, measured)
	}
	if got := gathered(t, "slidegate_redis_memory_budget_exceeded_total", "") - exceeded; got != 1 {
		t.Errorf("slidegate_redis_memory_budget_exceeded_total rose by %v, want 1", got)
	}
	if n := series(t, overBudgetMetric); n != 1 || gathered(t, overBudgetMetric, tenant) != 1 {
		t.Errorf("slidegate_redis_namespace_over_memory_budget: %d series, want 1 of 1 for %s", n, tenant)
	}
	if err := rdb.Ping(ctx).Err(); err == nil {
		t.Error("the tenant's connection still answers after its user was switched off")
	}
	if c, err := conn(tenant); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		if c != nil {
			_ = c.Close()
		}
		t.Errorf("the tenant's credentials after the switch: %v, want WRONGPASS", err)
	}
	if err := other.Ping(ctx).Err(); err != nil {
		t.Errorf("the bystander's connection: %v", err)
	}
	readyIs(t, p, metav1.ConditionFalse, v1alpha1.ReasonRedisMemoryBudgetExceeded, "switched off")
	var found bool
	for _, e := range recorder.since(events) {
		found = found || strings.HasPrefix(e, managerPod.Namespace+"/"+managerPod.Name+" Warning RedisMemoryBudgetExceeded") && strings.Contains(e, tenant)
	}
	if !found {
		t.Errorf("no RedisMemoryBudgetExceeded event on the manager's Pod naming %s: %q", tenant, recorder.since(events))
	}
	// The periodic pass sets every user as desired: it keeps this one off.
	time.Sleep(3 * identities.Interval)
	if got, _ := redisServer.Do("ACL", "GETUSER", user); !strings.Contains(got, "\noff\n") {
		t.Errorf("the tenant's user after three periodic passes: %q, want off", got)
	}
	if data, err := credentialsOf(tenant); err != nil || len(data[redisconn.SecretNamespacePasswordKey]) == 0 {
		t.Errorf("the tenant's Secret lost its password while off: %v", err)
	}

	// The platform team deletes the keys written around slidegate.
	if _, err := redisServer.Do("DEL", junk); err != nil {
		t.Fatal(err)
	}
	identities.CheckMemory(ctx)
	readyIs(t, p, metav1.ConditionTrue, v1alpha1.ReasonPublished, "")
	eventually(t, "the tenant's credentials open Redis again", func() error {
		c, err := conn(tenant)
		if err != nil {
			return err
		}
		return c.Close()
	})
	if n := series(t, overBudgetMetric); n != 0 {
		t.Errorf("slidegate_redis_namespace_over_memory_budget: %d series after the switch on, want none", n)
	}
}

// overBudgetMetric is the gauge of the namespaces switched off.
const overBudgetMetric = "slidegate_redis_namespace_over_memory_budget"

// series is how many series of metric the manager's registry holds.
func series(t *testing.T, metric string) int {
	t.Helper()
	n, err := testutil.GatherAndCount(ctrlmetrics.Registry, metric)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// gathered is the value of metric's series for namespace ns (any series
// when ns is ""), 0 when there is none.
func gathered(t *testing.T, metric, ns string) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != metric {
			continue
		}
		for _, m := range f.GetMetric() {
			if ns != "" && !hasLabel(m, "namespace", ns) {
				continue
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
