package limiter

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Durable admits (Rule.Durable). Redis replicates asynchronously: a master
// answers a script before its replicas have its writes, and a replica that
// takes over after the master died has lost whatever had not reached it,
// admits included. The fleet then admits those requests' budget a second
// time: over the limit by what the replica lacked (measured on a replica
// 100 ms behind: every admit of the last 100 ms before a kill -9).
//
// A round trip that carries a durable admit therefore ends with WAIT 1
// on each connection it used (each node's part, on a Cluster; WAIT counts
// the replicas that have every write of its connection so far), and such
// an admit counts only if a replica acknowledged it. One that none did in
// time is taken back (the undo script) and decided by the rule's fail
// mode, with ErrNotReplicated: Redis did not decide it in a way that
// survives a failover. A denial writes nothing and needs no replica.
//
// A master without a replica, as the one promoted by a failover is until a
// new replica has synced, acknowledges nothing: each round trip with a
// durable admit then waits ReplicaWait and its durable rules go to their
// fail mode.

// replicaAcks collects, for one round trip, how many replicas acknowledged
// each command (the WAIT that followed it on its connection).
type replicaAcks struct {
	timeoutMs int64

	mu   sync.Mutex
	acks map[redis.Cmder]int64
}

type replicaAcksKey struct{}

// withReplicaAcks asks, through ctx, the pipelineHook of each connection
// the round trip uses to append a WAIT with timeout, and returns where
// the answers go.
func withReplicaAcks(ctx context.Context, timeout time.Duration) (context.Context, *replicaAcks) {
	a := &replicaAcks{timeoutMs: max(1, timeout.Milliseconds()), acks: map[redis.Cmder]int64{}}
	return context.WithValue(ctx, replicaAcksKey{}, a), a
}

func replicaAcksOf(ctx context.Context) *replicaAcks {
	a, _ := ctx.Value(replicaAcksKey{}).(*replicaAcks)
	return a
}

// record notes that the commands of one pipeline that succeeded have
// wait's answer: the replicas that have them. A later attempt (go-redis
// following a redirect) overwrites an earlier one.
func (a *replicaAcks) record(cmds []redis.Cmder, wait *redis.IntCmd) {
	n := int64(0)
	if wait.Err() == nil {
		n = wait.Val()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range cmds {
		if c != wait && c.Err() == nil {
			a.acks[c] = n
		}
	}
}

// acknowledged reports whether a replica has what c wrote.
func (a *replicaAcks) acknowledged(c redis.Cmder) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.acks[c] >= 1
}

// copy gives to, one decision's part of a batch call's answer, the
// acknowledgement of from, the batch call.
func (a *replicaAcks) copy(from, to redis.Cmder) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n, ok := a.acks[from]; ok {
		a.acks[to] = n
	}
}

// replicaWaitFor is the WAIT timeout of a round trip that must end by dl:
// ReplicaWait, or half of what remains, so that WAIT's answer and not the
// deadline ends the round trip.
func (l *Limiter) replicaWaitFor(dl time.Time) time.Duration {
	return min(l.opts.ReplicaWait, time.Until(dl)/2)
}

// notReplicated finishes o, a durable decide op whose admit no replica
// acknowledged, with ErrNotReplicated, and takes its admit back. It
// reports false when the script admitted nothing: its answer (a denial)
// stands.
func (l *Limiter) notReplicated(o *op, v any) bool {
	rep, err := decodeDecide(v, o.args[2].(int), nil)
	if err != nil || !rep.committed {
		return false
	}
	l.stats.notReplicated.Add(1)
	if args := lateUndoArgs(o.args, rep); args != nil {
		l.stats.undos.Add(1)
		l.enqueueNoWait(l.repairOp(&undoLua, args))
	}
	o.finish(nil, ErrNotReplicated)
	return true
}
