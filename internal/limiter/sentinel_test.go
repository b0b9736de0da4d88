package limiter

import (
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestSentinel: the limiter finds the master through a Sentinel.
func TestSentinel(t *testing.T) {
	t.Parallel()
	master := testsupport.StartRedis(t)
	sentinel := testsupport.StartSentinel(t, master, "mymaster", "")
	rdb := client(t, redisconn.Config{Mode: redisconn.Sentinel, Addrs: []string{sentinel.Addr}, MasterName: "mymaster"})
	l := newLimiter(t, rdb, Options{Timeout: 2 * time.Second})
	if l.grouping != groupAll {
		t.Errorf("sentinel client grouping %v, want all keys in one script", l.grouping)
	}
	if d := one(l, Rule{ID: "ns/sentinel", Limit: 1, Window: time.Minute}, "c"); d.Source != SourceRedis || !d.Allowed {
		t.Fatalf("through sentinel: %+v", d)
	}
	if n, _ := master.Do("EXISTS", Key(defaultPrefix, "ns/sentinel", "c")); n != "1" {
		t.Error("the key is not on the master")
	}
}
