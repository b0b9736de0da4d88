package redisadmin

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// The cluster the tests share: 3 masters with a replica each, started once
// for the package, in the background while the other tests run.
var (
	clusterOnce sync.WaitGroup
	cluster     *testsupport.Cluster
	clusterErr  error
)

func TestMain(m *testing.M) {
	testsupport.RedisInMain()
	redis.SetLogger(quietLogger{})
	clusterOnce.Add(1)
	go func() {
		defer clusterOnce.Done()
		cluster, clusterErr = testsupport.NewClusterWith(testsupport.ClusterOptions{Masters: 3, Replicas: 1})
	}()
	code := m.Run()
	clusterOnce.Wait()
	if cluster != nil {
		cluster.Close()
	}
	os.Exit(code)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func sharedCluster(t *testing.T) *testsupport.Cluster {
	t.Helper()
	clusterOnce.Wait()
	if clusterErr != nil {
		t.Fatalf("starting the redis cluster: %v", clusterErr)
	}
	if err := cluster.WaitOK(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	return cluster
}
