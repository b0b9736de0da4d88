package limiter

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// announceScript registers one member under a rule's presence key and
// counts the members seen within the ttl, on Redis's clock.
//
//	KEYS[1]  the presence key of a rule
//	ARGV[1]  the member (this process)
//	ARGV[2]  ttl in ms
var announceScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
return redis.call('ZCARD', KEYS[1])
`)

// presenceKey is the Redis key under which the sidecars enforcing a rule
// announce themselves.
func presenceKey(prefix, ruleID string) string { return prefix + "peers:" + ruleID }

// Announce registers this process as enforcing each rule of ids and
// returns, per rule, how many processes did so within ttl (this one
// included): the fail-open share's divisor, counted by the sidecars
// themselves, so that scaling a Deployment changes nothing the controller
// has to write. A rule whose count could not be read is missing from the
// result; the error is the first failure.
func (l *Limiter) Announce(ctx context.Context, ids []string, ttl time.Duration) (map[string]int, error) {
	out := make(map[string]int, len(ids))
	var errs []error
	ms := max(ttl.Milliseconds(), 1)
	for _, id := range ids {
		n, err := announceScript.Run(ctx, l.rdb, []string{presenceKey(l.opts.Prefix, id)}, l.memberPrefix, ms).Int()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[id] = n
	}
	return out, errors.Join(errs...)
}
