package redisconn

import (
	"bytes"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestFlagsAndCredentials(t *testing.T) {
	c := Config{Mode: Standalone, Addrs: []string{DefaultAddr}}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse([]string{"--redis-mode=cluster", "--redis-addrs", " a:1, ,b:2 ", "--redis-tls", "--redis-tls-dir=/d"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{EnvUsername: "slidegate", EnvPassword: "hunter2", EnvSentinelPassword: "sentinel-hunter3"}
	c.ApplyEnvCredentials(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if c.Mode != Cluster || fmt.Sprint(c.Addrs) != "[a:1 b:2]" || !c.TLS || c.TLSDir != "/d" ||
		c.Username != "slidegate" || c.Password != "hunter2" || c.SentinelPassword != "sentinel-hunter3" {
		t.Errorf("config %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	// Credentials never reach a log line or a %v.
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("starting", "redis", c)
	if s := buf.String() + fmt.Sprint(c) + fmt.Sprintf("%+v", c); strings.Contains(s, "hunter") {
		t.Errorf("password leaked: %s", s)
	}
}
