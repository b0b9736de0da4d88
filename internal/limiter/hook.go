package limiter

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// pipelineHook shapes each pipeline a client sends to one server: on a
// Redis Cluster, each node's part of a round trip.
//
// When the round trip's context asks for replicaAcks (durable admits), a
// WAIT ends the pipeline and its answer is recorded for the commands
// before it.
//
// guard (Cluster nodes) puts a PING first. go-redis resends a node's whole
// part when its first command fails with an error worth retrying
// (pipelineReadCmds, v9.23), TRYAGAIN included, while the commands of that
// part that got ASK are resent to the other node too: one command then
// runs on two nodes at once, its reply written by both (a data race in
// go-redis) and possibly overwritten by the refusal. A PING answers on any
// node, so the first command never fails that way and each command's
// refusal reaches the limiter, which resends it itself (retryLater).
type pipelineHook struct {
	guard bool
}

// install puts the hook on rdb: on each node client of a cluster client,
// as the cluster client creates them (New is called before the client's
// first use, so that is every node). A node created before has no WAIT,
// so its durable admits are never acknowledged: they go to the fail mode,
// never through unreplicated.
func (h pipelineHook) install(rdb redis.UniversalClient) {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		h.guard = true
		c.OnNewNode(func(n *redis.Client) { n.AddHook(h) })
	case *redis.Client:
		c.AddHook(h)
	}
}

func (pipelineHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (pipelineHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h pipelineHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		acks := replicaAcksOf(ctx)
		if !h.guard && acks == nil {
			return next(ctx, cmds)
		}
		out := make([]redis.Cmder, 0, len(cmds)+2)
		if h.guard {
			out = append(out, redis.NewStatusCmd(ctx, "ping"))
		}
		for _, c := range cmds {
			// A PING or WAIT of an earlier attempt that go-redis resends
			// with the rest: this attempt has its own.
			if n := c.Name(); n != "ping" && n != "wait" {
				out = append(out, c)
			}
		}
		if acks == nil {
			return next(ctx, out)
		}
		wait := redis.NewIntCmd(ctx, "wait", 1, acks.timeoutMs)
		out = append(out, wait)
		err := next(ctx, out)
		acks.record(out, wait)
		return err
	}
}
