package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisschema"
)

var (
	resetLua  = newScript(redisschema.Reset)
	resetEval = redis.NewScript(redisschema.Reset.Script())
)

// ErrNoReset is the error of a Reset on a Redis whose slidegate library
// predates the reset function (a manager of this release loads it when it
// starts).
var ErrNoReset = errors.New("limiter: the slidegate library on this Redis predates reset")

// periodSlack is how far from Redis's clock, as this process knows it, a
// reset also looks for a quota's period: near midnight the period the
// guess names may not be the one Redis is in, so both are reset.
const periodSlack = time.Second

// ResetKeys are the Redis keys that hold client's admits under rules (one
// policy's rules: its window, its additional windows and its quotas'
// current periods), the keys Reset deletes. The rules must share an ID
// (one policy), so the keys share a slot.
func (l *Limiter) ResetKeys(rules []Rule, client string) ([]string, error) {
	var keys []string
	now := l.redisNow()
	for i := range rules {
		rule := rules[i]
		if i > 0 && rule.ID != rules[0].ID {
			return nil, fmt.Errorf("limiter: reset of rules %q and %q together: one policy's rules only", rules[0].ID, rule.ID)
		}
		reqs := []Request{{Rule: rule, Client: client}}
		if rule.Calendar != nil {
			reqs = []Request{{Rule: rule, Client: client}, {Rule: rule, Client: client}}
			reqs[0] = first(l.inPeriods(reqs[:1], now.Add(-periodSlack)))
			reqs[1] = first(l.inPeriods(reqs[1:], now.Add(periodSlack)))
		}
		for j := range reqs {
			if err := validRule(&reqs[j].Rule); err != nil {
				return nil, err
			}
			k := l.keyOf(&reqs[j])
			keys = append(keys, k)
			if rule.Weighted && rule.Algorithm != SlidingWindowCounter {
				// A weighted log's companions: its sums and checkpoints
				// (redisschema.WeightedKey).
				keys = append(keys, k+"s", k+"p")
			}
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

func first(reqs []Request, _ bool) Request { return reqs[0] }

// Reset deletes client's keys under rules (ResetKeys) in one call, so
// that the client's next request starts from an empty window and empty
// quotas, and forgets what this process remembered of them: its deny
// cache entries. Other processes' deny caches serve their cached denial
// for at most Options.DenyCacheHold more. It returns the keys and how
// many of them existed. Like Peek, it bypasses the circuit breaker and the
// fallback: it is an administrator's act on Redis, and an error when
// Redis cannot do it.
func (l *Limiter) Reset(ctx context.Context, rules []Rule, client string) (keys []string, existed int64, err error) {
	if len(rules) == 0 {
		return nil, 0, errors.New("limiter: reset of no rule")
	}
	if keys, err = l.ResetKeys(rules, client); err != nil {
		return nil, 0, err
	}
	if l.closed.Load() {
		return nil, 0, ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, l.opts.MaxTimeout)
	defer cancel()
	if l.api.functions {
		args := make([]any, 0, 3+len(keys))
		args = append(args, argFCall, resetLua.fnArg, len(keys))
		for _, k := range keys {
			args = append(args, k)
		}
		existed, err = l.rdb.Do(ctx, args...).Int64()
		if err != nil && strings.HasPrefix(err.Error(), "ERR Function not found") {
			err = fmt.Errorf("%w: %w", ErrNoReset, err)
		}
	} else {
		existed, err = resetEval.Run(ctx, l.rdb, keys).Int64()
	}
	if err != nil {
		return nil, 0, fmt.Errorf("limiter: reset: %w", err)
	}
	if l.view != nil {
		for _, k := range keys {
			l.view.forget(k)
		}
	}
	return keys, existed, nil
}
