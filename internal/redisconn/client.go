package redisconn

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

	"github.com/slidegate/slidegate/internal/dirwatch"
)

// UniversalOptions builds go-redis options from c, with the settings the
// limiter relies on:
//   - ContextTimeoutEnabled, so a decision's deadline bounds the socket
//     read and a hung Redis frees the connection when the decision gives
//     up, not after ReadTimeout;
//   - MaxRetries -1: a standalone or Sentinel client does not resend a
//     round trip whose reply was lost (the breaker and fallback handle it).
//     A ClusterClient still does: MaxRedirects, not MaxRetries, bounds its
//     retries, network errors included, so Redis may run a decide script
//     twice; the limiter's scripts make that harmless (see redisschema.Decide).
func (c Config) UniversalOptions() (*redis.UniversalOptions, error) {
	if c.Mode == "" {
		c.Mode = Standalone
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	o := &redis.UniversalOptions{
		Addrs:                 c.Addrs,
		Username:              c.Username,
		Password:              c.Password,
		SentinelUsername:      c.SentinelUsername,
		SentinelPassword:      c.SentinelPassword,
		PoolSize:              c.PoolSize,
		DialTimeout:           orDefault(c.DialTimeout, time.Second),
		ReadTimeout:           orDefault(c.ReadTimeout, defaultIOTimeout),
		WriteTimeout:          orDefault(c.WriteTimeout, defaultIOTimeout),
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DialerRetries:         1,
		ClientName:            "slidegate",
	}
	switch c.Mode {
	case Cluster:
		o.IsClusterMode = true
	case Sentinel:
		o.MasterName = c.MasterName
		o.DB = c.DB
	default:
		o.DB = c.DB
	}
	if c.CredentialsDir != "" {
		d := &dirCredentials{dir: c.CredentialsDir}
		o.CredentialsProviderContext = d.read
		user, pass, err := readCredentials(c.CredentialsDir, CredentialsSentinelUsernameFile, CredentialsSentinelPasswordFile)
		if err != nil {
			return nil, err
		}
		o.SentinelUsername, o.SentinelPassword = user, pass
	}
	switch {
	case c.TLSDir != "":
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
	}
	return o, nil
}

// defaultIOTimeout bounds a socket read or write of a call that has no
// deadline of its own. It must not be shorter than any caller's deadline:
// go-redis bounds a read by the earlier of the context's deadline and
// ReadTimeout, and every call of the limiter carries its decision's (up to
// MaxTimeout, 3 s by default), which is what bounds it. With the former
// 1 s, a Redis answering in 1.5 s, which the limiter waits for as slow
// rather than down, was cut off by the socket at 1 s, and so was a round
// trip that a process kept from running for longer than that had not read
// yet (TestStalledProcess: 4 to 24 of ~100,000 decisions fell back).
const defaultIOTimeout = 30 * time.Second

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func (c Config) tlsConfig() (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.TLSServerName}
	if c.TLSCAFile != "" {
		pem, err := os.ReadFile(c.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("redis config: CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis config: no certificate in CA file %s", c.TLSCAFile)
		}
		t.RootCAs = pool
	}
	if c.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("redis config: client certificate: %w", err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}

// The files a TLSDir may hold, under the names of cert-manager and
// kubernetes.io/tls Secrets (the keys v1alpha1.RedisTLS*Key the injector
// mounts).
const (
	TLSDirCA   = "ca.crt"
	TLSDirCert = "tls.crt"
	TLSDirKey  = "tls.key"
)

// tlsDirDialer dials TLS with the directory's files as they are now. The
// server's name is verified as by tls.Dial: TLSServerName, else the host of
// the address.
func (c Config) tlsDirDialer(timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
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

func (c Config) tlsConfigFromDir() (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.TLSServerName}
	// All three from one version of the mounted Secret.
	dir := dirwatch.Snapshot(c.TLSDir)
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
	ca, ok, err := read(TLSDirCA)
	if err != nil {
		return nil, err
	}
	if ok {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("redis tls: no certificate in %s", filepath.Join(c.TLSDir, TLSDirCA))
		}
		t.RootCAs = pool
	}
	crt, haveCrt, err := read(TLSDirCert)
	if err != nil {
		return nil, err
	}
	key, haveKey, err := read(TLSDirKey)
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
		return nil, fmt.Errorf("redis tls: a client certificate needs both %s and %s in %s", TLSDirCert, TLSDirKey, c.TLSDir)
	}
	return t, nil
}

// NewClient returns the client c describes: *redis.Client for standalone
// and sentinel (a failover client), *redis.ClusterClient for cluster. It
// does not connect; the caller closes it.
func NewClient(c Config) (redis.UniversalClient, error) {
	o, err := c.UniversalOptions()
	if err != nil {
		return nil, err
	}
	switch c.Mode {
	case Cluster:
		co := o.Cluster()
		// Every node's client, as the cluster client creates them.
		co.NewClient = func(no *redis.Options) *redis.Client {
			n := redis.NewClient(no)
			n.AddHook(dialErrorsAtFirstUse{})
			return n
		}
		return redis.NewClusterClient(co), nil
	case Sentinel:
		rdb := redis.NewFailoverClient(o.Failover())
		rdb.AddHook(dialErrorsAtFirstUse{})
		return rdb, nil
	}
	rdb := redis.NewClient(o.Simple())
	rdb.AddHook(dialErrorsAtFirstUse{})
	return rdb, nil
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
