package rls

import (
	"context"
	"strconv"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// members is what Redis holds for the limiter: sorted-set members (one per
// SlidingLog admit) over all keys but the replicas' presence.
func members(t *testing.T, addr string) int64 {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer func() { _ = rdb.Close() }()
	ctx := context.Background()
	var n int64
	iter := rdb.Scan(ctx, 0, "*", 100).Iterator()
	for iter.Next(ctx) {
		if typ, err := rdb.Type(ctx, iter.Val()).Result(); err != nil || typ != "zset" {
			continue
		}
		c, err := rdb.ZCard(ctx, iter.Val()).Result()
		if err != nil {
			t.Fatal(err)
		}
		n += c
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCallBound (issue 22): what one call adds to Redis is bounded by
// MaxCallHits, its hits summed over every (policy, client) pair. Above
// the bound the call is OVER_LIMIT wherever an enforced policy matched,
// and writes nothing; at the bound it is decided as usual. Before, one
// call of 64 descriptors of distinct values at 1000 hits wrote 64,000
// members that lived for the window (a day here), and a hits_addend above
// 1000 got INVALID_ARGUMENT, which Envoy's default failure_mode_deny
// (false) lets through uncounted.
func TestCallBound(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	daily := pol("per-ip", 1_000_000, 24*time.Hour, entry("remote_address"))
	dry := pol("dry", 1_000_000, 24*time.Hour, entry("generic_key"))
	dry.Mode = "DryRun"
	c := startReplica(t, standaloneConfig(r.Addr), writeConfig(t, dry, daily), limiter.Options{Timeout: 5 * time.Second}).client
	ips := func(n int, prefix string, hits uint64) []*ratelimitv3.RateLimitDescriptor {
		var ds []*ratelimitv3.RateLimitDescriptor
		for i := range n {
			d := desc("remote_address", prefix+strconv.Itoa(i))
			if hits > 0 {
				d.HitsAddend = wrapperspb.UInt64(hits)
			}
			ds = append(ds, d)
		}
		return ds
	}
	var written int64
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		// over: the answer is OVER_LIMIT; added: members written.
		over  bool
		added int64
	}{
		{"64 clients × 1000 hits", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1000, Descriptors: ips(64, "10.1.0.", 0)}, true, 0},
		{"64 clients × 1000 hits, per descriptor", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ips(64, "10.2.0.", 1000)}, true, 0},
		{"one client, hits above the bound", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: MaxCallHits + 1, Descriptors: ips(1, "10.3.0.", 0)}, true, 0},
		{"one client, hits of 2^64-1", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ips(1, "10.4.0.", 1<<64-1)}, true, 0},
		{"one client twice, 600 + 600", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 600, Descriptors: append(ips(1, "10.5.0.", 0), ips(1, "10.5.0.", 0)...)}, true, 0},
		{"at the bound: 10 clients × 100", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 100, Descriptors: ips(10, "10.6.0.", 0)}, false, MaxCallHits},
		{"at the bound: one client × 1000", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: MaxCallHits, Descriptors: ips(1, "10.7.0.", 0)}, false, MaxCallHits},
		{"descriptors no policy matches", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1 << 30, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("other", "x")}}, false, 0},
		{"only a DryRun policy matched", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 5000, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("generic_key", "x")}}, false, 0},
	} {
		resp := ask(t, c, tc.req)
		if got := resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT; got != tc.over {
			t.Errorf("%s: overall %v", tc.name, resp.GetOverallCode())
		}
		if len(resp.GetStatuses()) != len(tc.req.GetDescriptors()) {
			t.Fatalf("%s: %d statuses for %d descriptors", tc.name, len(resp.GetStatuses()), len(tc.req.GetDescriptors()))
		}
		for i, st := range resp.GetStatuses() {
			if tc.over && (st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetCurrentLimit().GetRequestsPerUnit() != 1_000_000) {
				t.Errorf("%s: status %d: %v", tc.name, i, st)
			}
		}
		now := members(t, r.Addr)
		if now-written != tc.added {
			t.Errorf("%s: %d members written, want %d", tc.name, now-written, tc.added)
		}
		written = now
	}
}
