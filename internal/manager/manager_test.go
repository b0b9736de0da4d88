package manager

import (
	"flag"
	"io"
	"strconv"
	"strings"
	"testing"

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
