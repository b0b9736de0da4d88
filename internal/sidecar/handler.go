package sidecar

import (
	"net/http"
	"time"

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
	if len(st.policies) == 0 {
		s.forward(w, r)
		return
	}

	ri := reqInfo{r: r, trusted: st.trusted}
	reqs := make([]limiter.Request, 0, len(st.policies))
	var polsBuf [8]*policy
	pols := polsBuf[:0]
	var missing *policy
	for _, p := range st.policies {
		if !p.matches(&ri) {
			continue
		}
		key, ok := ri.key(p)
		if !ok {
			switch {
			case p.onMissing != sidecarconfig.MissingDeny:
				p.counters[idxSkipped].Inc()
			case p.dryRun:
				p.counters[idxMissingKey].Inc()
			case missing == nil:
				missing = p
			}
			continue
		}
		rule := p.rule
		if n := s.peerCount(rule.ID); n > 0 {
			rule.Replicas = n
		}
		reqs = append(reqs, limiter.Request{Rule: rule, Client: key, DryRun: p.dryRun})
		pols = append(pols, p)
	}
	if missing != nil {
		// Rejected before asking Redis: nothing is counted anywhere.
		missing.counters[idxMissingKey].Inc()
		s.reply(w, s.respRejected, missingKeyAnswer(st.namespace, missing))
		return
	}
	if len(reqs) == 0 {
		s.forward(w, r)
		return
	}

	start := time.Now()
	ds := s.lim.Decide(r.Context(), reqs)
	s.metrics.decisionSeconds.Observe(time.Since(start).Seconds())
	if r.Context().Err() != nil {
		// The client went away while Redis decided: nobody reads an answer,
		// and its cancelled decisions say nothing about Redis.
		return
	}
	if len(ds) != len(reqs) {
		// Broken contract; never forward on it.
		s.log.Error("limiter returned a wrong number of decisions", "want", len(reqs), "got", len(ds))
		s.reply(w, s.respFailedClosed, failedClosedAnswer(st.namespace, pols[0], 0))
		return
	}

	deny, closed := -1, -1
	var redisErr error
	for i := range ds {
		d := &ds[i]
		if d.Err != nil {
			redisErr = d.Err
		}
		s.countSource(d.Source)
		if reqs[i].DryRun || d.Allowed {
			continue
		}
		// The longest wait is the one after which every denying policy
		// admits again.
		if d.Source == limiter.SourceFailedClosed {
			if closed < 0 || d.RetryAfter > ds[closed].RetryAfter {
				closed = i
			}
		} else if deny < 0 || d.RetryAfter > ds[deny].RetryAfter {
			deny = i
		}
	}
	if redisErr != nil {
		s.metrics.redisErrors.Inc()
		s.logRedisError(redisErr)
	}
	rejected := deny >= 0 || closed >= 0
	for i, p := range pols {
		d := &ds[i]
		switch {
		case reqs[i].DryRun && d.Allowed:
			p.counters[idxAllowed].Inc()
		case reqs[i].DryRun:
			p.counters[idxDryRunRejected].Inc()
		case d.Allowed && rejected:
			p.counters[idxNotCounted].Inc()
		case d.Allowed:
			p.counters[idxAllowed].Inc()
		case d.Source == limiter.SourceFailedClosed:
			p.counters[idxFailedClosed].Inc()
		default:
			p.counters[idxRejected].Inc()
			s.top.add(p.name, reqs[i].Client)
		}
	}

	switch {
	case closed >= 0:
		s.reply(w, s.respFailedClosed, failedClosedAnswer(st.namespace, pols[closed], ds[closed].RetryAfter))
	case deny >= 0:
		s.reply(w, s.respRejected, rejectedAnswer(st.namespace, pols[deny], ds[deny].RetryAfter))
	default:
		// Admitted: advertise the enforced policies' state on the response.
		var f ratelimitheader.Fields
		for i, p := range pols {
			if !reqs[i].DryRun {
				f.Add(p.nameItem, p.policyItem, ds[i].Remaining, ds[i].ResetAfter)
			}
		}
		if f.Len() > 0 {
			h := w.Header()
			h[canonRateLimitPolicy] = []string{f.Policy()}
			h[canonRateLimit] = []string{f.RateLimit()}
		}
		s.forward(w, r)
	}
}

func (s *Sidecar) countSource(src limiter.Source) {
	switch src {
	case limiter.SourceRedis:
		s.srcRedis.Inc()
	case limiter.SourceDenyCache:
		s.srcDenyCache.Inc()
	case limiter.SourceFallback:
		s.srcFallback.Inc()
	case limiter.SourceFailedClosed:
		s.srcFailedClosed.Inc()
	default:
		s.metrics.limiterSources.WithLabelValues(string(src)).Inc()
	}
}

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
