package limiter

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

// slotMoving reports whether err is Redis Cluster refusing a command,
// unrun, because its slot is moving between nodes: a redirect that
// go-redis's own MaxRedirects did not settle (MOVED, ASK), or TRYAGAIN
// (some keys of the command have moved and some not, or the node the slot
// moves to lacks some of them).
func slotMoving(err error) bool {
	if redis.IsTryAgainError(err) {
		return true
	}
	_, moved := redis.IsMovedError(err)
	_, ask := redis.IsAskError(err)
	return moved || ask
}

// retryLater resends o after a pause when Redis Cluster refused it unrun
// for a moving slot, while its deadline allows; it reports whether it took
// o. The pause grows from 1 ms to 64 ms: a redirect settles at once and a
// split command's keys are moved by the next MIGRATE, while a long
// migration should not be hammered. A decide script over several keys that
// met TRYAGAIN is not resent: its caller decides its keys one by one
// (call.splitRefused), since a new node refuses it until the whole slot
// has moved if one of its keys does not exist yet.
func (l *Limiter) retryLater(o *op, err error) bool {
	if !slotMoving(err) || (o.script == &decideLua && o.args[2].(int) > 1 && redis.IsTryAgainError(err)) {
		return false
	}
	pause := time.Millisecond << min(o.resent, 6)
	if !time.Now().Add(pause).Before(o.deadline) {
		return false
	}
	o.resent++
	if !o.state.CompareAndSwap(opInflight, opQueued) {
		return true // its caller gave up; nothing ran, nothing to undo
	}
	l.stats.resent.Add(1)
	time.AfterFunc(pause, func() { l.enqueueNoWait(o) })
	return true
}

// resendTimedOut sends a decision of the idle path once more, through the
// queue, when its read timed out and the process was not running at the
// time it should have: it woke more than a twentieth of the timeout after
// the deadline (a SIGSTOP, a throttled container, a starved node). It
// reports whether it took o. Redis may have answered in time: Go reports a
// passed deadline before it looks at the socket, and go-redis then closes
// the connection with the answer in it. Resent, the decision is read until
// its hard deadline, and its caller waits with the patience of a queued
// decision, whose grace is as long as the process was late (patience). A
// read that timed out on time is a Redis that did not answer within the
// budget, and the decision follows its fail mode as before.
//
// The resend admits nothing twice into a SlidingLog key: the decide script
// finds its own member and replays the first run's answer. A counter key
// keeps no members, so a resend after a first run that did commit counts
// it twice there (stricter by its hits, for a window, never looser), as a
// lost reply on Redis Cluster does.
func (l *Limiter) resendTimedOut(o *op, err error) bool {
	if o.idleBy.IsZero() || o.script != &decideLua || !timedOut(err) {
		return false
	}
	late := time.Since(o.idleBy)
	o.idleBy = time.Time{} // once
	if late <= l.opts.Timeout/20 || !time.Now().Before(o.deadline) {
		return false
	}
	if !o.state.CompareAndSwap(opInflight, opQueued) {
		return false
	}
	l.stats.readAgain.Add(1)
	l.enqueueNoWait(o)
	return true
}

// timedOut reports whether err is a read or write that hit its deadline.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.As(err, &ne) && ne.Timeout()
}

// undoLate takes back what a decide script admitted for a caller that had
// already given up (timed out, cancelled): the caller answered from the
// fallback or failed closed, so the admit must not stand. Only the op's
// lost finish leads here, once, and the caller, not having the reply, never
// undoes it itself.
func (l *Limiter) undoLate(o *op, v any) {
	if o.script != &decideLua {
		return
	}
	rep, err := decodeDecide(v, o.args[2].(int), nil)
	if err != nil {
		return
	}
	if args := lateUndoArgs(o.args, rep); args != nil {
		l.stats.undos.Add(1)
		l.enqueueNoWait(l.repairOp(&undoLua, args))
	}
}

// cancelLost takes back, best effort, the SlidingLog admits of a decide
// script whose reply was lost after it may have been written (err).
// Counter keys are left: without the reply the field to decrement is
// unknown and a decrement is not idempotent, so a lost reply may keep at
// most its hits there, for a window.
func (l *Limiter) cancelLost(o *op, err error) {
	if o.script != &decideLua || !mayHaveRun(err) || l.ctx.Err() != nil {
		return
	}
	args := cancelArgs(o.args)
	if args == nil {
		return
	}
	if l.cancels.Add(1) > maxCancels {
		l.cancels.Add(-1)
		return
	}
	l.stats.undos.Add(1)
	go l.cancelUntilDone(args)
}

// maxCancels bounds the cancels pending at once (a long outage without the
// breaker loses a reply per decision).
const maxCancels = 1024

// cancelRetryFor is how long a cancel is retried: the lost script may sit
// in the socket buffer of a hung Redis until it resumes, and the new
// connection a cancel needs cannot be set up before then.
const cancelRetryFor = time.Minute

// cancelUntilDone sends the cancel command args until Redis answers it
// (the cancel is idempotent, so an attempt given up on may still run),
// backing off from Timeout to a second between attempts.
func (l *Limiter) cancelUntilDone(args []any) {
	defer l.cancels.Add(-1)
	giveUp := time.Now().Add(cancelRetryFor)
	pause := l.opts.Timeout
	wait := time.NewTimer(time.Hour)
	defer wait.Stop()
	for {
		o := l.repairOp(&cancelLua, args)
		l.enqueueNoWait(o)
		// An op whose deadline passes in the queue is dropped unanswered.
		wait.Reset(2 * time.Until(o.deadline))
		select {
		case <-o.done:
		case <-wait.C:
			o.abandon(ErrTimeout)
		case <-l.ctx.Done():
			return
		}
		if o.err == nil || !time.Now().Add(pause).Before(giveUp) {
			return
		}
		wait.Reset(pause)
		select {
		case <-wait.C:
		case <-l.ctx.Done():
			return
		}
		pause = min(2*pause, time.Second)
	}
}

// mayHaveRun says whether a command that failed with err may have reached
// Redis: a timeout or a connection lost while reading or writing, not a
// failed dial or an answer of Redis's.
func mayHaveRun(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op != "dial"
}
