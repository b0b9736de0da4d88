package limiter

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"
)

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
	if charges, others := splitCharges(reqs); charges != nil {
		return l.decideApart(ctx, reqs, charges, others)
	}
	if len(reqs) == 0 {
		return []Decision{}
	}
	// Only a call with a calendar rule reads Redis's clock off the reply:
	// the other decisions do no more work for it.
	placed, calendar := l.inPeriods(reqs, time.Time{})
	out, stale := l.decideOnce(ctx, placed, calendar)
	if stale != 0 {
		// A calendar rule's period was guessed wrong (a boundary fell
		// between the guess and the script): nothing was counted in its
		// slot; ask again in the periods of Redis's clock.
		again, _ := l.inPeriods(reqs, serverTime(stale))
		out, _ = l.decideOnce(ctx, again, true)
	}
	return out
}

// decideOnce is Decide of reqs, whose calendar rules are placed in their
// periods; calendar says reqs has one. stale is Redis's clock (µs since
// scoreEpoch) when a calendar key named a period that did not hold it, 0
// otherwise.
func (l *Limiter) decideOnce(ctx context.Context, reqs []Request, calendar bool) (out []Decision, stale int64) {
	out = make([]Decision, len(reqs))
	c := call{l: l, reqs: reqs, out: out, pass: true, calendar: calendar}
	c.setDeadlines(ctx, time.Now())
	// keys[i] is the key of reqs[i], "" when it is invalid. For a single
	// request it lives in this frame; inside call it would not, since
	// escape analysis sees call's fields as one.
	var keyBuf [1]string
	keys := c.validate(keyBuf[:0])
	if l.view != nil && l.deniedByCache(reqs, keys, c.start, out) {
		l.stats.denyCache.Add(1)
		return out, 0
	}
	c.askRedis(ctx, keys)
	c.splitRefused(ctx)
	c.collect(ctx)
	c.fallBack(keys)
	if !c.pass && c.admitted {
		c.undo()
	}
	c.count()
	return out, c.stale
}

// splitCharges returns, when reqs mixes charges (OpCharge) with other
// requests, the indexes of each; nil, nil otherwise.
func splitCharges(reqs []Request) (charges, others []int) {
	n := 0
	for i := range reqs {
		if reqs[i].Op == OpCharge {
			n++
		}
	}
	if n == 0 || n == len(reqs) {
		return nil, nil
	}
	for i := range reqs {
		if reqs[i].Op == OpCharge {
			charges = append(charges, i)
		} else {
			others = append(others, i)
		}
	}
	return charges, others
}

// decideApart decides the charges of reqs apart from its other requests:
// a charge counts whatever the others decide (a rate limit service call
// may carry the after-stream charge of one policy beside another's
// check), where one Decide is all or nothing.
func (l *Limiter) decideApart(ctx context.Context, reqs []Request, parts ...[]int) []Decision {
	out := make([]Decision, len(reqs))
	for _, idx := range parts {
		sub := make([]Request, len(idx))
		for k, i := range idx {
			sub[k] = reqs[i]
		}
		for k, d := range l.Decide(ctx, sub) {
			out[idx[k]] = d
		}
	}
	return out
}

// call is one Decide in progress. Its phases, in order: validate, (the
// deny cache), askRedis, splitRefused, collect, fallBack, undo, count.
type call struct {
	l    *Limiter
	reqs []Request
	out  []Decision // out[i] is the decision of reqs[i]

	// start is when the decision began. Past deadline (the budget) it
	// falls back unless Redis has answered anyone since start (then Redis
	// is slow, not down, and the decision waits on); past hard it falls
	// back in any case.
	start, deadline, hard time.Time

	member string  // what the scripts admit under (nextMember)
	groups []group // nil when Redis was not asked or nothing was valid
	// notAsked is why Redis was not asked at all (closed, breaker open).
	notAsked error
	// pass says no non-dry-run request is denied so far; admitted, that
	// some group admitted into Redis; commit, that the scripts may admit.
	pass, admitted, commit bool
	// replicas is Options.Replicas, read once the first request fails
	// over (0 until then).
	replicas int64
	// stale is Redis's clock (µs since scoreEpoch) in a reply whose
	// calendar key named a period that did not hold it; 0: none did.
	stale int64
	// calendar: a request has a calendar rule (Rule.Calendar).
	calendar bool
}

// setDeadlines sets the decision's two deadlines (see call.start), neither
// past ctx's.
func (c *call) setDeadlines(ctx context.Context, start time.Time) {
	c.start = start
	c.deadline, c.hard = start.Add(c.l.budget(start)), start.Add(c.l.opts.MaxTimeout)
	if d, ok := ctx.Deadline(); ok {
		c.deadline, c.hard = minTime(c.deadline, d), minTime(c.hard, d)
	}
}

// validate fails the invalid requests closed and returns each request's
// key ("" for an invalid one), in buf when it is long enough.
func (c *call) validate(buf []string) []string {
	keys := buf
	if len(c.reqs) > cap(buf) {
		keys = make([]string, 0, len(c.reqs))
	}
	for i := range c.reqs {
		r := &c.reqs[i]
		if err := validRequest(r); err != nil {
			c.out[i] = failedClosed(r, err)
			c.pass = c.pass && r.DryRun
			keys = append(keys, "")
			continue
		}
		keys = append(keys, c.l.keyOf(r))
	}
	return keys
}

// failedClosed is the decision of r when it is denied for err, uncounted.
func failedClosed(r *Request, err error) Decision {
	return Decision{Limit: r.Rule.Limit, RetryAfter: failedClosedRetry, Source: SourceFailedClosed, Err: err}
}

// validRequest checks r's rule and hits.
func validRequest(r *Request) error {
	most := int64(MaxHits)
	if r.Rule.Weighted {
		most = MaxCost
	}
	if r.Hits < 0 || r.Hits > most {
		return fmt.Errorf("%w: %q hits %d outside [0, %d]", ErrInvalidRule, r.Rule.ID, r.Hits, most)
	}
	if r.Op > OpCharge || (r.Op != OpDecide && !r.Rule.Weighted) {
		return fmt.Errorf("%w: %q: op %d on a rule that is not weighted", ErrInvalidRule, r.Rule.ID, r.Op)
	}
	return validRule(&r.Rule)
}

// validRule checks that r's window and algorithm can be enforced.
func validRule(r *Rule) error {
	if r.Window < minWindow || r.Window > maxWindow {
		return fmt.Errorf("%w: %q window %v outside [%v, %v]", ErrInvalidRule, r.ID, r.Window, minWindow, maxWindow)
	}
	switch r.Algorithm {
	case SlidingLog, SlidingWindowCounter, "":
	default:
		return fmt.Errorf("%w: %q algorithm %q", ErrInvalidRule, r.ID, r.Algorithm)
	}
	if r.Variant != "" && (r.Weighted || !validVariant(r.Variant)) {
		return fmt.Errorf("%w: %q variant %q (at most %d lower-case letters and digits, not on a weighted rule)", ErrInvalidRule, r.ID, r.Variant, maxVariant)
	}
	if r.Calendar != nil && (r.Weighted || r.Limit > MaxQuota) {
		return fmt.Errorf("%w: %q: a calendar rule's limit is at most %d and it is not weighted", ErrInvalidRule, r.ID, int64(MaxQuota))
	}
	return nil
}

// validVariant says whether v may be a Rule.Variant: nothing in it can
// make its key another rule's (redisschema.VariantKey).
func validVariant(v string) bool {
	if len(v) > maxVariant {
		return false
	}
	for i := range len(v) {
		if c := v[i]; (c < '0' || c > '9') && (c < 'a' || c > 'z') {
			return false
		}
	}
	return true
}

// deniedByCache answers reqs from the deny cache when a non-dry-run rule
// of the request is cached as exhausted: the request is denied whatever the
// others say, and Redis would have admitted into none of them. A request
// with a dry-run rule not in the cache still goes to Redis, which decides
// (and counts) that rule.
func (l *Limiter) deniedByCache(reqs []Request, keys []string, now time.Time, out []Decision) bool {
	if reqs[0].Op == OpCharge { // Decide split them off: all are charges
		return false
	}
	hit, dryMiss := false, false
	for i := range reqs {
		if keys[i] == "" { // invalid: already failed closed
			dryMiss = dryMiss || reqs[i].DryRun
			continue
		}
		d, ok := l.view.denied(keys[i], &reqs[i].Rule, now)
		// A denial is learned for one hit: a request of more is denied too,
		// but may have to wait longer than that retry time, which only
		// Redis can tell.
		ok = ok && reqs[i].needsOne()
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
// 8 random bytes (math/rand/v2's generator, ChaCha8 seeded by the OS in
// each process). Two members meet only if they are equal and live in one
// key at once: with m members in a key, a chance below m²/2^65 (10^-14
// for 1000). Short, since a SlidingLog key holds one per admit: 8 bytes
// and the score make a listpack entry of 20 B (a process id and sequence
// number, as before, took 13-15 B and made 26). Because it comes from
// the caller, a call that runs twice (go-redis or the limiter resending
// it) finds its own admit and admits nothing more (redisschema.DecideBatch).
func (l *Limiter) nextMember() string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64()) //nolint:gosec // uniqueness, not secrecy
	return string(b[:])
}

// askRedis sends the valid requests to Redis, one script per group, and
// waits for the answers; unless Redis is known not to answer (the limiter
// is closed, the breaker open): then notAsked says why.
func (c *call) askRedis(ctx context.Context, keys []string) {
	l := c.l
	switch {
	case l.closed.Load():
		c.notAsked = ErrClosed
		return
	case !l.breaker.allow():
		c.notAsked = ErrCircuitOpen
		if last := l.breaker.err(); last != nil {
			c.notAsked = fmt.Errorf("%w (last error: %w)", ErrCircuitOpen, last)
		}
		return
	}
	c.groups = l.grouping.split(keys)
	c.member = l.nextMember()
	// An invalid non-dry-run request already fails the request: Redis then
	// only decides, admitting nothing.
	c.commit = c.pass
	for gi := range c.groups {
		c.newOp(&c.groups[gi])
	}
	l.submitAndWait(ctx, c.groups, c.start, c.deadline, c.hard)
}

// newOp gives g the decide script over its keys.
func (c *call) newOp(g *group) {
	g.op = &op{script: &decideLua, start: c.start, deadline: c.hard, done: make(chan struct{}, 1)}
	g.op.args = decideArgs(g.op.argsBuf[:0], c.l.api, c.reqs, g.idx, g.keys, c.member, c.l.marginMs, c.commit)
	for _, i := range g.idx {
		g.op.durable = g.op.durable || (c.commit && c.reqs[i].Rule.Durable)
	}
}

// splitRefused asks again, one script per key, about the groups whose
// script Redis Cluster refused with TRYAGAIN: their slot is moving, and
// some of their keys have moved while others have not, or the node it
// moves to lacks some of them (a key never written, or emptied by the
// trim), which it refuses until the whole slot has moved. A script over
// one key is always served: by the old node while it holds the key, else
// by the new one (ASK). The group's rules are then decided as rules in
// different slots are: a request that fails has its admits undone.
func (c *call) splitRefused(ctx context.Context) {
	var split []group
	for gi := range c.groups {
		g := &c.groups[gi]
		if len(g.idx) < 2 || g.op.err == nil || !redis.IsTryAgainError(g.op.err) {
			continue
		}
		for k, i := range g.idx {
			one := group{slot: g.slot, tag: g.tag, idx: []int{i}, keys: []string{g.keys[k]}}
			c.newOp(&one)
			split = append(split, one)
		}
		g.idx = nil // replaced by split
		c.l.stats.resent.Add(1)
	}
	if split == nil {
		return
	}
	c.l.submitAndWait(ctx, split, c.start, c.deadline, c.hard)
	kept := split
	for _, g := range c.groups {
		if g.idx != nil {
			kept = append(kept, g)
		}
	}
	c.groups = kept
}

// collect turns each group's reply into decisions; a group Redis did not
// decide keeps its err for fallBack.
func (c *call) collect(ctx context.Context) {
	for gi := range c.groups {
		g := &c.groups[gi]
		if g.err = g.op.err; g.err == nil {
			g.reply, g.err = decodeDecide(g.op.reply, len(g.idx), g.replyBuf[:0])
		}
		if g.err == nil {
			c.fillRedis(ctx, g)
		}
	}
}

// fillRedis writes the decisions of g's reply, and caches the denials of
// a decision that started at c.start.
func (c *call) fillRedis(ctx context.Context, g *group) {
	rep := &g.reply
	if c.calendar {
		c.l.sawRedisTime(rep.now, time.Now())
	}
	for k, i := range g.idx {
		r, v := &c.reqs[i], &rep.keys[k]
		c.out[i] = Decision{
			Allowed:    v.allowed,
			Limit:      r.Rule.Limit,
			Remaining:  v.remaining,
			RetryAfter: v.retryAfter,
			ResetAfter: v.resetAfter,
			Source:     SourceRedis,
		}
		g.admitted = g.admitted || (rep.committed && v.allowed)
		c.pass = c.pass && (r.DryRun || v.allowed)
		if r.Rule.Calendar != nil && v.field == staleField {
			// Not a denial of the client: the period was another.
			c.stale = rep.now
			continue
		}
		// A denial of several hits says nothing about one hit: it is not
		// cached, or the deny cache would refuse what Redis admits. (A
		// weighted rule's answers are in cost, and so is its view: its
		// fallback counts cost.) A charge's answer says nothing of the room
		// left but that there is none past the limit: not cached.
		if c.l.view != nil && (r.needsOne() || v.allowed) && r.Op != OpCharge {
			c.l.view.put(g.keys[k], &r.Rule, c.start, &c.out[i])
		}
	}
	c.admitted = c.admitted || g.admitted
	if c.l.observe != nil {
		c.l.observe(ctx, rep.now, c.reqs, g.idx, c.out)
	}
}

// fallBack decides the requests Redis did not: a FailClosed rule denies,
// the others are decided together by the local fallback, which admits
// only if the request still passes.
func (c *call) fallBack(keys []string) {
	var fbReqs []fbReq
	for gi := range c.groups {
		if g := &c.groups[gi]; g.err != nil {
			for _, i := range g.idx {
				fbReqs = c.failOver(fbReqs, i, keys[i], g.err)
			}
		}
	}
	if c.notAsked != nil {
		for i, k := range keys {
			if k != "" {
				fbReqs = c.failOver(fbReqs, i, k, c.notAsked)
			}
		}
	}
	if len(fbReqs) > 0 && !c.l.fallback.decide(fbReqs, c.pass) {
		c.pass = false
	}
}

// failOver decides request i (of key), which Redis did not decide because
// of err, if its rule fails closed; else it appends it to fbReqs for the
// fallback, with its share of the limit.
func (c *call) failOver(fbReqs []fbReq, i int, key string, err error) []fbReq {
	if c.replicas == 0 {
		c.replicas = c.l.opts.replicas()
	}
	r := &c.reqs[i]
	if r.Rule.FailMode == FailClosed {
		c.out[i] = failedClosed(r, err)
		c.pass = c.pass && r.DryRun
		return fbReqs
	}
	n := c.replicas
	if r.Rule.Replicas > 0 {
		n = int64(r.Rule.Replicas)
	}
	fr := fbReq{rule: &r.Rule, client: r.Client, dryRun: r.DryRun, hits: r.hits(), op: r.Op, share: ceilDiv(r.Rule.Limit, n), out: &c.out[i], err: err}
	if c.l.view != nil {
		if e, ok := c.l.view.get(key, &r.Rule); ok {
			fr.seed = c.l.fallback.seedOf(e, n)
		}
	}
	return append(fbReqs, fr)
}

// undo is the compensating call: it takes back the admits of the groups
// that admitted, waiting for it at most until the decision's deadline (it
// still runs after that: a late undo only returns budget late). Each
// allowed decision it undoes gets its hits back in Remaining.
func (c *call) undo() {
	l := c.l
	ops := make([]*op, 0, len(c.groups))
	for gi := range c.groups {
		g := &c.groups[gi]
		if !g.admitted {
			continue
		}
		var keys []undoKey
		for k, i := range g.idx {
			if !g.reply.keys[k].allowed {
				continue
			}
			r := &c.reqs[i]
			h := r.hits()
			if h == 0 || r.Op == OpCharge {
				continue // nothing written, or a charge: counted whatever the others say
			}
			keys = append(keys, undoKey{key: g.keys[k], counter: r.Rule.Algorithm == SlidingWindowCounter || r.Rule.Calendar != nil, weighted: r.Rule.Weighted, field: g.reply.keys[k].field, hits: h})
			c.out[i].Remaining = min(c.out[i].Remaining+h, max(c.out[i].Limit, 0))
		}
		if len(keys) == 0 {
			continue
		}
		// An undo gets a full budget of its own: it must not be dropped
		// because the decision that needs it is about to give up.
		o := l.repairOp(&undoLua, undoArgs(l.api, c.member, keys))
		ops = append(ops, o)
		l.stats.undos.Add(1)
		l.enqueueNoWait(o)
	}
	timer := time.NewTimer(time.Until(c.deadline))
	defer timer.Stop()
	for _, o := range ops {
		select {
		case <-o.done:
		case <-timer.C:
			return
		}
	}
}

// enqueueNoWait queues o without blocking the caller: when the queue is
// full, a goroutine waits for room (or for Close).
func (l *Limiter) enqueueNoWait(o *op) {
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

// count adds the decisions to the stats, by source.
func (c *call) count() {
	for i := range c.out {
		switch c.out[i].Source {
		case SourceRedis:
			c.l.stats.redis.Add(1)
		case SourceFallback:
			c.l.stats.fallback.Add(1)
		case SourceFailedClosed:
			c.l.stats.failedClosed.Add(1)
		}
	}
}
