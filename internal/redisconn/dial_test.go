package redisconn

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestBackAtOnceAfterDialErrors: after a run of failed dials the client's
// first command to a Redis that answers again gets through. go-redis's pool
// stops dialing after PoolSize failed dials in a row and leaves the retry to
// a background dial once a second (pool.ConnPool.tryDial), so without
// dialErrorsAtFirstUse the PING below fails with the old "connection
// refused" for up to a second after Redis is back: what TestFaults in
// internal/limiter saw as a 1.175 s recovery in CI.
func TestBackAtOnceAfterDialErrors(t *testing.T) {
	for _, mode := range []Mode{Standalone, Sentinel} {
		t.Run(string(mode), func(t *testing.T) {
			r := testsupport.StartRedis(t)
			cfg := Config{Mode: Standalone, Addrs: []string{r.Addr}, PoolSize: 2}
			if mode == Sentinel {
				s := testsupport.StartSentinel(t, r, "m", "")
				cfg = Config{Mode: Sentinel, Addrs: []string{s.Addr}, MasterName: "m", PoolSize: 2}
			}
			c, err := NewClient(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			if err := c.Ping(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if err := r.Kill(); err != nil {
				t.Fatal(err)
			}
			// More failed dials than the pool holds connections; each
			// reports the dial's own error.
			for range 2 * cfg.PoolSize {
				err := c.Ping(ctx).Err()
				if err == nil {
					t.Fatal("PING answered by a killed redis-server")
				}
				if !strings.Contains(err.Error(), "connection refused") {
					t.Fatalf("PING of a killed redis-server: %v, want the dial's connection refused", err)
				}
			}
			if err := r.Restart(); err != nil { // returns once the new server answers
				t.Fatal(err)
			}
			start := time.Now()
			if err := c.Ping(ctx).Err(); err != nil {
				t.Fatalf("the first PING after redis-server answered again failed (%v later): %v", time.Since(start), err)
			}
		})
	}
}
