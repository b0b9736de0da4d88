// Package rls serves Envoy's rate limit service (RLS v3,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) from the
// exact limiter: the descriptors of one request are matched against the
// policies of its domain (rlsconfig), and every matched (policy, client)
// pair is decided in one limiter.Decide call, all or nothing.
package rls

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/ratelimitheader"
	"github.com/slidegate/slidegate/internal/rlsconfig"
)

// Bounds of one request. Envoy's descriptors are built from a route's rate
// limit actions: a few descriptors of a few entries each. Values are hashed
// into client keys, so their size only costs hashing; the bound is above
// Envoy's default header size limit (60 KiB), so no value a gateway
// forwards is refused.
const (
	MaxDescriptors = 64
	MaxEntries     = 32
	MaxKeyBytes    = 256
	MaxValueBytes  = 64 << 10
	MaxDomainBytes = 256
	// MaxHits is the limiter's bound on the hits of one (policy, client)
	// pair in one decision.
	MaxHits = limiter.MaxHits
	// MaxCallHits bounds what one call may add to Redis: its hits summed
	// over every (policy, client) pair its descriptors matched (a pair
	// matched by n descriptors counts their n hits). Each hit of a
	// SlidingLog policy is one sorted-set member that lives for the window
	// (a day for a daily policy); a SlidingWindowCounter adds to a counter
	// instead, and counts the same here. Without it one call of 64
	// descriptors of distinct values at 1000 hits wrote 64,000 members. A
	// call above it is answered OVER_LIMIT (see tooLarge) and decides and
	// counts nothing. It equals MaxHits: a call may cost what one maximal
	// request to one policy costs.
	MaxCallHits = limiter.MaxHits
)

// Server implements RateLimitServiceServer. Its config is swapped
// atomically by Reload; a request sees one config throughout.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer

	lim     enforce.Decider
	state   atomic.Pointer[index]
	peers   atomic.Int64 // RLS replicas counted through Redis; 0: unknown
	metrics *metrics
	log     *slog.Logger
	opts    Options
	loader  loader
}

// New returns a server deciding with lim. It serves nothing until the
// first Reload succeeds (see Ready).
func New(lim enforce.Decider, opts Options) *Server {
	opts = opts.withDefaults()
	s := &Server{lim: lim, opts: opts, log: opts.Logger}
	s.metrics = newMetrics(func() float64 {
		if lim.Healthy() {
			return 0
		}
		return 1
	})
	return s
}

// Ready reports whether a config is loaded.
func (s *Server) Ready() bool { return s.state.Load() != nil }

// Loaded is the document in force and its revision (nil before the first
// load), for rlsconfig.LoadedHandler: the controller reports a policy
// Enforced once every ready server loaded it.
func (s *Server) Loaded() (*rlsconfig.Config, string) {
	ix := s.state.Load()
	if ix == nil {
		return nil, ""
	}
	return ix.cfg, ix.revision
}

// descriptor is one request descriptor, checked, with the (policy, client)
// pairs it matched (indexes into the decided requests), and the first
// enforced (not DryRun) policy it matched, if any.
type descriptor struct {
	pairs    []int
	enforced *policy
}

// ShouldRateLimit decides one request of Envoy's rate limit filter.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := validate(req); err != nil {
		s.metrics.answered.invalid.Inc()
		return nil, err
	}
	ix := s.state.Load()
	if ix == nil {
		s.metrics.answered.noConfig.Inc()
		return nil, status.Error(codes.Unavailable, "slidegate rls: no config loaded yet")
	}
	reqs, pols, descs, tooLarge := s.gather(ix, req)
	if tooLarge {
		s.metrics.answered.tooLarge.Inc()
		return s.tooLarge(descs), nil
	}
	var ds []limiter.Decision
	if len(reqs) > 0 {
		start := time.Now()
		ds = s.lim.Decide(ctx, reqs)
		s.metrics.decisions.DecisionSeconds.Observe(time.Since(start).Seconds())
	}
	resp := s.answer(reqs, pols, descs, ds)
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		s.metrics.answered.overLimit.Inc()
	} else {
		s.metrics.answered.ok.Inc()
	}
	return resp, nil
}

// validate checks the request's shape and bounds.
func validate(req *rlsv3.RateLimitRequest) error {
	switch {
	case req.GetDomain() == "":
		return status.Error(codes.InvalidArgument, "domain is required")
	case len(req.GetDomain()) > MaxDomainBytes:
		return status.Errorf(codes.InvalidArgument, "domain longer than %d bytes", MaxDomainBytes)
	case len(req.GetDescriptors()) == 0:
		return status.Error(codes.InvalidArgument, "at least one descriptor is required")
	case len(req.GetDescriptors()) > MaxDescriptors:
		return status.Errorf(codes.InvalidArgument, "%d descriptors, at most %d", len(req.GetDescriptors()), MaxDescriptors)
	}
	// Hits are not refused here: an error lets the request through
	// uncounted on a gateway left at failure_mode_deny false (Envoy's
	// default), so a request that costs too much is answered OVER_LIMIT
	// instead (MaxCallHits).
	for i, d := range req.GetDescriptors() {
		if err := validateDescriptor(d); err != nil {
			return status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
		}
	}
	return nil
}

func validateDescriptor(d *ratelimitv3.RateLimitDescriptor) error {
	es := d.GetEntries()
	switch {
	case len(es) == 0:
		return fmt.Errorf("no entries")
	case len(es) > MaxEntries:
		return fmt.Errorf("%d entries, at most %d", len(es), MaxEntries)
	case d.GetIsNegativeHits():
		// Sliding-log admits are requests that happened; giving budget
		// back by hand would make the window's count a fiction.
		return fmt.Errorf("is_negative_hits is not supported")
	}
	for j, e := range es {
		if e.GetKey() == "" || len(e.GetKey()) > MaxKeyBytes {
			return fmt.Errorf("entry %d: key must have 1 to %d bytes", j, MaxKeyBytes)
		}
		if len(e.GetValue()) > MaxValueBytes {
			return fmt.Errorf("entry %d (%q): value longer than %d bytes", j, e.GetKey(), MaxValueBytes)
		}
	}
	return nil
}

// hitsOf is what descriptor d costs a count policy: its own hits_addend
// when set, else the request's; 0 (unset, or Envoy's filter-state override
// of 0) is 1, since a count policy only decides requests that count.
// Anything above MaxCallHits is MaxCallHits+1: too much for a call in any
// case.
func hitsOf(req *rlsv3.RateLimitRequest, d *ratelimitv3.RateLimitDescriptor) int64 {
	h := uint64(req.GetHitsAddend())
	if v := d.GetHitsAddend(); v != nil {
		h = v.GetValue()
	}
	return int64(min(max(h, 1), MaxCallHits+1)) //nolint:gosec // clamped
}

// costOf is what descriptor d does to a cost policy p (spec.cost), as
// Envoy and Envoy Gateway send it (docs/rls.md):
//   - the descriptor's hits_addend set to 0: a check, admitted while the
//     window's cost is under the limit, counting nothing (Envoy Gateway's
//     request cost of 0; unlike the request-level field, the descriptor's
//     is a UInt64Value, so a 0 there is told from unset);
//   - set above 0, for a policy charged after the response: a charge,
//     counted even past the limit (Envoy's apply_on_stream_done call,
//     which nothing else in the message marks);
//   - otherwise a decide of the descriptor's, else the request's,
//     hits_addend (unset or 0: 1).
//
// A cost above limiter.MaxCost is decided as it is (the limiter refuses
// it: denied) and charged as MaxCost.
func costOf(req *rlsv3.RateLimitRequest, d *ratelimitv3.RateLimitDescriptor, p *policy) (limiter.Op, int64) {
	v := d.GetHitsAddend()
	switch {
	case v != nil && v.GetValue() == 0:
		return limiter.OpCheck, 0
	case v != nil && p.chargedAfter:
		return limiter.OpCharge, int64(min(v.GetValue(), limiter.MaxCost))
	case v != nil:
		return limiter.OpDecide, int64(min(v.GetValue(), limiter.MaxCost+1)) //nolint:gosec // clamped
	}
	return limiter.OpDecide, int64(max(req.GetHitsAddend(), 1))
}

// gather matches every descriptor and builds the limiter requests: one per
// distinct (policy, client) pair, whose hits sum over the descriptors that
// matched it (the same key twice in one Decide would be checked twice
// against the same count). tooLarge: the hits add up to more than
// MaxCallHits; then no request is built, and descs say only which enforced
// policy each descriptor matched.
func (s *Server) gather(ix *index, req *rlsv3.RateLimitRequest) (reqs []limiter.Request, pols []*policy, descs []descriptor, tooLarge bool) {
	descs = make([]descriptor, len(req.GetDescriptors()))
	shapes := ix.domains[req.GetDomain()]
	if shapes == nil {
		return nil, nil, descs, false // unknown domain: nothing limits it
	}
	replicas := int(s.peers.Load())
	var keys, values []string
	var ms []matched
	var total int64
	for i, d := range req.GetDescriptors() {
		keys, values = keys[:0], values[:0]
		for _, e := range d.GetEntries() {
			keys, values = append(keys, e.GetKey()), append(values, e.GetValue())
		}
		ms = ix.match(shapes, keys, values, ms[:0])
		for _, m := range ms {
			if !m.p.dryRun {
				descs[i].enforced = m.p
				break
			}
		}
		h := hitsOf(req, d)
		// At most MaxCallHits+1 per pair and a bounded number of pairs
		// per descriptor: no overflow. A cost policy's pair writes one
		// member whatever its cost: it counts 1 here.
		for _, m := range ms {
			if m.p.rule.Weighted {
				total++
			} else {
				total += h * int64(1+len(m.p.windows))
			}
		}
		if tooLarge = tooLarge || total > MaxCallHits; tooLarge {
			continue // only which policies the rest matched
		}
		for _, m := range ms {
			op, hits := limiter.OpDecide, h
			if m.p.rule.Weighted {
				op, hits = costOf(req, d, m.p)
			}
			var k int
			reqs, pols, k = addPair(reqs, pols, m, op, hits, replicas)
			descs[i].pairs = append(descs[i].pairs, k)
			for _, w := range m.p.windows {
				reqs, pols, k = addPair(reqs, pols, matched{p: w, client: m.client}, op, hits, replicas)
				descs[i].pairs = append(descs[i].pairs, k)
			}
		}
	}
	if tooLarge {
		return nil, nil, descs, true
	}
	return reqs, pols, descs, false
}

// addPair adds a matched (policy, client) pair of op and hits to the
// requests and returns its index: the hits add to the request of the same
// pair and op when there is one, else the pair is a new request.
func addPair(reqs []limiter.Request, pols []*policy, m matched, op limiter.Op, hits int64, replicas int) ([]limiter.Request, []*policy, int) {
	for k := range reqs {
		if pols[k] == m.p && reqs[k].Client == m.client && reqs[k].Op == op {
			// A cost above MaxCost stays above it (refused).
			reqs[k].Hits = min(reqs[k].Hits+hits, limiter.MaxCost+1)
			if op == limiter.OpCharge {
				reqs[k].Hits = min(reqs[k].Hits, limiter.MaxCost)
			}
			return reqs, pols, k
		}
	}
	rule := m.p.rule
	rule.Replicas = replicas
	reqs = append(reqs, limiter.Request{Rule: rule, Client: m.client, DryRun: m.p.dryRun, Hits: hits, Op: op})
	return reqs, append(pols, m.p), len(reqs) - 1
}

// policyPair is the pair of the policy whose additional window is pair k:
// the same client and op (gather adds it before its windows' pairs).
func policyPair(reqs []limiter.Request, pols []*policy, k int) int {
	for j := range k {
		if pols[j] == pols[k].of && reqs[j].Client == reqs[k].Client && reqs[j].Op == reqs[k].Op {
			return j
		}
	}
	return k
}

// tooLarge answers a call whose hits add up to more than MaxCallHits: each
// descriptor that matched an enforced policy is OVER_LIMIT with that
// policy's limit (no reset time: waiting does not make the call fit), the
// others OK; nothing was decided or counted. Not INVALID_ARGUMENT: Envoy
// turns an error into its failure_mode_deny choice, which by default lets
// the request through uncounted, so a client able to raise the hits
// (hits_addend from a request header or body) would pass every limit.
func (s *Server) tooLarge(descs []descriptor) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(descs)),
	}
	for i, d := range descs {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		if d.enforced != nil {
			st.Code, st.CurrentLimit = rlsv3.RateLimitResponse_OVER_LIMIT, d.enforced.limit
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		resp.Statuses[i] = st
	}
	return resp
}

// answer builds the response from the decisions: a descriptor is
// OVER_LIMIT when an enforced policy it matched denied; its current_limit
// is that policy's (the longest wait if several denied), or else the
// enforced policy with the least remaining.
// A descriptor that matched no enforced policy is OK without a limit.
func (s *Server) answer(reqs []limiter.Request, pols []*policy, descs []descriptor, ds []limiter.Decision) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(descs)),
	}
	// The refusal that answers for the request is the one with the longest
	// wait, as in the sidecar: a client that obeys Retry-After is then not
	// denied again by another of the limits.
	v := enforce.Sum(reqs, ds)
	deny := v.Refusal(ds)
	// A policy with additional windows has a pair per window for a client:
	// the gravest of their outcomes counts, once, as the policy's.
	var outcomes map[int]enforce.Outcome
	s.metrics.decisions.Record(reqs, ds, &v, func(k int, o enforce.Outcome) {
		p := pols[k]
		if p.of == nil && len(p.windows) == 0 {
			p.counters.Inc(o)
			return
		}
		if outcomes == nil {
			outcomes = map[int]enforce.Outcome{}
		}
		if p.of != nil {
			k = policyPair(reqs, pols, k)
		}
		if cur, ok := outcomes[k]; ok {
			o = enforce.Graver(cur, o)
		}
		outcomes[k] = o
	})
	for k, o := range outcomes {
		p := pols[k]
		if p.of != nil {
			p = p.of // only if policyPair found no pair of the policy
		}
		p.counters.Inc(o)
	}
	for i, d := range descs {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		pick := -1
		for _, k := range d.pairs {
			// A pair the deny cache left undecided (allowed, uncounted)
			// knows neither remaining nor reset; reporting 0 for them
			// would be Envoy's X-RateLimit-* headers of a 429.
			if reqs[k].DryRun || (ds[k].Allowed && ds[k].Source == limiter.SourceDenyCache) {
				continue
			}
			switch {
			case !ds[k].Allowed:
				if pick < 0 || ds[pick].Allowed || ds[k].RetryAfter > ds[pick].RetryAfter {
					pick = k
				}
			case pick < 0 || (ds[pick].Allowed && ds[k].Remaining < ds[pick].Remaining):
				pick = k
			}
		}
		if pick < 0 {
			continue
		}
		dec := &ds[pick]
		st.CurrentLimit = pols[pick].limit
		st.LimitRemaining = uint32(min(max(dec.Remaining, 0), 1<<32-1)) //nolint:gosec // clamped
		wait := dec.ResetAfter
		if !dec.Allowed {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			wait = dec.RetryAfter
		}
		st.DurationUntilReset = durationpb.New(wait)
	}
	resp.ResponseHeadersToAdd = headers(reqs, pols, ds, deny)
	return resp
}

// headers are the sidecar's header fields (ratelimitheader): on a denial,
// Retry-After and the denying policy; otherwise every enforced policy with
// its remaining quota.
func headers(reqs []limiter.Request, pols []*policy, ds []limiter.Decision, deny int) []*corev3.HeaderValue {
	if deny >= 0 {
		d := &ds[deny]
		return []*corev3.HeaderValue{
			{Key: ratelimitheader.RetryAfter, Value: ratelimitheader.RetryAfterSeconds(d.RetryAfter)},
			{Key: ratelimitheader.Policy, Value: pols[deny].policyItem},
			{Key: ratelimitheader.RateLimit, Value: ratelimitheader.DeniedItem(pols[deny].nameItem, d.RetryAfter)},
		}
	}
	var f ratelimitheader.Fields
	for k := range reqs {
		if !reqs[k].DryRun {
			f.Add(pols[k].nameItem, pols[k].policyItem, ds[k].Remaining, ds[k].ResetAfter)
		}
	}
	if f.Len() == 0 {
		return nil
	}
	return []*corev3.HeaderValue{
		{Key: ratelimitheader.Policy, Value: f.Policy()},
		{Key: ratelimitheader.RateLimit, Value: f.RateLimit()},
	}
}

func wrapUint32(v uint32) *wrapperspb.UInt32Value { return wrapperspb.UInt32(v) }
