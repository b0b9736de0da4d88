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
// probe never closed the breaker and every decision fell back.
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
	t.Logf("first decision by Redis %v after the start", time.Since(start).Round(time.Millisecond))
	for i := range 10 {
		if d := one(l, rule, "c"); d.Source != SourceRedis {
			t.Fatalf("decision %d after Redis decided again: %+v", i, d)
		}
	}
}
