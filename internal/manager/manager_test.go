package manager

import (
	"flag"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/internal/cli"
	"github.com/slidegate/slidegate/internal/inject"
)

// TestSidecarPortFlags: the port flags reach the injector's options, their
// defaults are the injector's, and impossible ports are refused by name.
func TestSidecarPortFlags(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		args                  []string
		wantListen, wantAdmin int32
		wantErr               string
	}{
		{name: "defaults", wantListen: inject.DefaultListenPort, wantAdmin: inject.DefaultAdminPort},
		{name: "set", args: []string{"--sidecar-listen-port=18080", "--sidecar-admin-port=18090"}, wantListen: 18080, wantAdmin: 18090},
		{name: "listen zero", args: []string{"--sidecar-listen-port=0"}, wantErr: "--sidecar-listen-port=0: not a port number (1-65535)"},
		{name: "admin too big", args: []string{"--sidecar-admin-port=65536"}, wantErr: "--sidecar-admin-port=65536: not a port number (1-65535)"},
		{name: "admin negative", args: []string{"--sidecar-admin-port=-1"}, wantErr: "--sidecar-admin-port=-1: not a port number"},
		{name: "same port", args: []string{"--sidecar-listen-port=9000", "--sidecar-admin-port=9000"},
			wantErr: "--sidecar-listen-port and --sidecar-admin-port are both 9000"},
		{name: "same as the other's default", args: []string{"--sidecar-admin-port=" + itoa(inject.DefaultListenPort)},
			wantErr: "are both " + itoa(inject.DefaultListenPort)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o options
			fs := flag.NewFlagSet("manager", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o.bindFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := o.completeSidecarPorts()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := o.webhook.Inject; got.ListenPort != tc.wantListen || got.AdminPort != tc.wantAdmin {
				t.Errorf("injector ports = %d, %d, want %d, %d", got.ListenPort, got.AdminPort, tc.wantListen, tc.wantAdmin)
			}
		})
	}
}

func itoa(p int32) string { return strconv.Itoa(int(p)) }

// TestFlagsFromEnvironment: every manager flag is also SLIDEGATE_<FLAG>
// (the install's Redis ConfigMap sets --redis-mode and --redis-addrs that
// way), a flag on the command line beats it, and Command applies it before
// the configuration is checked (a wrong value from the environment stops
// the manager with a usage error, not a run on the default).
func TestFlagsFromEnvironment(t *testing.T) {
	env := map[string]string{
		"SLIDEGATE_REDIS_MODE":    "cluster",
		"SLIDEGATE_REDIS_ADDRS":   "redis-0.example:6379, redis-1.example:6379",
		"SLIDEGATE_SIDECAR_IMAGE": "registry.example/slidegate:v9@sha256:" + strings.Repeat("a", 64),
	}
	for _, tc := range []struct {
		name      string
		args      []string
		wantAddrs string
	}{
		{name: "environment", wantAddrs: "redis-0.example:6379,redis-1.example:6379"},
		{name: "flag beats environment", args: []string{"--redis-addrs=flag.example:6379"}, wantAddrs: "flag.example:6379"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o options
			fs := flag.NewFlagSet("manager", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o.bindFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if err := cli.ApplyEnv(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(o.redis.Config.Addrs, ","); got != tc.wantAddrs {
				t.Errorf("redis addrs = %q, want %q", got, tc.wantAddrs)
			}
			if o.redis.Config.Mode != "cluster" {
				t.Errorf("redis mode = %q, want cluster", o.redis.Config.Mode)
			}
			if o.webhook.Inject.Image != env["SLIDEGATE_SIDECAR_IMAGE"] {
				t.Errorf("sidecar image = %q, want %q", o.webhook.Inject.Image, env["SLIDEGATE_SIDECAR_IMAGE"])
			}
		})
	}
	t.Run("Command applies it", func(t *testing.T) {
		t.Setenv("SLIDEGATE_REDIS_ADDRS", "redis.example:6379")
		t.Setenv("SLIDEGATE_REDIS_MODE", "not-a-mode")
		// Main reports on os.Stderr: read it through a pipe.
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		stderr := os.Stderr
		os.Stderr = w
		fs := flag.NewFlagSet("manager", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		code := Command().Main(fs, nil)
		os.Stderr = stderr
		_ = w.Close()
		out, _ := io.ReadAll(r)
		if want := `--redis-mode "not-a-mode"`; code != cli.ExitUsage || !strings.Contains(string(out), want) || strings.Contains(string(out), "--redis-addrs is required") {
			t.Fatalf("exit code %d, stderr %q; want %d and %s from the environment, the addresses taken from it", code, out, cli.ExitUsage, want)
		}
	})
}
