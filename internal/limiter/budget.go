package limiter

import (
	"sync"
	"time"
)

// budget is how long a decision beginning at now waits for Redis: Timeout,
// or twice the slowest answer of the last one to two seconds when that is
// longer, up to MaxTimeout. A Redis that answers slowly is still answering:
// its decisions must not fall back (the fallback cannot see what Redis
// admits). A Redis that hangs stops producing answers, so within two
// seconds the budget is Timeout again and the breaker takes over.
func (l *Limiter) budget(now time.Time) time.Duration {
	return min(max(l.opts.Timeout, 2*l.latency.recent(now)), l.opts.MaxTimeout)
}

// repairOp is an op the limiter sends on its own behalf (an undo, a lost
// reply's cancel), with the budget's deadline, like a decision's. A fixed
// Timeout would fail every repair against a Redis slower than Timeout,
// which the budget serves, and each failure counts toward the breaker: a
// lost reply's cancel, retried for a minute, then reopened the breaker
// between decisions Redis answered.
func (l *Limiter) repairOp(s *script, args []any) *op {
	now := time.Now()
	return &op{script: s, args: args, deadline: now.Add(l.budget(now)), done: make(chan struct{}, 1)}
}

// latencyWindow keeps the slowest answer of the current and the previous
// second.
type latencyWindow struct {
	mu        sync.Mutex
	since     time.Time
	cur, prev time.Duration
}

func (w *latencyWindow) roll(now time.Time) {
	switch age := now.Sub(w.since); {
	case age < time.Second:
		return
	case age < 2*time.Second:
		w.prev = w.cur
	default:
		w.prev = 0
	}
	w.cur, w.since = 0, now
}

func (w *latencyWindow) observe(d time.Duration, now time.Time) {
	w.mu.Lock()
	w.roll(now)
	w.cur = max(w.cur, d)
	w.mu.Unlock()
}

func (w *latencyWindow) recent(now time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.roll(now)
	return max(w.cur, w.prev)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
