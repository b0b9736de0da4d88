package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// op is one script call waiting for, or riding in, a pipelined round trip.
type op struct {
	state    atomic.Int32
	args     []any // the whole EVALSHA command
	nkeys    int
	start    time.Time // when its decision began (zero for an undo)
	deadline time.Time
	reply    []int64
	err      error
	done     chan struct{}
	// Inline room for a one-key decision, so the hot path allocates
	// neither its arguments nor its reply.
	argsBuf  [11]any
	replyBuf [2 + replyPerKey]int64
}

const (
	opQueued int32 = iota
	opInflight
	opAbandoned
	opDone
)

// take moves a queued op into a batch; false if its caller gave up or its
// deadline passed (it is then never sent: Redis must not count an admit
// whose caller already decided otherwise).
func (o *op) take(now time.Time) bool {
	if !now.IsZero() && !now.Before(o.deadline) {
		o.state.CompareAndSwap(opQueued, opAbandoned)
		return false
	}
	return o.state.CompareAndSwap(opQueued, opInflight)
}

// finish hands the result to the caller unless it gave up. The fields are
// written only after winning the state, and read by the caller only after
// receiving from done, so the two never race.
func (o *op) finish(c *redis.Cmd, err error) {
	if !o.state.CompareAndSwap(opInflight, opDone) {
		return
	}
	if err == nil {
		o.reply, o.err = parseReply(c, o.replyBuf[:0])
	} else {
		o.err = err
	}
	o.done <- struct{}{}
}

// parseReply reads a script's array of integers into buf.
func parseReply(c *redis.Cmd, buf []int64) ([]int64, error) {
	vals, ok := c.Val().([]any)
	if !ok {
		return nil, fmt.Errorf("limiter: unexpected reply %T", c.Val())
	}
	for _, v := range vals {
		n, ok := v.(int64)
		if !ok {
			return nil, fmt.Errorf("limiter: unexpected reply element %T", v)
		}
		buf = append(buf, n)
	}
	return buf, nil
}

// run queues the ops and waits for them until the deadline, or on until
// hard while Redis is answering (see giveUp). It returns the error of the
// ops that did not finish (nil when all did).
func (l *Limiter) run(ctx context.Context, groups []group, start, deadline, hard time.Time) error {
	if len(groups) == 1 && l.direct && len(l.queue) == 0 && l.waiting.Load() == 0 {
		// Idle: nothing to coalesce with and a connection free. The caller
		// makes the round trip itself, saving two goroutine hand-offs.
		// Under load the flushers always wait for tokens, so this path
		// turns itself off and decisions are batched.
		select {
		case l.tokens <- struct{}{}:
			o := groups[0].op
			o.state.Store(opInflight)
			// Bounded by the budget: the idle path has no one to tell a
			// slow Redis from a hung one.
			l.exec([]*op{o}, make([]*redis.Cmd, 0, 1), deadline)
			<-l.tokens
			if o.err != nil && !time.Now().Before(deadline) {
				o.err = fmt.Errorf("%w: %w", ErrTimeout, o.err)
				l.stats.timeouts.Add(1)
				return o.err
			}
			return nil
		default:
		}
	}
	timer := timerPool.Get().(*time.Timer)
	timer.Reset(time.Until(deadline))
	defer func() {
		timer.Stop() // Go ≥1.23: no stale tick is left for the next user
		timerPool.Put(timer)
	}()
	graced := false
	// giveUp is asked when the timer fires: past the budget, a decision
	// waits on until hard if Redis has answered anyone since it began.
	// Before judging that it has not, it waits a twentieth of the timeout
	// once more: a process starved of CPU may hold answers it has not read.
	giveUp := func() bool {
		now := time.Now()
		if !now.Before(hard) {
			return true
		}
		if l.lastAnswer.Load() > start.UnixNano() {
			timer.Reset(hard.Sub(now))
			return false
		}
		if !graced {
			graced = true
			timer.Reset(min(l.opts.Timeout/20, hard.Sub(now)))
			return false
		}
		return true
	}
	var err error
	for gi := range groups {
		o := groups[gi].op
	send:
		for err == nil {
			select {
			case l.queue <- o:
				break send
			case <-timer.C:
				if giveUp() {
					err = ErrTimeout
				}
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		if err != nil {
			o.state.Store(opAbandoned) // never queued
			o.err = err
		}
	}
	for gi := range groups {
		o := groups[gi].op
	wait:
		for err == nil {
			select {
			case <-o.done:
				break wait
			case <-timer.C:
				if giveUp() {
					err = ErrTimeout
				}
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		if err == nil {
			continue
		}
		if prev := o.state.Swap(opAbandoned); prev == opDone {
			<-o.done // it finished as we gave up: use the answer
			continue
		}
		o.err = err
	}
	if err != nil {
		l.stats.timeouts.Add(1)
		if errors.Is(err, ErrTimeout) {
			l.br.failure(err)
		}
	}
	return err
}

var timerPool = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// flusher owns one pipelined round trip at a time: it takes whatever
// decisions are queued (up to MaxBatch, waiting up to MaxWait for more when
// the batch is short) and sends them together.
func (l *Limiter) flusher() {
	defer l.wg.Done()
	batch := make([]*op, 0, l.opts.MaxBatch)
	cmds := make([]*redis.Cmd, 0, l.opts.MaxBatch)
	var linger *time.Timer
	if l.opts.MaxWait > 0 {
		linger = time.NewTimer(time.Hour)
		linger.Stop()
	}
	for {
		var first *op
		select {
		case first = <-l.queue:
		case <-l.ctx.Done():
			return
		}
		// A connection token; meanwhile more decisions queue up.
		l.waiting.Add(1)
		select {
		case l.tokens <- struct{}{}:
			l.waiting.Add(-1)
		case <-l.ctx.Done():
			l.waiting.Add(-1)
			if first.take(time.Time{}) {
				first.finish(nil, ErrClosed)
			}
			return
		}
		now := time.Now()
		batch = batch[:0]
		if first.take(now) {
			batch = append(batch, first)
		}
		lingered := linger == nil
	fill:
		for len(batch) < l.opts.MaxBatch {
			select {
			case o := <-l.queue:
				if o.take(now) {
					batch = append(batch, o)
				}
			default:
				if lingered {
					break fill
				}
				lingered = true
				linger.Reset(l.opts.MaxWait)
				select {
				case o := <-l.queue:
					if o.take(now) {
						batch = append(batch, o)
					}
					linger.Stop() // Go ≥1.23: no stale tick survives Stop
				case <-linger.C:
					break fill
				}
			}
		}
		if len(batch) > 0 {
			cmds = l.exec(batch, cmds[:0], time.Time{})
		}
		<-l.tokens
	}
}

// send makes one round trip: a pipeline, or for a single command the plain
// path, which go-redis makes cheaper than a pipeline of one.
func (l *Limiter) send(ctx context.Context, cmds []*redis.Cmd) error {
	if len(cmds) == 1 {
		return l.rdb.Process(ctx, cmds[0])
	}
	pipe := l.rdb.Pipeline()
	for _, c := range cmds {
		_ = pipe.Process(ctx, c) // queues; errors come from Exec
	}
	_, err := pipe.Exec(ctx)
	return err
}

func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// exec sends one batch as one pipeline. Scripts the server does not know
// (restart, failover, SCRIPT FLUSH: the cache is gone) come back NOSCRIPT
// without having run, so they are resent as EVAL, which also caches them
// again; go-redis's Script.Run cannot do this inside a pipeline.
func (l *Limiter) exec(batch []*op, cmds []*redis.Cmd, dl time.Time) []*redis.Cmd {
	if dl.IsZero() {
		for _, o := range batch {
			if o.deadline.After(dl) {
				dl = o.deadline
			}
		}
	}
	ctx, cancel := context.WithDeadline(l.ctx, dl)
	defer cancel()
	for _, o := range batch {
		cmds = append(cmds, redis.NewCmd(ctx, o.args...))
	}
	// Per-command errors are read below. Exec's own error matters when the
	// connection could not be set up with a Redis error (WRONGPASS,
	// NOPERM on HELLO): go-redis then leaves the commands without error
	// and without value.
	execErr := l.send(ctx, cmds)
	l.stats.roundTrips.Add(1)
	l.stats.ops.Add(int64(len(batch)))

	var again []*redis.Cmd
	for i, c := range cmds {
		if isNoScript(c.Err()) {
			args := make([]any, len(batch[i].args))
			copy(args, batch[i].args)
			args[0] = "eval"
			if args[1] == argDecide {
				args[1] = decideLua.src
			} else {
				args[1] = undoLua.src
			}
			cmds[i] = redis.NewCmd(ctx, args...)
			again = append(again, cmds[i])
		}
	}
	if len(again) > 0 {
		l.stats.noScript.Add(1)
		if err := l.send(ctx, again); err != nil {
			execErr = err
		}
		l.stats.roundTrips.Add(1)
	}

	var firstErr error
	answered := time.Now()
	anyAnswer := false
	for i, o := range batch {
		c := cmds[i]
		err := c.Err()
		if err == nil && c.Val() == nil {
			err = execErr
			if err == nil {
				err = errNoReply
			}
		}
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			o.finish(nil, err)
			continue
		}
		if !o.start.IsZero() {
			l.lat.observe(answered.Sub(o.start), answered)
		}
		anyAnswer = true
		o.finish(c, nil)
	}
	if anyAnswer {
		l.lastAnswer.Store(answered.UnixNano())
	}
	if firstErr != nil {
		l.br.failure(firstErr)
	} else {
		l.br.success()
	}
	clear(cmds)
	return cmds[:0]
}
