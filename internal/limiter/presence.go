package limiter

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisschema"
)

var (
	announceLua  = newScript(redisschema.Announce)
	announceEval = redis.NewScript(redisschema.Announce.Script())
)

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
		n, err := l.announce(ctx, redisschema.PresenceKey(l.opts.Prefix, id), ms)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[id] = n
	}
	return out, errors.Join(errs...)
}

// announce runs the announce script on key.
func (l *Limiter) announce(ctx context.Context, key string, ttlMs int64) (int, error) {
	if l.api.functions {
		n, err := l.rdb.Do(ctx, argFCall, announceLua.fnArg, 1, key, l.memberPrefix, ttlMs).Int()
		return n, functionsMissing(err)
	}
	return announceEval.Run(ctx, l.rdb, []string{key}, l.memberPrefix, ttlMs).Int()
}

// Announcer is what AnnounceLoop announces through (*Limiter is one).
type Announcer interface {
	Announce(ctx context.Context, ids []string, ttl time.Duration) (map[string]int, error)
}

// AnnounceLoop announces ids() through a every interval, and hands each
// answer to got (counts that could be read; err, the first failure), until
// ctx ends. A process is counted for three intervals after its last
// announcement.
//
// While the fleet settles it reads ten times as often: for three
// intervals after it starts, and after a count it read changed. A count is
// only as fresh as its last read, and a fleet that starts together (a
// rollout, a node drained onto others) is where it changes: three sidecars
// started within a second, reading every 5 s, each kept the count it read
// when it alone or two of them had announced, and when Redis died four
// seconds later they admitted 30, 15 and 10 of a fail-open limit of 30
// (TestFleetStartingTogether). What stays is bounded: a process that joins
// a settled fleet is unknown to the others until their next read, at most
// one interval, and a fleet that loses Redis in that time admits at most
// one share more than the limit per process that joined (each of the others
// divides by one less).
func AnnounceLoop(ctx context.Context, a Announcer, interval time.Duration, ids func() []string, got func(counts map[string]int, err error)) {
	ttl := 3 * interval
	fast := max(interval/10, time.Millisecond)
	settleUntil := time.Now().Add(ttl)
	last := map[string]int{}
	for {
		if id := ids(); len(id) > 0 {
			actx, cancel := context.WithTimeout(ctx, min(interval, time.Second))
			counts, err := a.Announce(actx, id, ttl)
			cancel()
			for k, n := range counts {
				if last[k] != n {
					settleUntil = time.Now().Add(ttl)
				}
				last[k] = n
			}
			if ctx.Err() != nil {
				return
			}
			got(counts, err)
		}
		wait := interval
		if time.Now().Before(settleUntil) {
			wait = fast
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}
