package sidecar

import (
	"context"
	"flag"
	"os"

	"github.com/slidegate/slidegate/internal/cli"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/version"
)

// Command is cmd/sidecar: the flags of Options (each also settable as
// SLIDEGATE_<UPPER_SNAKE>; Redis credentials come from the files of
// --redis-credentials-dir, else REDIS_USERNAME and REDIS_PASSWORD), checked
// by Validate, then Run until a signal.
func Command() cli.Command {
	return cli.Command{
		Name:         "sidecar",
		Version:      "slidegate sidecar " + version.Get() + " config " + sidecarconfig.Version,
		VersionUsage: "print the release and the sidecar config version this sidecar reads, and exit",
		Flags: func(fs *flag.FlagSet) cli.Setup {
			opts := DefaultOptions()
			opts.RegisterFlags(fs)
			return func() (cli.Program, error) {
				if err := opts.ApplyEnv(fs, os.LookupEnv); err != nil {
					return cli.Program{}, err
				}
				if err := opts.Validate(); err != nil {
					return cli.Program{}, err
				}
				log := opts.Logger()
				redisconn.RouteClientLogs(log)
				return cli.SlogProgram(log, "sidecar", func(ctx context.Context) error { return Run(ctx, opts, log) }), nil
			}
		},
	}
}
