package limiter

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Errors carried in Decision.Err.
var (
	// ErrTimeout: Redis did not answer within Options.Timeout.
	ErrTimeout = errors.New("limiter: redis did not answer in time")
	// ErrCircuitOpen: the breaker is open; Redis was not asked.
	ErrCircuitOpen = errors.New("limiter: circuit breaker open")
	// ErrClosed: Decide was called after Close.
	ErrClosed = errors.New("limiter: closed")
	// ErrInvalidRule: the rule cannot be enforced (window outside
	// [1ms, 1 year], unknown algorithm) or the request's Hits is outside
	// [0, MaxHits]; such a request is always denied.
	ErrInvalidRule = errors.New("limiter: invalid rule")

	errNoReply = errors.New("limiter: no reply from redis")
)

// Limiter decides requests against sliding-window limits kept in Redis.
// It is safe for concurrent use; one per process is the intent, since
// concurrent decisions share its pipelined round trips.
type Limiter struct {
	rdb      redis.UniversalClient
	opts     Options
	grouping grouping
	marginMs string

	memberPrefix string
	seq          atomic.Uint64

	queue   chan *op
	tokens  chan struct{} // one per round trip in flight (MaxInflight)
	waiting atomic.Int32  // flushers holding a batch, waiting for a token
	direct  bool          // the client bounds socket I/O by the deadline
	br      *breaker
	lat     latencyWindow // how long Redis's answers took lately
	// lastAnswer is when Redis last answered a round trip (UnixNano).
	lastAnswer atomic.Int64
	fb         *fallback
	view       *view // what Redis last said per key; nil: disabled
	ctx        context.Context
	cancel     context.CancelFunc
	closed     atomic.Bool
	closeMu    sync.Once
	wg         sync.WaitGroup

	stats stats

	// observe, when set (tests only, before use), sees each Redis reply
	// of a decision, on the caller's goroutine with its context: the
	// server time of the decision in µs since scoreEpoch and the decisions
	// of the group.
	observe func(ctx context.Context, nowUS int64, reqs []Request, idx []int, out []Decision)
}

// grouping says which keys one script may touch together.
type grouping int

const (
	groupAll  grouping = iota // standalone/sentinel: one server holds every key
	groupSlot                 // Redis Cluster: keys of one hash slot
	groupTag                  // other sharded clients: keys of one hash tag
)

// New returns a Limiter deciding through rdb. It does not contact Redis:
// scripts are loaded on first use (and again after a NOSCRIPT), so New
// succeeds while Redis is down and the first decisions fall back.
//
// Give rdb ContextTimeoutEnabled (redisconn.NewClient does): otherwise go-redis
// bounds its socket reads by ReadTimeout, not by the decision's deadline,
// and a hung Redis holds a connection for ReadTimeout, though callers
// still get their answer within Timeout.
func New(rdb redis.UniversalClient, opts Options) (*Limiter, error) {
	if rdb == nil {
		return nil, errors.New("limiter: nil redis client")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	var id [6]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("limiter: process id: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Limiter{
		rdb:          rdb,
		opts:         opts,
		marginMs:     strconv.FormatInt(max(1, opts.ExpiryMargin.Milliseconds()), 10),
		memberPrefix: base64.RawURLEncoding.EncodeToString(id[:]),
		queue:        make(chan *op, opts.QueueSize),
		tokens:       make(chan struct{}, opts.MaxInflight),
		direct:       honorsDeadlines(rdb),
		br:           newBreaker(opts.BreakerFailures),
		fb:           newFallback(opts.FallbackMaxClients),
		ctx:          ctx,
		cancel:       cancel,
	}
	if opts.DenyCacheMax > 0 {
		l.view = newView(opts.DenyCacheMax)
	}
	switch rdb.(type) {
	case *redis.Client:
		l.grouping = groupAll
	case *redis.ClusterClient:
		l.grouping = groupSlot
	default:
		l.grouping = groupTag
	}
	l.wg.Add(opts.MaxInflight + 1)
	for range opts.MaxInflight {
		go l.flusher()
	}
	go l.prober()
	return l, nil
}

// honorsDeadlines reports whether rdb bounds its socket reads and writes
// by the context's deadline (ContextTimeoutEnabled), so that a caller may
// run a round trip itself without risking its timeout.
func honorsDeadlines(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// Healthy reports whether decisions go to Redis: false while the circuit
// breaker is open (decisions are then made by each rule's fail mode).
func (l *Limiter) Healthy() bool { return l.br.allow() && !l.closed.Load() }

// Close stops the limiter's goroutines. Decisions in flight end within
// their timeout; later Decide calls act as if Redis were down (ErrClosed).
// It does not close the Redis client, which the caller owns.
func (l *Limiter) Close() error {
	l.closeMu.Do(func() {
		l.closed.Store(true)
		l.cancel()
		l.wg.Wait()
		// Fail what is still queued, so no caller waits for its timeout.
		for {
			select {
			case o := <-l.queue:
				if o.take(time.Time{}) {
					o.finish(nil, ErrClosed)
				}
			default:
				return
			}
		}
	})
	return nil
}

// Stats are counters since New, for metrics and the benchmark report.
type Stats struct {
	Redis, Fallback, FailedClosed int64 // decisions (per Request) by Source
	Timeouts                      int64 // Decide calls that hit the timeout
	RoundTrips, Ops               int64 // pipelined round trips and scripts they carried
	NoScript                      int64 // round trips that had to resend scripts (EVAL)
	Undos                         int64 // compensating calls for cross-slot requests
	BreakerOpens                  int64
	DenyCache                     int64 // Decide calls denied by the deny cache, without Redis
}

type stats struct {
	redis, fallback, failedClosed, timeouts, denyCache atomic.Int64
	roundTrips, ops, noScript, undos                   atomic.Int64
}

// Stats returns the counters.
func (l *Limiter) Stats() Stats {
	return Stats{
		Redis: l.stats.redis.Load(), Fallback: l.stats.fallback.Load(), FailedClosed: l.stats.failedClosed.Load(),
		Timeouts: l.stats.timeouts.Load(), RoundTrips: l.stats.roundTrips.Load(), Ops: l.stats.ops.Load(),
		NoScript: l.stats.noScript.Load(), Undos: l.stats.undos.Load(), BreakerOpens: l.br.opens.Load(),
		DenyCache: l.stats.denyCache.Load(),
	}
}

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

// group is the requests of one Decide whose keys one script may touch.
type group struct {
	slot int    // for groupSlot
	tag  string // for groupTag
	idx  []int
	keys []string
	op   *op
	// room for the common one-request Decide
	idxBuf [1]int
	keyBuf [1]string
}

func (l *Limiter) keyOf(r *Request) string {
	if r.Rule.Algorithm == SlidingWindowCounter {
		return counterKey(l.opts.Prefix, r.Rule.ID, r.Client)
	}
	return Key(l.opts.Prefix, r.Rule.ID, r.Client)
}

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

// budget is how long a decision beginning at now waits for Redis: Timeout,
// or twice the slowest answer of the last one to two seconds when that is
// longer, up to MaxTimeout. A Redis that answers slowly is still answering:
// its decisions must not fall back (the fallback cannot see what Redis
// admits). A Redis that hangs stops producing answers, so within two
// seconds the budget is Timeout again and the breaker takes over.
func (l *Limiter) budget(now time.Time) time.Duration {
	return min(max(l.opts.Timeout, 2*l.lat.recent(now)), l.opts.MaxTimeout)
}

// latencyWindow keeps the slowest answer of the current and the previous
// second.
type latencyWindow struct {
	mu        sync.Mutex
	since     time.Time
	cur, prev time.Duration
}

func (w *latencyWindow) roll(now time.Time) {
	switch age := now.Sub(w.since); {
	case age < time.Second:
		return
	case age < 2*time.Second:
		w.prev = w.cur
	default:
		w.prev = 0
	}
	w.cur, w.since = 0, now
}

func (w *latencyWindow) observe(d time.Duration, now time.Time) {
	w.mu.Lock()
	w.roll(now)
	w.cur = max(w.cur, d)
	w.mu.Unlock()
}

func (w *latencyWindow) recent(now time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.roll(now)
	return max(w.cur, w.prev)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return a
	}
	return (a + b - 1) / b
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

// groups splits the valid requests by what one script may touch; keys[i]
// is the key of reqs[i].
func (l *Limiter) groups(reqs []Request, keys []string, allValid bool) []group {
	if len(reqs) == 1 && allValid {
		gs := make([]group, 1)
		g := &gs[0]
		g.idxBuf[0], g.keyBuf[0] = 0, keys[0]
		g.idx, g.keys = g.idxBuf[:], g.keyBuf[:]
		return gs
	}
	if l.grouping == groupAll || len(reqs) == 1 {
		g := group{idx: make([]int, 0, len(reqs)), keys: make([]string, 0, len(reqs))}
		for i := range reqs {
			if allValid || validRequest(&reqs[i]) == nil {
				g.idx = append(g.idx, i)
				g.keys = append(g.keys, keys[i])
			}
		}
		if len(g.idx) == 0 {
			return nil
		}
		return []group{g}
	}
	var gs []group
	for i := range reqs {
		if !allValid && validRequest(&reqs[i]) != nil {
			continue
		}
		k := keys[i]
		s, tag := 0, ""
		if l.grouping == groupSlot {
			s = slot(k)
		} else {
			tag = hashTag(k)
		}
		found := false
		for gi := range gs {
			if gs[gi].slot == s && gs[gi].tag == tag {
				gs[gi].idx = append(gs[gi].idx, i)
				gs[gi].keys = append(gs[gi].keys, k)
				found = true
				break
			}
		}
		if !found {
			gs = append(gs, group{slot: s, tag: tag, idx: []int{i}, keys: []string{k}})
		}
	}
	return gs
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
		case <-l.br.wake:
		}
		for !l.br.allow() {
			select {
			case <-l.ctx.Done():
				return
			case <-t.C:
			}
			if l.ping() == nil {
				l.br.close()
			}
		}
	}
}

func (l *Limiter) ping() error {
	ctx, cancel := context.WithTimeout(l.ctx, max(l.opts.Timeout, 100*time.Millisecond))
	defer cancel()
	if c, ok := l.rdb.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.Ping(ctx).Err()
		})
	}
	return l.rdb.Ping(ctx).Err()
}
