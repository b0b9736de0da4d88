package sidecar

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
)

// limiterOptions are the limiter's options from the sidecar's.
func (o *Options) limiterOptions() limiter.Options {
	replicas := o.FallbackReplicas
	return limiter.Options{
		Prefix:    o.KeyPrefix,
		Functions: o.RedisFunctions,
		Timeout:   o.DecisionTimeout,
		MaxWait:   o.DecisionBatchWait,
		Replicas:  func() int { return replicas },
	}
}

// Run is the whole sidecar process: it connects the limiter to Redis,
// listens on both ports and serves until ctx ends (SIGTERM), then drains
// and closes everything. It does not need Redis to be up: the limiter
// connects lazily and decides by each policy's failMode meanwhile.
func Run(ctx context.Context, o Options, log *slog.Logger) error {
	if err := o.Validate(); err != nil {
		return err
	}
	rdb, err := redisconn.NewClient(o.Redis)
	if err != nil {
		return err
	}
	defer func() { _ = rdb.Close() }()
	lim, err := limiter.New(rdb, o.limiterOptions())
	if err != nil {
		return err
	}
	defer func() { _ = lim.Close() }()

	s, err := New(o, lim, log)
	if err != nil {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", o.ListenAddress)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.ListenAddress, err)
	}
	adminLn, err := lc.Listen(ctx, "tcp", o.AdminAddress)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("listen %s: %w", o.AdminAddress, err)
	}
	debugLn, err := lc.Listen(ctx, "tcp", o.DebugAddress) // a loopback address (Validate)
	if err != nil {
		_, _ = ln.Close(), adminLn.Close()
		return fmt.Errorf("listen %s: %w", o.DebugAddress, err)
	}
	log.Info("starting", "redis", o.Redis, "fallbackReplicas", o.FallbackReplicas,
		"decisionTimeout", o.DecisionTimeout, "configFile", o.ConfigFile, "podLabelsFile", o.PodLabelsFile,
		"clientHashKey", s.hasher.Load().Configured)
	return s.Serve(ctx, ln, adminLn, debugLn)
}
