package rls

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/serving"
)

// GCPercent is the server's GOGC unless the environment sets one. Its live
// heap is small (the config and the calls in flight) while every call
// allocates its request, answer and headers: at Go's default of 100 it
// collected about 60 times a second at 64 calls in flight. At 400 it
// collects a sixth as often for about 10 MiB more peak RSS (31 → 41 MiB);
// the Deployment's GOMEMLIMIT keeps the heap below its memory limit.
const GCPercent = 400

// StreamWorkers serve calls on long-lived goroutines. With gRPC's default,
// each call gets a new goroutine whose small stack grows, by copying,
// before the call is read: 11 % of the server's CPU in a profile at 64
// calls in flight. The two settings help together, since every collection
// shrinks idle workers' stacks again: the server's CPU per decision fell
// by about a fifth with both, by less than a tenth with either alone
// (docs/benchmarks.md, RLS server). Calls beyond the workers get new
// goroutines, as before.
const StreamWorkers = 256

// TuneGC sets GCPercent unless GOGC is set. Run calls it; it is the
// process's setting, so a benchmark of the server in its own process calls
// it too.
func TuneGC() {
	if _, ok := os.LookupEnv("GOGC"); !ok {
		debug.SetGCPercent(GCPercent)
	}
}

// Connection bounds of the gRPC listener (see Serve).
const (
	HandshakeTimeout     = 10 * time.Second
	KeepaliveTime        = 30 * time.Second
	KeepaliveTimeout     = 10 * time.Second
	MaxConnectionIdle    = 15 * time.Minute
	MaxConcurrentStreams = 1024
)

// adminReadHeaderTimeout bounds the request headers on the admin port.
const adminReadHeaderTimeout = 5 * time.Second

// RunOptions are the process settings of cmd/rls beyond the Server's.
type RunOptions struct {
	Server Options
	// Redis is the shared Redis, the sidecars' (the same --redis-* flags).
	Redis redisconn.Config
	// Limiter options (Prefix, Timeout, MaxWait); Replicas is set from the
	// replicas' own count.
	Limiter limiter.Options
	// ListenAddress serves gRPC (RLS and grpc.health.v1); AdminAddress
	// serves /metrics, /healthz and /readyz over HTTP.
	ListenAddress, AdminAddress string
	// TLS of the gRPC listener, and the client authentication of its
	// callers (TLSOptions); zero: plaintext.
	TLS TLSOptions
	// ShutdownDelay keeps serving with readiness failing after the signal,
	// so endpoints drop the pod before connections close; ShutdownTimeout
	// bounds the drain of calls in flight (GracefulStop), then Stop.
	ShutdownDelay, ShutdownTimeout time.Duration
}

// Run is the whole RLS process: limiter, config watch, peer count, gRPC and
// admin listeners, until ctx ends; then it drains and closes everything.
// Redis need not be up: the limiter connects lazily and each policy's fail
// mode decides meanwhile.
func Run(ctx context.Context, o RunOptions, log *slog.Logger) error {
	if err := o.TLS.Validate(); err != nil {
		return err
	}
	TuneGC()
	rdb, err := redisconn.NewClient(o.Redis)
	if err != nil {
		return err
	}
	defer func() { _ = rdb.Close() }()
	var s *Server
	lo := o.Limiter
	lo.Replicas = func() int { return int(s.peers.Load()) }
	lim, err := limiter.New(rdb, lo)
	if err != nil {
		return err
	}
	defer func() { _ = lim.Close() }()
	o.Server.Logger = log
	s = New(lim, o.Server)
	if err := s.Reload(); err != nil {
		log.Error("initial config not loaded; not ready until a valid one is", "error", err)
	}

	var gopts []grpc.ServerOption
	if o.TLS.Enabled() {
		creds, err := s.TLSCreds(o.TLS)
		if err != nil {
			return err
		}
		gopts = append(gopts, creds)
	} else {
		log.Warn("the gRPC listener is plaintext and authenticates no caller: any pod that reaches it can spend any client's budget; set --tls-cert-file, --tls-key-file and --tls-client-ca-file (docs/rls.md)")
	}

	var lc net.ListenConfig
	grpcLn, err := lc.Listen(ctx, "tcp", o.ListenAddress)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.ListenAddress, err)
	}
	adminLn, err := lc.Listen(ctx, "tcp", o.AdminAddress)
	if err != nil {
		_ = grpcLn.Close()
		return fmt.Errorf("listen %s: %w", o.AdminAddress, err)
	}
	log.Info("starting", "listen", o.ListenAddress, "admin", o.AdminAddress, "tls", o.TLS.Enabled(), "clientAuth", o.TLS.ClientAuth(),
		"clientNames", len(o.TLS.ClientNames),
		"configFile", o.Server.ConfigFile, "decisionTimeout", o.Limiter.Timeout)
	return s.Serve(ctx, grpcLn, adminLn, o.ShutdownDelay, o.ShutdownTimeout, gopts...)
}

// Serve serves RLS and grpc.health.v1 on grpcLn and the admin endpoints on
// adminLn (/metrics, /healthz, /readyz, and rlsconfig.LoadedPath for the
// controller), watches the config and counts the replicas, until ctx ends.
func (s *Server) Serve(ctx context.Context, grpcLn, adminLn net.Listener, shutdownDelay, shutdownTimeout time.Duration, gopts ...grpc.ServerOption) error {
	gopts = append(gopts,
		grpc.MaxRecvMsgSize(4<<20),
		grpc.NumStreamWorkers(StreamWorkers),
		// Bounds of a connection (gRPC's equivalent of an HTTP server's
		// timeouts): the handshake, TLS included, must end within
		// HandshakeTimeout; a peer that stops answering pings (gone, or no
		// longer reading) is closed after KeepaliveTime+KeepaliveTimeout;
		// a connection without calls for MaxConnectionIdle is sent GOAWAY
		// (a gateway opens a new one when it needs it); and one
		// connection carries at most MaxConcurrentStreams calls at once.
		grpc.ConnectionTimeout(HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time: KeepaliveTime, Timeout: KeepaliveTimeout, MaxConnectionIdle: MaxConnectionIdle,
		}),
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		// Gateways keep one connection open; the server lets it idle.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	gs := grpc.NewServer(gopts...)
	rlsv3.RegisterRateLimitServiceServer(gs, s)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)

	var stopping atomic.Bool
	ready := func() bool { return s.Ready() && !stopping.Load() }
	admin := s.adminServer(ready)

	bg, cancel := context.WithCancel(ctx)
	defer cancel()
	go s.WatchConfig(bg)
	go s.AnnounceLoop(bg)
	// The health service follows readiness (no config loaded: NOT_SERVING).
	go followReadiness(bg, hs, ready)
	main := serving.Main{
		Name:  "gRPC port",
		Serve: func() error { return gs.Serve(grpcLn) },
		Drain: func(ctx context.Context) error {
			done := make(chan struct{})
			go func() { gs.GracefulStop(); close(done) }()
			select {
			case <-done:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
		Close: gs.Stop,
	}
	return serving.Run(ctx, main, []serving.Aux{{Name: "admin port", Server: admin, Listener: adminLn}}, serving.Options{
		Delay: shutdownDelay, Timeout: shutdownTimeout,
		Stopping: func() {
			stopping.Store(true)
			hs.Shutdown() // NOT_SERVING for every service
		},
		Log: s.log,
	})
}

// adminServer serves /metrics, /healthz, /readyz (ready) and
// rlsconfig.LoadedPath.
func (s *Server) adminServer(ready func() bool) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.Handle(rlsconfig.LoadedPath, rlsconfig.LoadedHandler(s.Loaded))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "not ready: no config loaded, or shutting down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	// Its clients are the kubelet, Prometheus and the manager: small
	// requests and answers.
	return &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: adminReadHeaderTimeout,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second, // /metrics of a busy server
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    16 << 10,
	}
}

// followReadiness sets the health service's status from ready every second
// until ctx ends.
func followReadiness(ctx context.Context, hs *health.Server, ready func() bool) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if ready() {
			st = healthpb.HealthCheckResponse_SERVING
		}
		hs.SetServingStatus("", st)
		hs.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, st)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
