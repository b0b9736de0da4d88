// Package serving is the life of a front end's servers, shared by the
// sidecar and the rate limit service: serve until the context ends or a
// server fails, then say "not ready", wait for the endpoints to drop the
// pod, drain the main server within a bound (closing what is left after
// it), and stop the admin servers. Each front end brings its main server
// (HTTP proxy, gRPC) as three functions.
package serving

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Main is the server that carries the traffic.
type Main struct {
	// Name names it in errors ("proxied port", "gRPC port").
	Name string
	// Serve serves until the server is stopped.
	Serve func() error
	// Drain stops accepting, and waits for what is in flight to finish or
	// ctx to end (then it returns ctx's error).
	Drain func(ctx context.Context) error
	// Close ends what Drain left.
	Close func()
}

// Aux is a server beside the main one (admin, debug): stopped last, within
// a second, without a drain of its own.
type Aux struct {
	Name     string
	Server   *http.Server
	Listener net.Listener
}

// Options bound the shutdown.
type Options struct {
	// Delay is how long the server goes on serving once not ready, for
	// the endpoints (and the proxies that follow them) to drop the pod;
	// skipped when a server failed.
	Delay time.Duration
	// Timeout bounds the drain.
	Timeout time.Duration
	// Stopping is called first on shutdown: readiness becomes false.
	Stopping func()
	Log      *slog.Logger
}

// auxStopTimeout bounds the admin servers' shutdown: their requests are
// probes and scrapes.
const auxStopTimeout = time.Second

// Run serves main and aux until ctx ends or one of them fails, then shuts
// down in order. It returns the error of the server that failed, nil when
// ctx ended.
func Run(ctx context.Context, main Main, aux []Aux, o Options) error {
	errc := make(chan error, 1+len(aux))
	go func() { errc <- fmt.Errorf("%s: %w", main.Name, main.Serve()) }()
	for _, a := range aux {
		go func() {
			if err := a.Server.Serve(a.Listener); !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("%s: %w", a.Name, err)
			}
		}()
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
		o.Log.Error("server stopped", "error", serveErr)
	}

	if o.Stopping != nil {
		o.Stopping()
	}
	o.Log.Info("shutting down: draining", "delay", o.Delay, "timeout", o.Timeout)
	if serveErr == nil && o.Delay > 0 {
		time.Sleep(o.Delay)
	}
	drainCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.Timeout)
	defer cancel()
	if err := main.Drain(drainCtx); err != nil {
		o.Log.Warn("drain did not finish in time; closing the remaining connections", "error", err)
		main.Close()
	} else {
		o.Log.Info("drained")
	}
	auxCtx, cancelAux := context.WithTimeout(context.WithoutCancel(ctx), auxStopTimeout)
	defer cancelAux()
	for _, a := range aux {
		_ = a.Server.Shutdown(auxCtx)
	}
	return serveErr
}
