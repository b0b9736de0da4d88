package sidecar

import (
	"flag"

	"github.com/slidegate/slidegate/internal/cli"
)

// RegisterFlags defines one flag per option on fs, with o's values as the
// defaults. The injector relies on these names.
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.ListenAddress, "listen-address", o.ListenAddress, "address of the proxied port (the pod's Service sends traffic here)")
	fs.StringVar(&o.AdminAddress, "admin-address", o.AdminAddress, "address serving /metrics, /healthz and /readyz")
	fs.StringVar(&o.DebugAddress, "debug-address", o.DebugAddress, "loopback address serving /debug/why and /debug/top (reached through kubectl port-forward)")
	fs.StringVar(&o.ClientHashKeyFile, "client-hash-key-file", o.ClientHashKeyFile, "file with the key of the client hashes /debug shows (read again with the config; missing: a random key until it appears)")
	fs.StringVar(&o.Upstream, "upstream", o.Upstream, "URL of the application on localhost")
	fs.StringVar(&o.UpstreamProtocol, "upstream-protocol", o.UpstreamProtocol, "protocol to the application: http1, h2c, or auto (h2c for HTTP/2 requests)")
	fs.StringVar(&o.ConfigFile, "config-file", o.ConfigFile, "rendered sidecar config file (its directory is watched)")
	fs.StringVar(&o.PodLabelsFile, "pod-labels-file", o.PodLabelsFile, "downward-API file with the pod's labels (empty: no labels)")
	fs.DurationVar(&o.ConfigResyncInterval, "config-resync-interval", o.ConfigResyncInterval, "re-read the config and labels files this often even without a file event")
	o.Redis.RegisterFlags(fs)
	fs.IntVar(&o.FallbackReplicas, "fallback-replicas", o.FallbackReplicas, "replicas sharing a limit: a fail-open policy enforces limit/replicas locally while Redis is unavailable")
	fs.StringVar(&o.KeyPrefix, "key-prefix", o.KeyPrefix, "prefix of the limiter's Redis keys (empty: the limiter's default)")
	fs.BoolVar(&o.RedisFunctions, "redis-functions", o.RedisFunctions, "decide through the slidegate Redis Functions library (FCALL), which the manager loads, instead of sending the scripts (EVALSHA)")
	fs.DurationVar(&o.DecisionTimeout, "decision-timeout", o.DecisionTimeout, "how long a decision waits for Redis before the policy's fail mode decides (a hung Redis costs a request this much until the breaker opens)")
	fs.DurationVar(&o.DecisionBatchWait, "decision-batch-wait", o.DecisionBatchWait, "let a free Redis connection wait this long to pipeline more decisions together (0: send at once)")
	fs.DurationVar(&o.ShutdownDelay, "shutdown-delay", o.ShutdownDelay, "after SIGTERM, keep serving this long with /readyz failing before closing the listeners")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "how long to drain in-flight requests on shutdown")
	fs.DurationVar(&o.ReadHeaderTimeout, "read-header-timeout", o.ReadHeaderTimeout, "timeout to read a request's headers")
	fs.DurationVar(&o.IdleTimeout, "idle-timeout", o.IdleTimeout, "keep-alive timeout of idle client connections")
	fs.DurationVar(&o.UpstreamDialTimeout, "upstream-dial-timeout", o.UpstreamDialTimeout, "timeout to connect to the application")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "debug, info, warn or error")
}

// ApplyEnv sets every flag that was not given on the command line from its
// environment variable (cli.ApplyEnv: a flag beats the environment, which
// beats the default), and reads the Redis credentials
// (redisconn.EnvUsername and the others) into o, unless they come from
// --redis-credentials-dir. Call it after fs.Parse.
func (o *Options) ApplyEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	if err := cli.ApplyEnv(fs, lookup); err != nil {
		return err
	}
	if o.Redis.CredentialsDir == "" {
		o.Redis.ApplyEnvCredentials(lookup)
	}
	return nil
}
