package limiter

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// The 3-master cluster is started once for the package. Creating it takes
// several seconds, so TestMain starts it in the background and the other
// tests run meanwhile; cluster tests wait for it with sharedCluster.
var cluster *testsupport.BackgroundCluster

// The cluster the failover and reshard tests change: 3 masters with a
// replica each, whose replication lags by replicationLag (see
// testsupport.ClusterOptions), and a node timeout of a second, so that a
// replica replaces a killed master within about two.
var changing *testsupport.BackgroundCluster

const nodeTimeout = time.Second

// replicationLag is 100 ms, or SLIDEGATE_REPLICATION_LAG (a duration; "0s":
// replicas on loopback with nothing added, to measure a healthy network).
var replicationLag = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("SLIDEGATE_REPLICATION_LAG")); err == nil && d >= 0 {
		return d
	}
	return 100 * time.Millisecond
}()

func TestMain(m *testing.M) {
	testsupport.RedisInMain()
	// go-redis logs every failed dial; the fault tests cause thousands.
	redis.SetLogger(quietLogger{})
	cluster = testsupport.StartCluster(testsupport.ClusterOptions{Masters: 3})
	changing = testsupport.StartCluster(testsupport.ClusterOptions{
		Masters: 3, Replicas: 1, NodeTimeout: nodeTimeout, ReplicationDelay: replicationLag,
	})
	code := m.Run()
	cluster.Close()
	changing.Close()
	os.Exit(code)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func sharedCluster(t *testing.T) *testsupport.Cluster {
	t.Helper()
	return cluster.Get(t)
}

// changingCluster is the cluster that the failover and reshard tests
// change, once it is healthy.
func changingCluster(t *testing.T) *testsupport.Cluster {
	t.Helper()
	c := changing.Get(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the cluster's events so far (all tests'):\n%s", c.Events())
		}
	})
	if err := c.WaitOK(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// client returns a go-redis client for addr built by redisconn.NewClient, the
// way the sidecar builds it; closed at the end of the test.
func client(tb testing.TB, cfg redisconn.Config) redis.UniversalClient {
	tb.Helper()
	c, err := redisconn.NewClient(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// loadLibrary loads the slidegate library (EnsureLibrary) on rdb's server,
// or on every master of a cluster client, as the manager does.
func loadLibrary(tb testing.TB, rdb redis.UniversalClient) {
	tb.Helper()
	ctx := context.Background()
	var err error
	if c, ok := rdb.(*redis.ClusterClient); ok {
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			_, err := redisschema.EnsureLibrary(ctx, m)
			return err
		})
	} else {
		_, err = redisschema.EnsureLibrary(ctx, rdb)
	}
	if err != nil {
		tb.Fatalf("loading the slidegate library: %v", err)
	}
}

func standalone(tb testing.TB, addr string) redis.UniversalClient {
	return client(tb, redisconn.Config{Addrs: []string{addr}})
}

func newLimiter(tb testing.TB, rdb redis.UniversalClient, opts Options) *Limiter {
	tb.Helper()
	l, err := New(rdb, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = l.Close() })
	return l
}

func one(l *Limiter, r Rule, client string) Decision {
	return l.Decide(context.Background(), []Request{{Rule: r, Client: client}})[0]
}

// eventually polls cond every few ms until it holds or d passes; it
// returns how long that took and whether cond held.
func eventually(d time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > d {
			return time.Since(start), false
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Key is redisschema.Key, under the name the package's tests have long
// used for it.
var Key = redisschema.Key
