package sidecar

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"time"

	"github.com/slidegate/slidegate/internal/cli"
	"github.com/slidegate/slidegate/internal/redisconn"
)

// Upstream protocols accepted by --upstream-protocol.
const (
	// UpstreamHTTP1 forwards every request over HTTP/1.1 (the default; any
	// application speaks it).
	UpstreamHTTP1 = "http1"
	// UpstreamH2C forwards every request over cleartext HTTP/2 with prior
	// knowledge (an application that speaks only h2c, such as a gRPC server).
	UpstreamH2C = "h2c"
	// UpstreamAuto forwards HTTP/2 requests over h2c and the others over
	// HTTP/1.1.
	UpstreamAuto = "auto"
)

// Options are the sidecar's settings. The zero value is not usable: start
// from DefaultOptions.
type Options struct {
	// ListenAddress is the proxied port: the pod's Service reaches the
	// sidecar here (the injector takes over the application's named port).
	ListenAddress string
	// AdminAddress serves /metrics, /healthz and /readyz, for Prometheus
	// and the kubelet: nothing there names a client.
	AdminAddress string
	// DebugAddress serves /debug/why and /debug/top, on a loopback
	// address only: within the pod's network namespace, where only the
	// pod itself and a port-forward through the API server (pods/portforward,
	// which Kubernetes authorizes) reach it, never the pod network.
	DebugAddress string
	// ClientHashKeyFile holds the key of the hashes of client keys that
	// /debug shows (package clienthash): the namespace's, from the
	// mirrored Secret (an optional volume, so it may appear after the
	// sidecar started; it is read again with the config). Missing or
	// empty: a random key of this process until it appears.
	ClientHashKeyFile string
	// Upstream is the application, on localhost.
	Upstream string
	// UpstreamProtocol is one of the Upstream* constants.
	UpstreamProtocol string
	// ConfigFile is the rendered sidecar config (sidecarconfig.FileName in
	// the mounted ConfigMap). Its directory is watched.
	ConfigFile string
	// PodLabelsFile is the downward-API file with the pod's labels. Empty
	// means the pod has no labels (for running outside Kubernetes).
	PodLabelsFile string
	// ConfigResyncInterval re-reads both files even without a file event,
	// a backstop for missed events and for directories that appear late.
	ConfigResyncInterval time.Duration

	// Redis is the shared Redis, from the --redis-* flags and, for the
	// credentials, the environment (redisconn.Config.ApplyEnvCredentials).
	Redis redisconn.Config

	// FallbackReplicas is the number of sidecar replicas sharing a limit;
	// a fail-open policy enforces Limit/FallbackReplicas locally while
	// Redis is unavailable.
	FallbackReplicas int
	// KeyPrefix prefixes every Redis key of the limiter (empty: the
	// limiter's default).
	KeyPrefix string
	// RedisFunctions decides through the slidegate library's functions
	// (FCALL; limiter.Options.Functions), as the namespace's own Redis
	// identity must; false sends the scripts (EVALSHA), as an identity
	// shared by every namespace does.
	RedisFunctions bool
	// DecisionTimeout bounds how long a decision waits for Redis before its
	// policy's fail mode decides (limiter.Options.Timeout): what a Redis
	// that hangs costs a request until the breaker opens, not a latency
	// target; a merely slow Redis must still decide.
	DecisionTimeout time.Duration
	// DecisionBatchWait lets a free Redis connection wait this long for more
	// decisions to pipeline together (limiter MaxWait; 0 sends at once).
	// Fewer round trips cost less CPU per request at up to this much
	// latency.
	DecisionBatchWait time.Duration

	// ShutdownDelay keeps serving (with /readyz failing) for this long
	// after SIGTERM before closing the listeners, so that endpoints
	// controllers and load balancers stop sending new connections first.
	ShutdownDelay time.Duration
	// PeerInterval is how often the sidecar announces itself in Redis for
	// each policy it enforces and reads how many sidecars do (the fail-open
	// share's divisor); a sidecar not heard of for three intervals is no
	// longer counted.
	PeerInterval time.Duration
	// ShutdownTimeout bounds the drain of in-flight requests.
	ShutdownTimeout time.Duration

	// ReadHeaderTimeout and IdleTimeout protect the proxied port from slow
	// or idle clients. There is deliberately no read or write timeout on
	// whole requests there: bodies may stream for as long as the app wants
	// (uploads, downloads, server-sent events, gRPC streams), and the
	// application, not the sidecar, knows how long is too long. The admin
	// and debug ports answer small requests and have all four timeouts
	// (server.go).
	ReadHeaderTimeout time.Duration
	IdleTimeout       time.Duration
	// UpstreamDialTimeout bounds connecting to the application.
	UpstreamDialTimeout time.Duration

	// LogLevel is debug, info, warn or error.
	LogLevel string
}

// DefaultOptions are the flag defaults.
func DefaultOptions() Options {
	return Options{
		// The injector's default ports (v1alpha1.SidecarPort and
		// SidecarAdminPort, outside Istio's 15000-15090), which it passes
		// as flags anyway; internal/inject's tests keep the two equal.
		ListenAddress:        ":15280",
		AdminAddress:         ":15290",
		DebugAddress:         "127.0.0.1:15291",
		Upstream:             "http://127.0.0.1:8080",
		UpstreamProtocol:     UpstreamHTTP1,
		ConfigFile:           "/etc/slidegate/config/config.json",
		PodLabelsFile:        "/etc/slidegate/podinfo/labels",
		ConfigResyncInterval: 10 * time.Second,
		Redis: redisconn.Config{
			Mode:  redisconn.Standalone,
			Addrs: []string{redisconn.DefaultAddr},
		},
		FallbackReplicas:    1,
		DecisionTimeout:     time.Second,
		ShutdownDelay:       0,
		PeerInterval:        5 * time.Second,
		ShutdownTimeout:     20 * time.Second,
		ReadHeaderTimeout:   10 * time.Second,
		IdleTimeout:         120 * time.Second,
		UpstreamDialTimeout: 5 * time.Second,
		LogLevel:            "info",
	}
}

// Validate checks the options before anything starts.
func (o *Options) Validate() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if o.ListenAddress == "" {
		add("--listen-address is required")
	}
	if o.AdminAddress == "" {
		add("--admin-address is required")
	}
	if o.ListenAddress != "" && o.ListenAddress == o.AdminAddress {
		add("--listen-address and --admin-address must differ")
	}
	if err := loopbackAddress(o.DebugAddress); err != nil {
		add("--debug-address: %v", err)
	}
	if _, err := upstreamURL(o.Upstream); err != nil {
		add("--upstream: %v", err)
	}
	switch o.UpstreamProtocol {
	case UpstreamHTTP1, UpstreamH2C, UpstreamAuto:
	default:
		add("--upstream-protocol %q is not http1, h2c or auto", o.UpstreamProtocol)
	}
	if o.ConfigFile == "" {
		add("--config-file is required")
	}
	if o.ConfigResyncInterval <= 0 {
		add("--config-resync-interval must be positive")
	}
	errs = append(errs, o.Redis.Validate())
	if o.FallbackReplicas < 1 {
		add("--fallback-replicas must be at least 1")
	}
	if o.DecisionTimeout <= 0 {
		add("--decision-timeout must be positive")
	}
	if o.DecisionBatchWait < 0 || o.DecisionBatchWait >= o.DecisionTimeout {
		add("--decision-batch-wait must be at least 0 and below --decision-timeout")
	}
	if o.PeerInterval <= 0 {
		add("the peer interval must be positive")
	}
	if o.ShutdownDelay < 0 || o.ShutdownTimeout <= 0 {
		add("--shutdown-delay must not be negative and --shutdown-timeout must be positive")
	}
	if o.ReadHeaderTimeout <= 0 || o.IdleTimeout <= 0 || o.UpstreamDialTimeout <= 0 {
		add("timeouts must be positive")
	}
	if _, err := cli.ParseLevel(o.LogLevel); err != nil {
		add("--log-level: %v", err)
	}
	return errors.Join(errs...)
}

// loopbackAddress checks that addr is host:port with a loopback IP host:
// /debug must not be reachable from the pod network.
func loopbackAddress(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if ip, err := netip.ParseAddr(host); err != nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not on a loopback IP address (127.0.0.1:PORT or [::1]:PORT): /debug answers only within the pod", addr)
	}
	return nil
}

func upstreamURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" {
		return nil, fmt.Errorf("%q: only http:// is supported (the application is on localhost)", s)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%q has no host", s)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("%q: no query, fragment or user info allowed", s)
	}
	return u, nil
}

// Logger returns the JSON logger at o's --log-level (info if it is not
// valid, which Validate reports).
func (o *Options) Logger() *slog.Logger {
	level, err := cli.ParseLevel(o.LogLevel)
	if err != nil {
		level = slog.LevelInfo
	}
	return cli.NewLogger(os.Stderr, level)
}
