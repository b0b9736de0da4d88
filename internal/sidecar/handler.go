package sidecar

import (
	"io"
	"net/http"
	"strconv"
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
		s.metrics.responses.WithLabelValues(outcomeNoConfig).Inc()
		h := w.Header()
		setTextHeaders(h)
		h.Set(headerRetryAfter, "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "slidegate: no rate limit configuration loaded yet\n")
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
		s.rejectMissingKey(w, st, missing)
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
		s.failClosed(w, st, pols[0], limiter.Decision{})
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
		s.failClosed(w, st, pols[closed], ds[closed])
	case deny >= 0:
		s.reject(w, st, pols[deny], ds[deny])
	default:
		// Admitted: advertise the enforced policies' state on the response.
		var buf []byte
		for i, p := range pols {
			if reqs[i].DryRun {
				continue
			}
			if len(buf) > 0 {
				buf = append(buf, ", "...)
			}
			buf = rateLimitItem(buf, p, ds[i].Remaining, ds[i].ResetAfter)
		}
		if len(buf) > 0 {
			h := w.Header()
			h[canonRateLimitPolicy] = []string{policyList(pols, reqs)}
			h[canonRateLimit] = []string{string(buf)}
		}
		s.forward(w, r)
	}
}

func policyList(pols []*policy, reqs []limiter.Request) string {
	if len(pols) == 1 {
		return pols[0].policyItem
	}
	var buf []byte
	for i, p := range pols {
		if reqs[i].DryRun {
			continue
		}
		if len(buf) > 0 {
			buf = append(buf, ", "...)
		}
		buf = append(buf, p.policyItem...)
	}
	return string(buf)
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

// reject answers 429 for the policy p that denied the request.
func (s *Sidecar) reject(w http.ResponseWriter, st *state, p *policy, d limiter.Decision) {
	s.respRejected.Inc()
	retry := ratelimitheader.RetryAfterSeconds(d.RetryAfter)
	h := w.Header()
	setTextHeaders(h)
	h.Set(headerRetryAfter, retry)
	h.Set(headerRateLimitPolicy, p.policyItem)
	h.Set(headerRateLimit, string(rateLimitItem(nil, p, 0, d.RetryAfter)))
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = io.WriteString(w, "slidegate: rate limit exceeded: policy "+strconv.Quote(p.name)+
		" in namespace "+strconv.Quote(st.namespace)+"; retry in "+retry+"s\n")
}

// rejectMissingKey answers 429 for a request without the client key of a
// policy whose onMissing is Deny. There is no Retry-After: waiting does not
// help; sending the key does.
func (s *Sidecar) rejectMissingKey(w http.ResponseWriter, st *state, p *policy) {
	s.respRejected.Inc()
	h := w.Header()
	setTextHeaders(h)
	h.Set(headerRateLimitPolicy, p.policyItem)
	w.WriteHeader(http.StatusTooManyRequests)
	var what string
	switch p.source {
	case sidecarconfig.SourceHeader:
		what = "header " + strconv.Quote(p.keyName)
	case sidecarconfig.SourceQueryParameter:
		what = "query parameter " + strconv.Quote(p.keyName)
	default:
		what = "bearer token claim " + strconv.Quote(p.keyName)
	}
	_, _ = io.WriteString(w, "slidegate: request rejected by policy "+strconv.Quote(p.name)+
		" in namespace "+strconv.Quote(st.namespace)+": it has no "+what+"\n")
}

// failClosed answers 503 for a fail-closed policy that Redis could not
// decide.
func (s *Sidecar) failClosed(w http.ResponseWriter, st *state, p *policy, d limiter.Decision) {
	s.respFailedClosed.Inc()
	retry := ratelimitheader.RetryAfterSeconds(d.RetryAfter)
	h := w.Header()
	setTextHeaders(h)
	h.Set(headerRetryAfter, retry)
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = io.WriteString(w, "slidegate: rate limiter unavailable and policy "+strconv.Quote(p.name)+
		" in namespace "+strconv.Quote(st.namespace)+" fails closed; retry in "+retry+"s\n")
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
