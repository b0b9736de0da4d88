package redisconn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/testsupport"
)

func TestUniversalOptions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr bool
		check   func(*redis.UniversalOptions) error
	}{
		{name: "standalone", cfg: Config{Addrs: []string{"r:6379"}, Username: "u", Password: "p", DB: 2},
			check: func(o *redis.UniversalOptions) error {
				if o.Username != "u" || o.Password != "p" || o.DB != 2 || !o.ContextTimeoutEnabled || o.MaxRetries != -1 {
					return fmt.Errorf("%+v", o)
				}
				return nil
			}},
		{name: "cluster", cfg: Config{Mode: Cluster, Addrs: []string{"a:1"}},
			check: func(o *redis.UniversalOptions) error {
				if !o.IsClusterMode {
					return errors.New("not cluster mode")
				}
				return nil
			}},
		{name: "sentinel", cfg: Config{Mode: Sentinel, Addrs: []string{"s1:26379", "s2:26379"}, MasterName: "m", DB: 1, SentinelPassword: "sp"},
			check: func(o *redis.UniversalOptions) error {
				if o.MasterName != "m" || o.DB != 1 || o.SentinelPassword != "sp" {
					return fmt.Errorf("%+v", o)
				}
				return nil
			}},
		{name: "tls with system roots", cfg: Config{Addrs: []string{"r:6379"}, TLS: true, TLSServerName: "redis.example"},
			check: func(o *redis.UniversalOptions) error {
				if o.TLSConfig == nil || o.TLSConfig.ServerName != "redis.example" || o.TLSConfig.RootCAs != nil || o.Dialer != nil {
					return fmt.Errorf("%+v", o.TLSConfig)
				}
				return nil
			}},
		{name: "tls directory: a dialer of its own", cfg: Config{Addrs: []string{"r:6379"}, TLS: true, TLSDir: "/etc/redis-tls"},
			check: func(o *redis.UniversalOptions) error {
				if o.Dialer == nil || o.TLSConfig != nil {
					return errors.New("no TLS directory dialer")
				}
				return nil
			}},
		{name: "invalid", cfg: Config{}, wantErr: true},
		{name: "missing CA file", cfg: Config{Addrs: []string{"a:1"}, TLS: true, TLSCAFile: "/nonexistent"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := tc.cfg.UniversalOptions()
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if tc.check != nil {
				if err := tc.check(o); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// TestValidate: one table for every rule of the one validator, which the
// manager, the sidecar and the rate limit service all apply. A case with
// no wantErr is valid.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "standalone", cfg: Config{Mode: Standalone, Addrs: []string{"redis:6379"}}},
		{name: "cluster", cfg: Config{Mode: Cluster, Addrs: []string{"a:7000", "b:7001"}, TLS: true, TLSServerName: "redis.data.svc"}},
		{name: "sentinel", cfg: Config{Mode: Sentinel, Addrs: []string{"s1:26379", "s2:26379"}, MasterName: "mymaster"}},
		{name: "client certificate", cfg: Config{Mode: Standalone, Addrs: []string{"a:1"}, TLS: true, TLSCAFile: "ca", TLSCertFile: "c", TLSKeyFile: "k"}},
		{name: "TLS directory", cfg: Config{Mode: Standalone, Addrs: []string{"a:1"}, TLS: true, TLSDir: "/etc/redis-tls"}},

		{name: "no address", cfg: Config{}, wantErr: "--redis-addrs is required"},
		{name: "not host:port", cfg: Config{Mode: Standalone, Addrs: []string{"redis"}}, wantErr: `--redis-addrs: "redis" is not host:port`},
		{name: "standalone with two addresses", cfg: Config{Mode: Standalone, Addrs: []string{"a:1", "b:1"}}, wantErr: "--redis-mode=standalone takes one address, not 2"},
		{name: "sentinel without master", cfg: Config{Mode: Sentinel, Addrs: []string{"a:1"}}, wantErr: "--redis-mode=sentinel needs --redis-master-name"},
		{name: "master outside sentinel", cfg: Config{Mode: Cluster, Addrs: []string{"a:1"}, MasterName: "m"}, wantErr: "--redis-master-name is only for --redis-mode=sentinel"},
		{name: "cluster with a db", cfg: Config{Mode: Cluster, Addrs: []string{"a:1"}, DB: 1}, wantErr: "cluster mode has only database 0"},
		{name: "unknown mode", cfg: Config{Mode: "ring", Addrs: []string{"a:1"}}, wantErr: `--redis-mode "ring" is not standalone, cluster or sentinel`},
		{name: "empty mode", cfg: Config{Addrs: []string{"a:1"}}, wantErr: `--redis-mode "" is not standalone, cluster or sentinel`},
		{name: "server name without TLS", cfg: Config{Mode: Standalone, Addrs: []string{"a:1"}, TLSServerName: "r"}, wantErr: "--redis-tls-server-name needs --redis-tls"},
		{name: "CA without TLS", cfg: Config{Mode: Standalone, Addrs: []string{"a:1"}, TLSCAFile: "ca.pem"}, wantErr: "--redis-tls-ca-file needs --redis-tls"},
		{name: "TLS directory without TLS", cfg: Config{Mode: Standalone, Addrs: []string{"a:1"}, TLSDir: "/d"}, wantErr: "--redis-tls-dir needs --redis-tls"},
		{name: "TLS directory and CA file", cfg: Config{Mode: Standalone, Addrs: []string{"a:1"}, TLS: true, TLSDir: "/d", TLSCAFile: "ca"},
			wantErr: "--redis-tls-ca-file and --redis-tls-dir exclude each other"},
		{name: "TLS directory and client certificate", cfg: Config{Mode: Standalone, Addrs: []string{"a:1"}, TLS: true, TLSDir: "/d", TLSCertFile: "c", TLSKeyFile: "k"},
			wantErr: "a TLS directory excludes the client certificate files"},
		{name: "cert without key", cfg: Config{Mode: Standalone, Addrs: []string{"a:1"}, TLS: true, TLSCertFile: "c.pem"}, wantErr: "needs both TLSCertFile and TLSKeyFile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// ping dials through a client built from cfg and returns PING's error.
func ping(t *testing.T, cfg Config) error {
	t.Helper()
	rdb, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rdb.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return rdb.Ping(ctx).Err()
}

// TestTLS: a client connects over mutual TLS with a private CA, and not
// without its client certificate.
func TestTLS(t *testing.T) {
	t.Parallel()
	pki := testsupport.NewPKI(t)
	_, tlsAddr := testsupport.StartTLSRedis(t, pki, true)
	cfg := Config{
		Addrs:         []string{tlsAddr},
		TLS:           true,
		TLSCAFile:     pki.CA,
		TLSCertFile:   pki.ClientCert,
		TLSKeyFile:    pki.ClientKey,
		TLSServerName: "localhost",
	}
	if err := ping(t, cfg); err != nil {
		t.Fatalf("over TLS: %v", err)
	}
	cfg.TLSCertFile, cfg.TLSKeyFile = "", ""
	if err := ping(t, cfg); err == nil {
		t.Fatal("without a client certificate: connected")
	}
}

// TestTLSDir: with a TLS directory (a mounted Secret) the client reads the
// CA and client certificate for every new connection, so files that arrive
// after the start are used without a restart. The server's name and CA are
// still verified: a wrong CA or name never connects.
func TestTLSDir(t *testing.T) {
	t.Parallel()
	pki := testsupport.NewPKI(t)
	_, addr := testsupport.StartTLSRedis(t, pki, true)
	copyTo := func(dir string, files map[string]string) {
		t.Helper()
		for name, src := range files {
			b, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}

	dir := t.TempDir()
	rdb, err := NewClient(Config{Addrs: []string{addr}, TLS: true, TLSDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	pingOnce := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return rdb.Ping(ctx).Err()
	}
	// Empty: the system roots do not know the private CA.
	if err := pingOnce(); err == nil {
		t.Fatal("without the CA: connected")
	}
	// The CA alone: the server still wants a client certificate.
	copyTo(dir, map[string]string{TLSDirCA: pki.CA})
	if err := pingOnce(); err == nil {
		t.Fatal("without a client certificate: connected")
	}
	// The whole Secret arrives: the same client connects.
	copyTo(dir, map[string]string{TLSDirCert: pki.ClientCert, TLSDirKey: pki.ClientKey})
	testsupport.Eventually(t, 10*time.Second, 50*time.Millisecond, "files in place, connected", pingOnce)

	// Verification stays on: another CA, or another server name, fails.
	other := testsupport.NewPKI(t)
	wrongCA := t.TempDir()
	copyTo(wrongCA, map[string]string{TLSDirCA: other.CA, TLSDirCert: pki.ClientCert, TLSDirKey: pki.ClientKey})
	if err := ping(t, Config{Addrs: []string{addr}, TLS: true, TLSDir: wrongCA}); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("server certificate from another CA: %v", err)
	}
	if err := ping(t, Config{Addrs: []string{addr}, TLS: true, TLSDir: dir, TLSServerName: "redis.elsewhere"}); err == nil || !strings.Contains(err.Error(), "redis.elsewhere") {
		t.Fatalf("server certificate for another name: %v", err)
	}
	if err := ping(t, Config{Addrs: []string{addr}, TLS: true, TLSDir: dir, TLSServerName: "localhost"}); err != nil {
		t.Fatalf("server name that the certificate carries (an IP is dialled): %v", err)
	}

	// The kubelet's layout: files are links into ..data, swapped at once.
	kube := t.TempDir()
	version := func(name string, files map[string]string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(kube, name), 0o755); err != nil {
			t.Fatal(err)
		}
		copyTo(filepath.Join(kube, name), files)
		tmp := filepath.Join(kube, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(kube, "..data")); err != nil {
			t.Fatal(err)
		}
		for f := range files {
			_ = os.Symlink(filepath.Join("..data", f), filepath.Join(kube, f)) // exists after the first version
		}
	}
	version("..v1", map[string]string{TLSDirCA: pki.CA, TLSDirCert: pki.ClientCert, TLSDirKey: pki.ClientKey})
	if err := ping(t, Config{Addrs: []string{addr}, TLS: true, TLSDir: kube}); err != nil {
		t.Fatalf("kubelet layout: %v", err)
	}
	version("..v2", map[string]string{TLSDirCA: other.CA, TLSDirCert: pki.ClientCert, TLSDirKey: pki.ClientKey})
	if err := ping(t, Config{Addrs: []string{addr}, TLS: true, TLSDir: kube}); err == nil {
		t.Fatal("after the swap to another CA, a new connection still verified with the old one")
	}

	// Half a client certificate is an error that says so.
	half := t.TempDir()
	copyTo(half, map[string]string{TLSDirCA: pki.CA, TLSDirCert: pki.ClientCert})
	if err := ping(t, Config{Addrs: []string{addr}, TLS: true, TLSDir: half}); err == nil || !strings.Contains(err.Error(), "needs both") {
		t.Fatalf("tls.crt without tls.key: %v", err)
	}
}

func TestClientLogsAreStructured(t *testing.T) {
	var b strings.Builder
	l := clientLogger{slog.New(slog.NewJSONHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	l.Printf(context.Background(), "sentinel: new master=%q addr=%q", "shop-redis", "10.0.0.7:6379")
	var line map[string]any
	if err := json.Unmarshal([]byte(b.String()), &line); err != nil {
		t.Fatalf("not one JSON line: %q: %v", b.String(), err)
	}
	if line["level"] != "DEBUG" || line["msg"] != "redis client" || line["message"] != `sentinel: new master="shop-redis" addr="10.0.0.7:6379"` {
		t.Errorf("line %v", line)
	}
}
