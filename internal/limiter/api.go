package limiter

import (
	"time"
)

// The types below are what the limiter's callers (the sidecar and the RLS
// server) exchange with it; the Limiter methods they call are listed at
// the end of the file.

// Algorithm selects how a rule counts requests.
type Algorithm string

const (
	// SlidingLog keeps one sorted-set member per admitted request: exact.
	SlidingLog Algorithm = "SlidingLog"
	// SlidingWindowCounter weights two fixed-window counters by the overlap
	// of the sliding window: O(1) memory per client, approximate.
	SlidingWindowCounter Algorithm = "SlidingWindowCounter"
)

// FailMode says what a rule does when Redis cannot answer in time.
type FailMode string

const (
	// FailOpen decides with a local in-memory fallback that enforces a
	// per-replica share of the limit.
	FailOpen FailMode = "Open"
	// FailClosed denies.
	FailClosed FailMode = "Closed"
)

// Source says which path produced a decision.
type Source string

// Sources of a Decision.
const (
	// SourceRedis means Redis decided, with the shared count.
	SourceRedis Source = "redis"
	// SourceFallback means Redis could not decide in time and the rule
	// fails open: the local fallback decided, with this replica's share.
	SourceFallback Source = "fallback"
	// SourceFailedClosed means the request was denied without a count:
	// Redis could not decide in time and the rule fails closed, or the
	// rule or the request is invalid (Decision.Err says which).
	SourceFailedClosed Source = "failed-closed"
	// SourceDenyCache means Redis reported the key exhausted for this rule
	// earlier, and its retry time has not come (see Options.DenyCacheMax).
	// A request denied this way asked Redis nothing; its other rules are
	// reported Allowed, uncounted.
	SourceDenyCache Source = "deny-cache"
)

// Rule is one limit: at most Limit admits in any sliding Window, per client.
type Rule struct {
	// ID identifies the rule in Redis keys; stable across limit changes so
	// that a reload keeps the counts (e.g. "<namespace>/<policy>").
	ID        string
	Limit     int64
	Window    time.Duration
	Algorithm Algorithm
	FailMode  FailMode
	// Replicas is how many sidecars share this rule's limit, for the
	// fail-open share ceil(Limit/Replicas); 0 means Options.Replicas.
	Replicas int
	// Durable makes an admit count only once a replica of the Redis
	// master has it (WAIT, once per round trip), so that a failover to
	// that replica cannot forget it; an admit no replica acknowledged in
	// time (Options.ReplicaWait) is taken back and decided by FailMode
	// (Decision.Err is ErrNotReplicated). Rules whose keys share a slot
	// are decided by one script: if one of them is durable, so are the
	// others' admits.
	Durable bool
	// Weighted makes Limit a cost per Window (tokens, bytes, …), not a
	// number of requests: a request costs its Hits, and Request.Op says
	// when the cost is counted. A SlidingLog key then keeps one member per
	// admit whatever its cost, and the window's sum beside it
	// (redisschema's weighted log), so its Remaining and RetryAfter are
	// exact in cost. Its keys are not a count rule's: switching a rule to
	// Weighted starts its clients afresh.
	Weighted bool
	// Variant tells apart the keys of several windows of one rule for one
	// client (a policy's additionalLimits): its keys are the rule's with
	// "@" and Variant after the hash tag, so they live in the same slot
	// and one script decides the windows of a request together, and the
	// fallback counts each window apart. "" (the rule's first window)
	// keeps the keys a rule had before it had variants, so counts survive
	// adding a window. Lower-case letters and digits, at most 16; not with
	// Weighted.
	Variant string
	// Calendar makes the rule a quota: at most Limit admits in each period
	// of the calendar (a day or a month in a time zone), counted apart.
	// Window and Algorithm are then ignored: the limiter sets the window to
	// the period's length. Its count is exact for every period whatever
	// Limit (one counter per client and period, not a log), and the period
	// is the one that holds Redis's clock, never the caller's. Its keys are
	// the rule's with "@", Variant, "." and the period's start in Unix ms;
	// each period's key expires with its period. Not with Weighted.
	Calendar Calendar
}

// MaxQuota bounds a calendar rule's Limit: a count stays a whole number in
// a Lua double (2^53) and in the fallback's float estimate with room to
// spare.
const MaxQuota = 1_000_000_000_000

// maxVariant bounds Rule.Variant (a window in milliseconds has at most 8
// digits).
const maxVariant = 16

// Op is what a request does to a Weighted rule.
type Op uint8

const (
	// OpDecide admits the request if its Hits (its cost, known when it
	// arrives) fit under the limit, all or nothing with its other rules.
	OpDecide Op = iota
	// OpCheck is for a cost known only from the response: the request is
	// admitted while the window's cost is under the limit, and counts
	// nothing (a later OpCharge counts it). Hits is ignored.
	OpCheck
	// OpCharge counts Hits when the response has ended, even past the
	// limit (the budget goes into debt, and later requests wait until
	// enough cost has left the window). Always Allowed, never undone when
	// another rule of the call denies, and never taken back when its reply
	// is lost (it counts once if Redis ran it).
	OpCharge
)

// Request asks whether one request of Client may pass Rule.
type Request struct {
	Rule   Rule
	Client string
	// DryRun requests are counted and decided, but their denial does not
	// stop the HTTP request (nor undo the admits of the other rules).
	DryRun bool
	// Hits is what the request costs in Rule: it is admitted only if all
	// of them fit, and then counts Hits times in every window. 0 means 1
	// (an HTTP request); above MaxHits the request is invalid (denied,
	// ErrInvalidRule), since each hit is one sorted-set member. For a
	// Weighted rule it is the cost, 0 to MaxCost, and 0 means 1 only for
	// OpDecide.
	Hits int64
	// Op is OpDecide, or for a Weighted rule OpCheck or OpCharge.
	Op Op

	// period is the start (Unix ms) of the period a calendar rule's
	// request is counted in (Limiter.inPeriods).
	period int64
}

// MaxHits bounds Request.Hits: a SlidingLog admit of Hits writes Hits
// sorted-set members in one script call.
const MaxHits = 1000

// MaxCost bounds the Hits of a Weighted rule's request (Envoy's own bound
// on hits_addend): one member whatever the cost, and a window's sum stays
// a whole number in a double up to millions of members at this cost.
const MaxCost = 1_000_000_000

// hits is what r adds when admitted: r.Hits with its default (none for a
// check).
func (r *Request) hits() int64 {
	switch {
	case r.Op == OpCheck:
		return 0
	case r.Hits == 0 && r.Op == OpDecide:
		return 1
	}
	return r.Hits
}

// needsOne reports whether r is admitted with room for exactly one: one
// hit, or a weighted check. A denial learned for it holds for any request
// but a charge until its retry time, and is exact for those needing one.
func (r *Request) needsOne() bool {
	return r.Op != OpCharge && (r.Op == OpCheck || r.hits() == 1)
}

// Decision is the answer for one Request.
type Decision struct {
	Allowed bool
	Limit   int64
	// Remaining admits in the current window after this decision.
	Remaining int64
	// RetryAfter is, for a denied request, the exact time until the next
	// admit can happen (0 when allowed).
	RetryAfter time.Duration
	// ResetAfter is the time until the window holds no admit of this client.
	ResetAfter time.Duration
	Source     Source
	// Err is the Redis error that sent the decision to the fallback or to
	// fail-closed; nil when Source is SourceRedis.
	Err error
}

// The Limiter type implements (exact signatures; the sidecar codes against them):
//
//	func New(rdb redis.UniversalClient, opts Options) (*Limiter, error)
//	func (l *Limiter) Decide(ctx context.Context, reqs []Request) []Decision
//	func (l *Limiter) Healthy() bool   // false while the circuit breaker is open
//	func (l *Limiter) Close() error
//
// Decide decides all the rules that one HTTP request must pass, together:
// one Decision per Request, in order. The HTTP request passes only if every
// Request with DryRun false is Allowed; when it does not pass, the admits it
// made in the other rules are undone (atomically in one script where the keys
// share a Redis Cluster slot, which is always the case on a standalone Redis;
// by a compensating call otherwise), so a request denied by one policy does
// not consume budget in the others.
