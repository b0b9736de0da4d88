// Command sidecar is slidegate's enforcement sidecar: a reverse proxy in
// front of the application in its pod that admits or rejects every request
// through the shared Redis limiter. It only wires flags (each also settable
// as SLIDEGATE_<UPPER_SNAKE>; Redis credentials come from the files of
// --redis-credentials-dir, else REDIS_USERNAME and REDIS_PASSWORD) to
// package internal/sidecar.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/sidecar"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/version"
)

func main() { os.Exit(run()) }

func run() int {
	opts := sidecar.DefaultOptions()
	fs := flag.NewFlagSet("sidecar", flag.ExitOnError)
	opts.RegisterFlags(fs)
	showVersion := fs.Bool("version", false, "print the release and the sidecar config version this sidecar reads, and exit")
	_ = fs.Parse(os.Args[1:])
	if *showVersion {
		fmt.Println("slidegate sidecar", version.Get(), "config", sidecarconfig.Version)
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "sidecar: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := opts.ApplyEnv(fs, os.LookupEnv); err != nil {
		fmt.Fprintf(os.Stderr, "sidecar: %v\n", err)
		return 2
	}
	if err := opts.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "sidecar: %v\n", err)
		return 2
	}
	log := opts.Logger()
	redisconn.RouteClientLogs(log)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := sidecar.Run(ctx, opts, log); err != nil {
		log.Error("sidecar stopped", "error", err)
		return 1
	}
	return 0
}
