package limiter

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// validRequest checks r's rule and hits.
func validRequest(r *Request) error {
	if r.Hits < 0 || r.Hits > MaxHits {
		return fmt.Errorf("%w: %q hits %d outside [0, %d]", ErrInvalidRule, r.Rule.ID, r.Hits, MaxHits)
	}
	return validRule(&r.Rule)
}

func validRule(r *Rule) error {
	if r.Window < minWindow || r.Window > maxWindow {
		return fmt.Errorf("%w: %q window %v outside [%v, %v]", ErrInvalidRule, r.ID, r.Window, minWindow, maxWindow)
	}
	switch r.Algorithm {
	case SlidingLog, SlidingWindowCounter, "":
	default:
		return fmt.Errorf("%w: %q algorithm %q", ErrInvalidRule, r.ID, r.Algorithm)
	}
	return nil
}

// Decide decides every rule one HTTP request must pass; see the contract in
// api.go. Rules whose keys share a slot (all of them on a standalone Redis)
// are decided by one atomic script that admits into none of them unless
// all non-dry-run rules allow. Across slots, a denial in one group undoes
// the admits of the others with a compensating call. A rule that allowed
// but whose admit was undone keeps Allowed true with Remaining as if the
// request had not come.
//
// FailMode "" counts as FailOpen.
func (l *Limiter) Decide(ctx context.Context, reqs []Request) []Decision {
	out := make([]Decision, len(reqs))
	if len(reqs) == 0 {
		return out
	}
	// Two deadlines: the budget, after which a decision falls back unless
	// Redis has answered anyone since it began (then it is slow, not down,
	// and the decision waits on), and MaxTimeout, after which it falls back
	// in any case.
	start := time.Now()
	deadline, hard := start.Add(l.budget(start)), start.Add(l.opts.MaxTimeout)
	if d, ok := ctx.Deadline(); ok {
		deadline, hard = minTime(deadline, d), minTime(hard, d)
	}

	valid := true
	var keyBuf [1]string
	keys := keyBuf[:0]
	if len(reqs) > 1 {
		keys = make([]string, 0, len(reqs))
	}
	for i := range reqs {
		if err := validRequest(&reqs[i]); err != nil {
			valid = false
			out[i] = Decision{Limit: reqs[i].Rule.Limit, RetryAfter: failedClosedRetry, Source: SourceFailedClosed, Err: err}
			keys = append(keys, "")
			continue
		}
		keys = append(keys, l.keyOf(&reqs[i]))
	}
	if l.view != nil && l.deniedByCache(reqs, keys, start, out) {
		l.stats.denyCache.Add(1)
		return out
	}

	var groups []group
	var failErr error
	switch {
	case l.closed.Load():
		failErr = ErrClosed
	case !l.br.allow():
		failErr = ErrCircuitOpen
		if last := l.br.err(); last != nil {
			failErr = fmt.Errorf("%w (last error: %w)", ErrCircuitOpen, last)
		}
	default:
		groups = l.groups(reqs, keys, valid)
		member := l.nextMember()
		for gi := range groups {
			g := &groups[gi]
			g.op = l.decideOp(reqs, g, member, valid || l.invalidAreDry(reqs), start, hard)
		}
		failErr = l.run(ctx, groups, start, deadline, hard)
	}

	// Redis answers.
	var failed []int
	var committed []*group
	for gi := range groups {
		g := &groups[gi]
		if g.op.err != nil || len(g.op.reply) != 2+replyPerKey*len(g.idx) {
			if g.op.err == nil {
				g.op.err = fmt.Errorf("limiter: malformed reply of %d values", len(g.op.reply))
			}
			failed = append(failed, g.idx...)
			continue
		}
		if l.fillRedis(ctx, reqs, g, start, out) {
			committed = append(committed, g)
		}
	}
	if failErr != nil && groups == nil {
		for i := range reqs {
			if out[i].Err == nil {
				failed = append(failed, i)
			}
		}
	}

	pass := true
	for i := range reqs {
		if !reqs[i].DryRun && !slices.Contains(failed, i) && !out[i].Allowed {
			pass = false
		}
	}

	// Requests Redis could not decide: fail closed, or the local fallback.
	if len(failed) > 0 {
		var fbReqs []fbReq
		replicas := l.opts.replicas()
		for _, i := range failed {
			r := &reqs[i]
			err := failErr
			for gi := range groups {
				if slices.Contains(groups[gi].idx, i) {
					err = groups[gi].op.err
				}
			}
			if r.Rule.FailMode == FailClosed {
				out[i] = Decision{Limit: r.Rule.Limit, RetryAfter: failedClosedRetry, Source: SourceFailedClosed, Err: err}
				if !r.DryRun {
					pass = false
				}
				continue
			}
			out[i].Err = err
			n := replicas
			if r.Rule.Replicas > 0 {
				n = int64(r.Rule.Replicas)
			}
			fr := fbReq{rule: &r.Rule, client: r.Client, dryRun: r.DryRun, hits: r.hits(), share: ceilDiv(r.Rule.Limit, n), out: &out[i]}
			if l.view != nil && keys[i] != "" {
				if e, ok := l.view.get(keys[i], &r.Rule); ok {
					fr.seed = l.fb.seedOf(e, n)
				}
			}
			fbReqs = append(fbReqs, fr)
		}
		if len(fbReqs) > 0 {
			errs := make([]error, len(fbReqs))
			for k := range fbReqs {
				errs[k] = fbReqs[k].out.Err
			}
			if !l.fb.decide(fbReqs, pass) {
				pass = false
			}
			for k := range fbReqs {
				fbReqs[k].out.Err = errs[k]
			}
		}
	}

	if !pass && len(committed) > 0 {
		l.undo(reqs, committed, out, deadline)
	}

	for i := range out {
		switch out[i].Source {
		case SourceRedis:
			l.stats.redis.Add(1)
		case SourceFallback:
			l.stats.fallback.Add(1)
		case SourceFailedClosed:
			l.stats.failedClosed.Add(1)
		}
	}
	return out
}

// deniedByCache answers reqs from the deny cache when a non-dry-run rule
// of the request is cached as exhausted: the request is denied whatever the
// others say, and Redis would have admitted into none of them. A request
// with a dry-run rule not in the cache still goes to Redis, which decides
// (and counts) that rule.
func (l *Limiter) deniedByCache(reqs []Request, keys []string, now time.Time, out []Decision) bool {
	hit, dryMiss := false, false
	for i := range reqs {
		if keys[i] == "" { // invalid: already failed closed
			dryMiss = dryMiss || reqs[i].DryRun
			continue
		}
		d, ok := l.view.denied(keys[i], &reqs[i].Rule, now)
		switch {
		case ok:
			out[i] = d
			hit = hit || !reqs[i].DryRun
		case reqs[i].DryRun:
			dryMiss = true
		default:
			out[i] = Decision{Allowed: true, Limit: reqs[i].Rule.Limit, Source: SourceDenyCache}
		}
	}
	if hit && !dryMiss {
		return true
	}
	for i := range reqs { // Redis decides: undo the answers filled in above
		if keys[i] != "" {
			out[i] = Decision{}
		}
	}
	return false
}

// nextMember is unique per decision across every process sharing Redis:
// a random process id and a sequence number. Because it comes from the
// caller, a script that go-redis runs twice (a retried pipeline) adds the
// same member again instead of a second admit.
func (l *Limiter) nextMember() string {
	n := l.seq.Add(1)
	var b [8 + 13]byte
	buf := append(b[:0], l.memberPrefix...)
	buf = strconv.AppendUint(buf, n, 36)
	return string(buf)
}

var (
	argEvalSha = any("evalsha")
	argDecide  = any(decideLua.sha)
	argUndo    = any(undoLua.sha)
	argFlags   = [4]any{"0", "1", "2", "3"}
	argOneHit  = any("1")
)

// invalidAreDry: the invalid rules of reqs are all dry-run, so the request
// may still pass.
func (l *Limiter) invalidAreDry(reqs []Request) bool {
	for i := range reqs {
		if !reqs[i].DryRun && validRequest(&reqs[i]) != nil {
			return false
		}
	}
	return true
}

// decideOp builds the script call of one group. commit false only decides:
// the request is known to fail already, so nothing is admitted.
func (l *Limiter) decideOp(reqs []Request, g *group, member string, commit bool, start, deadline time.Time) *op {
	n := len(g.idx)
	o := &op{nkeys: n, start: start, deadline: deadline, done: make(chan struct{}, 1)}
	args := o.argsBuf[:0]
	if size := 3 + n + 3 + 4*n; size > len(o.argsBuf) {
		args = make([]any, 0, size)
	}
	args = append(args, argEvalSha, argDecide, n)
	for _, k := range g.keys {
		args = append(args, k)
	}
	c := argFlags[0]
	if commit {
		c = argFlags[1]
	}
	args = append(args, member, l.marginMs, c)
	for _, i := range g.idx {
		r := &reqs[i]
		f := 0
		if r.Rule.Algorithm == SlidingWindowCounter {
			f |= flagCounter
		}
		if r.DryRun {
			f |= flagDryRun
		}
		win := (r.Rule.Window + time.Microsecond - 1) / time.Microsecond
		args = append(args, r.Rule.Limit, int64(win), argFlags[f])
		if h := r.hits(); h == 1 {
			args = append(args, argOneHit)
		} else {
			args = append(args, h)
		}
	}
	o.args = args
	return o
}

// fillRedis turns a group's reply into decisions, and caches the denials
// of a decision that started at start; it reports whether the group
// admitted anything that an overall denial must undo.
func (l *Limiter) fillRedis(ctx context.Context, reqs []Request, g *group, start time.Time, out []Decision) bool {
	rep := g.op.reply
	now, committed := rep[0], rep[1] == 1
	admitted := false
	for k, i := range g.idx {
		v := rep[2+replyPerKey*k : 2+replyPerKey*(k+1)]
		out[i] = Decision{
			Allowed:    v[0] == 1,
			Limit:      reqs[i].Rule.Limit,
			Remaining:  v[1],
			RetryAfter: time.Duration(v[2]) * time.Microsecond,
			ResetAfter: time.Duration(v[3]) * time.Microsecond,
			Source:     SourceRedis,
		}
		if committed && v[0] == 1 {
			admitted = true
		}
		// A denial of several hits says nothing about one hit: it is not
		// cached, or the deny cache would refuse what Redis admits.
		if l.view != nil && (reqs[i].hits() == 1 || out[i].Allowed) {
			l.view.put(g.keys[k], &reqs[i].Rule, start, &out[i])
		}
	}
	if l.observe != nil {
		l.observe(ctx, now, reqs, g.idx, out)
	}
	return admitted
}

// undo is the compensating call: it removes the admits of the committed
// groups, waiting for it at most until the decision's deadline (it still
// runs after that: a late undo only returns budget late).
func (l *Limiter) undo(reqs []Request, committed []*group, out []Decision, deadline time.Time) {
	member := ""
	ops := make([]*op, 0, len(committed))
	for _, g := range committed {
		args := []any{argEvalSha, argUndo, 0}
		var fields []any
		for k, i := range g.idx {
			if !out[i].Allowed {
				continue
			}
			args = append(args, g.keys[k])
			if reqs[i].Rule.Algorithm == SlidingWindowCounter {
				fields = append(fields, strconv.FormatInt(g.op.reply[2+replyPerKey*k+4], 10))
			} else {
				fields = append(fields, "")
			}
			h := reqs[i].hits()
			fields = append(fields, strconv.FormatInt(h, 10))
			out[i].Remaining = min(out[i].Remaining+h, max(out[i].Limit, 0))
		}
		if member == "" {
			member = g.op.args[3+g.op.nkeys].(string)
		}
		args[2] = len(fields) / 2
		args = append(args, member)
		args = append(args, fields...)
		// An undo gets a full timeout of its own: it must not be dropped
		// because the decision that needs it is about to give up.
		o := &op{args: args, nkeys: len(fields) / 2, deadline: time.Now().Add(l.opts.Timeout), done: make(chan struct{}, 1)}
		ops = append(ops, o)
		l.stats.undos.Add(1)
		select {
		case l.queue <- o:
		default:
			go func() {
				select {
				case l.queue <- o:
				case <-l.ctx.Done():
				}
			}()
		}
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for _, o := range ops {
		select {
		case <-o.done:
		case <-timer.C:
			return
		}
	}
}
