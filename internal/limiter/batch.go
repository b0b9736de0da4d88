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
	script   *script   // what args call, for a NOSCRIPT resend
	args     []any     // the whole EVALSHA command
	start    time.Time // when its decision began (zero for an undo)
	deadline time.Time
	reply    any // the script's reply, undecoded
	err      error
	done     chan struct{}
	// resent counts the times Redis Cluster refused it unrun because its
	// slot was moving (retryLater).
	resent int
	// durable: its admits count only once a replica has them (see
	// durable.go).
	durable bool
	// idleBy: its caller makes its round trip itself, reading only until
	// this time, the decision's budget (roundTripNow). A read that timed
	// out well after it is resent once through the queue (resendTimedOut).
	idleBy time.Time
	// Inline room for a one-key decision's command, so the hot path does
	// not allocate it.
	argsBuf [oneKeyDecideLen]any
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

// finish hands the result to the caller unless it gave up, and reports
// whether it did. The fields are written only after winning the state, and
// read by the caller only after receiving from done, so the two never race.
func (o *op) finish(c *redis.Cmd, err error) bool {
	if !o.state.CompareAndSwap(opInflight, opDone) {
		return false
	}
	if err == nil {
		o.reply = c.Val()
	} else {
		o.err = err
	}
	o.done <- struct{}{}
	return true
}

// abandon gives up on o with err, unless it finished meanwhile: its answer
// is then used.
func (o *op) abandon(err error) {
	if prev := o.state.Swap(opAbandoned); prev == opDone {
		<-o.done
		return
	}
	o.err = err
}

// submitAndWait queues the ops of groups and waits for them until the
// deadline, or on until hard while Redis is answering (see
// patience.exhausted). An op that did not finish carries the reason in its
// err.
func (l *Limiter) submitAndWait(ctx context.Context, groups []group, start, deadline, hard time.Time) {
	sent := false // the op of the only group is on its way already
	if len(groups) == 1 {
		var answered bool
		if sent, answered = l.roundTripNow(groups[0].op, deadline); answered {
			return
		}
	}
	p := patience{l: l, start: start, hard: hard, due: deadline, timer: timerPool.Get().(*time.Timer)}
	p.timer.Reset(time.Until(deadline))
	defer func() {
		p.timer.Stop() // Go ≥1.23: no stale tick is left for the next user
		timerPool.Put(p.timer)
	}()
	var err error
	for gi := range groups {
		o := groups[gi].op
		if err == nil && !sent {
			err = p.enqueue(ctx, o)
		}
		if err != nil {
			o.state.Store(opAbandoned) // never queued
			o.err = err
		}
	}
	for gi := range groups {
		o := groups[gi].op
		if err == nil {
			err = p.await(ctx, o)
		}
		if err != nil {
			o.abandon(err)
		}
	}
	if err != nil {
		l.stats.timeouts.Add(1)
		if errors.Is(err, ErrTimeout) {
			l.breaker.failure(err)
		}
	}
}

// roundTripNow makes o's round trip on the caller's goroutine when the
// limiter is idle: nothing to coalesce with and a connection free, which
// saves two goroutine hand-offs. Under load the flushers always wait for
// tokens, so this path turns itself off and decisions are batched. It
// reports whether it made the round trip, and whether o is answered: a
// Redis Cluster that refused it for a moving slot has it resent later
// (retryLater), and the caller waits for that answer as for any other.
func (l *Limiter) roundTripNow(o *op, deadline time.Time) (made, answered bool) {
	if !l.honorsDeadlines || len(l.queue) != 0 || l.waiting.Load() != 0 {
		return false, false
	}
	select {
	case l.tokens <- struct{}{}:
	default:
		return false, false
	}
	o.state.Store(opInflight)
	o.idleBy = deadline
	// Bounded by the budget: the idle path has no one to tell a slow Redis
	// from a hung one. A read that times out is resent (resendTimedOut),
	// and the caller then waits with the patience of a queued decision.
	l.exec([]*op{o}, make([]*redis.Cmd, 0, 1), deadline)
	<-l.tokens
	select {
	case <-o.done:
	default:
		return true, false
	}
	if o.err != nil && !time.Now().Before(deadline) {
		o.err = fmt.Errorf("%w: %w", ErrTimeout, o.err)
		l.stats.timeouts.Add(1)
	}
	return true, true
}

// patience is a decision's wait for Redis. When its timer fires (first at
// the budget), the decision waits on until hard if Redis has answered
// anyone since the decision began. Before judging that it has not, it
// waits once more, a grace: a process starved of CPU may hold answers it
// has not read. The grace is a twentieth of the timeout, or as long as the
// timer fired late if that is longer: a process that was not running (a
// SIGSTOP, a throttled container) wakes its waiting callers and its
// readers together, and the readers need as long to catch up.
type patience struct {
	l           *Limiter
	timer       *time.Timer
	start, hard time.Time
	due         time.Time // when the timer should fire
	graced      bool
}

// exhausted is asked when the timer fires; it rearms the timer when the
// decision waits on.
func (p *patience) exhausted() bool {
	now := time.Now()
	if !now.Before(p.hard) {
		return true
	}
	if p.l.lastAnswer.Load() > p.start.UnixNano() {
		p.timer.Reset(p.hard.Sub(now))
		p.due = p.hard
		return false
	}
	if !p.graced {
		p.graced = true
		grace := min(max(p.l.opts.Timeout/20, now.Sub(p.due)), p.hard.Sub(now))
		p.timer.Reset(grace)
		p.due = now.Add(grace)
		return false
	}
	return true
}

// enqueue puts o in the queue, waiting for room while patience lasts.
func (p *patience) enqueue(ctx context.Context, o *op) error {
	return p.wait(ctx, p.l.queue, o, nil)
}

// await waits for o's answer while patience lasts.
func (p *patience) await(ctx context.Context, o *op) error {
	return p.wait(ctx, nil, nil, o.done)
}

// wait sends o on queue or receives from done, whichever of the two is
// not nil (a nil channel is never ready), while patience lasts.
func (p *patience) wait(ctx context.Context, queue chan<- *op, o *op, done <-chan struct{}) error {
	for {
		select {
		case queue <- o:
			return nil
		case <-done:
			return nil
		case <-p.timer.C:
			if p.exhausted() {
				return ErrTimeout
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
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
		if !l.acquireToken(first) {
			return
		}
		batch = l.fillBatch(batch[:0], first, linger)
		if len(batch) > 0 {
			cmds = l.exec(batch, cmds[:0], time.Time{})
		}
		<-l.tokens
	}
}

// acquireToken waits for a connection token for the batch that first
// starts; meanwhile more decisions queue up. It reports false when the
// limiter closes first, after failing first.
func (l *Limiter) acquireToken(first *op) bool {
	l.waiting.Add(1)
	select {
	case l.tokens <- struct{}{}:
		l.waiting.Add(-1)
		return true
	case <-l.ctx.Done():
		l.waiting.Add(-1)
		if first.take(time.Time{}) {
			first.finish(nil, ErrClosed)
		}
		return false
	}
}

// fillBatch appends first and whatever else is queued, up to MaxBatch, to
// batch; when the queue runs dry and linger is set, it waits up to MaxWait
// once for one more. Ops whose deadline has passed are left out.
func (l *Limiter) fillBatch(batch []*op, first *op, linger *time.Timer) []*op {
	now := time.Now()
	if first.take(now) {
		batch = append(batch, first)
	}
	lingered := linger == nil
	for len(batch) < l.opts.MaxBatch {
		select {
		case o := <-l.queue:
			if o.take(now) {
				batch = append(batch, o)
			}
		default:
			if lingered {
				return batch
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
				return batch
			}
		}
	}
	return batch
}

// send makes one round trip: a pipeline, or for a single command the plain
// path, which go-redis makes cheaper than a pipeline of one; a round trip
// that must end with a WAIT (pipelineHook) is always a pipeline.
func (l *Limiter) send(ctx context.Context, cmds []*redis.Cmd, wait bool) error {
	if len(cmds) == 1 && !wait {
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

// exec sends one batch as one pipeline, with the batch's latest deadline
// unless dl is set, and hands each op its answer. Scripts the server does
// not know come back NOSCRIPT without having run, so they are resent as
// EVAL (asEval); go-redis's Script.Run cannot do this inside a pipeline.
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
	var acks *replicaAcks
	for _, o := range batch {
		if o.durable && acks == nil {
			ctx, acks = withReplicaAcks(ctx, l.replicaWaitFor(dl))
		}
	}
	calls := l.pack(batch)
	wire := make([]*redis.Cmd, len(calls))
	for i := range calls {
		wire[i] = redis.NewCmd(ctx, calls[i].args...)
	}
	// Per-command errors are read below. Exec's own error matters when the
	// connection could not be set up with a Redis error (WRONGPASS,
	// NOPERM on HELLO): go-redis then leaves the commands without error
	// and without value.
	execErr := l.send(ctx, wire, acks != nil)
	l.stats.roundTrips.Add(1)
	l.stats.ops.Add(int64(len(batch)))
	if err := l.resendUnknown(ctx, calls, wire, acks != nil); err != nil {
		execErr = err
	}
	calls, wire, err := l.olderLibrary(ctx, calls, wire, acks != nil)
	if err != nil {
		execErr = err
	}
	batch = batch[:0]
	for i := range calls {
		batch = append(batch, calls[i].ops...)
		cmds = calls[i].answers(ctx, wire[i], acks, cmds)
	}
	l.deliver(batch, cmds, execErr, acks)
	clear(cmds)
	return cmds[:0]
}

// resendUnknown resends as EVAL, in one more round trip, the commands of
// calls that came back NOSCRIPT, replacing them in cmds. It returns that
// round trip's error.
func (l *Limiter) resendUnknown(ctx context.Context, calls []wireCall, cmds []*redis.Cmd, wait bool) error {
	var again []*redis.Cmd
	for i, c := range cmds {
		if isNoScript(c.Err()) {
			cmds[i] = redis.NewCmd(ctx, asEval(calls[i].args, calls[i].script)...)
			again = append(again, cmds[i])
		}
	}
	if len(again) == 0 {
		return nil
	}
	l.stats.noScript.Add(1)
	err := l.send(ctx, again, wait)
	l.stats.roundTrips.Add(1)
	return err
}

// deliver hands each op of batch the answer of its command in cmds, and
// tells the breaker and the budget how the round trip went. execErr stands
// in for an answer go-redis left empty; acks, when set, says which
// commands a replica acknowledged (durable ops).
func (l *Limiter) deliver(batch []*op, cmds []*redis.Cmd, execErr error, acks *replicaAcks) {
	var firstErr error
	answered := time.Now()
	anyAnswer := false
	for i, o := range batch {
		c := cmds[i]
		err := functionsMissing(c.Err())
		if err == nil && c.Val() == nil {
			err = execErr
			if err == nil {
				err = errNoReply
			}
		}
		if err != nil && (l.resendTimedOut(o, err) || l.retryLater(o, err)) {
			continue
		}
		if err != nil {
			err = quotasUnknown(o, err)
			// A moving slot is Redis answering, not failing; so is a library
			// older than a quota (its fail mode decides the request, and
			// every other rule still goes to Redis).
			if firstErr == nil && !slotMoving(err) && !errors.Is(err, ErrNoQuotas) {
				firstErr = err
			}
			o.finish(nil, err)
			l.cancelLost(o, err)
			continue
		}
		if !o.start.IsZero() {
			l.latency.observe(answered.Sub(o.start), answered)
		}
		anyAnswer = true
		if o.durable && !acks.acknowledged(c) && l.notReplicated(o, c.Val()) {
			continue
		}
		if !o.finish(c, nil) {
			l.undoLate(o, c.Val())
		}
	}
	if anyAnswer {
		l.lastAnswer.Store(answered.UnixNano())
	}
	switch {
	case firstErr != nil:
		l.breaker.failure(firstErr)
	case anyAnswer:
		l.breaker.success()
	}
}
