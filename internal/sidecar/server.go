package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/slidegate/slidegate/internal/clienthash"
	"github.com/slidegate/slidegate/internal/debugapi"
	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/serving"
)

// announcer is a Decider that can count the sidecars enforcing each
// policy through Redis (limiter.Limiter can).
type announcer = limiter.Announcer

// Sidecar is the enforcement proxy of one pod.
type Sidecar struct {
	opts    Options
	log     *slog.Logger
	lim     enforce.Decider
	metrics *metrics
	proxy   http.Handler
	// drainMaxTime is cost.go's, read once (tests change it before New).
	drainMaxTime time.Duration

	state atomic.Pointer[state]

	// peers is, per rule ID, how many sidecars last announced enforcing it
	// through Redis (int): the fail-open share's divisor. It keeps the last
	// count while Redis is away.
	peers sync.Map

	loadMu      sync.Mutex
	lastFailure string
	// created is when New ran: a config file still missing one resync
	// interval later means the namespace has no policies.
	created time.Time

	// inflight counts running ServeHTTP calls, upgraded (WebSocket)
	// connections included: http.Server.Shutdown does not wait for those.
	inflight     sync.WaitGroup
	shuttingDown atomic.Bool

	// Redis errors are logged at most once per redisErrorLogEvery, with
	// the count since the last line: one per request would flood the log
	// exactly when Redis is down.
	redisErrLogged atomic.Int64 // when the last line was written, in ns since created
	redisErrQuiet  atomic.Int64 // errors since then

	// whySlots bounds the /debug/why requests served at once.
	whySlots chan struct{}
	// top counts each policy's 429s by client key (/debug/top), keyed
	// hashes by hasher.
	top *limitedTop
	// hasher makes the client keys that /debug shows keyed hashes
	// (hashkey.go).
	hasher atomic.Pointer[clienthash.Hasher]

	respForwarded, respRejected, respFailedClosed prometheus.Counter
	respBadRequest                                prometheus.Counter
}

// New builds a sidecar that decides with lim and forwards to
// opts.Upstream, and loads its config once (an error there is logged and
// retried by the watch; the sidecar is not ready until a load succeeds).
func New(opts Options, lim enforce.Decider, log *slog.Logger) (*Sidecar, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if lim == nil {
		return nil, errors.New("sidecar: a limiter is required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	upstream, _ := upstreamURL(opts.Upstream) // checked by Validate
	s := &Sidecar{opts: opts, log: log, lim: lim, created: time.Now(), whySlots: make(chan struct{}, whyMaxConcurrent), top: newLimitedTop(), drainMaxTime: drainMaxTime}
	s.loadHashKey()
	s.metrics = newMetrics(func() float64 {
		if lim.Healthy() {
			return 0
		}
		return 1
	}, s.eachPolicyReplicas)
	s.proxy = newProxy(upstream, newUpstreamTransport(&opts), newBufferPool(), log, s.metrics.upstreamErrors)
	s.respForwarded = s.metrics.responses.WithLabelValues(outcomeForwarded)
	s.respRejected = s.metrics.responses.WithLabelValues(outcomeRejected)
	s.respFailedClosed = s.metrics.responses.WithLabelValues(outcomeFailedClosed)
	s.respBadRequest = s.metrics.responses.WithLabelValues(outcomeBadRequest)
	_ = s.Reload()
	return s, nil
}

// Ready reports whether the sidecar can enforce: a config is loaded (the
// limiter exists by construction) and it is not shutting down. Redis being
// down does not make it unready: each policy's failMode decides what
// happens then, and an unready sidecar would turn every fail-open policy
// into an outage.
func (s *Sidecar) Ready() bool { return s.state.Load() != nil && !s.shuttingDown.Load() }

// Revision is the revision of the config in force ("" before the first
// load).
func (s *Sidecar) Revision() string {
	if st := s.state.Load(); st != nil {
		return st.revision
	}
	return ""
}

// Registry holds the sidecar's metrics.
func (s *Sidecar) Registry() *prometheus.Registry { return s.metrics.reg }

// AdminHandler serves /metrics, /healthz (the process is alive) and
// /readyz (see Ready): what Prometheus and the kubelet need, on the pod
// network. Nothing there names a client.
func (s *Sidecar) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case s.shuttingDown.Load():
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		case s.state.Load() == nil:
			http.Error(w, noConfig, http.StatusServiceUnavailable)
		default:
			_, _ = io.WriteString(w, "ok\n")
		}
	})
	return mux
}

// DebugHandler serves /debug/why (see why.go), /debug/top (top.go) and
// /debug/reset (reset.go), on the loopback-only debug listener: a guessed
// API key or user id must not tell anyone on the pod network whether it
// is active, nor /debug/top who is limited most, and no one there may
// reset a client. kubectl slidegate reaches it through pods/portforward.
func (s *Sidecar) DebugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+debugapi.WhyPath, s.serveWhy)
	mux.HandleFunc("GET "+debugapi.TopPath, s.serveTop)
	mux.HandleFunc("POST "+debugapi.ResetPath, s.serveReset)
	return mux
}

// writeJSON answers a /debug request with v: indented, as people read it,
// and not cached, as it is live state.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// Timeouts of the admin and debug servers: their requests are small
// GETs, and their answers small (/metrics, a JSON document). The write
// timeout leaves room for /debug/why, which reads Redis (a decision waits
// up to three DecisionTimeouts).
const (
	internalReadHeaderTimeout = 5 * time.Second
	internalReadTimeout       = 10 * time.Second
	internalWriteTimeout      = 30 * time.Second
	internalIdleTimeout       = 60 * time.Second
)

// servers are the sidecar's HTTP servers: the proxied port, with header
// and idle timeouts but no read or write timeout (Options.ReadHeaderTimeout
// says why), and the admin and debug ports, with all four.
func (s *Sidecar) servers() (proxied, admin, debug *http.Server) {
	errLog := slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	proxied = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: s.opts.ReadHeaderTimeout,
		IdleTimeout:       s.opts.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		Protocols:         protocols,
		ErrorLog:          errLog,
	}
	internal := func(h http.Handler) *http.Server {
		return &http.Server{
			Handler:           h,
			ReadHeaderTimeout: internalReadHeaderTimeout,
			ReadTimeout:       internalReadTimeout,
			WriteTimeout:      internalWriteTimeout,
			IdleTimeout:       internalIdleTimeout,
			MaxHeaderBytes:    64 << 10,
			ErrorLog:          errLog,
		}
	}
	return proxied, internal(s.AdminHandler()), internal(s.DebugHandler())
}

// Serve runs the sidecar on the proxied, admin and debug listeners until
// ctx ends, then shuts down gracefully: /readyz fails at once, the
// listeners stay open for ShutdownDelay, then close, and in-flight requests
// (upgraded connections included) get up to ShutdownTimeout to finish. The
// config watch runs meanwhile. debugLn must listen on a loopback address
// (Options.DebugAddress; Run checks it).
func (s *Sidecar) Serve(ctx context.Context, ln, adminLn, debugLn net.Listener) error {
	srv, admin, debug := s.servers()

	watchCtx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); s.watchFiles(watchCtx) }()
	defer func() { stopWatch(); <-watchDone }()
	if a, ok := s.lim.(announcer); ok {
		peersDone := make(chan struct{})
		go func() { defer close(peersDone); s.announceLoop(watchCtx, a) }()
		defer func() { stopWatch(); <-peersDone }()
	}

	s.log.Info("sidecar serving", "listen", ln.Addr().String(), "admin", adminLn.Addr().String(),
		"debug", debugLn.Addr().String(), "upstream", s.opts.Upstream, "ready", s.Ready())
	main := serving.Main{
		Name:  "proxied port",
		Serve: func() error { return srv.Serve(ln) },
		Drain: func(ctx context.Context) error {
			if err := srv.Shutdown(ctx); err != nil {
				return err
			}
			// Shutdown does not wait for hijacked (upgraded) connections;
			// their handlers still count in inflight.
			done := make(chan struct{})
			go func() { s.inflight.Wait(); close(done) }()
			select {
			case <-done:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
		Close: func() { _ = srv.Close() },
	}
	return serving.Run(ctx, main, []serving.Aux{
		{Name: "admin port", Server: admin, Listener: adminLn},
		{Name: "debug port", Server: debug, Listener: debugLn},
	}, serving.Options{
		Delay: s.opts.ShutdownDelay, Timeout: s.opts.ShutdownTimeout,
		Stopping: func() { s.shuttingDown.Store(true) }, Log: s.log,
	})
}
