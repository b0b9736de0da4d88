package limiter

import (
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestSlowerThanTimeout: a Redis that answers everything, always slower
// than Timeout (but within MaxTimeout), is slow, not down. The first idle
// decisions time out and open the breaker; the probe, which waits up to
// MaxTimeout (a new connection through the proxy takes about four delayed
// round trips: HELLO, CLIENT SETINFO, PING), closes it and teaches the
// budget the latency; from then on Redis decides. Bounded by Timeout, the
// probe never closed the breaker and every decision fell back. The
// limiter's own repairs (cancels, undos) get the same budget.
func TestSlowerThanTimeout(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	const delay = 150 * time.Millisecond
	l := newLimiter(t, standalone(t, testsupport.StartProxy(t, r.Addr, testsupport.ProxyOptions{Delay: func(time.Time) time.Duration { return delay }}).Addr), Options{Timeout: 100 * time.Millisecond, MaxTimeout: time.Second})
	rule := Rule{ID: "ns/slow", Limit: 1000, Window: time.Minute}
	start := time.Now()
	for one(l, rule, "c").Source != SourceRedis {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("no decision by Redis in 10 s (stats %+v)", l.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("first decision by Redis %v after the start (%d lost replies' cancels pending, stats %+v)",
		time.Since(start).Round(time.Millisecond), l.cancels.Load(), l.Stats())
	opens := l.Stats().BreakerOpens
	for i := range 10 {
		if d := one(l, rule, "c"); d.Source != SourceRedis {
			t.Fatalf("decision %d after Redis decided again: %+v", i, d)
		}
	}
	// The decisions that timed out before left cancels of their lost
	// replies (and undos of late admits). Sent with a deadline of Timeout,
	// each failed against this Redis, was retried for a minute, and its
	// failures reopened the breaker between answered decisions (under
	// load, five in a row). With the budget's deadline they are answered
	// as soon as the decisions are: within a few of the slowest answers.
	wait := 4 * l.budget(time.Now())
	for deadline := time.Now().Add(wait); l.cancels.Load() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d cancels still pending %v after Redis decided again (stats %+v)", l.cancels.Load(), wait, l.Stats())
		}
	}
	if got := l.Stats().BreakerOpens; got != opens {
		t.Errorf("the breaker opened %d more times after Redis decided again", got-opens)
	}
}
