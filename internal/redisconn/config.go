// Package redisconn is the one description of the connection to the shared
// Redis, its one validator and its client: the manager validates what it
// will inject, the injector passes it to the sidecar as flags, and the
// sidecar and the rate limit service build their go-redis client from it.
// Like cert-manager's shared validation packages, it imports nothing of the
// project and nothing of Kubernetes, so every side can import it; the
// limiter takes the client it builds and knows nothing of connecting.
package redisconn

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"
)

// Mode names how Redis is deployed.
type Mode string

// The modes of --redis-mode.
const (
	Standalone Mode = "standalone"
	Cluster    Mode = "cluster"
	Sentinel   Mode = "sentinel"
)

// DefaultAddr is the --redis-addrs default of the sidecar and the rate
// limit service: a Service named redis in their own namespace.
const DefaultAddr = "redis:6379"

// The environment variables holding the credentials (from a Secret). They
// have no flags, so that they never show in a process listing; the injector
// sets them from the mirrored Secret.
const (
	EnvUsername = "REDIS_USERNAME"
	EnvPassword = "REDIS_PASSWORD"
	// EnvSentinelUsername and EnvSentinelPassword are the sentinels' own
	// credentials (sentinel mode), when they differ.
	EnvSentinelUsername = "REDIS_SENTINEL_USERNAME"
	EnvSentinelPassword = "REDIS_SENTINEL_PASSWORD"
)

// Config describes the connection to the shared Redis. The manager sets
// the topology and TLS switch once, with its flags; the sidecar and the
// rate limit service get the same as flags, their credentials from the
// environment and their TLS files from a mounted Secret.
type Config struct {
	// Mode is standalone, cluster or sentinel. Validate wants it set (an
	// empty --redis-mode is a mistake); NewClient takes empty as standalone,
	// so that Config{Addrs: ...} is all a test needs.
	Mode Mode
	// Addrs are host:port addresses: the server (standalone), seed nodes
	// (cluster) or the sentinels (sentinel).
	Addrs []string
	// MasterName is the Sentinel master set name (sentinel mode only).
	MasterName string
	// DB selects a database (standalone and sentinel only).
	DB int

	// Username and Password authenticate with Redis 6+ ACLs (AUTH user
	// pass); Password alone is the legacy requirepass. They come from the
	// environment only (ApplyEnvCredentials) and are never logged.
	Username string
	Password string
	// SentinelUsername and SentinelPassword authenticate with the
	// sentinels when they differ from the data nodes; never logged.
	SentinelUsername string
	SentinelPassword string
	// CredentialsDir, instead of Username and Password, is a directory (a
	// mounted Secret) holding the files username and password, read for
	// every new connection, so that a rotated password is used without a
	// restart; and sentinel-username and sentinel-password, read at the
	// start (go-redis takes the sentinels' credentials once).
	CredentialsDir string

	// TLS turns on TLS to Redis (and to the sentinels). TLSCAFile verifies
	// the server (system roots when empty); TLSCertFile and TLSKeyFile
	// present a client certificate; TLSServerName is the name every server
	// certificate is verified for, instead of the host dialled (for
	// Cluster and Sentinel that is the address the nodes announce, often
	// an IP).
	TLS           bool
	TLSCAFile     string
	TLSCertFile   string
	TLSKeyFile    string
	TLSServerName string
	// TLSDir, instead of TLSCAFile, TLSCertFile and TLSKeyFile, is a
	// directory (a mounted Secret) that may hold TLSDirCA and, together,
	// TLSDirCert and TLSDirKey. They are read for every new connection, so
	// a Secret that arrives after the start, or rotates, is used without a
	// restart.
	TLSDir string

	// PoolSize per node (default: go-redis's, 10 per CPU). DialTimeout
	// (default 1s) bounds a dial; ReadTimeout/WriteTimeout (default 30s)
	// only bound calls without a deadline of their own: the limiter's
	// decisions carry theirs (Timeout, stretched up to MaxTimeout).
	PoolSize     int
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
}

// Validate checks c. Its messages name the --redis-* flags, the same in
// every binary, that set each field; fields no flag sets by their Go name.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	switch c.Mode {
	case Standalone:
		if len(c.Addrs) > 1 {
			add("--redis-mode=standalone takes one address, not %d", len(c.Addrs))
		}
	case Cluster:
		if c.DB != 0 {
			add("redis config: cluster mode has only database 0")
		}
	case Sentinel:
		if c.MasterName == "" {
			add("--redis-mode=sentinel needs --redis-master-name")
		}
	default:
		add("--redis-mode %q is not standalone, cluster or sentinel", c.Mode)
	}
	if c.Mode != Sentinel && c.MasterName != "" {
		add("--redis-master-name is only for --redis-mode=sentinel")
	}
	if len(c.Addrs) == 0 {
		add("--redis-addrs is required")
	}
	for _, a := range c.Addrs {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			add("--redis-addrs: %q is not host:port", a)
		}
	}
	errs = append(errs, c.validateTLS()...)
	if c.CredentialsDir != "" && (c.Username != "" || c.Password != "") {
		add("--redis-credentials-dir excludes %s and %s", EnvUsername, EnvPassword)
	}
	return errors.Join(errs...)
}

func (c Config) validateTLS() []error {
	var errs []error
	if !c.TLS {
		for _, s := range []struct{ value, name string }{
			{c.TLSCAFile, "--redis-tls-ca-file"}, {c.TLSDir, "--redis-tls-dir"}, {c.TLSServerName, "--redis-tls-server-name"},
			{c.TLSCertFile, "TLSCertFile"}, {c.TLSKeyFile, "TLSKeyFile"},
		} {
			if s.value != "" {
				errs = append(errs, fmt.Errorf("%s needs --redis-tls", s.name))
			}
		}
	}
	if c.TLSDir != "" && c.TLSCAFile != "" {
		errs = append(errs, errors.New("--redis-tls-ca-file and --redis-tls-dir exclude each other"))
	}
	if c.TLSDir != "" && (c.TLSCertFile != "" || c.TLSKeyFile != "") {
		errs = append(errs, errors.New("redis config: a TLS directory excludes the client certificate files"))
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		errs = append(errs, errors.New("redis config: client certificate needs both TLSCertFile and TLSKeyFile"))
	}
	return errs
}

// LogValue keeps the credentials out of every log line.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("mode", string(c.Mode)),
		slog.Any("addrs", c.Addrs),
		slog.String("masterName", c.MasterName),
		slog.Bool("tls", c.TLS),
		slog.String("tlsDir", c.TLSDir),
		slog.String("credentialsDir", c.CredentialsDir),
		slog.Bool("username", c.Username != ""),
		slog.Bool("password", c.Password != ""),
		slog.Bool("sentinelPassword", c.SentinelPassword != ""),
	)
}

// String keeps the credentials out of any %v.
func (c Config) String() string {
	return fmt.Sprintf("{mode=%s addrs=%v masterName=%q tls=%t username=%t password=%t sentinelPassword=%t}",
		c.Mode, c.Addrs, c.MasterName, c.TLS, c.Username != "", c.Password != "", c.SentinelPassword != "")
}

// The names of the --redis-* flags: RegisterFlags defines them for the
// processes that connect, Args writes them for the injector, and the
// manager's own (internal/manager's redisOptions) use them too.
const (
	FlagMode           = "redis-mode"
	FlagAddrs          = "redis-addrs"
	FlagMasterName     = "redis-master-name"
	FlagTLS            = "redis-tls"
	FlagTLSCAFile      = "redis-tls-ca-file"
	FlagTLSDir         = "redis-tls-dir"
	FlagTLSServerName  = "redis-tls-server-name"
	FlagCredentialsDir = "redis-credentials-dir"
)

// RegisterFlags defines the --redis-* flags of the processes that connect
// (the sidecar and the rate limit service) on fs, with c's values as the
// defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar((*string)(&c.Mode), FlagMode, string(c.Mode), "Redis deployment: standalone, cluster or sentinel")
	fs.Var(AddrsFlag(&c.Addrs), FlagAddrs, "comma-separated host:port list: the server, cluster seeds or sentinels")
	fs.StringVar(&c.MasterName, FlagMasterName, c.MasterName, "sentinel master set name (sentinel mode)")
	fs.BoolVar(&c.TLS, FlagTLS, c.TLS, "connect to Redis over TLS")
	fs.StringVar(&c.TLSCAFile, FlagTLSCAFile, c.TLSCAFile, "PEM CA bundle to verify Redis with (default: system roots)")
	fs.StringVar(&c.TLSDir, FlagTLSDir, c.TLSDir, "directory with ca.crt, and tls.crt with tls.key for a client certificate (a mounted Secret; read for every new connection)")
	fs.StringVar(&c.TLSServerName, FlagTLSServerName, c.TLSServerName, "server name to verify in the Redis certificate")
	fs.StringVar(&c.CredentialsDir, FlagCredentialsDir, c.CredentialsDir,
		"directory with the files username and password (a mounted Secret; read for every new connection), and sentinel-username and sentinel-password; instead of "+EnvUsername+" and "+EnvPassword)
}

// Args are the command-line arguments that give a process c's connection
// through RegisterFlags' flags (the injector's sidecar arguments): the
// settings that are set, credentials never (those come from
// CredentialsDir's files); the TLS settings only with TLS.
func (c Config) Args() []string {
	var args []string
	if c.Mode != "" {
		args = append(args, "--"+FlagMode+"="+string(c.Mode))
	}
	if len(c.Addrs) > 0 {
		args = append(args, "--"+FlagAddrs+"="+strings.Join(c.Addrs, ","))
	}
	if c.MasterName != "" {
		args = append(args, "--"+FlagMasterName+"="+c.MasterName)
	}
	if c.TLS {
		args = append(args, "--"+FlagTLS)
		for _, f := range []struct{ name, value string }{
			{FlagTLSCAFile, c.TLSCAFile}, {FlagTLSDir, c.TLSDir}, {FlagTLSServerName, c.TLSServerName},
		} {
			if f.value != "" {
				args = append(args, "--"+f.name+"="+f.value)
			}
		}
	}
	if c.CredentialsDir != "" {
		args = append(args, "--"+FlagCredentialsDir+"="+c.CredentialsDir)
	}
	return args
}

// ApplyEnvCredentials reads the credentials from the environment variables
// Env*, through lookup (os.LookupEnv).
func (c *Config) ApplyEnvCredentials(lookup func(string) (string, bool)) {
	c.Username, _ = lookup(EnvUsername)
	c.Password, _ = lookup(EnvPassword)
	c.SentinelUsername, _ = lookup(EnvSentinelUsername)
	c.SentinelPassword, _ = lookup(EnvSentinelPassword)
}

// AddrsFlag is the flag.Value of --redis-addrs for addrs: a comma-separated
// list, blanks around and between the addresses dropped.
func AddrsFlag(addrs *[]string) flag.Value { return (*addrsValue)(addrs) }

type addrsValue []string

func (l *addrsValue) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, ",")
}

func (l *addrsValue) Set(s string) error {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	*l = out
	return nil
}
