// Command sidecar benchmarks the enforcement sidecar against its baselines
// and writes a Markdown section ("## Sidecar") for the benchmark report:
//
//	go run ./test/bench/sidecar -out bench-sidecar.md
//
// Six targets serve the same tiny application, side by side in one run:
// (a) the application directly, (b) a bare httputil.ReverseProxy hop with a
// buffer pool, (c) the sidecar with every request admitted and (d) the
// sidecar with half the requests rejected (429); (e) and (f) are the sidecar
// with a limiter that admits at once and with one that only PINGs Redis per
// request, which split (c)'s cost into handler, round trip and limiter. For
// each it measures the maximum throughput (closed loop, fixed concurrency)
// and the p50/p99 latency at one fixed offered load (open loop, latency
// counted from each request's scheduled send time, so a stall is not
// hidden). (j) and (J) are (c) and (e) with the policy keyed on the sub
// claim of a verified RS256 bearer token instead of a header: what
// verifying tokens costs per request (issue 23). (n) is (c) as the
// namespace's own Redis ACL user calling the Functions library: what the
// tenant isolation costs (issue 22). The targets are
// measured in interleaved rounds, so that load from elsewhere on the machine
// spreads over all of them. Then a streaming response (a model server's
// Server-Sent Events) directly, through the bare hop, and through a sidecar
// counting requests and one counting the response's tokens (issue 27):
// time to first byte and bytes/s (stream.go; -stream-only measures that
// alone and replaces its section in -out). It needs redis-server in PATH.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/jwtverify"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisadmin"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/sidecar"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
	"github.com/slidegate/slidegate/test/bench/internal/mdsection"
)

type target struct {
	name, label string
	url         string
	// path returns the path and client of the i-th request.
	path func(i int) (string, string)
	// lim is the limiter behind the target, if it has a real one.
	lim *limiter.Limiter
	// bearer, when set, identifies the client by the bearer token it
	// returns for the user instead of the X-User header.
	bearer func(user string) string
}

type result struct {
	rps      []float64 // per round
	cpu      []float64 // per round: CPU µs per request, this process
	redisCPU []float64 // per round: CPU µs per request, redis-server
	allocs   []float64 // per round: heap allocations per request, this process
	p50, p99 []float64 // per round, in ms
	// per round: Redis scripts per 429, (scripts - admits) / rejections
	scriptsPer429 []float64
	codes         map[int]int
	errs          int
	latErrors     int
}

// limOpts are the limiter's options: its defaults unless a flag changes them.
var limOpts limiter.Options

func main() { os.Exit(mainErr()) }

func mainErr() int {
	out := flag.String("out", "", "write the Markdown section to this file (default: stdout)")
	rounds := flag.Int("rounds", 5, "interleaved rounds over the targets")
	rpsDur := flag.Duration("rps-duration", 1500*time.Millisecond, "closed-loop slice per target and round")
	latDur := flag.Duration("latency-duration", 3*time.Second, "open-loop slice per target and round")
	conc := flag.Int("concurrency", 32, "closed-loop workers")
	only := flag.String("only", "", "measure only these targets, e.g. \"bc\" (for profiling; no streams)")
	streamOnly := flag.Bool("stream-only", false, "measure only the streaming responses (issue 27) and replace their section in -out, keeping the rest")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	rate := flag.Int("rate", 0, "offered load of the latency phase, requests/s (default: 30% of the lowest maximum)")
	flag.DurationVar(&limOpts.MaxWait, "max-wait", 0, "limiter MaxWait (experiments; default: the limiter's default)")
	flag.IntVar(&limOpts.MaxInflight, "max-inflight", 0, "limiter MaxInflight (experiments; default: the limiter's default)")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		_ = pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if err := run(*out, *only, *streamOnly, *rounds, *rpsDur, *latDur, *conc, *rate); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	return 0
}

func run(out, only string, streamOnly bool, rounds int, rpsDur, latDur time.Duration, conc, rate int) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := time.Now()
	loadBefore := loadAvg()

	// (a) the application: a small fixed body, or under /stream a model
	// server's event stream (stream.go).
	body := []byte(strings.Repeat("x", 128))
	appURL, err := serveHTTP(ctx, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, streamPathPrefix+"/") {
			serveStream(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write(body)
	}))
	if err != nil {
		return err
	}

	// (b) a bare reverse proxy hop with a buffer pool.
	u, _ := url.Parse(appURL)
	bare := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Host = pr.In.Host
		},
		Transport: &http.Transport{
			MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: 90 * time.Second,
			DisableCompression: true,
		},
		BufferPool: sidecar.NewBufferPool(),
	}
	bareURL, err := serveHTTP(ctx, bare)
	if err != nil {
		return err
	}

	// (c) and (d): the sidecar on a real limiter and redis-server.
	redis, err := testsupport.NewRedis()
	if err != nil {
		return fmt.Errorf("redis-server: %w", err)
	}
	defer redis.Close()
	rdb, err := redisconn.NewClient(redisconn.Config{Addrs: []string{redis.Addr}})
	if err != nil {
		return err
	}
	defer func() { _ = rdb.Close() }()
	// A timeout far above any queueing here: every decision is made by
	// Redis, none by the local fallback (checked below).
	limOpts.Timeout = time.Second
	lim, err := limiter.New(rdb, limOpts)
	if err != nil {
		return err
	}
	defer func() { _ = lim.Close() }()
	tmp, err := os.MkdirTemp("", "slidegate-bench-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()

	perUser := func(name string, limit, windowMs int64, prefix string) sidecarconfig.Policy {
		return sidecarconfig.Policy{
			Name: name, ID: "bench/" + name, WindowMillis: windowMs, Limit: limit,
			Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce",
			Key:   sidecarconfig.Key{Source: sidecarconfig.SourceHeader, Name: "X-User", OnMissing: sidecarconfig.MissingRemoteAddress},
			Match: sidecarconfig.Match{PathPrefixes: []string{prefix}},
		}
	}
	// /ok: 1000 users far under their limit. /hot: a limit of 1 per hour,
	// spent during the warm-up, so every /hot request is rejected.
	cfg := &sidecarconfig.Config{
		Version: sidecarconfig.Version, Namespace: "bench",
		Policies: []sidecarconfig.Policy{
			perUser("api", 100, 10_000, "/api"),
			perUser("hot", 1, 3_600_000, "/hot"),
			perUser("ok", 1_000_000, 10_000, "/ok"),
		},
	}
	data, err := sidecarconfig.Marshal(cfg)
	if err != nil {
		return err
	}
	cfgFile := filepath.Join(tmp, sidecarconfig.FileName)
	if err := os.WriteFile(cfgFile, data, 0o644); err != nil {
		return err
	}
	opts := sidecar.DefaultOptions()
	opts.ListenAddress, opts.AdminAddress = "127.0.0.1:0", "127.0.0.1:1"
	opts.Upstream = appURL
	opts.ConfigFile = cfgFile
	opts.PodLabelsFile = ""
	opts.Redis.Addrs = []string{redis.Addr}
	sc, err := sidecar.New(opts, lim, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	if !sc.Ready() {
		return errors.New("sidecar not ready")
	}
	sideURL, err := serveSidecar(ctx, sc)
	if err != nil {
		return err
	}
	// The same sidecar without the deny cache, on its own client and
	// limiter: every 429 is Redis's answer to a round trip.
	rdbNC, err := redisconn.NewClient(redisconn.Config{Addrs: []string{redis.Addr}})
	if err != nil {
		return err
	}
	defer func() { _ = rdbNC.Close() }()
	ncOpts := limOpts
	ncOpts.DenyCacheMax = -1
	limNC, err := limiter.New(rdbNC, ncOpts)
	if err != nil {
		return err
	}
	defer func() { _ = limNC.Close() }()
	scNC, err := sidecar.New(opts, limNC, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	noCacheURL, err := serveSidecar(ctx, scNC)
	if err != nil {
		return err
	}

	// (j): the same sidecar with the /ok policy keyed on the sub claim of a
	// verified RS256 bearer token (issue 23) instead of the X-User header:
	// one token per user, signed once, verified per request.
	jwtURL, jwtInstantURL, tokens, err := serveJWTSidecars(ctx, opts, tmp, lim)
	if err != nil {
		return err
	}
	bearer := func(user string) string { return tokens[user] }
	// (k): tokens whose signature does not verify (a byte of it changed):
	// never remembered, so each costs a full signature check; they count
	// as missing, and onMissing RemoteAddress puts them on the address.
	forged := map[string]string{}
	for u, tok := range tokens {
		i := strings.LastIndexByte(tok, '.') + 10
		c := byte('A')
		if tok[i] == 'A' {
			c = 'B'
		}
		forged[u] = tok[:i] + string(c) + tok[i+1:]
	}

	// (n): (c) as the namespace's own Redis user (issue 22's isolation): an
	// ACL user that reaches only the namespace's keys and decides through
	// the Functions library (FCALL), set up as the manager does.
	nsLim, closeNS, err := namespaceLimiter(ctx, redis.Addr, cfg)
	if err != nil {
		return err
	}
	defer closeNS()
	scNS, err := sidecar.New(opts, nsLim, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	nsURL, err := serveSidecar(ctx, scNS)
	if err != nil {
		return err
	}

	// (e) and (f) split (c)'s cost: the same sidecar with a limiter that
	// admits at once (the proxy and handler alone), and with one that makes
	// the cheapest Redis round trip, an unbatched PING, per request instead
	// of a decision: what waiting for Redis costs, without the limiter.
	instantURL, err := serveSidecarWith(ctx, opts, admitAll{})
	if err != nil {
		return err
	}
	pingErrors := new(atomic.Int64)
	pingURL, err := serveSidecarWith(ctx, opts, pingPerRequest{rdb, pingErrors})
	if err != nil {
		return err
	}

	// The streams' sidecar: a count and a response-cost policy (stream.go).
	streamSideURL, err := serveStreamSidecar(ctx, opts, tmp, lim)
	if err != nil {
		return err
	}
	charged := new(atomic.Int64)
	streamTargets := []*streamTarget{
		{name: "a", label: "direct to the model server", url: appURL + streamPathPrefix + "/direct"},
		{name: "b", label: "bare httputil.ReverseProxy + buffer pool", url: bareURL + streamPathPrefix + "/bare"},
		{name: "s", label: "sidecar, policy counting requests", url: streamSideURL + streamPathPrefix + "/count"},
		{name: "S", label: "sidecar, policy counting the response's tokens", url: streamSideURL + streamPathPrefix + "/cost", charged: charged},
	}
	streamSection := func() (string, error) {
		client := &http.Client{Transport: &http.Transport{
			MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: 90 * time.Second, DisableCompression: true,
		}}
		load := loadAvg()
		res, rate := measureStreams(client, streamTargets, rounds, conc, rpsDur, latDur)
		got, err := chargedTokens(ctx, rdb, charged.Load()*streamTokens)
		if err != nil {
			return "", err
		}
		if !streamOnly {
			load = ""
		} else {
			load += " before, " + loadAvg() + " after"
		}
		return streamReport(streamTargets, res, rate, rounds, conc, rpsDur, latDur, got, charged.Load()*streamTokens, load), nil
	}
	if streamOnly {
		if out == "" {
			return errors.New("-stream-only replaces a section of -out: give -out")
		}
		section, err := streamSection()
		if err != nil {
			return err
		}
		return mdsection.Replace(out, streamHeading, "", section)
	}

	user := func(i int) string { return "u" + strconv.Itoa(i%1000) }
	okPath := func(i int) (string, string) { return "/ok/items", user(i) }
	halfHot := func(i int) (string, string) {
		if i%2 == 0 {
			return "/ok/items", user(i / 2)
		}
		return "/hot/items", user(i / 2)
	}
	abuser := func(i int) (string, string) {
		if i%2 == 0 {
			return "/api/items", user(i / 2)
		}
		return "/api/items", "mallory"
	}
	targets := []*target{
		{name: "a", label: "(a) direct to the app", url: appURL, path: okPath},
		{name: "b", label: "(b) bare httputil.ReverseProxy + buffer pool", url: bareURL, path: okPath},
		{name: "c", label: "(c) sidecar, all admitted", url: sideURL, path: okPath},
		{name: "n", label: "(n) as (c), as the namespace's own Redis user through the Functions library (FCALL)", url: nsURL, path: okPath},
		{name: "d", label: "(d) sidecar, half rejected", url: sideURL, lim: lim, path: halfHot},
		{name: "D", label: "(d) without the deny cache", url: noCacheURL, lim: limNC, path: halfHot},
		{name: "g", label: "(g) one abusive client (every other request, limit 100 per 10 s) + 1000 users under it", url: sideURL, lim: lim, path: abuser},
		{name: "G", label: "(g) without the deny cache", url: noCacheURL, lim: limNC, path: abuser},
		{name: "j", label: "(j) as (c), keyed on a verified RS256 bearer token's sub instead of a header (one token per user, remembered once verified)", url: jwtURL, path: okPath, bearer: bearer},
		{name: "k", label: "(k) as (j), every token's signature forged (a full check per request)", url: jwtURL, path: okPath, bearer: func(u string) string { return forged[u] }},
		{name: "e", label: "(e) sidecar, limiter admits at once (no Redis)", url: instantURL, path: okPath},
		{name: "J", label: "(J) as (e), keyed on a verified RS256 bearer token's sub", url: jwtInstantURL, path: okPath, bearer: bearer},
		{name: "f", label: "(f) sidecar, one unbatched Redis PING per request instead of a decision", url: pingURL, path: okPath},
	}
	if only != "" {
		targets = slices.DeleteFunc(targets, func(t *target) bool { return !strings.Contains(only, t.name) })
	}
	client := &http.Client{Transport: &http.Transport{
		MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: 90 * time.Second, DisableCompression: true,
	}}

	// Warm-up: connections, scripts, and the hot users' budgets spent.
	for _, t := range targets {
		closedLoop(client, t, conc, 500*time.Millisecond)
	}
	for i := range 1000 {
		_ = get(client, sideURL+"/hot/items", user(i))
	}

	results := map[string]*result{}
	for _, t := range targets {
		results[t.name] = &result{codes: map[int]int{}}
	}
	fmt.Fprintf(os.Stderr, "bench: max throughput, %d rounds of %v per target\n", rounds, rpsDur)
	for range rounds {
		for _, t := range targets {
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			var st0 limiter.Stats
			if t.lim != nil {
				st0 = t.lim.Stats()
			}
			cpu0, rcpu0 := processCPU(), pidCPU(redis.Pid())
			rps, codes, errs := closedLoop(client, t, conc, rpsDur)
			cpu1, rcpu1 := processCPU(), pidCPU(redis.Pid())
			if t.lim != nil && codes[429] > 0 {
				ops := t.lim.Stats().Ops - st0.Ops
				results[t.name].scriptsPer429 = append(results[t.name].scriptsPer429, float64(ops-int64(codes[200]))/float64(codes[429]))
			}
			runtime.ReadMemStats(&m1)
			r := results[t.name]
			r.rps = append(r.rps, rps)
			n := rps * rpsDur.Seconds()
			r.cpu = append(r.cpu, float64(cpu1-cpu0)/float64(time.Microsecond)/n)
			r.redisCPU = append(r.redisCPU, float64(rcpu1-rcpu0)/float64(time.Microsecond)/n)
			r.allocs = append(r.allocs, float64(m1.Mallocs-m0.Mallocs)/n)
			r.errs += errs
			for c, n := range codes {
				r.codes[c] += n
			}
		}
	}
	if rate <= 0 {
		lowest := 0.0
		for i, t := range targets {
			if m := median(results[t.name].rps); i == 0 || m < lowest {
				lowest = m
			}
		}
		rate = max(100, int(lowest*0.3)/100*100)
	}
	fmt.Fprintf(os.Stderr, "bench: latency at %d req/s, %d rounds of %v per target\n", rate, rounds, latDur)
	for _, t := range targets {
		openLoop(client, t, rate, 500*time.Millisecond) // connections for the open loop
	}
	for range rounds {
		for _, t := range targets {
			lat, errs := openLoop(client, t, rate, latDur)
			slices.Sort(lat)
			r := results[t.name]
			r.p50 = append(r.p50, msf(percentile(lat, 0.5)))
			r.p99 = append(r.p99, msf(percentile(lat, 0.99)))
			r.latErrors += errs
		}
	}
	st := lim.Stats()
	// The streams after st: the limiter's figures below are (c), (d) and
	// (g)'s.
	var streamMD, idleMD string
	if only == "" {
		if streamMD, err = streamSection(); err != nil {
			return err
		}
		if idleMD, err = idleSection(ctx, tmp, cfgFile, redis.Addr); err != nil {
			return err
		}
	}
	md := report(targets, results, rate, conc, rounds, rpsDur, latDur, st, pingErrors.Load(), time.Since(started), loadBefore, loadAvg()) + idleMD + streamMD
	if out == "" {
		_, err = os.Stdout.WriteString(md)
		return err
	}
	return os.WriteFile(out, []byte(md), 0o644)
}

func serveHTTP(ctx context.Context, h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	return "http://" + ln.Addr().String(), nil
}

func serveSidecar(ctx context.Context, s *sidecar.Sidecar) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	debugLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() { _ = s.Serve(ctx, ln, adminLn, debugLn) }()
	return "http://" + ln.Addr().String(), nil
}

func serveSidecarWith(ctx context.Context, opts sidecar.Options, lim enforce.Decider) (string, error) {
	sc, err := sidecar.New(opts, lim, slog.New(slog.DiscardHandler))
	if err != nil {
		return "", err
	}
	return serveSidecar(ctx, sc)
}

// admitAll admits every request without asking Redis.
type admitAll struct{}

func (admitAll) Healthy() bool { return true }

func (admitAll) Decide(_ context.Context, reqs []limiter.Request) []limiter.Decision {
	out := make([]limiter.Decision, len(reqs))
	for i, r := range reqs {
		out[i] = limiter.Decision{Allowed: true, Limit: r.Rule.Limit, Remaining: r.Rule.Limit - 1, ResetAfter: r.Rule.Window, Source: limiter.SourceRedis}
	}
	return out
}

// pingPerRequest admits every request after one PING to Redis; failed
// PINGs are counted, since they would make the figure meaningless.
type pingPerRequest struct {
	rdb    redis.UniversalClient
	errors *atomic.Int64
}

func (pingPerRequest) Healthy() bool { return true }

func (p pingPerRequest) Decide(ctx context.Context, reqs []limiter.Request) []limiter.Decision {
	if p.rdb.Ping(ctx).Err() != nil {
		p.errors.Add(1)
	}
	return admitAll{}.Decide(ctx, reqs)
}

func get(c *http.Client, u, user string) int {
	return send(c, u, user, nil)
}

// send is one request as user: by the X-User header, or by bearer's token.
func send(c *http.Client, u, user string, bearer func(string) string) int {
	req, _ := http.NewRequest("GET", u, nil)
	if bearer != nil {
		req.Header.Set("Authorization", "Bearer "+bearer(user))
	} else {
		req.Header.Set("X-User", user)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// closedLoop runs conc workers sending back to back for d and returns the
// completed requests per second and the status counts.
func closedLoop(c *http.Client, t *target, conc int, d time.Duration) (float64, map[int]int, int) {
	local := make([]map[int]int, conc)
	for w := range local {
		local[w] = map[int]int{}
	}
	elapsed := workers(conc, d, func(w, i int) {
		p, u := t.path(i)
		local[w][send(c, t.url+p, u, t.bearer)]++
	})
	codes := map[int]int{}
	errs, total := 0, 0
	for _, l := range local {
		for k, v := range l {
			if k == 0 {
				errs += v
			}
			codes[k] += v
			total += v
		}
	}
	return float64(total) / elapsed.Seconds(), codes, errs
}

// workers runs f(w, i) from conc workers (w the worker, i a sequence over
// all of them), each calling again as soon as the last call returned,
// until d has passed; it returns how long that took.
func workers(conc int, d time.Duration, f func(w, i int)) time.Duration {
	var n atomic.Int64
	deadline := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range conc {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				f(w, int(n.Add(1)))
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// openLoop offers rate requests/s for d regardless of how fast they are
// answered, and returns each request's latency from its scheduled time.
func openLoop(c *http.Client, t *target, rate int, d time.Duration) ([]time.Duration, int) {
	lat := make([]time.Duration, int(float64(rate)*d.Seconds()))
	var errs atomic.Int64
	offer(rate, d, func(i int, sched time.Time) {
		p, u := t.path(i)
		if code := send(c, t.url+p, u, t.bearer); code == 0 {
			errs.Add(1)
		}
		lat[i] = time.Since(sched)
	})
	return lat, int(errs.Load())
}

// offer calls f(i, scheduled time) for rate·d calls spaced evenly over d,
// each in its own goroutine at its time however long the others take, and
// returns when all have returned.
func offer(rate int, d time.Duration, f func(i int, sched time.Time)) {
	n := int(float64(rate) * d.Seconds())
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		sched := start.Add(time.Duration(i) * interval)
		if w := time.Until(sched); w > 0 {
			time.Sleep(w)
		}
		wg.Go(func() { f(i, sched) })
	}
	wg.Wait()
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return sorted[i]
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// processCPU is the CPU time (user+system) this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pidCPU is the CPU time (user+system) process pid used so far (Linux).
func pidCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command name; utime and stime are
	// fields 14 and 15 of the whole line, in clock ticks (100 Hz on Linux).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// loadAvg is the machine's 1-minute load average (Linux), to tell a quiet
// run from one that shared the cores with other work.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	return strings.Fields(string(b))[0]
}

func report(targets []*target, res map[string]*result, rate, conc, rounds int, rpsDur, latDur time.Duration, st limiter.Stats, pingErrs int64, took time.Duration, loadBefore, loadAfter string) string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("## Sidecar\n\n")
	p("Generated by `go run ./test/bench/sidecar` on %s/%s, %d CPUs (GOMAXPROCS %d), %s, %s; the run took %s; 1-minute load average %s before, %s after.\n\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), time.Now().UTC().Format("2006-01-02"), took.Round(time.Second), loadBefore, loadAfter)
	p("One process holds the application (a 128-byte response), the bare proxy, the sidecar and the load generator, ")
	p("on loopback; redis-server runs beside it. They share the same cores, so the figures are relative, not absolute capacity. ")
	p("The sidecar decides one per-user SlidingLog policy per request (1000 users, header key) through the real limiter with its default settings; ")
	p("in (d) every other request goes to a policy whose budget is spent and is answered 429 without reaching the app. ")
	p("(g) sends every other request as one user far beyond a limit of 100 per 10 s, the others as 1000 users under it. ")
	p("The rows \"without the deny cache\" are the same sidecar on a limiter with `DenyCacheMax: -1`, so every 429 is a Redis round trip; Redis scripts / 429 counts the limiter's scripts per rejected request ((scripts − admits) / 429s). ")
	p("(e) and (f) are references, not products: the same sidecar with a limiter that admits without asking Redis, and with one that sends a single, unbatched PING per request instead of a decision (the real limiter batches its scripts).\n\n")
	p("- Maximum throughput: closed loop, %d concurrent keep-alive HTTP/1.1 clients, median of %d interleaved slices of %v.\n", conc, rounds, rpsDur)
	p("- Latency: open loop at a fixed offered load of **%d req/s** for every target (by default 30%% of the lowest maximum), %d interleaved slices of %v, measured from each request's scheduled send time; p50 and p99 are the medians of the slices' percentiles, so that one slice stalled by other work on the machine does not decide the figure.\n\n", rate, rounds, latDur)

	p("- CPU µs/req: CPU time per request during the closed-loop slices, of this process (load generator, app and proxies together) and of redis-server. ")
	p("The difference between (c) and (b) is what the sidecar costs beyond a bare hop; redis-server's share runs on another machine in a cluster. allocs/req: heap allocations per request in this process (load generator included).\n\n")
	base, baseName := res["b"], "bare hop"
	if base == nil {
		// -only without b: ratios against the first target
		base, baseName = res[targets[0].name], "("+targets[0].name+")"
	}
	baseP99, baseRPS := median(base.p99), median(base.rps)
	p("| target | p50 | p99 | max RPS | p99 / %s | max RPS / %s | CPU µs/req (bench process + redis-server) | Redis scripts / 429 | allocs/req | status mix |\n", baseName, baseName)
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, t := range targets {
		r := res[t.name]
		p99, rps := median(r.p99), median(r.rps)
		var mix []string
		total := 0
		for _, n := range r.codes {
			total += n
		}
		for _, c := range []int{200, 429, 503, 502, 0} {
			if n := r.codes[c]; n > 0 {
				name := strconv.Itoa(c)
				if c == 0 {
					name = "error"
				}
				mix = append(mix, fmt.Sprintf("%s %.0f%%", name, 100*float64(n)/float64(total)))
			}
		}
		per429 := "–"
		if len(r.scriptsPer429) > 0 {
			per429 = fmt.Sprintf("%.3f", median(r.scriptsPer429))
		}
		p("| %s | %.2f ms | %.2f ms | %.0f | %.2f | %.2f | %.0f + %.0f | %s | %.0f | %s |\n", t.label, median(r.p50), p99, rps,
			p99/baseP99, rps/baseRPS, median(r.cpu), median(r.redisCPU), per429, median(r.allocs), strings.Join(mix, ", "))
	}
	c := res["c"]
	if c == nil {
		c = base
	}
	cP99, cRPS := median(c.p99), median(c.rps)
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**not met**"
	}
	p("\nMax RPS of each slice, in round order (the spread shows how much other work on the machine moved them):\n\n")
	for _, t := range targets {
		var xs []string
		for _, v := range res[t.name].rps {
			xs = append(xs, fmt.Sprintf("%.0f", v))
		}
		p("- %s: %s\n", t.label, strings.Join(xs, ", "))
	}
	if res["b"] != nil && res["c"] != nil {
		p("\nGoals for (c) against (b): p99 ≤ 1.3 × bare hop: %.2f × — %s; max RPS ≥ 0.8 × bare hop: %.2f × — %s.\n\n",
			cP99/baseP99, verdict(cP99 <= 1.3*baseP99), cRPS/baseRPS, verdict(cRPS >= 0.8*baseRPS))
	} else {
		p("\nGoals: not evaluated (they compare (c) with (b), and this run did not measure both).\n\n")
	}
	if e, f := res["e"], res["f"]; e != nil && f != nil && res["c"] != nil && res["b"] != nil {
		p("Where the gap goes, as max RPS against (b): the sidecar's handler, keys and headers alone, (e) = %.2f ×; ", median(e.rps)/baseRPS)
		p("waiting for one unbatched Redis PING per request, without the limiter, (f) = %.2f ×; the real limiter, (c) = %.2f ×, which is %.2f × (f) ", median(f.rps)/baseRPS, cRPS/baseRPS, cRPS/median(f.rps))
		p("(compare the slices above: the spread is of the same order). The cost is CPU on the shared cores: per request, (f) spends %.0f µs more than (e) in this process plus %.0f µs in redis-server; (c) spends %.0f µs more than (e) plus %.0f µs in redis-server. ",
			median(f.cpu)-median(e.cpu), median(f.redisCPU), median(c.cpu)-median(e.cpu), median(c.redisCPU))
		p("Failed PINGs in (f): %d.\n\n", pingErrs)
	}
	if n, c := res["n"], res["c"]; n != nil && c != nil {
		p("Isolation (issue 22), side by side: the sidecar as its namespace's own ACL user calling the Functions library, (n), against the shared default user sending the scripts (EVALSHA), (c): max RPS %.2f × (c), p99 %.2f × (c), redis-server CPU %.0f against %.0f µs/req.\n\n",
			median(n.rps)/median(c.rps), median(n.p99)/median(c.p99), median(n.redisCPU), median(c.redisCPU))
	}
	if j, c, J, e := res["j"], res["c"], res["J"], res["e"]; j != nil && c != nil {
		p("Verified tokens (issue 23), side by side: keyed on the sub of an RS256 bearer token, (j) against the same policy keyed on a header, (c): max RPS %.2f × (c), p99 %.2f × (c); CPU %.0f µs/req more in this process (a remembered token's hash and expiry, and the load generator's longer request). ",
			median(j.rps)/median(c.rps), median(j.p99)/median(c.p99), median(j.cpu)-median(c.cpu))
		if k := res["k"]; k != nil {
			p("A forged token is never remembered: (k), each request a full RS256 check that fails, %.2f × (c)'s max RPS, %.0f µs/req more CPU than (c). ",
				median(k.rps)/median(c.rps), median(k.cpu)-median(c.cpu))
		}
		if J != nil && e != nil {
			p("Without Redis, (J) against (e): max RPS %.2f ×, CPU %.0f µs/req more. ", median(J.rps)/median(e.rps), median(J.cpu)-median(e.cpu))
		}
		p("`go test -run XXX -bench . ./internal/jwtverify ./internal/sidecar` measures the verification alone.\n\n")
	}
	latErrs := 0
	for _, r := range res {
		latErrs += r.latErrors
	}
	p("Limiter of (c), (d), (g) during the run: %d decisions by Redis, %d requests denied by the deny cache, %d decisions by the fail-open fallback, %d failed closed; %d scripts in %d pipelined round trips (%.1f per round trip). Transport errors in the latency phase: %d.\n",
		st.Redis, st.DenyCache, st.Fallback, st.FailedClosed, st.Ops, st.RoundTrips, float64(st.Ops)/max(1, float64(st.RoundTrips)), latErrs)
	return b.String()
}

// namespaceLimiter is a limiter that decides as the namespace's own Redis
// user for cfg's policies, with the library loaded and the user set up by
// an Admin as the manager does it (here with Redis's default user as the
// administrative identity).
func namespaceLimiter(ctx context.Context, addr string, cfg *sidecarconfig.Config) (*limiter.Limiter, func(), error) {
	adm, err := redisadmin.New(redisadmin.Options{Redis: redisconn.Config{Addrs: []string{addr}}})
	if err != nil {
		return nil, nil, err
	}
	defer adm.Close()
	ids := make([]string, 0, len(cfg.Policies))
	for _, p := range cfg.Policies {
		ids = append(ids, p.ID)
	}
	const password = "bench-namespace-password"
	u, err := redisadmin.NamespaceIdentity("", cfg.Namespace, ids, []string{password})
	if err != nil {
		return nil, nil, err
	}
	if _, err := adm.Sync(ctx, []redisadmin.User{u}); err != nil {
		return nil, nil, fmt.Errorf("setting up the namespace's Redis user: %w", err)
	}
	rdb, err := redisconn.NewClient(redisconn.Config{Addrs: []string{addr}, Username: u.Name, Password: password})
	if err != nil {
		return nil, nil, err
	}
	o := limOpts
	o.Functions = true
	lim, err := limiter.New(rdb, o)
	if err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	return lim, func() { _ = lim.Close(); _ = rdb.Close() }, nil
}

// serveJWTSidecars serves two sidecars whose /ok policy keys on the sub
// claim of a bearer token verified with one RS256 key: one on the real
// limiter lim, one on a limiter that admits at once. tokens holds each
// user's token (u0..u999), valid for two hours.
func serveJWTSidecars(ctx context.Context, opts sidecar.Options, tmp string, lim *limiter.Limiter) (real, instant string, tokens map[string]string, err error) {
	const issuer, audience = "https://auth.bench.example/", "api"
	key := testsupport.NewJWTKey("bench-1", jose.RS256)
	keys, _, err := jwtverify.Normalize(testsupport.JWKSet(key))
	if err != nil {
		return "", "", nil, err
	}
	cfg := &sidecarconfig.Config{
		Version: sidecarconfig.Version, Namespace: "bench",
		Policies: []sidecarconfig.Policy{{
			Name: "ok", ID: "bench/ok-jwt", WindowMillis: 10_000, Limit: 1_000_000,
			Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce",
			Key: sidecarconfig.Key{Source: sidecarconfig.SourceJWTClaim, Name: "sub", OnMissing: sidecarconfig.MissingRemoteAddress,
				JWT: &sidecarconfig.JWT{Issuer: issuer, Audiences: []string{audience}, JWKS: keys}},
			Match: sidecarconfig.Match{PathPrefixes: []string{"/ok"}},
		}},
	}
	data, err := sidecarconfig.Marshal(cfg)
	if err != nil {
		return "", "", nil, err
	}
	dir := filepath.Join(tmp, "jwt")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", nil, err
	}
	file := filepath.Join(dir, sidecarconfig.FileName)
	if err := os.WriteFile(file, data, 0o644); err != nil {
		return "", "", nil, err
	}
	opts.ConfigFile = file
	sc, err := sidecar.New(opts, lim, slog.New(slog.DiscardHandler))
	if err != nil {
		return "", "", nil, err
	}
	if real, err = serveSidecar(ctx, sc); err != nil {
		return "", "", nil, err
	}
	if instant, err = serveSidecarWith(ctx, opts, admitAll{}); err != nil {
		return "", "", nil, err
	}
	tokens = map[string]string{}
	now := time.Now()
	for i := range 1000 {
		user := "u" + strconv.Itoa(i)
		c := testsupport.JWTClaims(issuer, audience, user, now)
		c["exp"] = now.Add(2 * time.Hour).Unix()
		tokens[user] = key.Sign(c)
	}
	return real, instant, tokens, nil
}
