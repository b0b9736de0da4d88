// Command rls benchmarks the RLS server (Envoy's rate limit service on the
// exact limiter) beside the limiter's own in-process rate, in the same run
// against the same redis-server, and writes a Markdown section ("## RLS
// server") for the benchmark report:
//
//	go run ./test/bench/rls -out docs/bench/rls.md
//
// For each number of concurrent callers it measures, back to back, (a) the
// limiter deciding in-process (one Decide per call, the reference) and (b)
// gRPC callers sending ShouldRateLimit to one RLS server on loopback, each
// request one descriptor (remote_address) matching one SlidingLog policy,
// over a few shared HTTP/2 connections as a gateway's Envoys keep. Both
// loops are closed (each caller waits for its answer) and count only
// decisions Redis made. The gRPC clients run in this process too, so (b)
// also pays the load generator's CPU: the ratio is a lower bound. It needs
// redis-server in PATH.
//
// The driver is hand-written (the limiter benchmark's closed loop): no gRPC
// load library (ghz) is among the modules this project's machines are known
// to reach.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
	"github.com/slidegate/slidegate/test/bench/internal/closedloop"
)

const (
	clients = 10000 // distinct client addresses
	limit   = 1_000_000
	window  = time.Minute
	conns   = 4 // gRPC connections shared by the callers
	goalAt  = 64
	goal    = 0.5
)

type row struct {
	callers  int
	lim, rls closedloop.Point
}

func main() { os.Exit(mainCode()) }

func mainCode() int {
	out := flag.String("out", "", "Markdown section to write (required)")
	dur := flag.Duration("duration", 3*time.Second, "measuring time per point")
	callersFlag := flag.String("callers", "1,16,64,256", "concurrent callers to measure")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run here")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "rls bench: -out is required")
		return 2
	}
	var callers []int
	for _, s := range strings.Split(*callersFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "rls bench: bad -callers %q\n", *callersFlag)
			return 2
		}
		callers = append(callers, n)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "rls bench: %v\n", err)
			return 1
		}
		_ = pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if err := run(*out, *dur, callers); err != nil {
		fmt.Fprintf(os.Stderr, "rls bench: %v\n", err)
		return 1
	}
	return 0
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func run(out string, dur time.Duration, callers []int) error {
	srv, err := testsupport.NewRedis()
	if err != nil {
		return err
	}
	defer srv.Close()
	redis.SetLogger(quiet{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started, loadBefore := time.Now(), loadAvg()

	rdb, err := redisconn.NewClient(redisconn.Config{Addrs: []string{srv.Addr}})
	if err != nil {
		return err
	}
	defer func() { _ = rdb.Close() }()

	addr, stopServer, err := startServer(ctx, srv.Addr)
	if err != nil {
		return err
	}
	defer stopServer()
	var cs []rlsv3.RateLimitServiceClient
	for range conns {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close() }()
		cs = append(cs, rlsv3.NewRateLimitServiceClient(conn))
	}

	var rows []row
	for _, c := range callers {
		r := row{callers: c}
		if r.lim, err = measureLimiter(ctx, rdb, c, dur); err != nil {
			return err
		}
		if r.rls, err = measureRLS(ctx, cs, c, dur); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "callers=%-3d limiter %8.0f/s  rls %8.0f/s  (%.2f)\n", c, r.lim.DPS, r.rls.DPS, r.rls.DPS/r.lim.DPS)
		rows = append(rows, r)
	}
	return write(out, rows, dur, time.Since(started), loadBefore, loadAvg())
}

// startServer runs one RLS server on loopback with one policy per client
// address, its own limiter and Redis client (as its pod would).
func startServer(ctx context.Context, redisAddr string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "rls-bench")
	if err != nil {
		return "", nil, err
	}
	cfg := &rlsconfig.Config{Version: rlsconfig.Version, Policies: []rlsconfig.Policy{{
		Namespace: "bench", Name: "per-ip", ID: rlsconfig.PolicyID("bench", "per-ip"), Domain: "edge",
		Descriptor: []rlsconfig.Entry{{Key: "remote_address"}}, WindowMillis: window.Milliseconds(), Limit: limit,
		Algorithm: string(limiter.SlidingLog), FailMode: string(limiter.FailOpen), Mode: rlsconfig.ModeEnforce,
	}}}
	data, err := rlsconfig.Marshal(cfg)
	if err != nil {
		return "", nil, err
	}
	path := filepath.Join(dir, rlsconfig.FileName)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return "", nil, err
	}
	rdb, err := redisconn.NewClient(redisconn.Config{Addrs: []string{redisAddr}})
	if err != nil {
		return "", nil, err
	}
	lim, err := limiter.New(rdb, limiter.Options{})
	if err != nil {
		return "", nil, err
	}
	s := rls.New(lim, rls.Options{ConfigFile: path})
	if err := s.Reload(); err != nil {
		return "", nil, err
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	al, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = s.Serve(sctx, gl, al, 0, time.Second); close(done) }()
	return gl.Addr().String(), func() {
		cancel()
		<-done
		_ = lim.Close()
		_ = rdb.Close()
		_ = os.RemoveAll(dir)
	}, nil
}

func measureLimiter(ctx context.Context, rdb redis.UniversalClient, callers int, d time.Duration) (closedloop.Point, error) {
	l, err := limiter.New(rdb, limiter.Options{})
	if err != nil {
		return closedloop.Point{}, err
	}
	defer func() { _ = l.Close() }()
	rule := limiter.Rule{ID: "bench/in-process", Limit: limit, Window: window}
	l.Decide(ctx, []limiter.Request{{Rule: rule, Client: "warmup"}})
	lat, elapsed := closedloop.Drive(callers, d, func(_ int, rng *rand.Rand) bool {
		dec := l.Decide(ctx, []limiter.Request{{Rule: rule, Client: strconv.Itoa(rng.IntN(clients))}})
		return dec[0].Source == limiter.SourceRedis
	})
	return closedloop.Summarize(lat, elapsed), nil
}

func measureRLS(ctx context.Context, cs []rlsv3.RateLimitServiceClient, callers int, d time.Duration) (closedloop.Point, error) {
	var firstErr error
	var mu sync.Mutex
	lat, elapsed := closedloop.Drive(callers, d, func(g int, rng *rand.Rand) bool {
		req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0." + strconv.Itoa(rng.IntN(clients))}},
		}}}
		resp, err := cs[g%len(cs)].ShouldRateLimit(ctx, req)
		if err != nil {
			mu.Lock()
			if firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
			return false
		}
		return resp.GetOverallCode() == rlsv3.RateLimitResponse_OK
	})
	if firstErr != nil {
		return closedloop.Point{}, firstErr
	}
	return closedloop.Summarize(lat, elapsed), nil
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
}

// loadAvg is the 1-minute load average, to show how busy the machine was.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Fields(string(b))[0]
}

func write(out string, rows []row, dur, took time.Duration, loadBefore, loadAfter string) error {
	var b strings.Builder
	b.WriteString("## RLS server\n\n")
	b.WriteString("Envoy's rate limit service (`ShouldRateLimit`, one descriptor matching one\n")
	b.WriteString("SlidingLog policy, 10,000 client addresses) against one redis-server, beside the\n")
	b.WriteString("limiter deciding in-process in the same run: what the gRPC layer costs.\n")
	fmt.Fprintf(&b, "Closed loops of %v per point; the gRPC callers share %d connections and run in\n", dur, conns)
	b.WriteString("the server's process (their CPU is charged to the RLS figures).\n\n")
	b.WriteString("| callers | limiter decisions/s | p50 ms | p99 ms | RLS decisions/s | p50 ms | p99 ms | RLS / limiter |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	verdict := "not measured"
	for _, r := range rows {
		ratio := 0.0
		if r.lim.DPS > 0 {
			ratio = r.rls.DPS / r.lim.DPS
		}
		fmt.Fprintf(&b, "| %d | %.0f | %s | %s | %.0f | %s | %s | %.2f |\n",
			r.callers, r.lim.DPS, ms(r.lim.P50), ms(r.lim.P99), r.rls.DPS, ms(r.rls.P50), ms(r.rls.P99), ratio)
		if r.callers == goalAt {
			verdict = "**not met**"
			if ratio >= goal {
				verdict = "**met**"
			}
			verdict = fmt.Sprintf("%s (%.2f)", verdict, ratio)
		}
	}
	fmt.Fprintf(&b, "\nGoal: at %d callers the RLS server reaches ≥ %.1f × the in-process limiter rate: %s.\n", goalAt, goal, verdict)
	fmt.Fprintf(&b, "The section took %v; 1-minute load average %s before, %s after (the machine is shared).\n",
		took.Round(time.Second), loadBefore, loadAfter)
	return os.WriteFile(out, []byte(b.String()), 0o644)
}
