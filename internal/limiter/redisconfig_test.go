package limiter

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

func TestRedisConfigOptions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     RedisConfig
		wantErr bool
		check   func(*redis.UniversalOptions) error
	}{
		{name: "standalone", cfg: RedisConfig{Addrs: []string{"r:6379"}, Username: "u", Password: "p", DB: 2},
			check: func(o *redis.UniversalOptions) error {
				if o.Username != "u" || o.Password != "p" || o.DB != 2 || !o.ContextTimeoutEnabled || o.MaxRetries != -1 {
					return fmt.Errorf("%+v", o)
				}
				return nil
			}},
		{name: "cluster", cfg: RedisConfig{Mode: RedisCluster, Addrs: []string{"a:1"}},
			check: func(o *redis.UniversalOptions) error {
				if !o.IsClusterMode {
					return errors.New("not cluster mode")
				}
				return nil
			}},
		{name: "sentinel", cfg: RedisConfig{Mode: RedisSentinel, Addrs: []string{"s1:26379", "s2:26379"}, MasterName: "m", SentinelPassword: "sp"},
			check: func(o *redis.UniversalOptions) error {
				if o.MasterName != "m" || o.SentinelPassword != "sp" {
					return fmt.Errorf("%+v", o)
				}
				return nil
			}},
		{name: "tls with system roots", cfg: RedisConfig{Addrs: []string{"r:6379"}, TLS: true, ServerName: "redis.example"},
			check: func(o *redis.UniversalOptions) error {
				if o.TLSConfig == nil || o.TLSConfig.ServerName != "redis.example" || o.TLSConfig.RootCAs != nil {
					return fmt.Errorf("%+v", o.TLSConfig)
				}
				return nil
			}},
		{name: "no address", cfg: RedisConfig{}, wantErr: true},
		{name: "standalone with two addresses", cfg: RedisConfig{Addrs: []string{"a:1", "b:1"}}, wantErr: true},
		{name: "sentinel without master", cfg: RedisConfig{Mode: RedisSentinel, Addrs: []string{"a:1"}}, wantErr: true},
		{name: "cluster with a db", cfg: RedisConfig{Mode: RedisCluster, Addrs: []string{"a:1"}, DB: 1}, wantErr: true},
		{name: "unknown mode", cfg: RedisConfig{Mode: "ring", Addrs: []string{"a:1"}}, wantErr: true},
		{name: "CA without TLS", cfg: RedisConfig{Addrs: []string{"a:1"}, CAFile: "ca.pem"}, wantErr: true},
		{name: "missing CA file", cfg: RedisConfig{Addrs: []string{"a:1"}, TLS: true, CAFile: "/nonexistent"}, wantErr: true},
		{name: "cert without key", cfg: RedisConfig{Addrs: []string{"a:1"}, TLS: true, CertFile: "c.pem"}, wantErr: true},
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

// TestACLUser: the limiter works as an ACL user restricted to its key
// prefix (which also proves that every key a script touches is declared),
// and a wrong password sends decisions to the fallback with the error.
func TestACLUser(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	if _, err := r.Do(append([]string{"ACL", "SETUSER", "limiter", "on", ">s3cret"}, ACLRules("")...)...); err != nil {
		t.Fatal(err)
	}
	good := newLimiter(t, client(t, RedisConfig{Addrs: []string{r.Addr}, Username: "limiter", Password: "s3cret"}), Options{})
	rule := Rule{ID: "ns/acl", Limit: 2, Window: time.Minute}
	reqs := []Request{{Rule: rule, Client: "c"}, {Rule: Rule{ID: "ns/acl2", Limit: 5, Window: time.Minute, Algorithm: SlidingWindowCounter}, Client: "c"}}
	for i := range 3 {
		ds := good.Decide(context.Background(), reqs)
		for _, d := range ds {
			if d.Source != SourceRedis || d.Err != nil {
				t.Fatalf("decision %d as ACL user: %+v", i, d)
			}
		}
	}
	// The scripts' commands are checked too: without ZADD the user fails.
	if _, err := r.Do("ACL", "SETUSER", "limiter", "-zadd"); err != nil {
		t.Fatal(err)
	}
	if d := one(good, Rule{ID: "ns/acl3", Limit: 2, Window: time.Minute}, "c"); d.Source != SourceFallback || d.Err == nil {
		t.Fatalf("without +zadd: %+v", d)
	}
	bad := newLimiter(t, client(t, RedisConfig{Addrs: []string{r.Addr}, Username: "limiter", Password: "wrong"}), Options{})
	d := one(bad, rule, "c")
	if d.Source != SourceFallback || d.Err == nil {
		t.Fatalf("wrong password: %+v", d)
	}
	t.Logf("wrong password: %v", d.Err)
}

// TestTLS: the limiter decides over mutual TLS with a private CA.
func TestTLS(t *testing.T) {
	t.Parallel()
	pki := testsupport.NewPKI(t)
	_, tlsAddr := testsupport.StartTLSRedis(t, pki, true)
	cfg := RedisConfig{
		Addrs:      []string{tlsAddr},
		TLS:        true,
		CAFile:     pki.CA,
		CertFile:   pki.ClientCert,
		KeyFile:    pki.ClientKey,
		ServerName: "localhost",
	}
	l := newLimiter(t, client(t, cfg), Options{Timeout: 2 * time.Second})
	if d := one(l, Rule{ID: "ns/tls", Limit: 1, Window: time.Minute}, "c"); d.Source != SourceRedis || !d.Allowed {
		t.Fatalf("over TLS: %+v", d)
	}
	// Without the client certificate the server refuses the handshake.
	cfg.CertFile, cfg.KeyFile = "", ""
	l2 := newLimiter(t, client(t, cfg), Options{Timeout: 2 * time.Second})
	if d := one(l2, Rule{ID: "ns/tls", Limit: 1, Window: time.Minute}, "c"); d.Source != SourceFallback || d.Err == nil {
		t.Fatalf("without a client certificate: %+v", d)
	}
}

// TestTLSDir: with a TLS directory (a mounted Secret) the limiter reads
// the CA and client certificate for every new connection, so files that
// arrive after the start are used without a restart. The server's name and
// CA are still verified: a wrong CA or name never connects.
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
	rule := Rule{ID: "ns/tlsdir", Limit: 1000, Window: time.Minute}
	opts := Options{Timeout: 2 * time.Second, ProbeInterval: 50 * time.Millisecond}

	dir := t.TempDir()
	l := newLimiter(t, client(t, RedisConfig{Addrs: []string{addr}, TLS: true, TLSDir: dir}), opts)
	// Empty: the system roots do not know the private CA.
	if d := one(l, rule, "c"); d.Source != SourceFallback || d.Err == nil {
		t.Fatalf("without the CA: %+v", d)
	}
	// The CA alone: the server still wants a client certificate.
	copyTo(dir, map[string]string{TLSCAFile: pki.CA})
	if d := one(l, rule, "c"); d.Source != SourceFallback || d.Err == nil {
		t.Fatalf("without a client certificate: %+v", d)
	}
	// The whole Secret arrives: the same limiter connects.
	copyTo(dir, map[string]string{TLSCertFile: pki.ClientCert, TLSKeyFile: pki.ClientKey})
	if _, ok := eventually(10*time.Second, func() bool { return one(l, rule, "c").Source == SourceRedis }); !ok {
		t.Fatalf("files in place, still not deciding by Redis: %+v", one(l, rule, "c"))
	}

	// Verification stays on: another CA, or another server name, fails.
	other := testsupport.NewPKI(t)
	wrongCA := t.TempDir()
	copyTo(wrongCA, map[string]string{TLSCAFile: other.CA, TLSCertFile: pki.ClientCert, TLSKeyFile: pki.ClientKey})
	if d := one(newLimiter(t, client(t, RedisConfig{Addrs: []string{addr}, TLS: true, TLSDir: wrongCA}), opts), rule, "c"); d.Source != SourceFallback || d.Err == nil || !strings.Contains(d.Err.Error(), "unknown authority") {
		t.Fatalf("server certificate from another CA accepted: %+v", d)
	}
	if d := one(newLimiter(t, client(t, RedisConfig{Addrs: []string{addr}, TLS: true, TLSDir: dir, ServerName: "redis.elsewhere"}), opts), rule, "c"); d.Source != SourceFallback || d.Err == nil || !strings.Contains(d.Err.Error(), "redis.elsewhere") {
		t.Fatalf("server certificate accepted for another name: %+v", d)
	}
	if d := one(newLimiter(t, client(t, RedisConfig{Addrs: []string{addr}, TLS: true, TLSDir: dir, ServerName: "localhost"}), opts), rule, "c"); d.Source != SourceRedis {
		t.Fatalf("server name that the certificate carries (an IP is dialled): %+v", d)
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
	all := map[string]string{TLSCAFile: pki.CA, TLSCertFile: pki.ClientCert, TLSKeyFile: pki.ClientKey}
	version("..v1", all)
	if d := one(newLimiter(t, client(t, RedisConfig{Addrs: []string{addr}, TLS: true, TLSDir: kube}), opts), rule, "c"); d.Source != SourceRedis {
		t.Fatalf("kubelet layout: %+v", d)
	}
	version("..v2", map[string]string{TLSCAFile: other.CA, TLSCertFile: pki.ClientCert, TLSKeyFile: pki.ClientKey})
	if d := one(newLimiter(t, client(t, RedisConfig{Addrs: []string{addr}, TLS: true, TLSDir: kube}), opts), rule, "c"); d.Source != SourceFallback {
		t.Fatalf("after the swap to another CA, a new connection still verified with the old one: %+v", d)
	}

	// Half a client certificate is an error that says so.
	half := t.TempDir()
	copyTo(half, map[string]string{TLSCAFile: pki.CA, TLSCertFile: pki.ClientCert})
	d := one(newLimiter(t, client(t, RedisConfig{Addrs: []string{addr}, TLS: true, TLSDir: half}), opts), rule, "c")
	if d.Err == nil || !strings.Contains(d.Err.Error(), "needs both") {
		t.Fatalf("tls.crt without tls.key: %+v", d)
	}
	if _, err := (RedisConfig{Addrs: []string{addr}, TLS: true, TLSDir: dir, CAFile: pki.CA}).UniversalOptions(); err == nil {
		t.Error("a TLS directory and a CA file together: no error")
	}
	if _, err := (RedisConfig{Addrs: []string{addr}, TLSDir: dir}).UniversalOptions(); err == nil {
		t.Error("a TLS directory without TLS: no error")
	}
}

// TestSentinel: the limiter finds the master through a Sentinel.
func TestSentinel(t *testing.T) {
	t.Parallel()
	master := testsupport.StartRedis(t)
	sentinel := testsupport.StartSentinel(t, master, "mymaster", "")
	rdb := client(t, RedisConfig{Mode: RedisSentinel, Addrs: []string{sentinel.Addr}, MasterName: "mymaster"})
	l := newLimiter(t, rdb, Options{Timeout: 2 * time.Second})
	if l.grouping != groupAll {
		t.Errorf("sentinel client grouping %v, want all keys in one script", l.grouping)
	}
	if d := one(l, Rule{ID: "ns/sentinel", Limit: 1, Window: time.Minute}, "c"); d.Source != SourceRedis || !d.Allowed {
		t.Fatalf("through sentinel: %+v", d)
	}
	if n, _ := master.Do("EXISTS", Key(defaultPrefix, "ns/sentinel", "c")); n != "1" {
		t.Error("the key is not on the master")
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
