package limiter

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisMode names how Redis is deployed.
type RedisMode string

const (
	RedisStandalone RedisMode = "standalone"
	RedisCluster    RedisMode = "cluster"
	RedisSentinel   RedisMode = "sentinel"
)

// RedisConfig is the small, flag- and file-friendly description of the
// shared Redis that the sidecar turns into a client with NewRedisClient.
type RedisConfig struct {
	// Mode is standalone (default), cluster or sentinel.
	Mode RedisMode
	// Addrs: the server (standalone), seed nodes (cluster) or sentinels.
	Addrs []string
	// MasterName is the Sentinel master set name (sentinel mode only).
	MasterName string
	// Username and Password authenticate with Redis 6+ ACLs (AUTH user
	// pass); Password alone is the legacy requirepass.
	Username string
	Password string
	// SentinelUsername and SentinelPassword authenticate with the
	// sentinels when they differ from the data nodes.
	SentinelUsername string
	SentinelPassword string
	// DB selects a database (standalone and sentinel only).
	DB int

	// TLS turns on TLS. CAFile verifies the server (system roots when
	// empty); CertFile and KeyFile present a client certificate;
	// ServerName overrides the name verified.
	TLS        bool
	CAFile     string
	CertFile   string
	KeyFile    string
	ServerName string
	// TLSDir, instead of CAFile, CertFile and KeyFile, is a directory (a
	// mounted Secret) that may hold TLSCAFile and, together, TLSCertFile
	// and TLSKeyFile. They are read for every new connection, so a Secret
	// that arrives after the start, or rotates, is used without a restart.
	TLSDir string

	// PoolSize per node (default: go-redis's, 10 per CPU). DialTimeout
	// (default 1s) and ReadTimeout/WriteTimeout (default 1s) bound each
	// attempt; the limiter's own Timeout bounds every decision.
	PoolSize     int
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
}

// ACLRules returns the rules of a least-privilege Redis ACL user for a
// limiter with this key prefix, for `ACL SETUSER <name> on >password
// <rules...>`: its keys, the scripts, every command the scripts call
// (Redis checks those too) and what go-redis sends on connect (its CLIENT
// SETINFO, Redis 7.2+, may fail harmlessly: go-redis ignores that).
func ACLRules(prefix string) []string {
	if prefix == "" {
		prefix = defaultPrefix
	}
	return []string{
		"resetkeys", "~" + prefix + "*", "-@all",
		"+evalsha", "+eval", "+ping", "+hello", "+auth", "+client|setname",
		"+time", "+zremrangebyscore", "+zcard", "+zadd", "+zrange", "+zrem", "+pexpire",
		"+hmget", "+hget", "+hincrby", "+hlen", "+hkeys", "+hdel",
		// A Cluster client reads the slot map; harmless elsewhere.
		"+cluster|slots", "+cluster|shards", "+readonly",
	}
}

// UniversalOptions builds go-redis options from c, with the settings the
// limiter relies on:
//   - ContextTimeoutEnabled, so a decision's deadline bounds the socket
//     read and a hung Redis frees the connection when the decision gives
//     up, not after ReadTimeout;
//   - MaxRetries -1: go-redis retries a failed pipeline whole, which could
//     run a decision twice; within a decision's timeout a retry rarely fits, and
//     the breaker and fallback handle a failed round trip.
func (c RedisConfig) UniversalOptions() (*redis.UniversalOptions, error) {
	if len(c.Addrs) == 0 {
		return nil, errors.New("redis config: no addresses")
	}
	o := &redis.UniversalOptions{
		Addrs:                 c.Addrs,
		Username:              c.Username,
		Password:              c.Password,
		SentinelUsername:      c.SentinelUsername,
		SentinelPassword:      c.SentinelPassword,
		PoolSize:              c.PoolSize,
		DialTimeout:           orDefault(c.DialTimeout, time.Second),
		ReadTimeout:           orDefault(c.ReadTimeout, time.Second),
		WriteTimeout:          orDefault(c.WriteTimeout, time.Second),
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DialerRetries:         1,
		ClientName:            "slidegate",
	}
	switch c.Mode {
	case RedisStandalone, "":
		if len(c.Addrs) != 1 {
			return nil, fmt.Errorf("redis config: standalone mode takes one address, got %d", len(c.Addrs))
		}
		o.DB = c.DB
	case RedisCluster:
		if c.DB != 0 {
			return nil, errors.New("redis config: cluster mode has only database 0")
		}
		o.IsClusterMode = true
	case RedisSentinel:
		if c.MasterName == "" {
			return nil, errors.New("redis config: sentinel mode needs a master name")
		}
		o.MasterName = c.MasterName
		o.DB = c.DB
	default:
		return nil, fmt.Errorf("redis config: unknown mode %q (standalone, cluster, sentinel)", c.Mode)
	}
	switch {
	case c.TLS && c.TLSDir != "":
		if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" {
			return nil, errors.New("redis config: a TLS directory excludes the CA and client certificate files")
		}
		// go-redis takes one fixed tls.Config; a dialer of our own builds
		// one per connection from the directory's current files. Every
		// client mode (cluster nodes, sentinels, the master) dials with it.
		o.Dialer = c.tlsDirDialer(o.DialTimeout)
	case c.TLS:
		t, err := c.tlsConfig()
		if err != nil {
			return nil, err
		}
		o.TLSConfig = t
	case c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.TLSDir != "":
		return nil, errors.New("redis config: CA or client certificate given without TLS")
	}
	return o, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func (c RedisConfig) tlsConfig() (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("redis config: CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis config: no certificate in CA file %s", c.CAFile)
		}
		t.RootCAs = pool
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, errors.New("redis config: client certificate needs both CertFile and KeyFile")
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("redis config: client certificate: %w", err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}

// The files a TLSDir may hold, under the names of cert-manager and
// kubernetes.io/tls Secrets.
const (
	TLSCAFile   = "ca.crt"
	TLSCertFile = "tls.crt"
	TLSKeyFile  = "tls.key"
)

// tlsDirDialer dials TLS with the directory's files as they are now. The
// server's name is verified as by tls.Dial: ServerName, else the host of
// the address.
func (c RedisConfig) tlsDirDialer(timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cfg, err := c.tlsConfigFromDir()
		if err != nil {
			return nil, err
		}
		// The keep-alive of go-redis's own dialer, which this one replaces.
		nd := &net.Dialer{Timeout: timeout, KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: 30 * time.Second, Interval: 5 * time.Second, Count: 3,
		}}
		d := &tls.Dialer{NetDialer: nd, Config: cfg}
		return d.DialContext(ctx, network, addr)
	}
}

func (c RedisConfig) tlsConfigFromDir() (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	// A mounted Secret's files are links into ..data, which the kubelet
	// swaps atomically on an update: read all three from one snapshot, so
	// that a certificate and key never come from two versions.
	dir := c.TLSDir
	if snap, err := filepath.EvalSymlinks(filepath.Join(dir, "..data")); err == nil {
		dir = snap
	}
	read := func(name string) ([]byte, bool, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("redis tls: %w", err)
		}
		return b, true, nil
	}
	ca, ok, err := read(TLSCAFile)
	if err != nil {
		return nil, err
	}
	if ok {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("redis tls: no certificate in %s", filepath.Join(c.TLSDir, TLSCAFile))
		}
		t.RootCAs = pool
	}
	crt, haveCrt, err := read(TLSCertFile)
	if err != nil {
		return nil, err
	}
	key, haveKey, err := read(TLSKeyFile)
	if err != nil {
		return nil, err
	}
	switch {
	case haveCrt && haveKey:
		pair, err := tls.X509KeyPair(crt, key)
		if err != nil {
			return nil, fmt.Errorf("redis tls: client certificate in %s: %w", c.TLSDir, err)
		}
		t.Certificates = []tls.Certificate{pair}
	case haveCrt || haveKey:
		return nil, fmt.Errorf("redis tls: a client certificate needs both %s and %s in %s", TLSCertFile, TLSKeyFile, c.TLSDir)
	}
	return t, nil
}

// NewRedisClient returns the client c describes: *redis.Client for
// standalone and sentinel (a failover client), *redis.ClusterClient for
// cluster. It does not connect; the caller closes it.
func NewRedisClient(c RedisConfig) (redis.UniversalClient, error) {
	o, err := c.UniversalOptions()
	if err != nil {
		return nil, err
	}
	switch c.Mode {
	case RedisCluster:
		return redis.NewClusterClient(o.Cluster()), nil
	case RedisSentinel:
		return redis.NewFailoverClient(o.Failover()), nil
	}
	return redis.NewClient(o.Simple()), nil
}

// RouteClientLogs sends go-redis's own log lines (failed dials, sentinel
// master switches) to log at debug level, so that the process writes only
// structured lines; the sidecar logs why decisions failed at WARN itself.
// The setting is process-wide: call it once, from main.
func RouteClientLogs(log *slog.Logger) { redis.SetLogger(clientLogger{log}) }

type clientLogger struct{ log *slog.Logger }

func (l clientLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "redis client", "message", fmt.Sprintf(format, v...))
}
