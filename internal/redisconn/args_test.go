package redisconn

import (
	"flag"
	"io"
	"reflect"
	"testing"
)

// TestArgsRoundTrip: what Args writes, RegisterFlags reads back as the same
// connection, so the injector's sidecar arguments and the sidecar's flags
// cannot drift apart (the names were spelled in three places).
func TestArgsRoundTrip(t *testing.T) {
	for _, c := range []Config{
		{Mode: Standalone, Addrs: []string{"redis:6379"}, CredentialsDir: "/etc/creds"},
		{Mode: Cluster, Addrs: []string{"a:6379", "b:6379", "c:6379"}},
		{Mode: Sentinel, Addrs: []string{"s1:26379", "s2:26379"}, MasterName: "mymaster", CredentialsDir: "/etc/creds"},
		{Mode: Standalone, Addrs: []string{"redis:6380"}, TLS: true, TLSDir: "/etc/tls", TLSServerName: "redis.internal", TLSCAFile: "/etc/ca.pem"},
		{},
	} {
		var got Config
		fs := flag.NewFlagSet("sidecar", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		got.RegisterFlags(fs)
		if err := fs.Parse(c.Args()); err != nil {
			t.Fatalf("%v: parsing %q: %v", c, c.Args(), err)
		}
		if !reflect.DeepEqual(got, c) {
			t.Errorf("Args %q read back as %#v, want %#v", c.Args(), got, c)
		}
	}
	// TLS settings without TLS are not written: the sidecar would refuse them.
	if args := (Config{Mode: Standalone, Addrs: []string{"r:1"}, TLSServerName: "x"}).Args(); len(args) != 2 {
		t.Errorf("Args without TLS = %q", args)
	}
}
