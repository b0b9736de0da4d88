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
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestTenantFillsRedis: what one tenant's credentials can do to the
// others through the shared Redis's memory (issue 36, item 4), and what
// the operator's maxmemory-policy makes of it. Tenant A may ZADD to its
// own keys (Redis checks a function's commands against its caller), so it
// can write large members to a key with no expiry until Redis is full.
//
// A fills Redis until its writes fail, which is when B's decisions fall
// to B's fail mode (closed here: denied), then frees a little (ZREM is one
// of its commands), so that B's decisions reach Redis again.
//
//   - noeviction (what docs/security.md asks for): A's writes end in OOM;
//     B's full window stays whole, and once A frees memory B's client is
//     still denied, by Redis. Availability is shared; the limit never
//     loosens.
//   - volatile-lru (the naive setting, a managed Redis's usual default):
//     Redis evicts keys that expire, which are slidegate's, never A's (no
//     expiry): B's window is evicted, and once A frees memory B's client,
//     denied before, is admitted again. The limit loosens: this is why
//     noeviction.
func TestTenantFillsRedis(t *testing.T) {
	for _, tc := range []struct {
		policy   string
		loosened bool
	}{
		{"noeviction", false},
		{"volatile-lru", true},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			ctx := context.Background()
			r := testsupport.StartRedis(t, "--maxmemory", "32mb", "--maxmemory-policy", tc.policy)
			cfg := redisconn.Config{Addrs: []string{r.Addr}}
			full := limiter.Rule{ID: "b/per-user", Limit: 10, Window: time.Hour, FailMode: limiter.FailClosed}
			userA, err := NamespaceIdentity("", "a", []string{"a/p"}, []string{"pw-a"})
			if err != nil {
				t.Fatal(err)
			}
			userB, err := NamespaceIdentity("", "b", []string{full.ID}, []string{"pw-b"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := newAdmin(t, cfg).Apply(ctx, []User{userA, userB}, nil); err != nil {
				t.Fatal(err)
			}
			adminClient := client(t, cfg)
			loadLibrary(t, adminClient)
			rdbA := clientAs(t, cfg, userA, "pw-a")
			limB, err := limiter.New(clientAs(t, cfg, userB, "pw-b"), limiter.Options{Functions: true, Timeout: 2 * time.Second, DenyCacheMax: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = limB.Close() })
			decide := func() limiter.Decision {
				return limB.Decide(ctx, []limiter.Request{{Rule: full, Client: "victim"}})[0]
			}
			for i := range full.Limit {
				if d := decide(); d.Source != limiter.SourceRedis || !d.Allowed {
					t.Fatalf("B's request %d: %+v", i, d)
				}
			}
			if d := decide(); d.Source != limiter.SourceRedis || d.Allowed {
				t.Fatalf("B's request past the limit: %+v", d)
			}
			victimKey := redisschema.Key("slidegate:", full.ID, "victim")

			// A fills Redis from its own key, 256 KiB a member, no expiry.
			member := strings.Repeat("x", 256<<10)
			written, oom := 0, false
			for i := 0; written < 128<<20; i++ {
				err := rdbA.ZAdd(ctx, "slidegate:{a/junk}", redis.Z{Score: float64(i), Member: member + string(rune('a'+i%26)) + strings.Repeat("y", i/26)}).Err()
				if err != nil {
					if !strings.Contains(err.Error(), "OOM") {
						t.Fatalf("A's ZADD %d: %v (want OOM or success)", i, err)
					}
					oom = true
					break
				}
				written += len(member)
			}
			ttl, _ := rdbA.PTTL(ctx, "slidegate:{a/junk}").Result()
			left, _ := adminClient.ZCard(ctx, victimKey).Result()
			during := decide()
			// A frees 4 MiB of its own.
			if err := rdbA.ZRem(ctx, "slidegate:{a/junk}", anyMembers(ctx, t, rdbA, 16)...).Err(); err != nil {
				t.Fatalf("A's ZREM: %v", err)
			}
			d := decide()
			t.Logf("%s: A wrote %d MiB into one key (PTTL %v) until OOM (%t); B's window then held %d of %d, B's decision meanwhile came from %s; after A freed 4 MiB: %+v",
				tc.policy, written>>20, ttl, oom, left, full.Limit, during.Source, d)
			if !oom {
				t.Errorf("%s: A wrote %d MiB into a 32 MiB Redis without OOM", tc.policy, written>>20)
			}
			if during.Allowed {
				t.Errorf("%s: B's client admitted while Redis was full: %+v", tc.policy, during)
			}
			if tc.loosened {
				if left != 0 || !d.Allowed || d.Source != limiter.SourceRedis {
					t.Errorf("%s: B's window was expected evicted and its client admitted again (the case that shows why noeviction): window %d, %+v", tc.policy, left, d)
				}
				return
			}
			if left != full.Limit {
				t.Errorf("%s: B's full window holds %d admits after A filled Redis, want %d", tc.policy, left, full.Limit)
			}
			if d.Allowed || d.Source != limiter.SourceRedis {
				t.Errorf("%s: after A freed memory, B's client: %+v, want denied by Redis", tc.policy, d)
			}
		})
	}
}

// anyMembers are n members of A's junk key, read as A (ZRANGE is one of
// its commands).
func anyMembers(ctx context.Context, t *testing.T, rdb redis.UniversalClient, n int64) []any {
	t.Helper()
	ms, err := rdb.ZRange(ctx, "slidegate:{a/junk}", 0, n-1).Result()
	if err != nil {
		t.Fatalf("A's ZRANGE: %v", err)
	}
	out := make([]any, len(ms))
	for i, m := range ms {
		out[i] = m
	}
	return out
}
