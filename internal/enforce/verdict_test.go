package enforce

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidegate/slidegate/internal/limiter"
)

var (
	errRedisDown = errors.New("connection refused")
	allow        = limiter.Decision{Allowed: true, Source: limiter.SourceRedis}
)

func deny(wait time.Duration) limiter.Decision {
	return limiter.Decision{RetryAfter: wait, Source: limiter.SourceRedis}
}

func closed(wait time.Duration) limiter.Decision {
	return limiter.Decision{RetryAfter: wait, Source: limiter.SourceFailedClosed, Err: errRedisDown}
}

func requests(dryRun ...bool) []limiter.Request {
	reqs := make([]limiter.Request, len(dryRun))
	for i, d := range dryRun {
		reqs[i].DryRun = d
	}
	return reqs
}

// TestSum: which policy answers for a refused request, in the sidecar (503
// before 429) and in the rate limit service (one OVER_LIMIT: Refusal).
// New cases go at the end.
func TestSum(t *testing.T) {
	tests := []struct {
		name           string
		dryRun         []bool
		ds             []limiter.Decision
		closed, denied int
		refusal        int
		wantErr        error
	}{
		{"all admitted", []bool{false, false}, []limiter.Decision{allow, allow}, -1, -1, -1, nil},
		{"a DryRun denial refuses nothing", []bool{true, false}, []limiter.Decision{deny(time.Second), allow}, -1, -1, -1, nil},
		// The first denial would do for one policy; with two, a client
		// retrying after the shorter wait would be denied again.
		{"the longest wait, not the first denial", []bool{false, false, false},
			[]limiter.Decision{deny(time.Second), deny(3 * time.Second), deny(2 * time.Second)}, -1, 1, 1, nil},
		{"failed closed is its own, beside a denial", []bool{false, false, false},
			[]limiter.Decision{deny(5 * time.Second), closed(time.Second), closed(2 * time.Second)}, 2, 0, 0, errRedisDown},
		{"a Redis error on an admitted fail-open decision is kept", []bool{false},
			[]limiter.Decision{{Allowed: true, Source: limiter.SourceFallback, Err: errRedisDown}}, -1, -1, -1, errRedisDown},
		// The row where the two front ends disagreed: a DryRun policy that
		// fails closed refuses nothing, in either.
		{"a DryRun policy failing closed refuses nothing", []bool{true, false},
			[]limiter.Decision{closed(time.Second), allow}, -1, -1, -1, errRedisDown},
		{"failed closed answers when its wait is the longer", []bool{false, false},
			[]limiter.Decision{deny(time.Second), closed(2 * time.Second)}, 1, 0, 1, errRedisDown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := Sum(requests(tt.dryRun...), tt.ds)
			if v.FailedClosed != tt.closed || v.Denied != tt.denied || !errors.Is(v.RedisErr, tt.wantErr) {
				t.Errorf("verdict %+v, want failedClosed %d denied %d error %v", v, tt.closed, tt.denied, tt.wantErr)
			}
			if want := tt.closed >= 0 || tt.denied >= 0; v.Rejected() != want {
				t.Errorf("Rejected() = %v, want %v", v.Rejected(), want)
			}
			if got := v.Refusal(tt.ds); got != tt.refusal {
				t.Errorf("Refusal = %d, want %d", got, tt.refusal)
			}
		})
	}
}

// TestOutcomeOf: the decision label each policy counts. The last row is
// where the sidecar and the rate limit service disagreed before they
// shared this rule: the RLS counted a DryRun policy that could not be
// decided and fails closed as failed_closed, which the SlidegateFailClosed
// runbook reads as clients refused with a 503, and it refused nobody.
func TestOutcomeOf(t *testing.T) {
	tests := []struct {
		dryRun   bool
		d        limiter.Decision
		rejected bool
		want     Outcome
	}{
		{false, allow, false, Allowed},
		// Another policy refused the request, so this admit was undone.
		{false, allow, true, NotCounted},
		{false, deny(time.Second), true, Rejected},
		{false, closed(time.Second), true, FailedClosed},
		{true, allow, true, Allowed},
		{true, deny(time.Second), false, DryRunRejected},
		{true, closed(time.Second), false, DryRunRejected},
	}
	for _, tt := range tests {
		if got := OutcomeOf(tt.dryRun, &tt.d, tt.rejected); got != tt.want {
			t.Errorf("dryRun %v, %+v, rejected %v: %s, want %s", tt.dryRun, tt.d, tt.rejected, got, tt.want)
		}
	}
}

// TestRecord: one request's decisions in the shared series, the labels
// both front ends' dashboards and alerts read.
func TestRecord(t *testing.T) {
	m := NewMetrics("test", "requests")
	a, b := m.PolicyCounters("a"), m.PolicyCounters("b")
	reqs := requests(false, true)
	ds := []limiter.Decision{deny(time.Second), closed(time.Second)}
	ds[0].Source = limiter.SourceDenyCache
	v := Sum(reqs, ds)
	m.Record(reqs, ds, &v, func(i int, o Outcome) { []*Counters{&a, &b}[i].Inc(o) })
	for _, c := range []struct {
		got  float64
		want float64
		what string
	}{
		{testutil.ToFloat64(m.Requests.WithLabelValues("a", "rejected")), 1, "a rejected"},
		{testutil.ToFloat64(m.Requests.WithLabelValues("b", "dry_run_rejected")), 1, "b dry_run_rejected"},
		{testutil.ToFloat64(m.Requests.WithLabelValues("b", "failed_closed")), 0, "b failed_closed"},
		{testutil.ToFloat64(m.Sources.WithLabelValues("deny-cache")), 1, "source deny-cache"},
		{testutil.ToFloat64(m.Sources.WithLabelValues("failed-closed")), 1, "source failed-closed"},
		{testutil.ToFloat64(m.RedisErrors), 1, "requests with a Redis error"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	for o := range NumOutcomes {
		if o.String() == "unknown" || o.String() == "" {
			t.Errorf("outcome %d has no label", o)
		}
	}
}
