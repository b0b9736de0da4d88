package limiter

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// breaker is a circuit breaker over the whole Redis client. It opens after
// `threshold` consecutive failures (failed round trips or decisions that
// timed out), so that no decision waits on a Redis already known to be
// down; while open, a prober (Limiter.prober) PINGs Redis and closes it
// on the first success. Successes reset the count, so sporadic errors never
// open it.
type breaker struct {
	threshold int64
	failures  atomic.Int64
	open      atomic.Bool
	opens     atomic.Int64

	mu       sync.Mutex
	openedAt time.Time
	lastErr  error
	wake     chan struct{} // signalled when the breaker opens
}

func newBreaker(threshold int) *breaker {
	return &breaker{threshold: int64(threshold), wake: make(chan struct{}, 1)}
}

// allow reports whether decisions may go to Redis.
func (b *breaker) allow() bool { return !b.open.Load() }

func (b *breaker) success() {
	if b.failures.Load() != 0 {
		b.failures.Store(0)
	}
}

func (b *breaker) failure(err error) {
	if b.failures.Add(1) < b.threshold || b.open.Load() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open.Load() {
		return
	}
	b.openedAt = time.Now()
	b.lastErr = err
	b.opens.Add(1)
	b.open.Store(true)
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// close is called by the prober after Redis answered.
func (b *breaker) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures.Store(0)
	b.open.Store(false)
}

func (b *breaker) err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastErr
}

// prober closes the breaker again: while it is open, it PINGs Redis (every
// master of a cluster) each ProbeInterval and closes it on success.
func (l *Limiter) prober() {
	defer l.wg.Done()
	t := time.NewTicker(l.opts.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-l.breaker.wake:
		}
		for !l.breaker.allow() {
			select {
			case <-l.ctx.Done():
				return
			case <-t.C:
			}
			if l.ping() == nil {
				l.breaker.close()
			}
		}
	}
}

// ping waits up to MaxTimeout, and a successful PING's time feeds the
// budget: a Redis that always answers, but slower than Timeout, is slow,
// not down. Bounded by Timeout, the probe never closed the breaker for it,
// and with the breaker closed the budget, which grows only from answers,
// still let every idle decision time out.
func (l *Limiter) ping() error {
	ctx, cancel := context.WithTimeout(l.ctx, max(l.opts.MaxTimeout, 100*time.Millisecond))
	defer cancel()
	start := time.Now()
	var err error
	if c, ok := l.rdb.(*redis.ClusterClient); ok {
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.Ping(ctx).Err()
		})
	} else {
		err = l.rdb.Ping(ctx).Err()
	}
	if err == nil {
		now := time.Now()
		l.latency.observe(now.Sub(start), now)
	}
	return err
}
