// Command luaab measures variants of the decide batch call's Lua against
// one redis-server, interleaved: each variant runs in turn for 0.7 s,
// round after round, under the same client load (32 goroutines, 20
// decisions of 10,000 keys per call, limit 1000 per 1 s, nearly every
// decision admitted), and redis-server's CPU time is summed per variant.
// Each variant has keys of its own (a packed log's string is not a
// sorted set). This machine's speed moves by tens of percent from one minute to the
// next; interleaving puts those moves on every variant alike, so the
// ratio between variants is what to read, as in `make bench`.
//
//	go run ./test/bench/luaab -print > now.lua   # this tree's batch call
//	go run ./test/bench/luaab before.lua now.lua  # A/B
//
// A variant is the EVAL form of slidegate_decide_batch_v1 (the same
// arguments and reply), e.g. printed with -print at another revision, or
// one of the floors below, named floor:<name>: what a batch call would
// cost Redis if it ran nothing but what its name says, to tell how much of
// a variant's cost is the call itself, the commands, and the rest.
//
//	go run ./test/bench/luaab now.lua floor:log floor:empty
//	go run ./test/bench/luaab -counter now.lua floor:counter floor:empty
//
// floor:call is not a floor but issue 39's packed log, a whole exact
// decision in its own call format (redisschema.PackedCall: the rule once
// per call, one reply string), floor:fixed the fixed window it is to cost
// no more than 1.5 times, floor:call-empty that call with no command per
// decision, floor:call-commands its GET and SETRANGE with no Lua to
// speak of, floor:pipelined-fixed the fixed window without Lua (INCRBY
// and EXPIRE pipelined, 20 decisions a pipeline; the bar of make bench),
// and call:<file> a Lua file that takes the call's format (e.g.
// printed with -print-packed and changed); -stats shows each variant's
// commands and their own µs per decision:
//
//	go run ./test/bench/luaab -stats -callers 64 floor:call call:new.lua floor:call-commands floor:pipelined-fixed
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

func main() {
	print := flag.Bool("print", false, "print this tree's decide batch script and exit")
	printPacked := flag.Bool("print-packed", false, "print this tree's packed call script (floor:call) and exit")
	counter := flag.Bool("counter", false, "SlidingWindowCounter keys instead of SlidingLog")
	rounds := flag.Int("rounds", 10, "rounds of every variant")
	flag.BoolVar(&stats, "stats", false, "also print each variant's commands per decision and their µs (INFO commandstats)")
	flag.IntVar(&goroutines, "callers", goroutines, "callers (goroutines), each with one call in flight")
	flag.IntVar(&clients, "clients", clients, "keys the decisions spread over (fewer: fuller windows)")
	flag.IntVar(&perCall, "per-call", perCall, "decisions per call (or pipeline)")
	flag.Parse()
	if *print {
		fmt.Print(redisschema.DecideBatch.Script())
		return
	}
	if *printPacked {
		fmt.Print(redisschema.PackedCallScript())
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

// goroutines is -callers, clients -clients, perCall -per-call, stats
// -stats.
var (
	goroutines, clients = 32, 10000
	perCall             = 20
	stats               bool
)

const (
	turn = 700 * time.Millisecond
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
	lean := make([]bool, len(files))
	pipe := make([]bool, len(files))
	for i, f := range files {
		if f == "floor:pipelined-fixed" {
			pipe[i] = true
			continue
		}
		src, ok := floors[strings.TrimPrefix(f, "floor:")]
		if s, isCall := callFloors[strings.TrimPrefix(f, "floor:")]; isCall {
			src, ok, lean[i] = s, true, true
		}
		if path, isCall := strings.CutPrefix(f, "call:"); isCall {
			lean[i], f = true, path
		}
		if !ok || !strings.HasPrefix(f, "floor:") {
			b, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			src = string(b)
		}
		var err error
		if shas[i], err = rdb.ScriptLoad(ctx, src).Result(); err != nil {
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
			call := redisschema.PackedCall{Margin: time.Second}
			for !stop.Load() {
				v := cur.Load()
				if pipe[v] {
					p := rdb.Pipeline()
					x := strconv.FormatInt(time.Now().Unix(), 10)
					for range perCall {
						key := redisschema.Key("", "bench/luaab/"+strconv.Itoa(int(v)), strconv.Itoa(rng.IntN(clients))) + ":" + x
						p.IncrBy(ctx, key, 1)
						p.Expire(ctx, key, 2*time.Second)
					}
					if _, err := p.Exec(ctx); err != nil {
						firstErr.CompareAndSwap(nil, fmt.Errorf("%s: %w", files[v], err))
						stop.Store(true)
						return
					}
					counts[v].Add(int64(perCall))
					continue
				}
				if lean[v] {
					call.Reset()
					for range perCall {
						var m [8]byte
						binary.LittleEndian.PutUint64(m[:], rng.Uint64())
						_ = call.Add(redisschema.Key("", "bench/luaab/"+strconv.Itoa(int(v)), strconv.Itoa(rng.IntN(clients))), string(m[:]), packedRule, true)
					}
					keys, cargs := call.Args()
					args = append(args[:0], "evalsha", shas[v], len(keys))
					for _, k := range keys {
						args = append(args, k)
					}
					args = append(args, cargs...)
					if err := rdb.Do(ctx, args...).Err(); err != nil {
						firstErr.CompareAndSwap(nil, fmt.Errorf("%s: %w", files[v], err))
						stop.Store(true)
						return
					}
					counts[v].Add(int64(perCall))
					continue
				}
				args = append(args[:0], "evalsha", shas[v], perCall)
				for range perCall {
					args = append(args, redisschema.Key("", "bench/luaab/"+strconv.Itoa(int(v)), strconv.Itoa(rng.IntN(clients))))
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
				counts[v].Add(int64(perCall))
			}
		}()
	}
	time.Sleep(2 * time.Second) // the keys fill to their steady size
	cpu := make([]time.Duration, len(files))
	decisions := make([]int64, len(files))
	cmds := make([]map[string]cmdStat, len(files))
	for v := range cmds {
		cmds[v] = map[string]cmdStat{}
	}
	for range rounds {
		for v := range files {
			cur.Store(int32(v)) //nolint:gosec // a handful of files
			time.Sleep(50 * time.Millisecond)
			s0, err := commandStats(ctx, rdb)
			if err != nil {
				return err
			}
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
			s1, err := commandStats(ctx, rdb)
			if err != nil {
				return err
			}
			for name, b := range s1 {
				a := cmds[v][name]
				a.calls += b.calls - s0[name].calls
				a.usec += b.usec - s0[name].usec
				cmds[v][name] = a
			}
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
		if stats {
			printStats(cmds[v], decisions[v])
		}
	}
	return nil
}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct{ calls, usec int64 }

// commandStats reads INFO commandstats: calls and µs per command, those
// a script ran counted too (the µs are the command's own, not the
// script's around it).
func commandStats(ctx context.Context, rdb *redis.Client) (map[string]cmdStat, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]cmdStat{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		var c cmdStat
		for kv := range strings.SplitSeq(rest, ",") {
			k, val, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				c.calls, _ = strconv.ParseInt(val, 10, 64)
			case "usec":
				c.usec, _ = strconv.ParseInt(val, 10, 64)
			}
		}
		out[name] = c
	}
	return out, nil
}

// printStats prints the commands of one variant that ran at least once
// per hundred decisions: per decision, calls and µs.
func printStats(cmds map[string]cmdStat, decisions int64) {
	names := make([]string, 0, len(cmds))
	for name, c := range cmds {
		if c.calls*100 >= decisions && name != "info" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		c := cmds[name]
		fmt.Printf("    %-14s %5.2f calls/decision %6.2f µs/decision (its own time)\n", name,
			float64(c.calls)/float64(max(1, decisions)), float64(c.usec)/float64(max(1, decisions)))
	}
}

// floorHead reads Redis's clock as the batch call does.
const floorHead = `
local t = redis.call('TIME')
local now = (tonumber(t[1]) - 1577836800) * 1000000 + tonumber(t[2])
local w = 1000000
local out = {now}
`

// floors are the floor:<name> variants. Each takes the batch call's
// arguments (run's: one hit on one key per decision, limit 1000 per 1 s)
// and answers in its shape, six values per decision.
var floors = map[string]string{
	// The call, TIME, each decision's arguments read and its reply; no
	// command per decision.
	"empty": floorHead + `
for i = 1, #KEYS do
  local b = 2 + 7 * (i - 1)
  local l = tonumber(ARGV[b + 3])
  local o = #out
  out[o+1], out[o+2], out[o+3], out[o+4], out[o+5], out[o+6] = 1, 1, l - 1, 0, w, 0
end
return out`,
	// An exact count log's four commands per decision (ZCOUNT, ZADD NX,
	// ZREMRANGEBYSCORE, PEXPIRE) and nothing else: no argument checked,
	// no retry or reset read, no hot key read once.
	"log": floorHead + logFloor(true),
	// As floor:log without the PEXPIRE (not exact: keys would expire under
	// live admits): what the expiry costs.
	"log-no-expiry": floorHead + logFloor(false),
	// A sliding window counter's two commands per decision (HMGET of the
	// two fields, HINCRBY) and nothing else: no expiry, no old field
	// dropped.
	// The fixed window envoyproxy/ratelimit counts (INCRBY, EXPIRE per
	// decision; not exact): the bar issue 39 sets for an exact decision.
	"fixed": floorHead + `
local x = math.floor(now / w)
local xs = string.format('%d', x)
for i = 1, #KEYS do
  local key = KEYS[i] .. ':' .. xs
  local c = redis.call('INCRBY', key, 1)
  redis.call('EXPIRE', key, 2)
  local o = #out
  if c <= 1000 then
    out[o+1], out[o+2], out[o+3], out[o+4], out[o+5], out[o+6] = 1, 1, 1000 - c, 0, w, 0
  else
    out[o+1], out[o+2], out[o+3], out[o+4], out[o+5], out[o+6] = 0, 0, 0, 1, w, 0
  end
end
return out`,
	"counter": floorHead + `
local x = math.floor(now / w)
local xs, ps = string.format('%d', x), string.format('%d', x - 1)
local el = now - x * w
for i = 1, #KEYS do
  local key = KEYS[i]
  local v = redis.call('HMGET', key, xs, ps)
  local c, p = tonumber(v[1]) or 0, tonumber(v[2]) or 0
  local e = p * (w - el) / w + c
  local o = #out
  if e + 1 <= 1000 then
    redis.call('HINCRBY', key, xs, '1')
    out[o+1], out[o+2], out[o+3], out[o+4], out[o+5], out[o+6] = 1, 1, math.floor(999 - e), 0, w, x
  else
    out[o+1], out[o+2], out[o+3], out[o+4], out[o+5], out[o+6] = 0, 0, 0, 1, w, 0
  end
end
return out`,
}

// packedRule is the rule of every decision of a call: run's, one hit
// under 1000 per 1 s.
var packedRule = redisschema.PackedRule{Limit: 1000, Window: time.Second, Hits: 1}

// callFloors take the packed call's arguments (redisschema.PackedCall:
// the rule once per call, a byte per decision) and answer in its shape,
// as does a Lua file named call:<path>.
var callFloors = map[string]string{
	// The packed log in its own call format (redisschema.PackedCallScript).
	"call": redisschema.PackedCallScript(),
	// The packed call's two commands (GET, and SETRANGE into the value)
	// with next to no Lua around them: what the packed log's commands cost
	// in a script, the least any exact layout that reads a key and
	// writes it in place costs.
	"call-commands": floorHead + `
local out = {struct.pack('>I7', now)}
for i = 1, #KEYS do
  local key = KEYS[i]
  if redis.call('GET', key) then
    redis.call('SETRANGE', key, 7, struct.pack('>I7', now))
  else
    redis.call('SET', key, string.rep('\0', 70), 'PX', '2000')
  end
  out[i + 1] = struct.pack('>Bi4I6I6I7', 1, 999, 0, w, now)
end
return table.concat(out)`,
	// The packed call with no command per decision: its arguments read,
	// TIME and its reply.
	"call-empty": floorHead + `
local sel, l = ARGV[3], tonumber(ARGV[5])
local out = {struct.pack('>I7', now)}
for i = 1, #KEYS do
  local b = string.byte(sel, i)
  out[i + 1] = struct.pack('>Bi4I6I6I7', 1, l - 1, 0, w, b)
end
return table.concat(out)`,
}

func logFloor(expire bool) string {
	pexpire := ""
	if expire {
		pexpire = "redis.call('PEXPIRE', key, '2000')"
	}
	return `
local nowS = string.format('%d', now)
local cut = string.format('%d', now - w)
local cutx = '(' .. cut
for i = 1, #KEYS do
  local key, member = KEYS[i], ARGV[2 + 7 * (i - 1)]
  local c = redis.call('ZCOUNT', key, cutx, '+inf')
  local o = #out
  if c < 1000 and redis.call('ZADD', key, 'NX', nowS, member) == 1 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', cut)
    ` + pexpire + `
    out[o+1], out[o+2], out[o+3], out[o+4], out[o+5], out[o+6] = 1, 1, 999 - c, 0, w, 0
  else
    out[o+1], out[o+2], out[o+3], out[o+4], out[o+5], out[o+6] = 0, 0, 0, 1, w, 0
  end
end
return out`
}
