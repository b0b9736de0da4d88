package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisschema"
)

var decideBatchLua = newScript(redisschema.DecideBatch)

// maxBatchHits bounds the hits of one batch call (the script refuses
// more); a decision that alone has more goes by redisschema.Decide.
const maxBatchHits = 65536

// wireCall is one command of a round trip and the ops it answers: one op
// and its own command, or (script decideBatchLua) the decide ops of one
// slot, each one decision of the batch call.
type wireCall struct {
	script *script
	args   []any
	ops    []*op
	keys   int   // batch: the keys of its decisions
	hits   int64 // batch: their hits
	alone  bool  // batch: takes no other decision
}

// pack lays out batch as the commands of one round trip: the decide ops
// that share a slot (every one, on a standalone server) in one batch call,
// the others (undo, cancel, announce) as they are. A decide op that Redis
// Cluster refused once (retryLater) goes alone: a batch over keys of a
// moving slot is refused (TRYAGAIN) while a one-key call is served.
func (l *Limiter) pack(batch []*op) []wireCall {
	calls := make([]wireCall, 0, 2)
	var bySlot map[string]int // the open batch call of each slot
	perDecision := l.opts.CallPerDecision || l.oneCallUntil.Load() > time.Now().UnixNano()
	for _, o := range batch {
		nk, hits := decideSize(o)
		if perDecision || nk == 0 || hits > maxBatchHits {
			calls = append(calls, wireCall{script: o.script, args: o.args, ops: []*op{o}})
			continue
		}
		var where string
		switch l.grouping {
		case groupSlot:
			where = strconv.Itoa(redisschema.Slot(o.args[cmdHead].(string)))
		case groupTag:
			where = redisschema.HashTag(o.args[cmdHead].(string))
		}
		if o.resent > 0 {
			calls = append(calls, wireCall{script: &decideBatchLua, ops: []*op{o}, keys: nk, hits: hits, alone: true})
			continue
		}
		i, open := -1, false
		if bySlot != nil {
			i, open = bySlot[where]
		} else if l.grouping == groupAll && len(calls) > 0 && calls[0].script == &decideBatchLua && !calls[0].alone {
			// Standalone: the first batch call is the open one (pack
			// replaces it when full: see below).
			i, open = 0, true
		}
		if open {
			c := &calls[i]
			if c.keys+nk <= maxScriptKeys && c.hits+hits <= maxBatchHits {
				c.ops = append(c.ops, o)
				c.keys, c.hits = c.keys+nk, c.hits+hits
				continue
			}
		}
		calls = append(calls, wireCall{script: &decideBatchLua, ops: []*op{o}, keys: nk, hits: hits})
		if l.grouping == groupAll {
			// Keep the open call first.
			last := len(calls) - 1
			calls[0], calls[last] = calls[last], calls[0]
			continue
		}
		if bySlot == nil {
			bySlot = make(map[string]int)
		}
		bySlot[where] = len(calls) - 1
	}
	for i := range calls {
		if calls[i].args == nil {
			calls[i].args = batchArgs(l.api, calls[i].ops, calls[i].keys)
		}
	}
	return calls
}

// decideSize is the keys and hits of o's decision; 0 keys when o is not
// a decide op.
func decideSize(o *op) (keys int, hits int64) {
	if o.script != &decideLua {
		return 0, 0
	}
	n := o.args[2].(int)
	for k := range n {
		b := cmdHead + n + decideHead + decidePerKey*k
		if argInt(o.args[b+2])&flagCalendar != 0 {
			// The batch function knows no calendar key: the decision goes
			// alone, by redisschema.Decide.
			return 0, 0
		}
		if argInt(o.args[b+2])&flagWeighted != 0 {
			hits++ // one member whatever the cost
			continue
		}
		hits += argInt(o.args[b+3])
	}
	return n, hits
}

// batchArgs lays out the batch call of ops (decide ops over nkeys keys in
// all): each op's decide command as one decision.
func batchArgs(a api, ops []*op, nkeys int) []any {
	out := make([]any, 0, cmdHead+batchHead+(1+decidePerKey)*nkeys+3*len(ops))
	cmd, name := a.head(&decideBatchLua)
	out = append(out, cmd, name, nkeys)
	for _, o := range ops {
		out = append(out, o.args[cmdHead:cmdHead+o.args[2].(int)]...)
	}
	for j, o := range ops {
		n := o.args[2].(int)
		head := cmdHead + n
		if j == 0 {
			out = append(out, o.args[head+1]) // the margin: one per limiter
		}
		out = append(out, o.args[head], o.args[head+2], argCount(n))
		out = append(out, o.args[head+decideHead:head+decideHead+decidePerKey*n]...)
	}
	return out
}

// batchHead is ARGV[1] of the batch call: the margin.
const batchHead = 1

// argCount is a decision's number of keys as an argument, boxed once for
// the common one.
func argCount(n int) any {
	if n == 1 {
		return argOneHit
	}
	return strconv.Itoa(n)
}

// answers appends to cmds the answer of each op of c, from w, c's command
// as Redis answered it: w itself for an op sent alone, else each
// decision's part of the batch reply in redisschema.Decide's layout, with w's
// error or replica acknowledgement.
func (c *wireCall) answers(ctx context.Context, w *redis.Cmd, acks *replicaAcks, cmds []*redis.Cmd) []*redis.Cmd {
	if c.script != &decideBatchLua {
		return append(cmds, w)
	}
	var parts []any
	err := w.Err()
	if err == nil && w.Val() != nil {
		var ok bool
		if parts, ok = splitBatch(w.Val(), c.ops); !ok {
			err = fmt.Errorf("limiter: malformed decide batch reply")
		}
	}
	for j := range c.ops {
		a := redis.NewCmd(ctx)
		switch {
		case err != nil:
			a.SetErr(err)
		case parts != nil:
			a.SetVal(parts[j])
		}
		if acks != nil {
			acks.copy(w, a)
		}
		cmds = append(cmds, a)
	}
	return cmds
}

// splitBatch turns v, the reply of a batch call over ops, into each op's
// reply as redisschema.Decide would have given it.
func splitBatch(v any, ops []*op) ([]any, bool) {
	vals, ok := v.([]any)
	if !ok || len(vals) < 1 {
		return nil, false
	}
	out := make([]any, len(ops))
	i := 1
	for j, o := range ops {
		n := o.args[2].(int)
		size := 1 + replyPerKey*n
		if i+size > len(vals) {
			return nil, false
		}
		r := make([]any, 0, replyHead+replyPerKey*n)
		r = append(r, vals[0])
		out[j] = append(r, vals[i:i+size]...)
		i += size
	}
	return out, i == len(vals)
}

// olderLibraryPause is how long a limiter sends one call per decision
// after Redis's library lacked the batch function, before it tries the
// batch function again.
const olderLibraryPause = 10 * time.Second

// olderLibrary resends, one call per decision and in one more round trip,
// the decisions of the batch calls in wire that Redis answered "Function
// not found", and returns calls and wire with those calls replaced. A
// library of the release before has the decide function but not the batch
// one: while a fleet is upgraded the new sidecars start before the new
// manager leads and loads its library (or a platform team that loads the
// library itself has not yet), and they must decide through Redis, not by
// their fail mode. The limiter then sends one call per decision for
// olderLibraryPause. A Redis without any library answers the resent calls
// "Function not found" too, and the fail mode decides, as before.
func (l *Limiter) olderLibrary(ctx context.Context, calls []wireCall, wire []*redis.Cmd, wait bool) ([]wireCall, []*redis.Cmd, error) {
	missing := func(i int) bool {
		return calls[i].script == &decideBatchLua && l.api.functions && errors.Is(functionsMissing(wire[i].Err()), ErrNoFunctions)
	}
	found := false
	for i := range calls {
		if missing(i) {
			found = true
			break
		}
	}
	if !found {
		return calls, wire, nil
	}
	outCalls := make([]wireCall, 0, len(calls)+8)
	outWire := make([]*redis.Cmd, 0, len(calls)+8)
	var again []*redis.Cmd
	for i := range calls {
		if !missing(i) {
			outCalls, outWire = append(outCalls, calls[i]), append(outWire, wire[i])
			continue
		}
		for _, o := range calls[i].ops {
			c := redis.NewCmd(ctx, o.args...)
			outCalls = append(outCalls, wireCall{script: o.script, args: o.args, ops: []*op{o}})
			outWire, again = append(outWire, c), append(again, c)
		}
	}
	l.oneCallUntil.Store(time.Now().Add(olderLibraryPause).UnixNano())
	l.stats.olderLibrary.Add(1)
	err := l.send(ctx, again, wait)
	l.stats.roundTrips.Add(1)
	return outCalls, outWire, err
}
