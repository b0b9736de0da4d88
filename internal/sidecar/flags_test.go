package sidecar

import (
	"bytes"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/redisconn"
)

func TestFlagsAndEnv(t *testing.T) {
	o := DefaultOptions()
	fs := flag.NewFlagSet("sidecar", flag.ContinueOnError)
	o.RegisterFlags(fs)
	if err := fs.Parse([]string{"--listen-address=:9000", "--redis-addrs", "a:1, b:2", "--redis-mode=cluster"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"SLIDEGATE_LISTEN_ADDRESS":    ":1111", // the flag wins
		"SLIDEGATE_DECISION_TIMEOUT":  "75ms",
		"SLIDEGATE_FALLBACK_REPLICAS": "3",
		"SLIDEGATE_REDIS_TLS":         "true",
		"REDIS_USERNAME":              "slidegate",
		"REDIS_PASSWORD":              "hunter2",
		"REDIS_SENTINEL_PASSWORD":     "sentinel-hunter3",
	}
	if err := o.ApplyEnv(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	if o.ListenAddress != ":9000" || o.DecisionTimeout != 75*time.Millisecond || o.FallbackReplicas != 3 ||
		!o.Redis.TLS || o.Redis.Mode != "cluster" || fmt.Sprint(o.Redis.Addrs) != "[a:1 b:2]" ||
		o.Redis.Username != "slidegate" || o.Redis.Password != "hunter2" || o.Redis.SentinelPassword != "sentinel-hunter3" ||
		o.Redis.SentinelUsername != "" {
		t.Errorf("options %+v", o)
	}
	if err := o.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	// The injector relies on these names.
	for _, name := range []string{"listen-address", "admin-address", "debug-address", "client-hash-key-file", "upstream", "config-file", "pod-labels-file",
		"redis-mode", "redis-addrs", "redis-master-name", "redis-tls", "redis-tls-dir", "redis-tls-server-name", "fallback-replicas", "key-prefix",
		"decision-timeout", "shutdown-timeout", "redis-credentials-dir", "redis-functions"} {
		if fs.Lookup(name) == nil {
			t.Errorf("flag --%s missing", name)
		}
	}
	for _, secret := range []string{"redis-password", "redis-username", "client-hash-key"} {
		if fs.Lookup(secret) != nil {
			t.Errorf("--%s must not be a flag (environment only)", secret)
		}
	}

	// Credentials never reach a log line or a %v.
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("starting", "redis", o.Redis)
	if s := buf.String() + fmt.Sprint(o.Redis) + fmt.Sprintf("%+v", o.Redis); strings.Contains(s, "hunter") {
		t.Errorf("password leaked: %s", s)
	}

	// With a credentials directory the environment's credentials are not
	// read: the files are, for every new connection.
	dirOpts := DefaultOptions()
	fs = flag.NewFlagSet("sidecar", flag.ContinueOnError)
	dirOpts.RegisterFlags(fs)
	if err := fs.Parse([]string{"--redis-credentials-dir=/etc/slidegate/redis-credentials", "--redis-functions"}); err != nil {
		t.Fatal(err)
	}
	if err := dirOpts.ApplyEnv(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	if dirOpts.Redis.Username != "" || dirOpts.Redis.Password != "" || !dirOpts.RedisFunctions || dirOpts.limiterOptions().Functions != true {
		t.Errorf("with --redis-credentials-dir: %+v", dirOpts)
	}
	if err := dirOpts.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}

	bad := DefaultOptions()
	fs = flag.NewFlagSet("sidecar", flag.ContinueOnError)
	bad.RegisterFlags(fs)
	if err := bad.ApplyEnv(fs, func(k string) (string, bool) { return "x", k == "SLIDEGATE_DECISION_TIMEOUT" }); err == nil {
		t.Error("a malformed environment value must be an error")
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Options)
	}{
		{"same ports", func(o *Options) { o.AdminAddress = o.ListenAddress }},
		// /debug must not be reachable from the pod network.
		{"debug on every address", func(o *Options) { o.DebugAddress = ":15291" }},
		{"debug on 0.0.0.0", func(o *Options) { o.DebugAddress = "0.0.0.0:15291" }},
		{"debug on [::]", func(o *Options) { o.DebugAddress = "[::]:15291" }},
		{"debug on a pod IP", func(o *Options) { o.DebugAddress = "10.244.0.7:15291" }},
		{"debug on a name", func(o *Options) { o.DebugAddress = "localhost:15291" }},
		{"debug without a port", func(o *Options) { o.DebugAddress = "127.0.0.1" }},
		{"https upstream", func(o *Options) { o.Upstream = "https://127.0.0.1:8443" }},
		{"upstream without host", func(o *Options) { o.Upstream = "http://" }},
		{"unknown upstream protocol", func(o *Options) { o.UpstreamProtocol = "h3" }},
		{"sentinel without master", func(o *Options) { o.Redis.Mode = redisconn.Sentinel }},
		{"standalone with two addrs", func(o *Options) { o.Redis.Addrs = []string{"a:1", "b:1"} }},
		{"no redis", func(o *Options) { o.Redis.Addrs = nil }},
		{"zero replicas", func(o *Options) { o.FallbackReplicas = 0 }},
		{"zero timeout", func(o *Options) { o.DecisionTimeout = 0 }},
		{"bad log level", func(o *Options) { o.LogLevel = "loud" }},
		{"CA without TLS", func(o *Options) { o.Redis.TLSCAFile = "/ca.pem" }},
		{"TLS directory without TLS", func(o *Options) { o.Redis.TLSDir = "/etc/slidegate/redis-tls" }},
		{"TLS directory and CA file", func(o *Options) {
			o.Redis.TLS, o.Redis.TLSDir, o.Redis.TLSCAFile = true, "/etc/slidegate/redis-tls", "/ca.pem"
		}},
	} {
		o := DefaultOptions()
		tc.mod(&o)
		if err := o.Validate(); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	if o := DefaultOptions(); o.Validate() != nil {
		t.Errorf("defaults invalid: %v", o.Validate())
	}
	for _, debug := range []string{"127.0.0.1:15291", "127.0.0.2:1", "[::1]:15291"} {
		o := DefaultOptions()
		o.DebugAddress = debug
		if err := o.Validate(); err != nil {
			t.Errorf("--debug-address=%s: %v", debug, err)
		}
	}
}
