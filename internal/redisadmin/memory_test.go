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

package redisadmin

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestMemoryUsage: the administrative identity, with AdminACLRules only,
// measures what each namespace's keys hold, and a tenant cannot hide its
// keys' size from it. Tenant A writes, with its own credentials, a key
// whose first members (lowest scores) are 1 byte and whose later ones are
// 16 KiB: Redis's default MEMORY USAGE (SAMPLES 5, the naive measure)
// averages the first five and reports a small fraction of the truth;
// MemoryUsage counts every element.
func TestMemoryUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := testsupport.StartRedis(t)
	setAdmin(t, r, "slidegate-admin", AdminACLRules())
	cfg := redisconn.Config{Addrs: []string{r.Addr}}
	admin := newAdmin(t, redisconn.Config{Addrs: []string{r.Addr}, Username: "slidegate-admin", Password: "admin-pw"})
	us := users(t, "a", "b")
	if _, err := admin.Apply(ctx, us, nil); err != nil {
		t.Fatal(err)
	}
	loadLibrary(t, client(t, cfg))
	rdbA := clientAs(t, cfg, us[0], "pw-a")
	const small, large, big = 100, 300, 16 << 10
	hidden := "slidegate:{a/hidden}"
	for i := range small + large {
		m := strconv.Itoa(i)
		if i >= small {
			m += strings.Repeat("x", big)
		}
		if err := rdbA.ZAdd(ctx, hidden, redis.Z{Score: float64(i), Member: m}).Err(); err != nil {
			t.Fatalf("A's ZADD: %v", err)
		}
	}
	// B decides through the library, as its sidecars do.
	limB, err := limiter.New(clientAs(t, cfg, us[1], "pw-b"), limiter.Options{Functions: true, Timeout: 2 * time.Second, DenyCacheMax: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = limB.Close() })
	for i := range 5 {
		d := limB.Decide(ctx, []limiter.Request{{Rule: limiter.Rule{ID: "b/p", Limit: 10, Window: time.Minute}, Client: "c" + strconv.Itoa(i)}})[0]
		if d.Source != limiter.SourceRedis || !d.Allowed {
			t.Fatalf("B's decision %d: %+v", i, d)
		}
	}
	// A key of a namespace without a user: nobody's.
	if _, err := r.Do("SET", "slidegate:{c/x}", strings.Repeat("z", 1<<20)); err != nil {
		t.Fatal(err)
	}

	u, err := admin.MemoryUsage(ctx, us)
	if err != nil {
		t.Fatalf("MemoryUsage with the least-privilege admin: %v", err)
	}
	naive, err := client(t, cfg).MemoryUsage(ctx, hidden).Result() // SAMPLES 5
	if err != nil {
		t.Fatal(err)
	}
	payload := int64(large * big)
	t.Logf("A: %d B in %d keys (naive SAMPLES 5 on its key: %d B; payload %d B); B: %d B in %d keys; %d keys scanned",
		u.Bytes["slidegate-ns-a"], u.Keys["slidegate-ns-a"], naive, payload, u.Bytes["slidegate-ns-b"], u.Keys["slidegate-ns-b"], u.Scanned)
	if naive >= payload/10 {
		t.Errorf("the naive measure saw %d B of a %d B payload: the test's layout no longer hides it", naive, payload)
	}
	if got := u.Bytes["slidegate-ns-a"]; got < payload {
		t.Errorf("A's keys measured %d B, less than the %d B written", got, payload)
	}
	if u.Keys["slidegate-ns-a"] != 1 {
		t.Errorf("A holds %d keys, want 1", u.Keys["slidegate-ns-a"])
	}
	if got := u.Bytes["slidegate-ns-b"]; got <= 0 || got >= 64<<10 {
		t.Errorf("B's 5 windows measured %d B", got)
	}
	if u.Scanned < 3 || len(u.Bytes) != 2 {
		t.Errorf("scanned %d keys, attributed to %v (the namespace without a user is nobody's)", u.Scanned, u.Bytes)
	}
}

// TestMemoryRulesNeeded: each of the rules AdminACLRules adds for the
// memory budget is needed: without it, measuring or switching a user off
// fails with NOPERM (so the list is not merely sufficient by being broad).
func TestMemoryRulesNeeded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, drop := range []string{"%R~slidegate:*", "+scan", "+memory|usage", "+client|kill"} {
		t.Run("without "+drop, func(t *testing.T) {
			r := testsupport.StartRedis(t)
			var rules []string
			for _, rule := range AdminACLRules() {
				if rule != drop {
					rules = append(rules, rule)
				}
			}
			setAdmin(t, r, "slidegate-admin", rules)
			if _, err := r.Do("SET", "slidegate:{a/k}", "v"); err != nil {
				t.Fatal(err)
			}
			admin := newAdmin(t, redisconn.Config{Addrs: []string{r.Addr}, Username: "slidegate-admin", Password: "admin-pw"})
			off := users(t, "a")[0]
			off.Off = true
			_, err := admin.MemoryUsage(ctx, []User{off})
			if err == nil {
				_, err = admin.Apply(ctx, []User{off}, nil)
			}
			if err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Errorf("measuring and switching off without %s: %v, want NOPERM", drop, err)
			}
		})
	}
}

// TestMemoryUsageCluster: a Cluster's keys are summed over its masters
// (each SCAN sees its own slots), and replicas are not counted twice.
func TestMemoryUsageCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := sharedCluster(t)
	cfg := redisconn.Config{Mode: redisconn.Cluster, Addrs: c.Addrs()[:1]}
	ns := "mu-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	us := users(t, ns)
	admin := newAdmin(t, cfg)
	if _, err := admin.Apply(ctx, us, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Apply(context.Background(), nil, []string{us[0].Name}) })
	rdb := clientAs(t, cfg, us[0], "pw-"+ns)
	var want int64
	root := client(t, cfg)
	for i := range 40 {
		// Another hash tag per key: spread over the slots, and so the masters.
		k := fmt.Sprintf("slidegate:{%s/k%d}", ns, i)
		if err := rdb.ZAdd(ctx, k, redis.Z{Score: 1, Member: strings.Repeat("m", 1000+i)}).Err(); err != nil {
			t.Fatal(err)
		}
		n, err := root.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		want += n
	}
	u, err := admin.MemoryUsage(ctx, us)
	if err != nil {
		t.Fatal(err)
	}
	if got := u.Bytes[us[0].Name]; got != want || u.Keys[us[0].Name] != 40 {
		t.Errorf("the namespace's 40 keys: %d B in %d keys, want %d B (each key's MEMORY USAGE, summed)", got, u.Keys[us[0].Name], want)
	}
}

// TestUserOff: a user switched off can neither authenticate nor go on
// with a connection it already had; switched on again, it works with the
// same password. Its pair: ACL SETUSER off alone (the naive switch)
// leaves the pooled connection working, which is why Apply closes them.
func TestUserOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := testsupport.StartRedis(t)
	cfg := redisconn.Config{Addrs: []string{r.Addr}}
	admin := newAdmin(t, cfg)
	u := users(t, "a")[0]
	if _, err := admin.Apply(ctx, []User{u}, nil); err != nil {
		t.Fatal(err)
	}
	// One connection, kept: as a sidecar's pool keeps it.
	conn := redis.NewClient(&redis.Options{Addr: r.Addr, Username: u.Name, Password: "pw-a", PoolSize: 1, MaxRetries: -1})
	t.Cleanup(func() { _ = conn.Close() })
	write := func() error { return conn.ZAdd(ctx, "slidegate:{a/k}", redis.Z{Score: 1, Member: "m"}).Err() }
	if err := write(); err != nil {
		t.Fatal(err)
	}

	t.Run("naive: ACL SETUSER off alone", func(t *testing.T) {
		if _, err := r.Do("ACL", "SETUSER", u.Name, "off"); err != nil {
			t.Fatal(err)
		}
		if err := write(); err != nil {
			t.Errorf("the pooled connection failed after ACL SETUSER off alone (%v): the pair no longer shows why Apply closes connections", err)
		}
		if _, err := r.Do("ACL", "SETUSER", u.Name, "on"); err != nil {
			t.Fatal(err)
		}
	})

	off := u
	off.Off = true
	if _, err := admin.Apply(ctx, []User{off}, nil); err != nil {
		t.Fatalf("switching the user off: %v", err)
	}
	if err := write(); err == nil {
		t.Error("the connection authenticated before the switch still writes")
	}
	if err := write(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("a new connection as the user switched off: %v, want WRONGPASS", err)
	}
	if _, err := admin.Apply(ctx, []User{u}, nil); err != nil {
		t.Fatal(err)
	}
	if err := write(); err != nil {
		t.Errorf("switched on again: %v", err)
	}
}
