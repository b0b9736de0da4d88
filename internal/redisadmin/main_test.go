package redisadmin

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// The cluster the tests share: 3 masters with a replica each, started once
// for the package, in the background while the other tests run.
var cluster *testsupport.BackgroundCluster

func TestMain(m *testing.M) {
	testsupport.RedisInMain()
	redis.SetLogger(quietLogger{})
	cluster = testsupport.StartCluster(testsupport.ClusterOptions{Masters: 3, Replicas: 1})
	code := m.Run()
	cluster.Close()
	os.Exit(code)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func sharedCluster(t *testing.T) *testsupport.Cluster {
	t.Helper()
	c := cluster.Get(t)
	if err := c.WaitOK(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}
