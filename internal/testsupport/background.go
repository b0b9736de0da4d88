package testsupport

import (
	"sync"
	"testing"
)

// BackgroundCluster is a Redis Cluster a package's TestMain starts once,
// in the background, so that the tests that do not need it run meanwhile
// (creating one takes seconds); the tests that do wait with Get.
type BackgroundCluster struct {
	wg  sync.WaitGroup
	c   *Cluster
	err error
}

// StartCluster starts the cluster o describes in the background.
func StartCluster(o ClusterOptions) *BackgroundCluster {
	b := &BackgroundCluster{}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.c, b.err = NewClusterWith(o)
	}()
	return b
}

// Wait waits until the cluster is up or failed to start (a benchmark that
// must not share the CPU with its start).
func (b *BackgroundCluster) Wait() { b.wg.Wait() }

// Get waits for the cluster and returns it, failing tb if it did not start.
func (b *BackgroundCluster) Get(tb testing.TB) *Cluster {
	tb.Helper()
	b.wg.Wait()
	if b.err != nil {
		tb.Fatalf("starting the redis cluster: %v", b.err)
	}
	return b.c
}

// Close stops the cluster once it is up (for TestMain, after m.Run).
func (b *BackgroundCluster) Close() {
	b.wg.Wait()
	if b.c != nil {
		b.c.Close()
	}
}
