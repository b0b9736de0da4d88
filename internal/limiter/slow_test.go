package limiter

import (
	"io"
	"net"
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
	l := newLimiter(t, standalone(t, slowProxy(t, r.Addr, delay)), Options{Timeout: 100 * time.Millisecond, MaxTimeout: time.Second})
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

// slowProxy forwards to target and holds every chunk of Redis's answers
// for delay.
func slowProxy(t *testing.T, target string, delay time.Duration) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
			go func() {
				defer func() { _ = c.Close() }()
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						time.Sleep(delay)
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}
