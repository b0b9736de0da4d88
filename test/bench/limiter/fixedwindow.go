package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// fixedWindow is the cheapest Redis limiter: a fixed window counted with
// INCRBY + EXPIRE per decision (envoyproxy/ratelimit's), behind a client
// that batches as the limiter does (fwInflight pipelines in flight, up to
// fwMaxBatch decisions each), so that Redis CPU per decision compares
// what the two ask of Redis, not how they send it. With packed, the same
// client sends each batch as one call of issue 39's packed log
// (redisschema.PackedCall: exact, one string per client).
type fixedWindow struct {
	rdb    *redis.Client
	queue  chan *fwReq
	packed *redis.Script
}

type fwReq struct {
	key  string
	n    int64 // the window's count after this hit
	err  error
	done chan struct{}
}

const (
	fwInflight = 2   // limiter.Options.MaxInflight's default
	fwMaxBatch = 256 // limiter.Options.MaxBatch's default
)

func newFixedWindow(ctx context.Context, rdb *redis.Client, packed bool) *fixedWindow {
	f := &fixedWindow{rdb: rdb, queue: make(chan *fwReq, 16*fwMaxBatch)}
	if packed {
		f.packed = redis.NewScript(redisschema.PackedCallScript())
	}
	for range fwInflight {
		go f.flusher(ctx)
	}
	return f
}

func (f *fixedWindow) flusher(ctx context.Context) {
	batch := make([]*fwReq, 0, fwMaxBatch)
	expiry := int64(benchWindow / time.Second)
	for {
		select {
		case r := <-f.queue:
			batch = append(batch[:0], r)
		case <-ctx.Done():
			return
		}
	fill:
		for len(batch) < fwMaxBatch {
			select {
			case r := <-f.queue:
				batch = append(batch, r)
			default:
				break fill
			}
		}
		if f.packed != nil {
			err := f.sendPacked(ctx, batch)
			for _, r := range batch {
				r.err = err
				r.done <- struct{}{}
			}
			continue
		}
		pipe := f.rdb.Pipeline()
		incr := make([]*redis.IntCmd, len(batch))
		for i, r := range batch {
			incr[i] = pipe.IncrBy(ctx, r.key, 1)
			pipe.Expire(ctx, r.key, time.Duration(expiry)*time.Second)
		}
		_, err := pipe.Exec(ctx)
		for i, r := range batch {
			r.n, r.err = incr[i].Val(), incr[i].Err()
			if r.err == nil && err != nil {
				r.err = err
			}
			r.done <- struct{}{}
		}
	}
}

// packedRule is the rule of every decision of a packed call.
var packedRule = redisschema.PackedRule{Limit: benchLimit, Window: benchWindow, Hits: 1}

// sendPacked decides batch in one packed call, and reads its answers (as
// a limiter would; their count is checked).
func (f *fixedWindow) sendPacked(ctx context.Context, batch []*fwReq) error {
	call := redisschema.PackedCall{Margin: time.Second}
	for _, r := range batch {
		var m [8]byte
		binary.LittleEndian.PutUint64(m[:], rand.Uint64()) //nolint:gosec // uniqueness, not secrecy
		if err := call.Add(r.key, string(m[:]), packedRule, true); err != nil {
			return err
		}
	}
	keys, args := call.Args()
	reply, err := f.packed.Run(ctx, f.rdb, keys, args...).Result()
	if err != nil {
		return err
	}
	_, _, err = call.Decode(reply, make([]redisschema.PackedAnswer, 0, len(batch)))
	return err
}

// decide counts one hit for client in the current fixed window. (The
// client compares the count with the limit, which costs Redis nothing; the
// bench leaves it out.)
func (f *fixedWindow) decide(client string) error {
	key := "pk:" + client
	if f.packed == nil {
		key = "fw:" + client + ":" + strconv.FormatInt(time.Now().UnixNano()/int64(benchWindow), 10)
	}
	r := &fwReq{key: key, done: make(chan struct{}, 1)}
	f.queue <- r
	<-r.done
	return r.err
}

// measureFixedWindow drives the fixed-window client (the packed log's,
// with packed) as measureLimiter drives the limiter and reports
// redis-server's CPU per decision.
func measureFixedWindow(ctx context.Context, srv *testsupport.Redis, callers int, d time.Duration, packed bool) (point, error) {
	if err := flush(srv); err != nil {
		return point{}, err
	}
	u, err := redisconn.NewClient(redisconn.Config{Addrs: []string{srv.Addr}})
	if err != nil {
		return point{}, err
	}
	rdb := u.(*redis.Client)
	defer func() { _ = rdb.Close() }()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f := newFixedWindow(ctx, rdb, packed)
	if err := f.decide("warmup"); err != nil {
		return point{}, fmt.Errorf("fixed window: %w", err)
	}
	cpuBefore, err := srv.CPUTime()
	if err != nil {
		return point{}, err
	}
	var firstErr atomic.Pointer[error]
	lat, elapsed := drive(callers, d, func(rng *rand.Rand) bool {
		err := f.decide(strconv.Itoa(rng.IntN(clients)))
		if err != nil {
			firstErr.CompareAndSwap(nil, &err)
		}
		return err == nil
	})
	cpuAfter, err := srv.CPUTime()
	if err != nil {
		return point{}, err
	}
	if e := firstErr.Load(); e != nil {
		return point{}, fmt.Errorf("fixed window: %w", *e)
	}
	p := summarize(lat, elapsed)
	if n := len(lat); n > 0 {
		p.cpuPerDecision = (cpuAfter - cpuBefore) / time.Duration(n)
	}
	return p, nil
}
