package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/slidegate/slidegate/internal/debugapi"
	"github.com/slidegate/slidegate/internal/limiter"
)

// The debug port's POST /debug/reset empties one client's counters under
// one policy (kubectl slidegate reset): the policy's window, its
// additional windows and its quotas' current periods, in one call to
// Redis (limiter.Reset), with this sidecar's Redis identity, which reaches
// its namespace's keys only. It takes /debug/why's parameters, and the
// policy is required: a reset is of one policy's counters, never of every
// policy a request would meet.
//
// Who may ask is who may port-forward to the pod (the debug port listens
// on loopback only). That permission already reaches the application's
// own port past this sidecar, so a reset gives no one more than they
// had. kubectl slidegate records each reset as an Event on the policy,
// and every reset is logged here, by the client's keyed hash.

// resetter is a Decider that can empty a client's keys;
// *limiter.Limiter is one.
type resetter interface {
	Reset(ctx context.Context, rules []limiter.Rule, client string) ([]string, int64, error)
}

// serveReset answers POST /debug/reset, sharing /debug/why's bound on
// requests served at once.
func (s *Sidecar) serveReset(w http.ResponseWriter, r *http.Request) {
	serveClientQuery(s, w, r, "reset a client", func(ctx context.Context, st *state, rs resetter, q whyQuery) (any, int, error) {
		return s.reset(ctx, st, rs, q)
	})
}

// reset empties the counters of q's client under q's policy. The int is
// the HTTP status of the answer or of the error.
func (s *Sidecar) reset(ctx context.Context, st *state, rs resetter, q whyQuery) (*debugapi.ResetResponse, int, error) {
	if q.policy == "" {
		return nil, http.StatusBadRequest, errors.New("a reset names its policy")
	}
	p := st.policyNamed(q.policy)
	if p == nil {
		return nil, http.StatusNotFound, fmt.Errorf("policy %q does not apply to this pod (policies here: %s)", q.policy, st.policyNames())
	}
	if err := q.complete(p); err != nil {
		return nil, http.StatusBadRequest, err
	}
	if !q.identifies(p) {
		return nil, http.StatusBadRequest, fmt.Errorf("policy %q keys on %s, not on the identity given", p.name, describeSource(p.source, p.keyName))
	}
	req, err := whyRequest(q)
	if err != nil {
		return nil, http.StatusBadRequest, err
	}
	ri := reqInfo{r: req, trusted: st.trusted, trustClaims: true}
	key, ks := ri.key(p)
	if ks != keyFound {
		return nil, http.StatusBadRequest, fmt.Errorf("the identity gives no value for %s", describeSource(p.source, p.keyName))
	}
	rules := []limiter.Rule{p.rule}
	for _, w := range p.windows {
		rules = append(rules, w.rule)
	}
	keys, nonEmpty, err := rs.Reset(ctx, rules, key)
	client := s.hasher.Load().Sum(key)
	if err != nil {
		s.log.Warn("reset of a client failed", "policy", p.name, "client", client, "error", err)
		return nil, http.StatusServiceUnavailable, fmt.Errorf("reset: %w", err)
	}
	s.log.Info("reset a client's counters", "policy", p.name, "client", client, "keys", len(keys), "nonEmpty", nonEmpty)
	return &debugapi.ResetResponse{Namespace: st.namespace, Policy: p.name, ClientKey: client, RedisKeys: keys, NonEmpty: nonEmpty}, http.StatusOK, nil
}
