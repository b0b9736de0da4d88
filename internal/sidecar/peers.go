package sidecar

import (
	"context"

	"github.com/slidegate/slidegate/internal/limiter"
)

// announceLoop tells Redis, every PeerInterval (more often while the fleet
// settles, see limiter.AnnounceLoop), that this sidecar enforces the
// policies of its current config, and learns how many sidecars do: each
// fail-open policy's local share while Redis is away is ceil(limit/count).
// The count comes from the sidecars themselves, so a Deployment that scales
// changes no ConfigMap (the controller used to render the count, and every
// scale event rewrote the config of the whole namespace). A sidecar not
// heard of for three intervals (a deleted pod) drops out of the count;
// while Redis cannot answer, the last count stays.
func (s *Sidecar) announceLoop(ctx context.Context, a announcer) {
	ids := func() []string {
		st := s.state.Load()
		if st == nil {
			return nil
		}
		ids := make([]string, 0, len(st.policies))
		for _, p := range st.policies {
			ids = append(ids, p.rule.ID)
		}
		return ids
	}
	limiter.AnnounceLoop(ctx, a, s.opts.PeerInterval, ids, func(counts map[string]int, err error) {
		for id, n := range counts {
			s.peers.Store(id, n)
		}
		if err != nil {
			s.log.Debug("announcing to Redis failed; the last peer counts stay", "error", err)
		}
	})
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
