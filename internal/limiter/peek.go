package limiter

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
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
}

// RetryAt is the instant, on Redis's clock, from which the next request can
// be admitted (Now when it can be now).
func (w Window) RetryAt() time.Time { return w.Now.Add(w.RetryAfter) }

// peekScript reads one key the way decideScript's check and finish judge
// it, without admitting, trimming or touching the expiry. The shebang's
// no-writes flag makes Redis itself refuse any write the script might
// attempt, so a read can never change a window (and it may run on a
// read-only replica). The arithmetic is decideScript's, kept beside it
// rather than shared so that the two scripts can change independently;
// TestPeekAgreesWithNextDecide pins them together.
//
//	KEYS[1]  the key of the rule and client
//	ARGV[1]  limit, ARGV[2] window in µs, ARGV[3] "1" for a counter key
//
// Reply: now (µs since scoreEpoch), allowed, remaining, retry-after µs,
// reset-after µs, count, previous count (counter), elapsed µs in the
// current fixed window (counter), oldest age µs (-1: none), PTTL ms.
const peekScript = peekShebang + peekBody

// peekShebang gives the EVAL form its no-writes flag; the library
// registers peekBody with the same flag.
const peekShebang = "#!lua flags=no-writes\n"

const peekBody = `
if #KEYS ~= 1 or #ARGV ~= 3 or not tonumber(ARGV[1]) or not tonumber(ARGV[2]) or tonumber(ARGV[2]) < 1 then
  return redis.error_reply('ERR slidegate: malformed peek call')
end
local t = redis.call('TIME')
local now = (tonumber(t[1]) - 1577836800) * 1000000 + tonumber(t[2])
local key, l, w, ctr = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3] == '1'
local pttl = redis.call('PTTL', key)
local ok, rem, retry, reset, c, p, elapsed, oldest = false, 0, 0, 0, 0, 0, 0, -1
if ctr then
  local x = math.floor(now / w)
  local v = redis.call('HMGET', key, x, x - 1)
  c, p = tonumber(v[1]) or 0, tonumber(v[2]) or 0
  elapsed = now - x * w
  local e = p * (w - elapsed) / w + c
  ok = e + 1 <= l
  rem = math.floor(l - e)
  if c > 0 then
    reset = w
  elseif p > 0 then
    reset = w - elapsed
  end
  if not ok then
    if l <= 0 then
      retry = w
    elseif p > 0 and l - 1 - c >= 0 then
      retry = math.ceil(w * (1 - (l - 1 - c) / p) - elapsed)
    else
      local need = 0
      if c > l - 1 then need = w * (1 - (l - 1) / c) end
      retry = math.ceil(w - elapsed + need)
    end
    if retry < 1 then retry = 1 end
  end
else
  -- decideScript trims scores <= now-w; here they are only skipped.
  local stale = redis.call('ZCOUNT', key, '-inf', now - w)
  c = redis.call('ZCARD', key) - stale
  ok = c < l
  if c > 0 then
    local first = redis.call('ZRANGE', key, stale, stale, 'WITHSCORES')
    oldest = now - tonumber(first[2])
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    reset = tonumber(last[2]) + w - now
  end
  if not ok then
    local r = {}
    if l > 0 then r = redis.call('ZRANGE', key, stale + c - l, stale + c - l, 'WITHSCORES') end
    if r[2] then retry = tonumber(r[2]) + w - now else retry = w end
  end
  rem = l - c
end
if rem < 0 then rem = 0 end
return {now, ok and 1 or 0, rem, retry, reset, c, p, elapsed, oldest, pttl}
`

var (
	peekLua  = newScript(peekBody, "slidegate_peek_v1")
	peekEval = redis.NewScript(peekScript)
)

// peekReply is the decoded reply of peekScript.
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
	if err := validRule(&rule); err != nil {
		return Window{}, err
	}
	if l.closed.Load() {
		return Window{}, ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, l.opts.MaxTimeout)
	defer cancel()
	r := Request{Rule: rule, Client: client}
	key := l.keyOf(&r)
	win := windowMicros(rule.Window)
	ctr := "0"
	if rule.Algorithm == SlidingWindowCounter {
		ctr = "1"
	}
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
	}
	if alg == SlidingWindowCounter {
		wus := float64(win)
		w.Estimate = float64(rep.prev)*(wus-float64(rep.elapsed))/wus + float64(rep.count)
	}
	return w, nil
}
