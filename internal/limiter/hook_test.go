package limiter

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisschema"
)

// TestClusterPipelineRunsACommandOnce: in a slot that is moving, one
// round trip carries a script over two keys, one of which has moved
// (TRYAGAIN), first, and a script over a key that has moved (ASK). The
// second must run once, on the new node. Without the limiter's PING
// first in each node's pipeline (pipelineHook.guard), go-redis resends
// the first node's whole part because its first command failed with
// TRYAGAIN, the second script with it, while following the second's ASK
// too: it ran on the new node in every one of go-redis's attempts (3
// increments here), and under -race the two writes of its reply are a
// data race.
func TestClusterPipelineRunsACommandOnce(t *testing.T) {
	c := changingCluster(t)
	tag := "{guard" + strconv.FormatInt(time.Now().UnixNano(), 36) + "}"
	kept, moved, counter := tag+"kept", tag+"moved", tag+"counter"
	s := redisschema.Slot(kept)
	from, err := c.Owner(s)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{kept, moved, counter} {
		if _, err := from.Do("SET", k, "0"); err != nil {
			t.Fatal(err)
		}
	}
	m, err := c.StartMigration(s, otherMaster(t, c, from))
	if err != nil {
		t.Fatal(err)
	}
	finish := func() {
		if _, err := m.MoveAll(nil); err != nil {
			t.Fatal(err)
		}
		if err := m.Finish(); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{moved, counter} {
		if err := m.MoveKey(k); err != nil {
			finish()
			t.Fatal(err)
		}
	}

	rdb := clusterClient(t, c)
	newLimiter(t, rdb, Options{}) // installs its hook on rdb
	ctx := context.Background()
	pipe := rdb.Pipeline()
	split := pipe.Eval(ctx, "redis.call('incr', KEYS[1]); return redis.call('incr', KEYS[2])", []string{kept, moved})
	once := pipe.Eval(ctx, "return redis.call('incr', KEYS[1])", []string{counter})
	_, _ = pipe.Exec(ctx)
	if !redis.IsTryAgainError(split.Err()) {
		t.Errorf("the script over a kept and a moved key: %v, %v; want TRYAGAIN", split.Val(), split.Err())
	}
	if v, err := once.Int64(); err != nil || v != 1 {
		t.Errorf("the script over a moved key answered %d, %v; want 1 (its first run)", v, err)
	}
	finish()
	if v, err := rdb.Get(ctx, counter).Result(); err != nil || v != "1" {
		t.Errorf("the moved key holds %q (%v): the script ran %s times, want once", v, err, v)
	}
}
