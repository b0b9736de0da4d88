package rls

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/slidegate/slidegate/internal/cli"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/version"
)

// Command is cmd/rls: the flags of RunOptions (each also settable as
// SLIDEGATE_<UPPER_SNAKE>; Redis credentials come from the files of
// --redis-credentials-dir, else REDIS_USERNAME and REDIS_PASSWORD), then
// Run until a signal.
func Command() cli.Command {
	return cli.Command{
		Name:         "rls",
		Version:      "slidegate rls " + version.Get(),
		VersionUsage: "print the release and exit",
		Flags:        runFlags,
	}
}

// runFlags defines the server's flags on fs, with their defaults, and
// returns the Setup that reads the environment and checks them.
func runFlags(fs *flag.FlagSet) cli.Setup {
	o := RunOptions{
		ListenAddress: ":8081", AdminAddress: ":8082",
		Server:          Options{ConfigFile: "/etc/slidegate/rls/config.json", ResyncInterval: 10 * time.Second},
		Limiter:         limiter.Options{Timeout: time.Second},
		ShutdownDelay:   5 * time.Second,
		ShutdownTimeout: 20 * time.Second,
		Redis:           redisconn.Config{Mode: redisconn.Standalone, Addrs: []string{redisconn.DefaultAddr}},
	}
	logLevel := "info"
	fs.StringVar(&o.ListenAddress, "listen-address", o.ListenAddress, "gRPC address (RLS v3 and grpc.health.v1)")
	fs.StringVar(&o.AdminAddress, "admin-address", o.AdminAddress, "HTTP address serving /metrics, /healthz and /readyz")
	var clientNames string
	fs.StringVar(&o.TLS.CertFile, "tls-cert-file", "", "PEM certificate for the gRPC listener (with --tls-key-file; empty: plaintext); read again when it changes")
	fs.StringVar(&o.TLS.KeyFile, "tls-key-file", "", "PEM key for the gRPC listener")
	fs.StringVar(&o.TLS.ClientCAFile, "tls-client-ca-file", "", "PEM CA that must have signed every caller's client certificate (mTLS; needs --tls-cert-file); read again when it changes")
	fs.StringVar(&clientNames, "tls-client-names", "", "comma-separated URI or DNS SANs, one of which a caller's certificate must carry (e.g. the gateway's SPIFFE ID); empty: any certificate of the client CA")
	fs.StringVar(&o.Server.ConfigFile, "config-file", o.Server.ConfigFile, "rendered RLS config (its directory is watched; missing: no policies)")
	fs.DurationVar(&o.Server.ResyncInterval, "config-resync-interval", o.Server.ResyncInterval, "re-read the config this often even without a file event")
	o.Redis.RegisterFlags(fs)
	fs.StringVar(&o.Limiter.Prefix, "key-prefix", "", "prefix of the limiter's Redis keys (empty: the limiter's default, as the sidecars)")
	fs.BoolVar(&o.Limiter.Functions, "redis-functions", false, "decide through the slidegate Redis Functions library (FCALL), which the manager loads, instead of sending the scripts (EVALSHA)")
	fs.DurationVar(&o.Limiter.Timeout, "decision-timeout", o.Limiter.Timeout, "how long a decision waits for Redis before the policy's fail mode decides")
	fs.DurationVar(&o.Limiter.MaxWait, "decision-batch-wait", 0, "let a free Redis connection wait this long to pipeline more decisions together")
	fs.DurationVar(&o.ShutdownDelay, "shutdown-delay", o.ShutdownDelay, "after SIGTERM, keep serving this long with readiness failing")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "how long GracefulStop may drain calls in flight")
	fs.StringVar(&logLevel, "log-level", logLevel, "debug, info, warn or error")
	return func() (cli.Program, error) {
		if err := cli.ApplyEnv(fs, os.LookupEnv); err != nil {
			return cli.Program{}, err
		}
		if o.Redis.CredentialsDir == "" {
			o.Redis.ApplyEnvCredentials(os.LookupEnv)
		}
		if clientNames != "" {
			o.TLS.ClientNames = strings.Split(clientNames, ",")
		}
		if err := o.TLS.Validate(); err != nil {
			return cli.Program{}, err
		}
		level, err := cli.ParseLevel(logLevel)
		if err != nil {
			return cli.Program{}, fmt.Errorf("--log-level: %w", err)
		}
		if err := o.Redis.Validate(); err != nil {
			return cli.Program{}, err
		}
		log := cli.NewLogger(os.Stderr, level)
		redisconn.RouteClientLogs(log)
		return cli.SlogProgram(log, "rls", func(ctx context.Context) error { return Run(ctx, o, log) }), nil
	}
}

// descriptorsFlag collects repeated -descriptor flags.
type descriptorsFlag []string

func (d *descriptorsFlag) String() string     { return strings.Join(*d, " ") }
func (d *descriptorsFlag) Set(s string) error { *d = append(*d, s); return nil }

// ExitOverLimit is the exit code of `rls check` when the server answers
// OVER_LIMIT, so that a script can tell it from an error (cli.ExitFailed).
const ExitOverLimit = 3

// CheckMain is `rls check`: one request to a server, its answer printed on
// stdout; it returns the exit code.
func CheckMain(args []string, stdout, stderr io.Writer) int {
	var o CheckOptions
	var hits uint
	timeout := 5 * time.Second
	fs := flag.NewFlagSet("rls check", flag.ExitOnError)
	fs.StringVar(&o.Target, "target", "127.0.0.1:8081", "RLS server host:port")
	fs.BoolVar(&o.TLS, "tls", false, "dial with TLS")
	fs.StringVar(&o.CAFile, "tls-ca-file", "", "PEM CA to verify the server with (default: system roots)")
	fs.StringVar(&o.CertFile, "tls-cert-file", "", "PEM client certificate to present (a server with --tls-client-ca-file requires one)")
	fs.StringVar(&o.KeyFile, "tls-key-file", "", "PEM key of -tls-cert-file")
	fs.StringVar(&o.Domain, "domain", "", "rate limit domain (the gateway's)")
	fs.Var((*descriptorsFlag)(&o.Descriptors), "descriptor", "one descriptor as key=value[,key=value]; repeat for several")
	fs.UintVar(&hits, "hits", 0, "hits_addend (0: 1)")
	fs.DurationVar(&timeout, "timeout", timeout, "call timeout")
	if err := fs.Parse(args); err != nil {
		return cli.ExitUsage
	}
	o.Hits = uint32(min(hits, 1<<32-1)) //nolint:gosec // clamped
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := Check(ctx, o, stdout)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "rls check: %v\n", err)
		return cli.ExitFailed
	}
	if resp.GetOverallCode().String() != "OK" {
		return ExitOverLimit
	}
	return cli.ExitOK
}
