package sidecar

import (
	"context"
	"time"
)

// announceLoop tells Redis, every PeerInterval, that this sidecar enforces
// the policies of its current config, and learns how many sidecars do:
// each fail-open policy's local share while Redis is away is
// ceil(limit/count). The count comes from the sidecars themselves, so a
// Deployment that scales changes no ConfigMap (the controller used to
// render the count, and every scale event rewrote the config of the whole
// namespace). A sidecar not heard of for three intervals (a deleted pod)
// drops out of the count; while Redis cannot answer, the last count stays.
func (s *Sidecar) announceLoop(ctx context.Context, a announcer) {
	ttl := 3 * s.opts.PeerInterval
	t := time.NewTicker(s.opts.PeerInterval)
	defer t.Stop()
	for {
		if st := s.state.Load(); st != nil && len(st.policies) > 0 {
			ids := make([]string, 0, len(st.policies))
			for _, p := range st.policies {
				ids = append(ids, p.rule.ID)
			}
			actx, cancel := context.WithTimeout(ctx, s.opts.DecisionTimeout)
			counts, err := a.Announce(actx, ids, ttl)
			cancel()
			for id, n := range counts {
				s.peers.Store(id, n)
			}
			if err != nil && ctx.Err() == nil {
				s.log.Debug("announcing to Redis failed; the last peer counts stay", "error", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// peerCount is the last count of sidecars enforcing rule id, 0 if unknown.
func (s *Sidecar) peerCount(id string) int {
	if n, ok := s.peers.Load(id); ok {
		return n.(int)
	}
	return 0
}

// eachPolicyReplicas calls yield with each active policy and the replicas
// its fail-open share divides the limit by: the sidecars' own count, else
// the config's, else --fallback-replicas (the limiter's order).
func (s *Sidecar) eachPolicyReplicas(yield func(policy string, n int)) {
	st := s.state.Load()
	if st == nil {
		return
	}
	for _, p := range st.policies {
		n := s.peerCount(p.rule.ID)
		if n == 0 {
			n = p.rule.Replicas
		}
		if n == 0 {
			n = s.opts.FallbackReplicas
		}
		yield(p.name, n)
	}
}
