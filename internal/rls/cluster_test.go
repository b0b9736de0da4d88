package rls

import (
	"strconv"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
)

// TestClusterAllOrNothing: on a Redis Cluster, the descriptors of one
// request land in different slots (different policies and clients hash
// apart); a request denied by one still consumes nothing in the others.
func TestClusterAllOrNothing(t *testing.T) {
	t.Parallel()
	c := sharedCluster(t)
	prefix := testPrefix(t)
	cfg := writeConfig(t,
		pol("big", 5, time.Minute, entry("remote_address")),
		pol("small", 1, time.Minute, entry("generic_key", "small"), entry("user")),
	)
	rep := startReplica(t, redisconn.Config{Mode: redisconn.Cluster, Addrs: c.Addrs()}, cfg,
		limiter.Options{Timeout: 5 * time.Second, Prefix: prefix, DenyCacheMax: -1})
	// Find a user whose key is in another slot than the address's.
	ipKey := redisschema.Key(prefix, "rls/t/big", mustMatch(t, rep, "remote_address", "192.0.2.9"))
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer func() { _ = rdb.Close() }()
	slotOf := func(key string) int64 { return rdb.ClusterKeySlot(t.Context(), key).Val() }
	user := ""
	for i := 0; user == ""; i++ {
		u := "u" + strconv.Itoa(i)
		if slotOf(ipKey) != slotOf(redisschema.Key(prefix, "rls/t/small", mustMatch(t, rep, "generic_key", "small", "user", u))) {
			user = u
		}
	}
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("remote_address", "192.0.2.9"), desc("generic_key", "small", "user", user),
	}}
	if resp := ask(t, rep.client, req); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first request: %v", resp)
	}
	for i := range 3 {
		resp := ask(t, rep.client, req)
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.GetStatuses()[0].GetLimitRemaining() != 4 {
			t.Fatalf("denied request %d: %v (the address must keep 4 remaining)", i, resp)
		}
	}
	only := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "192.0.2.9")}}
	if resp := ask(t, rep.client, only); resp.GetStatuses()[0].GetLimitRemaining() != 3 {
		t.Fatalf("the address alone: %v, want remaining 3", resp)
	}
	if rep.lim.Stats().Undos == 0 {
		t.Fatal("no compensating undo ran: the keys shared a slot")
	}
}

// mustMatch is the client key the server derives for a descriptor.
func mustMatch(t *testing.T, rep *replica, kv ...string) string {
	t.Helper()
	ix := rep.srv.state.Load()
	d := desc(kv...)
	var keys, values []string
	for _, e := range d.GetEntries() {
		keys, values = append(keys, e.GetKey()), append(values, e.GetValue())
	}
	ms := ix.match(ix.domains["edge"], keys, values, nil)
	if len(ms) != 1 {
		t.Fatalf("%v matches %d policies", kv, len(ms))
	}
	return ms[0].client
}
