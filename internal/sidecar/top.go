package sidecar

import (
	"net/http"
	"sync"
	"time"

	"github.com/slidegate/slidegate/internal/debugapi"
	"github.com/slidegate/slidegate/internal/topk"
)

// The debug port's GET /debug/top?policy=NAME answers "whom does this
// policy limit most?" without a Prometheus label per client: each policy's
// 429s are counted by client key in a Space-Saving sketch of topCapacity
// keys (package topk: every count within N/k of the truth). The keys are
// keyed hashes (package clienthash) of the client keys, addresses included:
// the answer names no client, and its hashes cannot be reversed by hashing
// guesses without the namespace's key. Recent, not lifelong: a sketch
// covers topPeriod, and the answer merges the current and the previous one,
// so it covers the last one to two periods.

const (
	topCapacity = 64
	topPeriod   = 5 * time.Minute
)

// limitedTop counts 429s per policy and client key, all hashed with the
// key keyID names: a new key starts the counts afresh (rekey), so that one
// client never has two names in one answer.
type limitedTop struct {
	mu       sync.Mutex
	policies map[string]*topPeriods
	keyID    string
	now      func() time.Time
}

// topPeriods are one policy's sketches: cur counts since start, prev the
// period before it, from prevStart (nil when that period is over too).
type topPeriods struct {
	cur, prev *topk.Sketch
	start     time.Time
	prevStart time.Time
}

// newLimitedTop returns an empty count, on the wall clock.
func newLimitedTop() *limitedTop {
	return &limitedTop{policies: map[string]*topPeriods{}, now: time.Now}
}

// rotate starts a new period when the current one is over; t.mu is held.
func (t *limitedTop) rotate(p *topPeriods, now time.Time) {
	switch age := now.Sub(p.start); {
	case age < topPeriod:
		return
	case age < 2*topPeriod:
		p.prev, p.prevStart = p.cur, p.start
	default:
		p.prev = nil
	}
	p.cur, p.start = topk.New(topCapacity), now
}

// add counts one 429 of client, hashed with the key keyID names, under
// policy; a count hashed with a key replaced meanwhile is dropped.
func (t *limitedTop) add(policy, client, keyID string) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if keyID != t.keyID {
		return
	}
	p := t.policies[policy]
	if p == nil {
		p = &topPeriods{cur: topk.New(topCapacity), start: now}
		t.policies[policy] = p
	}
	t.rotate(p, now)
	p.cur.Add(client, 1)
}

// rekey forgets every count: from now on keys are hashed with the key
// keyID names.
func (t *limitedTop) rekey(keyID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.keyID = keyID
	clear(t.policies)
}

// summary is the policy's recent 429s by client key, since when they were
// counted, and the key they are hashed with.
func (t *limitedTop) summary(policy string) (topk.Summary, time.Time, string) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.policies[policy]
	if p == nil {
		return topk.Merge(topCapacity), now, t.keyID
	}
	t.rotate(p, now)
	if p.prev == nil {
		return p.cur.Summary(), p.start, t.keyID
	}
	return topk.Merge(topCapacity, p.prev.Summary(), p.cur.Summary()), p.prevStart, t.keyID
}

// serveTop answers GET /debug/top?policy=NAME.
func (s *Sidecar) serveTop(w http.ResponseWriter, r *http.Request) {
	st := s.state.Load()
	if st == nil {
		http.Error(w, noConfig, http.StatusServiceUnavailable)
		return
	}
	name := r.URL.Query().Get("policy")
	if st.policyNamed(name) == nil {
		http.Error(w, "policy "+name+" does not apply to this pod", http.StatusNotFound)
		return
	}
	sum, since, keyID := s.top.summary(name)
	writeJSON(w, debugapi.TopResponse{Namespace: st.namespace, Policy: name, Since: since, HashKeyID: keyID, Summary: sum})
}
