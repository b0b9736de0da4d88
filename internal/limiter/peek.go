package limiter

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisschema"
)

// Window is what one client's key holds under one rule at one instant of
// Redis's clock, as Peek reads it: the answer to "why was I limited?".
type Window struct {
	// Key is the Redis key that was read (the one Decide uses).
	Key       string
	Algorithm Algorithm
	Limit     int64
	Window    time.Duration
	// Now is Redis's clock at the read; RetryAfter, ResetAfter and
	// OldestAge are relative to it.
	Now time.Time
	// Count is the admits in the sliding window (SlidingLog), or in the
	// current fixed window (SlidingWindowCounter).
	Count int64
	// Previous is the previous fixed window's admits (SlidingWindowCounter
	// only), and Estimate the counter's weighted estimate of the sliding
	// window, Previous×(1-elapsed/window)+Count. For SlidingLog Estimate
	// is Count.
	Previous int64
	Estimate float64
	// Allowed says whether a request now would be admitted. Remaining is
	// the admits left before it: an admitted next Decide reports
	// Remaining-1, a denied one 0.
	Allowed   bool
	Remaining int64
	// RetryAfter is, when Allowed is false, the exact time until the next
	// admit can happen, by Decide's arithmetic (0 when allowed).
	RetryAfter time.Duration
	// ResetAfter is the time until the window holds no admit of this
	// client, as a decision that admits nothing would report it.
	ResetAfter time.Duration
	// OldestAge is the age of the oldest admit still in the window
	// (SlidingLog with Count > 0 only; HasOldest says whether it is set).
	OldestAge time.Duration
	HasOldest bool
	// TTL is the key's remaining time to live; 0 when the key does not
	// exist.
	TTL time.Duration
	// Weighted says the rule counts cost (Rule.Weighted): Count, Previous,
	// Estimate and Remaining are then cost, not admits, and Allowed and
	// RetryAfter answer a check (room for one unit).
	Weighted bool
}

// RetryAt is the instant, on Redis's clock, from which the next request can
// be admitted (Now when it can be now).
func (w Window) RetryAt() time.Time { return w.Now.Add(w.RetryAfter) }

var (
	peekLua  = newScript(redisschema.Peek)
	peekEval = redis.NewScript(redisschema.Peek.Script())
)

// peekReply is the decoded reply of the peek script (redisschema.Peek).
type peekReply struct {
	now, allowed, remaining, retry, reset, count, prev, elapsed, oldest, pttl int64
}

func decodePeek(v any) (peekReply, error) {
	vals, ok := v.([]any)
	if !ok || len(vals) != 10 {
		return peekReply{}, fmt.Errorf("limiter: unexpected peek reply %v", v)
	}
	var n [10]int64
	for i, x := range vals {
		if n[i], ok = x.(int64); !ok {
			return peekReply{}, fmt.Errorf("limiter: unexpected peek reply element %T", x)
		}
	}
	return peekReply{n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7], n[8], n[9]}, nil
}

// Peek reads client's window under rule from Redis, on Redis's clock,
// without changing it: no admit, no trim, no expiry. It answers what a
// request now would be told (Allowed, RetryAfter) and what the window
// holds. It bypasses the circuit breaker, the deny cache and the fallback:
// it is a diagnosis of Redis's state, and an error when Redis cannot
// answer.
func (l *Limiter) Peek(ctx context.Context, rule Rule, client string) (Window, error) {
	r := Request{Rule: rule, Client: client}
	if rule.Calendar != nil {
		// The period that holds now, and its length as the window.
		placed, _ := l.inPeriods([]Request{r}, time.Time{})
		r = placed[0]
		rule = r.Rule
	}
	if err := validRule(&rule); err != nil {
		return Window{}, err
	}
	if l.closed.Load() {
		return Window{}, ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, l.opts.MaxTimeout)
	defer cancel()
	key := l.keyOf(&r)
	win := windowMicros(rule.Window)
	ctr := peekKind(rule)
	var v any
	var err error
	if l.api.functions {
		// FCALL_RO: a function registered no-writes, which a replica
		// would serve too.
		v, err = l.rdb.Do(ctx, "fcall_ro", peekLua.fnArg, 1, key, rule.Limit, win, ctr).Result()
		err = functionsMissing(err)
	} else {
		v, err = peekEval.Run(ctx, l.rdb, []string{key}, rule.Limit, win, ctr).Result()
	}
	if err != nil {
		return Window{}, fmt.Errorf("limiter: peek: %w", err)
	}
	rep, err := decodePeek(v)
	if err != nil {
		return Window{}, err
	}
	return windowOf(rule, key, win, rep), nil
}

// peekKind is the peek script's kind argument of rule: 0 a log, 1 a
// counter, 2 a weighted log, 3 a weighted counter.
func peekKind(rule Rule) string {
	switch {
	case rule.Calendar != nil:
		return "4"
	case rule.Weighted && rule.Algorithm == SlidingWindowCounter:
		return "3"
	case rule.Weighted:
		return "2"
	case rule.Algorithm == SlidingWindowCounter:
		return "1"
	}
	return "0"
}

// windowOf is what the peek script replied (rep) about key under rule,
// whose window is win µs.
func windowOf(rule Rule, key string, win int64, rep peekReply) Window {
	alg := rule.Algorithm
	if alg == "" {
		alg = SlidingLog
	}
	us := func(n int64) time.Duration { return time.Duration(n) * time.Microsecond }
	w := Window{
		Key:        key,
		Algorithm:  alg,
		Limit:      rule.Limit,
		Window:     rule.Window,
		Now:        serverTime(rep.now),
		Count:      rep.count,
		Previous:   rep.prev,
		Estimate:   float64(rep.count),
		Allowed:    rep.allowed == 1,
		Remaining:  rep.remaining,
		RetryAfter: us(rep.retry),
		ResetAfter: us(rep.reset),
		OldestAge:  us(max(rep.oldest, 0)),
		HasOldest:  rep.oldest >= 0,
		TTL:        time.Duration(max(rep.pttl, 0)) * time.Millisecond,
		Weighted:   rule.Weighted,
	}
	if alg == SlidingWindowCounter {
		wus := float64(win)
		w.Estimate = float64(rep.prev)*(wus-float64(rep.elapsed))/wus + float64(rep.count)
	}
	return w
}
