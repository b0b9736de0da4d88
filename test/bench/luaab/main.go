// Command luaab measures variants of the decide batch call's Lua against
// one redis-server, interleaved: each variant runs in turn for 0.7 s,
// round after round, under the same client load (32 goroutines, 20
// decisions of 10,000 keys per call, limit 1000 per 1 s, nearly every
// decision admitted), and redis-server's CPU time is summed per variant.
// This machine's speed moves by tens of percent from one minute to the
// next; interleaving puts those moves on every variant alike, so the
// ratio between variants is what to read, as in `make bench`.
//
//	go run ./test/bench/luaab -print > now.lua   # this tree's batch call
//	go run ./test/bench/luaab before.lua now.lua  # A/B
//
// A variant is the EVAL form of slidegate_decide_batch_v1 (the same
// arguments and reply), e.g. printed with -print at another revision.
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

func main() {
	print := flag.Bool("print", false, "print this tree's decide batch script and exit")
	counter := flag.Bool("counter", false, "SlidingWindowCounter keys instead of SlidingLog")
	rounds := flag.Int("rounds", 10, "rounds of every variant")
	flag.Parse()
	if *print {
		fmt.Print(redisschema.DecideBatch.Script())
		return
	}
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "luaab: name the Lua files to compare (or -print)")
		os.Exit(2)
	}
	if err := run(flag.Args(), *counter, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "luaab:", err)
		os.Exit(1)
	}
}

const (
	goroutines = 32
	perCall    = 20
	clients    = 10000
	turn       = 700 * time.Millisecond
)

func run(files []string, counter bool, rounds int) error {
	srv, err := testsupport.NewRedis()
	if err != nil {
		return err
	}
	defer srv.Close()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: goroutines})
	defer func() { _ = rdb.Close() }()
	shas := make([]string, len(files))
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if shas[i], err = rdb.ScriptLoad(ctx, string(b)).Result(); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	flags := "0"
	if counter {
		flags = "1"
	}
	var (
		cur      atomic.Int32
		counts   = make([]atomic.Int64, len(files))
		firstErr atomic.Value
		stop     atomic.Bool
		wg       sync.WaitGroup
	)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1)) //nolint:gosec // load, not secrecy
			args := make([]any, 0, 4+8*perCall)
			for !stop.Load() {
				v := cur.Load()
				args = append(args[:0], "evalsha", shas[v], perCall)
				for range perCall {
					args = append(args, redisschema.Key("", "bench/luaab", strconv.Itoa(rng.IntN(clients))))
				}
				args = append(args, "1000") // the expiry margin, ms
				for range perCall {
					var m [8]byte
					binary.LittleEndian.PutUint64(m[:], rng.Uint64())
					args = append(args, string(m[:]), "1", "1", "1000", "1000000", flags, "1")
				}
				if err := rdb.Do(ctx, args...).Err(); err != nil {
					firstErr.CompareAndSwap(nil, fmt.Errorf("%s: %w", files[v], err))
					stop.Store(true)
					return
				}
				counts[v].Add(perCall)
			}
		}()
	}
	time.Sleep(2 * time.Second) // the keys fill to their steady size
	cpu := make([]time.Duration, len(files))
	decisions := make([]int64, len(files))
	for range rounds {
		for v := range files {
			cur.Store(int32(v)) //nolint:gosec // a handful of files
			time.Sleep(50 * time.Millisecond)
			c0, err := srv.CPUTime()
			if err != nil {
				return err
			}
			n0 := counts[v].Load()
			time.Sleep(turn)
			c1, err := srv.CPUTime()
			if err != nil {
				return err
			}
			cpu[v] += c1 - c0
			decisions[v] += counts[v].Load() - n0
		}
	}
	stop.Store(true)
	wg.Wait()
	if err, ok := firstErr.Load().(error); ok {
		return err
	}
	for v, f := range files {
		per := float64(cpu[v]) / float64(time.Microsecond) / float64(max(1, decisions[v]))
		first := float64(cpu[0]) / float64(max(1, decisions[0]))
		fmt.Printf("%-32s Redis CPU %6.2f µs/decision (%.2f× %s)  %8.0f decisions/s\n", f, per,
			float64(cpu[v])/float64(max(1, decisions[v]))/first, files[0], float64(decisions[v])/(turn.Seconds()*float64(rounds)))
	}
	return nil
}
