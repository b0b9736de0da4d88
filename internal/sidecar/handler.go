package sidecar

import (
	"context"
	"net/http"
	"time"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/ratelimitheader"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// ServeHTTP is the proxied port: decide every matching policy of the request
// in one limiter call, then forward the request to the application or answer
// it (429 over a limit, 503 when a fail-closed policy cannot be decided).
func (s *Sidecar) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.inflight.Add(1)
	s.metrics.inflight.Inc()
	defer func() {
		s.metrics.inflight.Dec()
		s.inflight.Done()
	}()

	st := s.state.Load()
	if st == nil {
		s.reply(w, s.metrics.responses.WithLabelValues(outcomeNoConfig), noConfigAnswer)
		return
	}
	var policyBuf [8]*policy // on the stack for the usual few policies
	reqs, pols, refused := s.gather(st, r, policyBuf[:0])
	if refused.policy != nil {
		// Refused before asking Redis: nothing is counted anywhere.
		if refused.ambiguous {
			s.reply(w, s.respBadRequest, ambiguousKeyAnswer(refused.policy))
		} else {
			s.reply(w, s.respRejected, missingKeyAnswer(refused.policy))
		}
		return
	}
	if len(reqs) == 0 {
		s.forward(w, r)
		return
	}
	ds := s.decide(r.Context(), reqs)
	if r.Context().Err() != nil {
		// The client went away while Redis decided: nobody reads an answer,
		// and its cancelled decisions say nothing about Redis.
		return
	}
	if len(ds) != len(reqs) {
		// Broken contract; never forward on it.
		s.log.Error("limiter returned a wrong number of decisions", "want", len(reqs), "got", len(ds))
		s.reply(w, s.respFailedClosed, failedClosedAnswer(0))
		return
	}
	// Put together only now: while one value held both pols and reqs,
	// handing reqs to the limiter would move policyBuf to the heap.
	dec := decided{policies: pols, requests: reqs, decisions: ds}
	v := enforce.Sum(dec.requests, dec.decisions)
	s.record(&dec, &v)
	s.respond(w, r, &dec, &v)
}

// decided is one request after the limiter: the policies that applied to it,
// the limiter request and the decision of each, index for index.
type decided struct {
	policies  []*policy
	requests  []limiter.Request
	decisions []limiter.Decision
}

// refusal is the policy that a request is turned away for before Redis is
// asked: the request has no client key for it and its onMissing is Deny
// (429), or, when ambiguous, the request gives more than one (400).
type refusal struct {
	policy    *policy
	ambiguous bool
}

// gather builds a limiter request for each policy of st that applies to r:
// the policy's rule (divided among the sidecars last counted enforcing it)
// for r's client key. The policies are appended to pols, index for index
// with reqs. A policy for which r has no client key, or an ambiguous one,
// is counted and left out; the first enforced one that refuses r, one with
// an ambiguous key before one with onMissing Deny, is returned, and r is to
// be refused for it.
func (s *Sidecar) gather(st *state, r *http.Request, pols []*policy) (reqs []limiter.Request, _ []*policy, refused refusal) {
	ri := reqInfo{r: r, trusted: st.trusted}
	reqs = make([]limiter.Request, 0, len(st.policies))
	for _, p := range st.policies {
		if !p.matches(&ri) {
			continue
		}
		key, ks := ri.key(p)
		if ks == keyFound && p.reqCost.hidden(r) {
			ks = keyAmbiguous
		}
		switch {
		case ks == keyAmbiguous && p.dryRun:
			p.counters.Inc(enforce.AmbiguousKey)
		case ks == keyAmbiguous:
			if !refused.ambiguous {
				refused = refusal{policy: p, ambiguous: true}
			}
		case ks == keyMissing && p.onMissing != sidecarconfig.MissingDeny:
			p.counters.Inc(enforce.Skipped)
		case ks == keyMissing && p.dryRun:
			p.counters.Inc(enforce.MissingKey)
		case ks == keyMissing:
			if refused.policy == nil {
				refused.policy = p
			}
		}
		if ks != keyFound {
			continue
		}
		rule := p.rule
		if n := s.peerCount(rule.ID); n > 0 {
			rule.Replicas = n
		}
		if rule.Weighted {
			reqs = append(reqs, costRequest(p, rule, key, r))
		} else {
			reqs = append(reqs, limiter.Request{Rule: rule, Client: key, DryRun: p.dryRun})
		}
		pols = append(pols, p)
		for _, w := range p.windows {
			rule := w.rule
			if n := s.peerCount(rule.ID); n > 0 {
				rule.Replicas = n
			}
			reqs = append(reqs, limiter.Request{Rule: rule, Client: key, DryRun: p.dryRun})
			pols = append(pols, w)
		}
	}
	switch {
	case refused.ambiguous:
		refused.policy.counters.Inc(enforce.AmbiguousKey)
	case refused.policy != nil:
		refused.policy.counters.Inc(enforce.MissingKey)
	}
	return reqs, pols, refused
}

// decide asks the limiter about all the requests at once, timed.
func (s *Sidecar) decide(ctx context.Context, reqs []limiter.Request) []limiter.Decision {
	start := time.Now()
	ds := s.lim.Decide(ctx, reqs)
	s.metrics.decisions.DecisionSeconds.Observe(time.Since(start).Seconds())
	return ds
}

// record counts the decisions under verdict v (package enforce: the
// limiter's sources, the Redis errors, each policy's outcome), logs why
// Redis did not decide, and counts the clients of the policies that
// rejected the request, for /debug/top.
func (s *Sidecar) record(dec *decided, v *enforce.Verdict) {
	if v.RedisErr != nil {
		s.logRedisError(v.RedisErr)
	}
	// A policy's additional windows follow it in dec: their outcomes fold
	// into one for the policy (the gravest), counted when the next policy
	// starts, or at the end.
	var (
		last    = -1
		outcome enforce.Outcome
	)
	count := func() {
		if last < 0 {
			return
		}
		p := dec.policies[last]
		p.counters.Inc(outcome)
		if outcome == enforce.Rejected {
			h := s.hasher.Load()
			s.top.add(p.name, h.Sum(dec.requests[last].Client), h.ID())
		}
	}
	s.metrics.decisions.Record(dec.requests, dec.decisions, v, func(i int, o enforce.Outcome) {
		if dec.policies[i].of != nil {
			outcome = enforce.Graver(outcome, o)
			return
		}
		count()
		last, outcome = i, o
	})
	count()
}

// respond answers the request after its decisions: the answer of the
// policy in v that rejected it, or else the application's response with
// the enforced policies' RateLimit fields.
func (s *Sidecar) respond(w http.ResponseWriter, r *http.Request, dec *decided, v *enforce.Verdict) {
	switch {
	case v.FailedClosed >= 0:
		i := v.FailedClosed
		s.reply(w, s.respFailedClosed, failedClosedAnswer(dec.decisions[i].RetryAfter))
	case v.Denied >= 0:
		i := v.Denied
		s.reply(w, s.respRejected, rejectedAnswer(dec.policies[i], dec.decisions[i].RetryAfter))
	default:
		if f := dec.admittedFields(); f.Len() > 0 {
			h := w.Header()
			h[canonRateLimitPolicy] = []string{f.Policy()}
			h[canonRateLimit] = []string{f.RateLimit()}
		}
		r, stop := s.withCharges(r, dec)
		if stop != nil {
			// Also when the application never answered (no body to close).
			defer stop()
		}
		s.forward(w, r)
	}
}

// admittedFields are the RateLimit fields of an admitted request: each
// enforced policy with its remaining quota, in config order.
func (dec *decided) admittedFields() ratelimitheader.Fields {
	var f ratelimitheader.Fields
	for i, p := range dec.policies {
		if !dec.requests[i].DryRun {
			f.Add(p.nameItem, p.policyItem, dec.decisions[i].Remaining, dec.decisions[i].ResetAfter)
		}
	}
	return f
}

// forward hands r to the application through the reverse proxy.
func (s *Sidecar) forward(w http.ResponseWriter, r *http.Request) {
	s.respForwarded.Inc()
	s.proxy.ServeHTTP(w, r)
}

// redisErrorLogEvery spaces the log lines about failed Redis decisions.
const redisErrorLogEvery = 10 * time.Second

// logRedisError says why decisions did not come from Redis (a refused
// login, a timeout, a lost connection), at most once per redisErrorLogEvery.
// The limiter's errors carry neither credentials nor client keys.
func (s *Sidecar) logRedisError(err error) {
	quiet := s.redisErrQuiet.Add(1)
	// Monotonic (since New), so a clock step cannot silence the log; +1
	// keeps 0 for "never logged".
	now := int64(time.Since(s.created)) + 1
	last := s.redisErrLogged.Load()
	if last != 0 && now-last < int64(redisErrorLogEvery) || !s.redisErrLogged.CompareAndSwap(last, now) {
		return
	}
	s.redisErrQuiet.Add(-quiet)
	s.log.Warn("Redis did not decide; policies follow their failMode", "error", err, "errorsSinceLastLog", quiet,
		"fallbackActive", !s.lim.Healthy(), "nextLogIn", redisErrorLogEvery)
}
