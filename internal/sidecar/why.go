package sidecar

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/slidegate/slidegate/internal/clienthash"
	"github.com/slidegate/slidegate/internal/debugapi"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// The debug port's GET /debug/why answers "why was this client limited?":
// for a client identity as the user knows it, the client key each policy of
// this pod derives from it and the live window behind that key, read from
// Redis without changing it (limiter.Peek).
//
// The key is derived by the request path's own code: the handler builds
// the request such a client would send (the header, the query parameter,
// a bearer token with the claim, the peer address) and asks reqInfo.key,
// so the answer is this sidecar's truth and cannot drift from it.
//
// Parameters:
//
//	policy   the policy asked about (optional: else every policy that
//	         applies to the request)
//	source   Header, QueryParameter, JWTClaim, RemoteAddress or Global;
//	         or one of the shorthands header=V, query=V, claim=V, ip=V,
//	         global
//	name     the header, query parameter or claim name (default: the
//	         policy's)
//	method, path  the request (default: the policy's first method, or
//	         GET, and first path prefix, or /)
//
// The client value travels in the Slidegate-Client-Value request header
// when it is not in a shorthand, not in the URL, which is what logs and
// proxies record (the API server's audit log did, when kubectl slidegate
// went through the pod proxy). Header, query
// and claim values may be credentials: they are never logged nor
// returned. The answer names the client by the keyed hash that /debug/top
// shows (package clienthash), so that a client found there can be asked
// about.

// whyMaxConcurrent bounds the /debug/why requests served at once: each
// costs Redis reads.
const whyMaxConcurrent = 4

// peeker is a Decider that can read a window without changing it;
// *limiter.Limiter is one.
type peeker interface {
	Peek(ctx context.Context, rule limiter.Rule, client string) (limiter.Window, error)
}

// whyQuery is a parsed /debug/why request.
type whyQuery struct {
	policy, source, name, value, method, path string
}

// whyShorthands are the query parameters that give a client identity and
// its value at once (header=V for source=Header), by the source they stand
// for.
var whyShorthands = map[string]string{
	"header": sidecarconfig.SourceHeader,
	"query":  sidecarconfig.SourceQueryParameter,
	"claim":  sidecarconfig.SourceJWTClaim,
	"ip":     sidecarconfig.SourceRemoteAddress,
	"global": sidecarconfig.SourceGlobal,
}

// parseWhy reads a /debug/why request: exactly one client identity, by
// source or by shorthand, and a value unless the source is Global.
func parseWhy(r *http.Request) (whyQuery, error) {
	q := r.URL.Query()
	w := whyQuery{policy: q.Get("policy"), name: q.Get("name"), method: q.Get("method"), path: q.Get("path")}
	n := 0
	if s := q.Get("source"); s != "" {
		n++
		w.source, w.value = s, r.Header.Get(debugapi.WhyValueHeader)
	}
	for short, src := range whyShorthands {
		if q.Has(short) {
			n++
			w.source, w.value = src, q.Get(short)
		}
	}
	if n != 1 {
		return w, fmt.Errorf("give exactly one client identity: source=Header|QueryParameter|JWTClaim|RemoteAddress|Global (value in the %s header), or header=, query=, claim=, ip=, global", debugapi.WhyValueHeader)
	}
	switch w.source {
	case sidecarconfig.SourceGlobal:
	case sidecarconfig.SourceHeader, sidecarconfig.SourceQueryParameter, sidecarconfig.SourceJWTClaim, sidecarconfig.SourceRemoteAddress:
		if w.value == "" {
			return w, fmt.Errorf("source %s needs a value", w.source)
		}
	default:
		return w, fmt.Errorf("unknown source %q", w.source)
	}
	return w, nil
}

// whyRequest is the request a client with the identity of q would send to
// the path and method of q, carrying nothing else.
func whyRequest(q whyQuery) (*http.Request, error) {
	u := &url.URL{Path: q.path}
	r := &http.Request{Method: q.method, URL: u, Header: http.Header{}, RemoteAddr: "why"}
	switch q.source {
	case sidecarconfig.SourceHeader:
		r.Header[http.CanonicalHeaderKey(q.name)] = []string{q.value}
	case sidecarconfig.SourceQueryParameter:
		u.RawQuery = url.QueryEscape(q.name) + "=" + url.QueryEscape(q.value)
	case sidecarconfig.SourceJWTClaim:
		payload, err := json.Marshal(map[string]string{q.name: q.value})
		if err != nil {
			return nil, err
		}
		enc := base64.RawURLEncoding
		r.Header.Set("Authorization", "Bearer "+enc.EncodeToString([]byte(`{"alg":"none"}`))+"."+enc.EncodeToString(payload)+".")
	case sidecarconfig.SourceRemoteAddress:
		a, err := netip.ParseAddr(q.value)
		if err != nil {
			return nil, fmt.Errorf("ip: %w", err)
		}
		r.RemoteAddr = net.JoinHostPort(a.String(), "0")
	}
	return r, nil
}

// identifies reports whether q's identity is what policy p keys on, so
// that the key p derives from the request built from q is this client's.
func (q *whyQuery) identifies(p *policy) bool {
	switch p.source {
	case sidecarconfig.SourceGlobal:
		return true
	case sidecarconfig.SourceRemoteAddress:
		return q.source == sidecarconfig.SourceRemoteAddress
	case sidecarconfig.SourceHeader:
		return q.source == p.source && http.CanonicalHeaderKey(q.name) == p.keyName
	}
	return q.source == p.source && q.name == p.keyName
}

// serveWhy answers GET /debug/why, at most whyMaxConcurrent at once.
func (s *Sidecar) serveWhy(w http.ResponseWriter, r *http.Request) {
	serveClientQuery(s, w, r, "read windows", func(ctx context.Context, st *state, pk peeker, q whyQuery) (any, int, error) {
		return s.why(ctx, st, pk, q)
	})
}

// serveClientQuery serves a /debug request about one client (why, reset)
// with answer: at most whyMaxConcurrent such requests at once, each with
// the state in force, the limiter as an L (what it cannot do, says can't)
// and the parsed client identity.
func serveClientQuery[L any](s *Sidecar, w http.ResponseWriter, r *http.Request, cant string, answer func(context.Context, *state, L, whyQuery) (any, int, error)) {
	select {
	case s.whySlots <- struct{}{}:
		defer func() { <-s.whySlots }()
	default:
		http.Error(w, "too many /debug requests at once", http.StatusTooManyRequests)
		return
	}
	st := s.state.Load()
	if st == nil {
		http.Error(w, noConfig, http.StatusServiceUnavailable)
		return
	}
	lim, ok := s.lim.(L)
	if !ok {
		http.Error(w, "this sidecar's limiter cannot "+cant, http.StatusNotImplemented)
		return
	}
	q, err := parseWhy(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	resp, code, err := answer(r.Context(), st, lim, q)
	if err != nil {
		http.Error(w, err.Error(), code)
		return
	}
	writeJSON(w, resp)
}

// why answers q from the state st, reading windows through pk. The int is
// the HTTP status of the answer or of the error.
func (s *Sidecar) why(ctx context.Context, st *state, pk peeker, q whyQuery) (*debugapi.WhyResponse, int, error) {
	var target *policy
	if q.policy != "" {
		if target = st.policyNamed(q.policy); target == nil {
			return nil, http.StatusNotFound, fmt.Errorf("policy %q does not apply to this pod (policies here: %s)", q.policy, st.policyNames())
		}
	}
	if err := q.complete(target); err != nil {
		return nil, http.StatusBadRequest, err
	}
	req, err := whyRequest(q)
	if err != nil {
		return nil, http.StatusBadRequest, err
	}
	// The claim value is given as that of a token the sidecar verified:
	// the request built for it carries an unsigned one.
	ri := reqInfo{r: req, trusted: st.trusted, trustClaims: true}
	hasher := s.hasher.Load() // one key for the whole answer
	resp := &debugapi.WhyResponse{Namespace: st.namespace, Revision: st.revision, HashKeyID: hasher.ID(), Source: q.source, Method: q.method, Path: q.path}
	if target != nil {
		resp.Policies = append(resp.Policies, s.whyPolicy(ctx, pk, hasher, &q, &ri, target, true))
	}
	for _, p := range st.policies {
		if p != target && p.matches(&ri) {
			resp.Policies = append(resp.Policies, s.whyPolicy(ctx, pk, hasher, &q, &ri, p, false))
		}
	}
	return resp, http.StatusOK, nil
}

// complete fills in what q leaves out: from the target policy when q asks
// about one (its key name, first method and first path prefix), then GET
// and /. Only a source keyed on a name needs one.
func (q *whyQuery) complete(target *policy) error {
	if target != nil {
		if q.name == "" {
			q.name = target.keyName
		}
		if q.method == "" && len(target.methods) > 0 {
			q.method = target.methods[0]
		}
		if q.path == "" && len(target.prefixes) > 0 {
			q.path = target.prefixes[0]
		}
	}
	if q.name == "" && q.source != sidecarconfig.SourceGlobal && q.source != sidecarconfig.SourceRemoteAddress {
		return fmt.Errorf("source %s needs a policy or a name", q.source)
	}
	if q.method == "" {
		q.method = http.MethodGet
	}
	if q.path == "" {
		q.path = "/"
	}
	return nil
}

// whyPolicy is policy p's view of the client of q, whose request is ri:
// the client key p derives and its window, read through pk, or why there
// is none.
func (s *Sidecar) whyPolicy(ctx context.Context, pk peeker, hasher *clienthash.Hasher, q *whyQuery, ri *reqInfo, p *policy, target bool) debugapi.WhyPolicy {
	mode := sidecarconfig.ModeEnforce
	if p.dryRun {
		mode = sidecarconfig.ModeDryRun
	}
	alg := p.rule.Algorithm
	if alg == "" {
		alg = limiter.SlidingLog
	}
	out := debugapi.WhyPolicy{
		Name: p.name, Target: target, MatchesRequest: p.matches(ri), Mode: mode,
		Algorithm: string(alg), Limit: p.rule.Limit, WindowSeconds: p.rule.Window.Seconds(),
		KeySource: p.source, KeyName: p.keyName,
	}
	if !q.identifies(p) {
		out.Unknown = "keys on " + describeSource(p.source, p.keyName) + ", not on the identity given"
		return out
	}
	key, ks := ri.key(p)
	if ks != keyFound {
		out.Unknown = "the identity gives no value for " + describeSource(p.source, p.keyName)
		return out
	}
	out.ClientKey = hasher.Sum(key)
	for _, w := range p.windows {
		l := debugapi.WhyLimit{Name: w.windowName, Limit: w.rule.Limit, WindowSeconds: w.rule.Window.Seconds()}
		if win, err := pk.Peek(ctx, w.rule, key); err != nil {
			l.Error = err.Error()
		} else {
			l.RedisKey, l.Window = win.Key, whyWindow(&win)
			if q := w.quota; q != nil {
				l.WindowSeconds = win.Window.Seconds() // the period's length
				start, end := w.rule.Calendar.Period(win.Now)
				zone := q.TimeZone
				if zone == "" {
					zone = "UTC"
				}
				l.Quota = &debugapi.WhyQuota{Period: q.Period, TimeZone: zone, Start: start, End: end}
			}
		}
		out.AdditionalLimits = append(out.AdditionalLimits, l)
	}
	win, err := pk.Peek(ctx, p.rule, key)
	if err != nil {
		out.Error = err.Error()
		return out
	}
	out.RedisKey = win.Key
	out.Window = whyWindow(&win)
	return out
}

// whyWindow is w as /debug/why shows it; the counts that w's algorithm
// does not keep are left out.
func whyWindow(w *limiter.Window) *debugapi.WhyWindow {
	ww := &debugapi.WhyWindow{
		InWindow:          w.Estimate,
		Allowed:           w.Allowed,
		Remaining:         w.Remaining,
		RetryAfterSeconds: w.RetryAfter.Seconds(),
		RetryAt:           w.RetryAt(),
		ResetAfterSeconds: w.ResetAfter.Seconds(),
		ServerTime:        w.Now,
	}
	if w.Algorithm == limiter.SlidingWindowCounter {
		ww.Current, ww.Previous = &w.Count, &w.Previous
	}
	if w.Weighted {
		ww.Unit = "cost"
	}
	if w.HasOldest {
		age := w.OldestAge.Seconds()
		ww.OldestAgeSeconds = &age
	}
	return ww
}

// describeSource names a key source for a person: "header X-User".
func describeSource(source, name string) string {
	switch source {
	case sidecarconfig.SourceHeader:
		return "header " + name
	case sidecarconfig.SourceQueryParameter:
		return "query parameter " + name
	case sidecarconfig.SourceJWTClaim:
		return "claim " + name
	case sidecarconfig.SourceRemoteAddress:
		return "the client address"
	}
	return strings.ToLower(source)
}
