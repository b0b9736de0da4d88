package limiter

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Errors carried in Decision.Err.
var (
	// ErrTimeout means Redis did not answer within the decision's budget
	// (Options.Timeout, stretched up to MaxTimeout while Redis is slow).
	ErrTimeout = errors.New("limiter: redis did not answer in time")
	// ErrCircuitOpen means the breaker is open; Redis was not asked.
	ErrCircuitOpen = errors.New("limiter: circuit breaker open")
	// ErrClosed means Decide was called after Close.
	ErrClosed = errors.New("limiter: closed")
	// ErrInvalidRule means the rule cannot be enforced (window outside
	// [1ms, 1 year], unknown algorithm) or the request's Hits is outside
	// [0, MaxHits]; such a request is always denied.
	ErrInvalidRule = errors.New("limiter: invalid rule")

	// ErrNotReplicated means Redis admitted a durable rule's request but
	// no replica acknowledged the admit within Options.ReplicaWait (the
	// master has no replica, or it lags): the admit was taken back and the
	// rule's fail mode decided.
	ErrNotReplicated = errors.New("limiter: no replica acknowledged the admit in time")

	// errNoReply stands for an answer go-redis left empty without an
	// error of its own.
	errNoReply = errors.New("limiter: no reply from redis")
)

// Limiter decides requests against sliding-window limits kept in Redis.
// It is safe for concurrent use; one per process is the intent, since
// concurrent decisions share its pipelined round trips.
type Limiter struct {
	rdb      redis.UniversalClient
	opts     Options
	api      api // EVALSHA or FCALL (Options.Functions)
	grouping grouping
	marginMs string

	memberPrefix string // this process, in presence keys (Announce)

	queue           chan *op
	tokens          chan struct{} // one per round trip in flight (MaxInflight)
	waiting         atomic.Int32  // flushers holding a batch, waiting for a token
	honorsDeadlines bool          // so a caller may make its round trip itself (roundTripNow)
	breaker         *breaker
	latency         latencyWindow // how long Redis's answers took lately
	// lastAnswer is when Redis last answered a round trip (UnixNano).
	lastAnswer atomic.Int64
	// redisAhead is how far Redis's clock was ahead of this process's in
	// the last reply (ns; negative when behind): where a calendar rule's
	// period is guessed (inPeriods).
	redisAhead atomic.Int64
	// guessNow, when set (tests only, before use), replaces redisNow: a
	// process whose guess of Redis's clock is off.
	guessNow func() time.Time
	// oneCallUntil: until then (Unix ns) each decision is a call of its
	// own, since Redis's library lacked the batch function (olderLibrary).
	oneCallUntil atomic.Int64
	fallback     *fallback
	view         *view // what Redis last said per key; nil: disabled
	ctx          context.Context
	cancel       context.CancelFunc
	closed       atomic.Bool
	closeOnce    sync.Once
	wg           sync.WaitGroup

	stats stats
	// cancels counts the lost replies' cancels still being sent.
	cancels atomic.Int64

	// observe, when set (tests only, before use), sees each Redis reply
	// of a decision, on the caller's goroutine with its context: the
	// server time of the decision in µs since scoreEpoch and the decisions
	// of the group.
	observe func(ctx context.Context, nowUS int64, reqs []Request, idx []int, out []Decision)
}

// New returns a Limiter deciding through rdb. It does not contact Redis:
// scripts are loaded on first use (and again after a NOSCRIPT; with
// Options.Functions the library must have been loaded), so New succeeds
// while Redis is down and the first decisions fall back.
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
		rdb:             rdb,
		opts:            opts,
		api:             api{functions: opts.Functions},
		grouping:        groupingOf(rdb),
		marginMs:        strconv.FormatInt(max(1, opts.ExpiryMargin.Milliseconds()), 10),
		memberPrefix:    base64.RawURLEncoding.EncodeToString(id[:]),
		queue:           make(chan *op, opts.QueueSize),
		tokens:          make(chan struct{}, opts.MaxInflight),
		honorsDeadlines: honorsDeadlines(rdb),
		breaker:         newBreaker(opts.BreakerFailures),
		fallback:        newFallback(opts.FallbackMaxClients, opts.FallbackMaxLogBytes),
		ctx:             ctx,
		cancel:          cancel,
	}
	if opts.DenyCacheMax > 0 {
		l.view = newView(opts.DenyCacheMax)
		l.view.hold = opts.DenyCacheHold
	}
	pipelineHook{}.install(rdb)
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
func (l *Limiter) Healthy() bool { return l.breaker.allow() && !l.closed.Load() }

// Close stops the limiter's goroutines. Decisions in flight end within
// their timeout; later Decide calls act as if Redis were down (ErrClosed).
// It does not close the Redis client, which the caller owns.
func (l *Limiter) Close() error {
	l.closeOnce.Do(func() {
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
	// Resent counts scripts Redis Cluster refused unrun because their slot
	// was moving (MOVED, ASK, TRYAGAIN), and asked again: resent after a
	// pause, or split into one script per key.
	Resent int64
	// ReadAgain counts decisions of the idle path whose read timed out at
	// the budget and that were sent once more, to be read until their hard
	// deadline (a process that was not running may have missed an answer
	// that came in time).
	ReadAgain int64
	// OlderLibrary counts round trips whose batch calls Redis did not know
	// (a library of the release before): their decisions were resent one
	// call each.
	OlderLibrary int64
	// NotReplicated counts durable admits that no replica acknowledged in
	// time, taken back (ErrNotReplicated).
	NotReplicated int64
}

type stats struct {
	redis, fallback, failedClosed, timeouts, denyCache atomic.Int64
	roundTrips, ops, noScript, undos, resent           atomic.Int64
	notReplicated, readAgain, olderLibrary             atomic.Int64
}

// Stats returns the counters.
func (l *Limiter) Stats() Stats {
	return Stats{
		Redis: l.stats.redis.Load(), Fallback: l.stats.fallback.Load(), FailedClosed: l.stats.failedClosed.Load(),
		Timeouts: l.stats.timeouts.Load(), RoundTrips: l.stats.roundTrips.Load(), Ops: l.stats.ops.Load(),
		NoScript: l.stats.noScript.Load(), Undos: l.stats.undos.Load(), BreakerOpens: l.breaker.opens.Load(),
		DenyCache: l.stats.denyCache.Load(), Resent: l.stats.resent.Load(), NotReplicated: l.stats.notReplicated.Load(),
		ReadAgain: l.stats.readAgain.Load(), OlderLibrary: l.stats.olderLibrary.Load(),
	}
}
