package enforce

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidegate/slidegate/internal/limiter"
)

// Outcome is what one policy did to one request: the decision label of
// slidegate_sidecar_requests_total and slidegate_rls_requests_total.
type Outcome uint8

// The outcomes. The last three are the sidecar's only: they are decided
// before the limiter is asked (the request gives no client key, or more
// than one), and a descriptor of the rate limit service always has one.
const (
	// Allowed: the policy admitted the request (for a DryRun policy: it
	// would have).
	Allowed Outcome = iota
	// Rejected: the policy refused the request (429, OVER_LIMIT).
	Rejected
	// DryRunRejected: a DryRun policy would have refused the request
	// (over its limit, or undecided with failMode Closed); the request
	// went on unless another policy refused it.
	DryRunRejected
	// FailedClosed: Redis could not decide and the enforced policy fails
	// closed (503; OVER_LIMIT from the rate limit service).
	FailedClosed
	// NotCounted: the policy admitted the request but another one refused
	// it, so the admit was undone.
	NotCounted
	// MissingKey: the request has no client key for the policy and the
	// policy's onMissing is Deny (429; a DryRun policy only counts it).
	MissingKey
	// Skipped: the request has no client key and the policy's onMissing is
	// Allow: the policy does not apply.
	Skipped
	// AmbiguousKey: the request gives more than one value for the policy's
	// client key (400, whatever onMissing says; a DryRun policy only
	// counts it).
	AmbiguousKey

	// NumOutcomes is the number of outcomes.
	NumOutcomes
)

var outcomeLabels = [NumOutcomes]string{
	Allowed:        "allowed",
	Rejected:       "rejected",
	DryRunRejected: "dry_run_rejected",
	FailedClosed:   "failed_closed",
	NotCounted:     "not_counted",
	MissingKey:     "missing_key_rejected",
	Skipped:        "skipped",
	AmbiguousKey:   "ambiguous_key_rejected",
}

// String is the outcome's label value.
func (o Outcome) String() string {
	if o < NumOutcomes {
		return outcomeLabels[o]
	}
	return "unknown"
}

// Metrics are the series in which both front ends count their decisions,
// under their own subsystem (slidegate_sidecar_*, slidegate_rls_*).
type Metrics struct {
	// Requests counts each policy's outcomes (labels policy, decision).
	Requests *prometheus.CounterVec
	// DecisionSeconds times the limiter's decision of one request.
	DecisionSeconds prometheus.Histogram
	// Sources counts the limiter's decisions by the path that made them
	// (label source).
	Sources *prometheus.CounterVec
	// RedisErrors counts the requests with a decision Redis could not make.
	RedisErrors prometheus.Counter

	// The known sources' series, bound once: the request path then does
	// no label lookup.
	srcRedis, srcDenyCache, srcFallback, srcFailedClosed prometheus.Counter
}

// NewMetrics returns the decision metrics of subsystem sub, whose callers
// send it what (the help texts' noun: "requests", "RLS requests").
// Register them with Collectors.
func NewMetrics(sub, what string) *Metrics {
	const ns = "slidegate"
	m := &Metrics{}
	m.Requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "requests_total",
		Help: "Decisions of each policy on the " + what + " it applied to, by policy and decision.",
	}, []string{"policy", "decision"})
	m.DecisionSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "decision_duration_seconds",
		Help:    "Time the limiter took to decide all the policies of one of the " + what + ".",
		Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	})
	m.Sources = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "limiter_decisions_total",
		Help: "Limiter decisions by the path that produced them: redis, deny-cache (Redis said exhausted, retry time not reached), fallback (fail-open, local) or failed-closed.",
	}, []string{"source"})
	m.RedisErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "redis_errors_total",
		Help: "The " + what + " whose limiter decision hit a Redis error (timeout, connection) and went to the fallback or failed closed.",
	})
	m.srcRedis = m.Sources.WithLabelValues(string(limiter.SourceRedis))
	m.srcDenyCache = m.Sources.WithLabelValues(string(limiter.SourceDenyCache))
	m.srcFallback = m.Sources.WithLabelValues(string(limiter.SourceFallback))
	m.srcFailedClosed = m.Sources.WithLabelValues(string(limiter.SourceFailedClosed))
	return m
}

// Collectors are the metrics, to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Requests, m.DecisionSeconds, m.Sources, m.RedisErrors}
}

// Counters are one policy's Requests series, one per outcome, bound when
// the policy is loaded.
type Counters [NumOutcomes]prometheus.Counter

// PolicyCounters binds policy's series.
func (m *Metrics) PolicyCounters(policy string) Counters {
	var c Counters
	for o := range NumOutcomes {
		c[o] = m.Requests.WithLabelValues(policy, o.String())
	}
	return c
}

// Inc counts one outcome.
func (c *Counters) Inc(o Outcome) { c[o].Inc() }

// Record counts one request's decisions ds (of reqs, index for index)
// under verdict v: the path that made each, a Redis error, and each
// policy's outcome, which it hands to count with the decision's index for
// the caller's own Counters (and anything else it keeps per outcome).
func (m *Metrics) Record(reqs []limiter.Request, ds []limiter.Decision, v *Verdict, count func(i int, o Outcome)) {
	for i := range ds {
		m.countSource(ds[i].Source)
	}
	if v.RedisErr != nil {
		m.RedisErrors.Inc()
	}
	rejected := v.Rejected()
	for i := range ds {
		count(i, OutcomeOf(reqs[i].DryRun, &ds[i], rejected))
	}
}

func (m *Metrics) countSource(src limiter.Source) {
	switch src {
	case limiter.SourceRedis:
		m.srcRedis.Inc()
	case limiter.SourceDenyCache:
		m.srcDenyCache.Inc()
	case limiter.SourceFallback:
		m.srcFallback.Inc()
	case limiter.SourceFailedClosed:
		m.srcFailedClosed.Inc()
	default:
		m.Sources.WithLabelValues(string(src)).Inc()
	}
}
