// Command rls benchmarks the RLS server (Envoy's rate limit service on the
// exact limiter) beside the limiter's own in-process rate, in the same run
// against the same redis-server, and writes a Markdown section ("## RLS
// server") for the benchmark report:
//
//	go run ./test/bench/rls -out docs/bench/rls.md
//
// For each number of concurrent callers it measures three sides, in
// alternating slices so that a machine whose speed drifts (a shared VM)
// slows them alike:
//
//   - the limiter deciding in-process (one Decide per call): the reference;
//   - h2load (nghttp2's HTTP/2 load generator, C; nghttp2 was Envoy's
//     HTTP/2 codec) sending ShouldRateLimit as a gateway does: a few
//     connections, many streams each, one gRPC request body;
//   - gRPC-go clients in this process, each request one of 10,000 client
//     addresses: the load generator's CPU is charged to the server here,
//     so this side is a lower bound;
//   - the two RLS sides again over TLS (issue 22), in the same run: the
//     gRPC-go clients present client certificates to a server that
//     requires them (--tls-client-ca-file); h2load, which cannot present
//     one (nghttp2 1.52 has no option for it), speaks TLS to a server with
//     the same certificate and no client authentication. A connection's
//     handshake is its only extra step with a client certificate, and the
//     gateways' connections are long-lived, so either measures what TLS
//     costs per decision.
//
// Each request is one descriptor matching one SlidingLog policy. Loops are
// closed (a caller sends its next request when the last one is answered)
// and count only decisions Redis made. It needs redis-server and h2load
// (Debian's nghttp2-client) in PATH.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisadmin"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
	"github.com/slidegate/slidegate/test/bench/internal/closedloop"
)

const (
	clients = 10000 // distinct client addresses of the gRPC-go side
	limit   = 1_000_000
	window  = time.Minute
	conns   = 4 // connections of either gRPC side, as a gateway's Envoys keep
	goalAt  = 64
	goal    = 0.8
	method  = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
)

// side is one measured side of a point.
type side struct {
	closedloop.Point
	// CPU per counted decision: this process (limiter, server, and the
	// gRPC-go clients on that side), redis-server, and h2load.
	self, redis, client time.Duration
	// perTrip is the decisions a round trip to Redis carried.
	perTrip float64
}

type row struct {
	callers      int
	lim, h2, goc side
	// Over TLS: h2load (server TLS), gRPC-go (mTLS).
	h2tls, gomtls side
	// gRPC-go → RLS as the rate limit service's own Redis user, through
	// the Functions library (issue 22).
	gons side
	// h2load → an RLS server whose decider asks nothing (admitAll): the
	// most the gRPC layer lets an RLS server answer here.
	floor side
}

func (r row) ratio(s side) float64 {
	if r.lim.DPS == 0 {
		return 0
	}
	return s.DPS / r.lim.DPS
}

// slice is what one side returns for one slice of a point.
type slice struct {
	lat       []time.Duration
	elapsed   time.Duration
	clientCPU time.Duration // of a child process (h2load)
	// decided and trips are the limiter's decisions with Redis and its
	// round trips to Redis over the slice (limiter.Stats): how many
	// decisions a round trip carried.
	decided, trips int64
}

// phase drives callers for d; n numbers the slice.
type phase func(callers, n int, d time.Duration) (slice, error)

// tally sums the slices of one side.
type tally struct {
	slice
	self, redis time.Duration
}

func (t *tally) run(redisPid, callers, n int, d time.Duration, f phase) error {
	s0 := closedloop.SelfCPU()
	r0, err := closedloop.ProcCPU(redisPid)
	if err != nil {
		return err
	}
	s, err := f(callers, n, d)
	if err != nil {
		return err
	}
	r1, err := closedloop.ProcCPU(redisPid)
	if err != nil {
		return err
	}
	t.lat = append(t.lat, s.lat...)
	t.elapsed += s.elapsed
	t.clientCPU += s.clientCPU
	t.decided += s.decided
	t.trips += s.trips
	t.self += closedloop.SelfCPU() - s0
	t.redis += r1 - r0
	return nil
}

func (t *tally) result() side {
	n := time.Duration(max(len(t.lat), 1))
	return side{Point: closedloop.Summarize(t.lat, t.elapsed), self: t.self / n, redis: t.redis / n, client: t.clientCPU / n,
		perTrip: float64(t.decided) / float64(max(t.trips, 1))}
}

func main() { os.Exit(mainCode()) }

func mainCode() int {
	out := flag.String("out", "", "Markdown section to write (required)")
	dur := flag.Duration("duration", 4*time.Second, "measuring time per point and side")
	rounds := flag.Int("rounds", 4, "slices per point: the sides take turns this many times")
	callersFlag := flag.String("callers", "1,16,64,256", "concurrent callers to measure")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run here")
	flag.Parse()
	if *out == "" || *rounds < 1 {
		fmt.Fprintln(os.Stderr, "rls bench: -out is required, -rounds at least 1")
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
	if _, err := exec.LookPath("h2load"); err != nil {
		fmt.Fprintln(os.Stderr, "rls bench: h2load is not in PATH (Debian: apt-get install nghttp2-client; make bench installs it)")
		return 1
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
	if err := run(*out, *dur, *rounds, callers); err != nil {
		fmt.Fprintf(os.Stderr, "rls bench: %v\n", err)
		return 1
	}
	return 0
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func run(out string, dur time.Duration, rounds int, callers []int) error {
	srv, err := testsupport.NewRedis()
	if err != nil {
		return err
	}
	defer srv.Close()
	redis.SetLogger(quiet{})
	// The server's garbage collector setting, as cmd/rls runs it; it is the
	// process's, so the in-process limiter runs with it too.
	rls.TuneGC()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started, loadBefore := time.Now(), loadAvg()

	rdb, err := redisconn.NewClient(redisconn.Config{Addrs: []string{srv.Addr}})
	if err != nil {
		return err
	}
	defer func() { _ = rdb.Close() }()
	lim, err := limiter.New(rdb, limiter.Options{})
	if err != nil {
		return err
	}
	defer func() { _ = lim.Close() }()

	tmp, err := os.MkdirTemp("", "rls-bench-h2load")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	pki, err := testsupport.WritePKI(tmp)
	if err != nil {
		return err
	}

	def := redisconn.Config{Addrs: []string{srv.Addr}}
	sv, err := startServer(ctx, def, rls.TLSOptions{})
	if err != nil {
		return err
	}
	defer sv.stop()
	tlsSv, err := startServer(ctx, def, rls.TLSOptions{CertFile: pki.ServerCert, KeyFile: pki.ServerKey})
	if err != nil {
		return err
	}
	defer tlsSv.stop()
	mtlsSv, err := startServer(ctx, def, rls.TLSOptions{CertFile: pki.ServerCert, KeyFile: pki.ServerKey, ClientCAFile: pki.CA})
	if err != nil {
		return err
	}
	defer mtlsSv.stop()
	floorSv, err := serve(ctx, admitAll{}, rls.TLSOptions{}, func() {})
	if err != nil {
		return err
	}
	defer floorSv.stop()
	own, err := rlsIdentity(ctx, srv.Addr)
	if err != nil {
		return err
	}
	nsSv, err := startServer(ctx, own, rls.TLSOptions{})
	if err != nil {
		return err
	}
	defer nsSv.stop()
	ncs, closeNcs, err := dialSide(nsSv.addr, insecure.NewCredentials())
	if err != nil {
		return err
	}
	defer closeNcs()
	cs, closeCs, err := dialSide(sv.addr, insecure.NewCredentials())
	if err != nil {
		return err
	}
	defer closeCs()
	mtlsCreds, err := clientTLS(pki)
	if err != nil {
		return err
	}
	mcs, closeMcs, err := dialSide(mtlsSv.addr, mtlsCreds)
	if err != nil {
		return err
	}
	defer closeMcs()

	sides := []phase{
		func(c, _ int, d time.Duration) (slice, error) {
			before := lim.Stats()
			s := measureLimiter(ctx, lim, c, d)
			after := lim.Stats()
			s.decided, s.trips = after.Redis-before.Redis, after.RoundTrips-before.RoundTrips
			return s, nil
		},
		func(c, n int, d time.Duration) (slice, error) {
			return sv.counted(c, func() (slice, error) { return measureH2load(ctx, tmp, "http://"+sv.addr, c, n, d) })
		},
		func(c, _ int, d time.Duration) (slice, error) {
			return sv.counted(c, func() (slice, error) { return measureGRPC(ctx, cs, c, d) })
		},
		func(c, n int, d time.Duration) (slice, error) {
			return tlsSv.counted(c, func() (slice, error) { return measureH2load(ctx, tmp, "https://"+tlsSv.addr, c, n, d) })
		},
		func(c, _ int, d time.Duration) (slice, error) {
			return mtlsSv.counted(c, func() (slice, error) { return measureGRPC(ctx, mcs, c, d) })
		},
		func(c, _ int, d time.Duration) (slice, error) {
			return nsSv.counted(c, func() (slice, error) { return measureGRPC(ctx, ncs, c, d) })
		},
		func(c, n int, d time.Duration) (slice, error) {
			return measureH2load(ctx, tmp, "http://"+floorSv.addr, c, n, d)
		},
	}
	var rows []row
	for _, c := range callers {
		ts := make([]tally, len(sides))
		for n := range rounds {
			for i, f := range sides {
				if err := ts[i].run(srv.Pid(), c, n, dur/time.Duration(rounds), f); err != nil {
					return err
				}
			}
		}
		r := row{callers: c, lim: ts[0].result(), h2: ts[1].result(), goc: ts[2].result(), h2tls: ts[3].result(), gomtls: ts[4].result(), gons: ts[5].result(), floor: ts[6].result()}
		fmt.Fprintf(os.Stderr, "callers=%-3d limiter %6.0f/s  h2load→RLS %6.0f/s (%.2f)  gRPC-go→RLS %6.0f/s (%.2f)  µs CPU/decision (self+redis+h2load): %.1f+%.1f, %.1f+%.1f+%.1f, %.1f+%.1f\n",
			c, r.lim.DPS, r.h2.DPS, r.ratio(r.h2), r.goc.DPS, r.ratio(r.goc),
			us(r.lim.self), us(r.lim.redis), us(r.h2.self), us(r.h2.redis), us(r.h2.client), us(r.goc.self), us(r.goc.redis))
		fmt.Fprintf(os.Stderr, "            decisions per Redis round trip: limiter %.1f, h2load→RLS %.1f, gRPC-go→RLS %.1f\n",
			r.lim.perTrip, r.h2.perTrip, r.goc.perTrip)
		fmt.Fprintf(os.Stderr, "            TLS: h2load→RLS %6.0f/s (%.2f of h2c)  gRPC-go→RLS mTLS %6.0f/s (%.2f of h2c)\n",
			r.h2tls.DPS, of(r.h2tls.DPS, r.h2.DPS), r.gomtls.DPS, of(r.gomtls.DPS, r.goc.DPS))
		fmt.Fprintf(os.Stderr, "            floor: h2load→RLS asking nothing %6.0f/s (%.2f of the limiter), %.1f+%.1f µs CPU/answer (self+h2load)\n",
			r.floor.DPS, r.ratio(r.floor), us(r.floor.self), us(r.floor.client))
		rows = append(rows, r)
	}
	return write(out, rows, dur, rounds, time.Since(started), loadBefore, loadAvg())
}

// rlsIdentity sets up, as the manager does, the library and the rate limit
// service's own Redis user on the server at addr (with its default user as
// the administrative identity), and returns the connection as that user.
func rlsIdentity(ctx context.Context, addr string) (redisconn.Config, error) {
	adm, err := redisadmin.New(redisadmin.Options{Redis: redisconn.Config{Addrs: []string{addr}}})
	if err != nil {
		return redisconn.Config{}, err
	}
	defer adm.Close()
	const password = "bench-rls-password"
	u := redisadmin.RLSIdentity("", []string{rlsconfig.PolicyID("bench", "per-ip")}, []string{password})
	if _, err := adm.Sync(ctx, []redisadmin.User{u}); err != nil {
		return redisconn.Config{}, fmt.Errorf("setting up the rate limit service's Redis user: %w", err)
	}
	return redisconn.Config{Addrs: []string{addr}, Username: u.Name, Password: password}, nil
}

// server is one RLS server on loopback with its own limiter and Redis
// client, as its pod would have.
type server struct {
	addr string
	lim  *limiter.Limiter
	stop func()
}

// dialSide opens the gRPC-go side's connections to addr.
func dialSide(addr string, creds credentials.TransportCredentials) ([]rlsv3.RateLimitServiceClient, func(), error) {
	var cs []rlsv3.RateLimitServiceClient
	var open []*grpc.ClientConn
	closeAll := func() {
		for _, c := range open {
			_ = c.Close()
		}
	}
	for range conns {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		open = append(open, conn)
		cs = append(cs, rlsv3.NewRateLimitServiceClient(conn))
	}
	return cs, closeAll, nil
}

// clientTLS trusts the PKI's CA and presents its client certificate.
func clientTLS(p testsupport.PKI) (credentials.TransportCredentials, error) {
	pair, err := tls.LoadX509KeyPair(p.ClientCert, p.ClientKey)
	if err != nil {
		return nil, err
	}
	pem, err := os.ReadFile(p.CA)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	return credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, Certificates: []tls.Certificate{pair}}), nil
}

// of is a/b, or 0.
func of(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// startServer runs the server with one policy per client address, with
// the TLS of o (zero: h2c).
func startServer(ctx context.Context, rc redisconn.Config, o rls.TLSOptions) (*server, error) {
	rdb, err := redisconn.NewClient(rc)
	if err != nil {
		return nil, err
	}
	// An identity of its own decides through the Functions library, as
	// cmd/rls does with --redis-functions.
	lim, err := limiter.New(rdb, limiter.Options{Functions: rc.Username != ""})
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	sv, err := serve(ctx, lim, o, func() {
		_ = lim.Close()
		_ = rdb.Close()
	})
	if err != nil {
		return nil, err
	}
	sv.lim = lim
	return sv, nil
}

// serve runs an RLS server deciding with dec, as cmd/rls serves it (the
// same Serve, the same gRPC settings), on a loopback port; closeDec runs
// after it stopped.
func serve(ctx context.Context, dec enforce.Decider, o rls.TLSOptions, closeDec func()) (*server, error) {
	dir, err := os.MkdirTemp("", "rls-bench")
	if err != nil {
		return nil, err
	}
	cfg := &rlsconfig.Config{Version: rlsconfig.Version, Policies: []rlsconfig.Policy{{
		Namespace: "bench", Name: "per-ip", ID: rlsconfig.PolicyID("bench", "per-ip"), Domain: "edge",
		Descriptor: []rlsconfig.Entry{{Key: "remote_address"}}, WindowMillis: window.Milliseconds(), Limit: limit,
		Algorithm: string(limiter.SlidingLog), FailMode: string(limiter.FailOpen), Mode: sidecarconfig.ModeEnforce,
	}}}
	data, err := rlsconfig.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, rlsconfig.FileName)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return nil, err
	}
	s := rls.New(dec, rls.Options{ConfigFile: path})
	if err := s.Reload(); err != nil {
		return nil, err
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	al, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	var gopts []grpc.ServerOption
	if o.Enabled() {
		creds, err := s.TLSCreds(o)
		if err != nil {
			return nil, err
		}
		gopts = append(gopts, creds)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = s.Serve(sctx, gl, al, 0, time.Second, gopts...); close(done) }()
	return &server{addr: gl.Addr().String(), stop: func() {
		cancel()
		<-done
		closeDec()
		_ = os.RemoveAll(dir)
	}}, nil
}

// admitAll decides every request at once, allowed, asking nothing: the
// RLS server on it costs only what serving gRPC and answering cost, the
// most an RLS server on this gRPC stack can answer on this machine.
type admitAll struct{}

func (admitAll) Healthy() bool { return true }

func (admitAll) Decide(_ context.Context, reqs []limiter.Request) []limiter.Decision {
	ds := make([]limiter.Decision, len(reqs))
	for i := range reqs {
		ds[i] = limiter.Decision{Allowed: true, Remaining: reqs[i].Rule.Limit - 1, ResetAfter: reqs[i].Rule.Window, Source: limiter.SourceRedis}
	}
	return ds
}

// counted runs f and refuses its slice if the server made fewer decisions
// with Redis than the answers counted (a fallback answers OK too; h2load
// counts by HTTP status, and a gRPC error is a 200 too), or fell back for
// more than the calls in flight when a slice ends (h2load then resets its
// streams; the limiter answers a cancelled call from its fallback).
func (sv *server) counted(callers int, f func() (slice, error)) (slice, error) {
	before := sv.lim.Stats()
	s, err := f()
	after := sv.lim.Stats()
	s.decided, s.trips = after.Redis-before.Redis, after.RoundTrips-before.RoundTrips
	switch {
	case err != nil:
	case after.Fallback-before.Fallback+after.FailedClosed-before.FailedClosed > int64(callers):
		err = fmt.Errorf("the server decided %d requests without Redis; the figures would count them",
			after.Fallback-before.Fallback+after.FailedClosed-before.FailedClosed)
	case after.Redis-before.Redis < int64(len(s.lat)):
		err = fmt.Errorf("%d answers counted, but the server's limiter made only %d decisions with Redis",
			len(s.lat), after.Redis-before.Redis)
	}
	return s, err
}

func measureLimiter(ctx context.Context, l *limiter.Limiter, callers int, d time.Duration) slice {
	rule := limiter.Rule{ID: "bench/in-process", Limit: limit, Window: window}
	lat, elapsed := closedloop.Drive(callers, d, func(_ int, rng *rand.Rand) bool {
		dec := l.Decide(ctx, []limiter.Request{{Rule: rule, Client: strconv.Itoa(rng.IntN(clients))}})
		return dec[0].Source == limiter.SourceRedis
	})
	return slice{lat: lat, elapsed: elapsed}
}

func measureGRPC(ctx context.Context, cs []rlsv3.RateLimitServiceClient, callers int, d time.Duration) (slice, error) {
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
	return slice{lat: lat, elapsed: elapsed}, firstErr
}

// measureH2load runs h2load against base (http:// for h2c, https:// for
// TLS) for d with `callers` streams in flight over at most conns
// connections. h2load sends one body: every request of slice n
// is one client address, fresh for each slice (one hot sorted set, as a
// gateway's generic_key limit; the in-process limiter measured the same
// rate with one key as with 10,000).
func measureH2load(ctx context.Context, dir, base string, callers, n int, d time.Duration) (slice, error) {
	body, err := grpcFrame(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: fmt.Sprintf("h2load-%d-%d", callers, n)}},
	}}})
	if err != nil {
		return slice{}, err
	}
	bodyFile, logFile := filepath.Join(dir, "body"), filepath.Join(dir, "log.tsv")
	if err := os.WriteFile(bodyFile, body, 0o600); err != nil {
		return slice{}, err
	}
	// h2load appends to its log.
	if err := os.Remove(logFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return slice{}, err
	}
	c := min(conns, callers)
	m := (callers + c - 1) / c
	cmd := exec.CommandContext(ctx, "h2load", //nolint:gosec // the bench's own arguments
		"-D", strconv.FormatInt(d.Milliseconds(), 10)+"ms", "--warm-up-time", "0",
		"-c", strconv.Itoa(c), "-m", strconv.Itoa(m), "-t", "1",
		"-H", "content-type: application/grpc", "-H", "te: trailers",
		"-d", bodyFile, "--log-file", logFile, base+method)
	start := time.Now()
	outb, err := cmd.CombinedOutput()
	elapsed := time.Since(start)
	if err != nil {
		return slice{}, fmt.Errorf("h2load: %w: %s", err, outb)
	}
	lat, err := readH2loadLog(logFile)
	if err != nil {
		return slice{}, err
	}
	st := cmd.ProcessState
	// elapsed includes h2load's start and connections: a bound in the
	// server's disfavour.
	return slice{lat: lat, elapsed: elapsed, clientCPU: st.UserTime() + st.SystemTime()}, nil
}

// grpcFrame is a gRPC message on the wire: uncompressed flag, length, body.
func grpcFrame(m proto.Message) ([]byte, error) {
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, err
	}
	frame := make([]byte, 5, 5+len(b))
	binary.BigEndian.PutUint32(frame[1:], uint32(len(b))) //nolint:gosec // a small message
	return append(frame, b...), nil
}

// readH2loadLog reads h2load's per-request log (start µs, HTTP status,
// duration µs) and returns the durations of the 200s. A gRPC error also
// comes with 200 (its status is in the trailers); counted refuses slices
// in which the server decided anything without Redis.
func readH2loadLog(path string) ([]time.Duration, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var lat []time.Duration
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 3 {
			return nil, fmt.Errorf("h2load log: unexpected line %q", sc.Text())
		}
		if fs[1] != "200" {
			continue
		}
		us, err := strconv.ParseInt(fs[2], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("h2load log: %w", err)
		}
		lat = append(lat, time.Duration(us)*time.Microsecond)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(lat) == 0 {
		return nil, errors.New("h2load log: no successful request")
	}
	return lat, nil
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

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

func write(out string, rows []row, dur time.Duration, rounds int, took time.Duration, loadBefore, loadAfter string) error {
	var b strings.Builder
	b.WriteString("## RLS server\n\n")
	b.WriteString("Envoy's rate limit service (`ShouldRateLimit`, one descriptor matching one\n")
	b.WriteString("SlidingLog policy) against one redis-server, beside the limiter deciding\n")
	b.WriteString("in-process in the same run: what the gRPC layer costs, and what TLS adds to it. Seven\nsides per point, in\n")
	fmt.Fprintf(&b, "%d alternating slices (%v per side in all):\n\n", rounds, dur)
	b.WriteString("- **limiter**: `Decide` called in-process, 10,000 client keys (the reference);\n")
	fmt.Fprintf(&b, "- **h2load → RLS**: h2load (nghttp2, C) over %d connections with the callers as\n", conns)
	b.WriteString("  streams, as a gateway sends; one client key per slice, since h2load sends one body\n")
	b.WriteString("  (the in-process limiter decides one key as fast as 10,000);\n")
	fmt.Fprintf(&b, "- **gRPC-go → RLS**: gRPC-go clients in the server's process over %d connections,\n", conns)
	b.WriteString("  10,000 client keys: the clients' CPU is charged to the server (a lower bound);\n")
	b.WriteString("- **over TLS** (issue 22), the same two again: gRPC-go clients presenting client\n")
	b.WriteString("  certificates to a server that requires them (`--tls-client-ca-file`), and h2load\n")
	b.WriteString("  speaking TLS to a server with the same certificate but no client authentication,\n")
	b.WriteString("  since h2load cannot present a certificate. The handshake is a connection's only\n")
	b.WriteString("  extra step with one, and connections are long-lived: both measure TLS per decision;\n")
	b.WriteString("- **own Redis user** (issue 22): gRPC-go → RLS (h2c) with the server deciding as\n")
	b.WriteString("  `slidegate-rls` through the Functions library, as the install runs it;\n")
	b.WriteString("- **floor**: h2load → the same server on a decider that admits at once and asks\n")
	b.WriteString("  nothing (`admitAll`): what serving gRPC and answering cost alone, the most any RLS\n")
	b.WriteString("  server on this gRPC stack answers here, whatever decides behind it.\n\n")
	fmt.Fprintf(&b, "The process runs with the server's GOGC (%d, `rls.GCPercent`), all sides alike.\n\n", debug.SetGCPercent(-1))
	b.WriteString("| callers | limiter decisions/s | p50 ms | p99 ms | h2load → RLS decisions/s | p50 ms | p99 ms | ÷ limiter | gRPC-go → RLS decisions/s | p99 ms | ÷ limiter |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	verdict := "not measured"
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d | %.0f | %s | %s | %.0f | %s | %s | %.2f | %.0f | %s | %.2f |\n",
			r.callers, r.lim.DPS, ms(r.lim.P50), ms(r.lim.P99),
			r.h2.DPS, ms(r.h2.P50), ms(r.h2.P99), r.ratio(r.h2),
			r.goc.DPS, ms(r.goc.P99), r.ratio(r.goc))
		if r.callers == goalAt {
			verdict = "**not met**"
			if r.ratio(r.h2) >= goal {
				verdict = "**met**"
			}
			// The best an RLS server on this stack can do here: serving
			// as the floor does, deciding as the in-process limiter does.
			best := r.floor.self + r.lim.self + r.lim.redis + r.floor.client
			bound := float64(runtime.NumCPU()) / best.Seconds()
			verdict = fmt.Sprintf("%s (%.2f with h2load as the gateway; %.2f with the gRPC-go clients in the server's process). "+
				"Where the floor is: serving gRPC costs the server %.1f µs per answer with nothing decided; with a decision that cost no more than "+
				"in-process (%.1f µs, and %.1f µs of redis-server) and h2load's %.1f µs, one decision takes %.1f µs of CPU, so %d cores answer at most %.0f/s, "+
				"%.2f of the limiter's rate",
				verdict, r.ratio(r.h2), r.ratio(r.goc), us(r.floor.self), us(r.lim.self), us(r.lim.redis), us(r.floor.client), us(best),
				runtime.NumCPU(), bound, bound/r.lim.DPS)
		}
	}
	b.WriteString("\nCPU per counted decision, µs: this process (limiter; with the RLS server; with\n")
	b.WriteString("server and gRPC-go clients) + redis-server (+ h2load). With two cores, the sum\n")
	b.WriteString("bounds the rate. Per trip: the decisions one round trip to Redis carried\n")
	b.WriteString("(limiter.Stats: decisions with Redis ÷ round trips), on each side.\n\n")
	b.WriteString("| callers | limiter | h2load → RLS | gRPC-go → RLS | per trip: limiter | h2load → RLS | gRPC-go → RLS |\n|---:|---|---|---|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d | %.1f + %.1f | %.1f + %.1f + %.1f | %.1f + %.1f | %.1f | %.1f | %.1f |\n", r.callers,
			us(r.lim.self), us(r.lim.redis), us(r.h2.self), us(r.h2.redis), us(r.h2.client), us(r.goc.self), us(r.goc.redis),
			r.lim.perTrip, r.h2.perTrip, r.goc.perTrip)
	}
	b.WriteString("\nThe floor, same run: h2load → the RLS server asking nothing (answers/s; CPU per\n")
	b.WriteString("answer of this process, the server alone, and of h2load).\n\n")
	b.WriteString("| callers | floor answers/s | ÷ limiter | p99 ms | µs CPU (server + h2load) | h2load → RLS µs CPU (server + redis-server + h2load) |\n|---:|---:|---:|---:|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d | %.0f | %.2f | %s | %.1f + %.1f | %.1f + %.1f + %.1f |\n", r.callers,
			r.floor.DPS, r.ratio(r.floor), ms(r.floor.P99), us(r.floor.self), us(r.floor.client),
			us(r.h2.self), us(r.h2.redis), us(r.h2.client))
	}
	b.WriteString("\nTLS against h2c, same run: decisions/s, p99 and the server process's CPU per\n")
	b.WriteString("decision over TLS, and their ratio to the same client over h2c.\n\n")
	b.WriteString("| callers | h2load → RLS TLS decisions/s | ÷ h2c | p99 ms | ÷ h2c | µs CPU | ÷ h2c | gRPC-go → RLS mTLS decisions/s | ÷ h2c | p99 ms | ÷ h2c | µs CPU | ÷ h2c |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d | %.0f | %.2f | %s | %.2f | %.1f | %.2f | %.0f | %.2f | %s | %.2f | %.1f | %.2f |\n", r.callers,
			r.h2tls.DPS, of(r.h2tls.DPS, r.h2.DPS), ms(r.h2tls.P99), of(float64(r.h2tls.P99), float64(r.h2.P99)), us(r.h2tls.self), of(us(r.h2tls.self), us(r.h2.self)),
			r.gomtls.DPS, of(r.gomtls.DPS, r.goc.DPS), ms(r.gomtls.P99), of(float64(r.gomtls.P99), float64(r.goc.P99)), us(r.gomtls.self), of(us(r.gomtls.self), us(r.goc.self)))
	}
	b.WriteString("\nIsolation (issue 22), same run: gRPC-go → RLS (h2c) as the rate limit\n")
	b.WriteString("service's own ACL user (`slidegate-rls`, the rls/ keys only), deciding through\n")
	b.WriteString("the Functions library (FCALL), against the same server as Redis's default user\n")
	b.WriteString("sending the scripts (EVALSHA).\n\n")
	b.WriteString("| callers | own user decisions/s | ÷ default user | p99 ms | ÷ default user | µs CPU (self + redis-server) | default user |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d | %.0f | %.2f | %s | %.2f | %.1f + %.1f | %.1f + %.1f |\n", r.callers,
			r.gons.DPS, of(r.gons.DPS, r.goc.DPS), ms(r.gons.P99), of(float64(r.gons.P99), float64(r.goc.P99)),
			us(r.gons.self), us(r.gons.redis), us(r.goc.self), us(r.goc.redis))
	}
	fmt.Fprintf(&b, "\nGoal: at %d callers the RLS server reaches ≥ %.1f × the in-process limiter rate: %s.\n", goalAt, goal, verdict)
	fmt.Fprintf(&b, "The section took %v; 1-minute load average %s before, %s after (the machine is shared).\n",
		took.Round(time.Second), loadBefore, loadAfter)
	return os.WriteFile(out, []byte(b.String()), 0o644)
}
