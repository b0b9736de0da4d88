package rls

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// statusView is what a test compares of one descriptor status.
type statusView struct {
	Code       rlsv3.RateLimitResponse_Code
	Name       string
	PerUnit    uint32
	Unit       rlsv3.RateLimitResponse_RateLimit_Unit
	Multiplier uint32
	Remaining  uint32
	ResetSecs  int64 // duration_until_reset rounded up to seconds
}

func view(resp *rlsv3.RateLimitResponse) []statusView {
	var out []statusView
	for _, s := range resp.GetStatuses() {
		v := statusView{Code: s.GetCode(), Remaining: s.GetLimitRemaining()}
		if l := s.GetCurrentLimit(); l != nil {
			v.Name, v.PerUnit, v.Unit, v.Multiplier = l.GetName(), l.GetRequestsPerUnit(), l.GetUnit(), l.GetUnitMultiplier().GetValue()
		}
		if d := s.GetDurationUntilReset(); d != nil {
			v.ResetSecs = int64((d.AsDuration() + time.Second - 1) / time.Second)
		}
		out = append(out, v)
	}
	return out
}

// TestStatusesAndHeaders sends what Envoy sends for a route with three
// rate_limits: remote_address; generic_key "api" + request_headers
// x-user as "user"; and a generic_key no policy matches.
func TestStatusesAndHeaders(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	cfg := writeConfig(t,
		pol("api-user", 2, 90*time.Second, entry("generic_key", "api"), entry("user")),
		pol("per-ip", 3, time.Minute, entry("remote_address")),
	)
	c := startReplica(t, standaloneConfig(r.Addr), cfg, limiter.Options{Timeout: 5 * time.Second}).client
	req := func(user string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("remote_address", "10.0.0.1"),
			desc("generic_key", "api", "user", user),
			desc("generic_key", "other"),
		}}
	}
	ip := func(code rlsv3.RateLimitResponse_Code, rem uint32) statusView {
		return statusView{Code: code, Name: "t/per-ip", PerUnit: 3, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, Remaining: rem, ResetSecs: 60}
	}
	user := func(code rlsv3.RateLimitResponse_Code, rem uint32) statusView {
		return statusView{Code: code, Name: "t/api-user", PerUnit: 2, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND, Multiplier: 90, Remaining: rem, ResetSecs: 90}
	}
	steps := []struct {
		req     *rlsv3.RateLimitRequest
		overall rlsv3.RateLimitResponse_Code
		want    []statusView
		headers map[string]string
	}{
		{req("alice"), ok, []statusView{ip(ok, 2), user(ok, 1), {Code: ok}}, map[string]string{
			"RateLimit-Policy": `"t/per-ip";q=3;w=60, "t/api-user";q=2;w=90`,
			"RateLimit":        `"t/per-ip";r=2;t=60, "t/api-user";r=1;t=90`,
		}},
		{req("alice"), ok, []statusView{ip(ok, 1), user(ok, 0), {Code: ok}}, map[string]string{
			"RateLimit-Policy": `"t/per-ip";q=3;w=60, "t/api-user";q=2;w=90`,
			"RateLimit":        `"t/per-ip";r=1;t=60, "t/api-user";r=0;t=90`,
		}},
		// alice is out of budget: the request is denied and its per-ip
		// admit undone (remaining stays 1: all or nothing).
		{req("alice"), over, []statusView{ip(ok, 1), user(over, 0), {Code: ok}}, map[string]string{
			"Retry-After":      "90",
			"RateLimit-Policy": `"t/api-user";q=2;w=90`,
			"RateLimit":        `"t/api-user";r=0;t=90`,
		}},
		{&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "10.0.0.1")}},
			ok, []statusView{ip(ok, 0)}, map[string]string{
				"RateLimit-Policy": `"t/per-ip";q=3;w=60`,
				"RateLimit":        `"t/per-ip";r=0;t=60`,
			}},
		// bob has his own api-user bucket, but the address is exhausted.
		// bob's window stays empty: nothing to reset.
		{req("bob"), over, []statusView{ip(over, 0), {Code: ok, Name: "t/api-user", PerUnit: 2, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND, Multiplier: 90, Remaining: 2}, {Code: ok}}, map[string]string{
			"Retry-After":      "60",
			"RateLimit-Policy": `"t/per-ip";q=3;w=60`,
			"RateLimit":        `"t/per-ip";r=0;t=60`,
		}},
		// Both of alice's limits deny: the answer is the longer wait (the
		// first descriptor's would have her denied again after 60 s).
		{req("alice"), over, []statusView{ip(over, 0), user(over, 0), {Code: ok}}, map[string]string{
			"Retry-After":      "90",
			"RateLimit-Policy": `"t/api-user";q=2;w=90`,
			"RateLimit":        `"t/api-user";r=0;t=90`,
		}},
	}
	for i, s := range steps {
		resp := ask(t, c, s.req)
		if resp.GetOverallCode() != s.overall {
			t.Errorf("step %d: overall %v, want %v", i, resp.GetOverallCode(), s.overall)
		}
		if d := cmp.Diff(s.want, view(resp)); d != "" {
			t.Errorf("step %d: statuses (-want +got):\n%s", i, d)
		}
		if d := cmp.Diff(s.headers, headerMap(resp)); d != "" {
			t.Errorf("step %d: headers (-want +got):\n%s", i, d)
		}
	}
}

// TestDenyCacheStatuses: once a request is denied from the deny cache,
// Redis is not asked about its other limits; their descriptors are OK
// without a limit, not "remaining 0, reset now" (Envoy would put that in
// its X-RateLimit-* headers of the 429).
func TestDenyCacheStatuses(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	cfg := writeConfig(t,
		pol("per-ip", 100, time.Minute, entry("remote_address")),
		pol("per-user", 1, time.Minute, entry("user")),
	)
	rep := startReplica(t, standaloneConfig(r.Addr), cfg, limiter.Options{Timeout: 5 * time.Second})
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("remote_address", "10.0.0.1"), desc("user", "alice"),
	}}
	user := statusView{Code: over, Name: "t/per-user", PerUnit: 1, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, ResetSecs: 60}
	ask(t, rep.client, req) // admitted: alice's one request
	if got := view(ask(t, rep.client, req)); got[1].Code != over {
		t.Fatalf("second request (Redis denies): %v", got)
	}
	before := rep.lim.Stats().DenyCache
	got := view(ask(t, rep.client, req))
	if rep.lim.Stats().DenyCache == before {
		t.Fatal("the third request was not answered by the deny cache; this test needs it")
	}
	if d := cmp.Diff([]statusView{{Code: ok}, user}, got); d != "" {
		t.Errorf("statuses from the deny cache (-want +got):\n%s", d)
	}
}

// TestUnmatched: an unknown domain, or descriptors no policy matches
// (another shape, another fixed value), are OK without a limit.
func TestUnmatched(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	cfg := writeConfig(t, pol("api", 1, time.Minute, entry("generic_key", "api")))
	c := startReplica(t, standaloneConfig(r.Addr), cfg, limiter.Options{Timeout: 5 * time.Second}).client
	for _, req := range []*rlsv3.RateLimitRequest{
		{Domain: "other", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("generic_key", "api")}},
		{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("generic_key", "web"), desc("generic_key", "api", "user", "a")}},
	} {
		for range 3 { // over the limit of 1 if anything counted
			resp := ask(t, c, req)
			if resp.GetOverallCode() != ok || len(resp.GetStatuses()) != len(req.GetDescriptors()) || len(resp.GetResponseHeadersToAdd()) != 0 {
				t.Fatalf("%v: %v", req, resp)
			}
			for _, s := range resp.GetStatuses() {
				if s.GetCode() != ok || s.GetCurrentLimit() != nil {
					t.Fatalf("%v: status %v", req, s)
				}
			}
		}
	}
}

// TestHitsAddend: the request's hits_addend, a descriptor's own overriding
// it, and two descriptors of one request matching the same (policy,
// client) adding up in one decision.
func TestHitsAddend(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	cfg := writeConfig(t, pol("h", 10, time.Minute, entry("generic_key", "h")))
	c := startReplica(t, standaloneConfig(r.Addr), cfg, limiter.Options{Timeout: 5 * time.Second}).client
	withHits := func(d *ratelimitv3.RateLimitDescriptor, h uint64) *ratelimitv3.RateLimitDescriptor {
		d.HitsAddend = wrapperspb.UInt64(h)
		return d
	}
	steps := []struct {
		req     *rlsv3.RateLimitRequest
		overall rlsv3.RateLimitResponse_Code
		rem     []uint32
	}{
		{&rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 4, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("generic_key", "h")}}, ok, []uint32{6}},
		{&rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 4, Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(desc("generic_key", "h"), 5)}}, ok, []uint32{1}},
		// 1+1 hits on one key: 2 > 1 left, both statuses over, nothing counted.
		{&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("generic_key", "h"), desc("generic_key", "h")}}, over, []uint32{1, 1}},
		{&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("generic_key", "h")}}, ok, []uint32{0}},
	}
	for i, s := range steps {
		resp := ask(t, c, s.req)
		var rem []uint32
		for _, st := range resp.GetStatuses() {
			rem = append(rem, st.GetLimitRemaining())
		}
		if resp.GetOverallCode() != s.overall || !cmp.Equal(rem, s.rem) {
			t.Fatalf("step %d: overall %v remaining %v, want %v %v", i, resp.GetOverallCode(), rem, s.overall, s.rem)
		}
	}
}

// TestCostPolicies: a cost policy (spec.cost) served through the real gRPC
// server, as Envoy Gateway calls it for a token limit: the request's
// descriptor with hits_addend 0 checks (admitted while under the limit,
// counting nothing), the after-stream call's descriptor with the response
// cost charges it even past the limit, and then the check is denied until
// the debt has left. Paired with a count policy, where hits_addend 0 is
// today's 1: ten checks count ten.
func TestCostPolicies(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	charged := pol("tokens", 1000, time.Minute, entry("generic_key", "llm"), entry("user"))
	charged.Cost = &rlsconfig.Cost{Response: &rlsconfig.ResponseCost{}}
	known := pol("known", 1000, time.Minute, entry("generic_key", "known"), entry("user"))
	known.Cost = &rlsconfig.Cost{Request: &rlsconfig.RequestCost{}}
	count := pol("count", 10, time.Minute, entry("generic_key", "count"), entry("user"))
	cfg := writeConfig(t, count, known, charged) // sorted by id
	c := startReplica(t, standaloneConfig(r.Addr), cfg, limiter.Options{Timeout: 5 * time.Second, DenyCacheMax: -1}).client
	call := func(key string, hits *uint64) *rlsv3.RateLimitResponse {
		d := desc("generic_key", key, "user", "alice")
		if hits != nil {
			d.HitsAddend = wrapperspb.UInt64(*hits)
		}
		return ask(t, c, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	}
	n := func(v uint64) *uint64 { return &v }
	steps := []struct {
		key     string
		hits    *uint64
		overall rlsv3.RateLimitResponse_Code
		rem     uint32
	}{
		{"llm", n(0), ok, 1000},    // check: nothing counted
		{"llm", n(0), ok, 1000},    // again
		{"llm", n(600), ok, 400},   // the after-stream charge
		{"llm", n(0), ok, 400},     // under the limit: admitted
		{"llm", n(700), ok, 0},     // charged past the limit: 300 in debt
		{"llm", n(0), over, 0},     // the check is now denied
		{"llm", nil, over, 0},      // unset: a decide of 1, denied too
		{"known", n(600), ok, 400}, // a request cost: admitted if it fits
		{"known", n(500), over, 400},
		{"known", n(0), ok, 400},
		{"count", n(0), ok, 9}, // a count policy: 0 is 1, as before
	}
	for i, s := range steps {
		resp := call(s.key, s.hits)
		if resp.GetOverallCode() != s.overall || resp.GetStatuses()[0].GetLimitRemaining() != s.rem {
			hits := "unset"
			if s.hits != nil {
				hits = strconv.FormatUint(*s.hits, 10)
			}
			t.Fatalf("step %d (%s, hits %s): overall %v remaining %d, want %v %d", i, s.key, hits, resp.GetOverallCode(), resp.GetStatuses()[0].GetLimitRemaining(), s.overall, s.rem)
		}
		if s.overall == over {
			if d := resp.GetStatuses()[0].GetDurationUntilReset(); s.key == "llm" && (d == nil || d.AsDuration() <= 0 || d.AsDuration() > time.Minute) {
				t.Fatalf("step %d: duration until reset %v, want the retry within the window", i, d)
			}
		}
	}
	for range 9 {
		call("count", n(0))
	}
	if resp := call("count", n(0)); resp.GetOverallCode() != over {
		t.Fatalf("the count policy's 11th call of hits_addend 0: %v, want OVER_LIMIT (0 counts 1)", resp.GetOverallCode())
	}
}

// TestBadRequests: malformed or oversized requests get InvalidArgument with
// a message saying what is wrong, and nothing is counted. (Too many hits
// are OVER_LIMIT instead: TestCallBound.)
func TestBadRequests(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	cfg := writeConfig(t, pol("any", 1000, time.Minute, entry("k")))
	c := startReplica(t, standaloneConfig(r.Addr), cfg, limiter.Options{Timeout: 5 * time.Second}).client
	many := func(n int, mk func() *ratelimitv3.RateLimitDescriptor) []*ratelimitv3.RateLimitDescriptor {
		var ds []*ratelimitv3.RateLimitDescriptor
		for range n {
			ds = append(ds, mk())
		}
		return ds
	}
	one := func(d *ratelimitv3.RateLimitDescriptor) []*ratelimitv3.RateLimitDescriptor {
		return []*ratelimitv3.RateLimitDescriptor{d}
	}
	manyEntries := &ratelimitv3.RateLimitDescriptor{}
	for range MaxEntries + 1 {
		manyEntries.Entries = append(manyEntries.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	cases := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{"empty domain", &rlsv3.RateLimitRequest{Descriptors: one(desc("k", "v"))}, "domain is required"},
		{"long domain", &rlsv3.RateLimitRequest{Domain: strings.Repeat("d", 257), Descriptors: one(desc("k", "v"))}, "domain longer than 256"},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "edge"}, "at least one descriptor"},
		{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: many(MaxDescriptors+1, func() *ratelimitv3.RateLimitDescriptor { return desc("k", "v") })}, "65 descriptors"},
		{"no entries", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: one(&ratelimitv3.RateLimitDescriptor{})}, "descriptor 0: no entries"},
		{"too many entries", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: one(manyEntries)}, "33 entries"},
		{"empty key", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: one(desc("", "v"))}, "key must have 1 to 256"},
		{"long key", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: one(desc(strings.Repeat("k", 257), "v"))}, "key must have 1 to 256"},
		{"huge value", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: one(desc("k", strings.Repeat("v", MaxValueBytes+1)))}, "value longer than 65536"},
		{"negative hits", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: one(&ratelimitv3.RateLimitDescriptor{
			Entries: desc("k", "v").Entries, IsNegativeHits: true})}, "is_negative_hits is not supported"},
	}
	for _, tc := range cases {
		_, err := c.ShouldRateLimit(context.Background(), tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
			t.Errorf("%s: %v, want InvalidArgument containing %q", tc.name, err, tc.want)
		}
	}
	// A value of exactly the bound is served, and nothing above counted.
	resp := ask(t, c, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: one(desc("k", "v"))})
	if rem := resp.GetStatuses()[0].GetLimitRemaining(); rem != 999 {
		t.Errorf("remaining %d after the bad requests, want 999", rem)
	}
	resp = ask(t, c, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: one(desc("k", strings.Repeat("v", MaxValueBytes)))})
	if resp.GetOverallCode() != ok || resp.GetStatuses()[0].GetLimitRemaining() != 999 {
		t.Errorf("largest value: %v", resp)
	}
}

// TestNoConfigYet: a server whose config never loaded answers UNAVAILABLE
// (and is not ready), so the gateway applies its own failure mode.
func TestNoConfigYet(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	rdb, err := redisconn.NewClient(standaloneConfig(r.Addr))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rdb.Close() }()
	lim, err := limiter.New(rdb, limiter.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lim.Close() }()
	s := New(lim, Options{ConfigFile: writeConfig(t) + ".bad"})
	_, err = s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "v")}})
	if status.Code(err) != codes.Unavailable || s.Ready() {
		t.Fatalf("before any load: %v, ready %v", err, s.Ready())
	}
	// The file is missing: no policies, ready, everything OK.
	if err := s.Reload(); err != nil || !s.Ready() {
		t.Fatalf("missing file: %v, ready %v", err, s.Ready())
	}
}
