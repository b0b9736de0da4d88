package sidecarconfig

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestParseTrustedProxies: the manager's flag, as rendered into the
// document. The IPv4-mapped rows are what the manager used to render
// unmapped (::ffff:10.0.0.0/104 as is), which only the sidecar mapped back
// to IPv4; now the document carries what the sidecar matches with.
func TestParseTrustedProxies(t *testing.T) {
	tests := []struct {
		in      []string
		want    []string
		wantErr bool
	}{
		{in: nil, want: nil},
		{in: []string{"10.0.0.0/8"}, want: []string{"10.0.0.0/8"}},
		{in: []string{" 192.168.1.7 ", "10.9.9.9/8", "10.0.0.0/8", "", "fd00::1/8"}, want: []string{"10.0.0.0/8", "192.168.1.7/32", "fd00::/8"}},
		{in: []string{"::1"}, want: []string{"::1/128"}},
		{in: []string{"fe80::1%eth0"}, want: []string{"fe80::1/128"}},
		// IPv4-mapped IPv6: the IPv4 prefix it covers.
		{in: []string{"::ffff:10.0.0.0/104"}, want: []string{"10.0.0.0/8"}},
		{in: []string{"::ffff:10.1.2.3/104"}, want: []string{"10.0.0.0/8"}},
		{in: []string{"::ffff:192.168.1.7"}, want: []string{"192.168.1.7/32"}},
		{in: []string{"::ffff:0:0/96"}, want: []string{"0.0.0.0/0"}},
		{in: []string{"::ffff:10.0.0.0/90"}, want: []string{"0.0.0.0/0"}},
		{in: []string{"10.0.0.0/8", "::ffff:10.0.0.0/104", "fd00::/8"}, want: []string{"10.0.0.0/8", "fd00::/8"}},
		// An IPv6 prefix that merely contains mapped addresses stays IPv6.
		{in: []string{"::/0"}, want: []string{"::/0"}},
		{in: []string{"10.0.0.0/33"}, wantErr: true},
		{in: []string{"proxy.example"}, wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseTrustedProxies(tt.in)
		if tt.wantErr {
			if err == nil {
				t.Errorf("ParseTrustedProxies(%q) = %v; want an error", tt.in, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseTrustedProxies(%q): %v", tt.in, err)
			continue
		}
		var s []string
		for _, p := range got {
			s = append(s, p.String())
			// What the manager renders, the sidecar reads back unchanged.
			if back, err := ParseTrustedProxy(p.String()); err != nil || back != p {
				t.Errorf("rendered %s reads back as %v, %v", p, back, err)
			}
		}
		if diff := cmp.Diff(tt.want, s); diff != "" {
			t.Errorf("ParseTrustedProxies(%q) (-want +got):\n%s", tt.in, diff)
		}
	}
}

// TestParseTrustedProxy: one document entry, as the sidecar and Validate
// read it. A document carries CIDRs only; the flag's bare addresses are
// rendered as /32 or /128.
func TestParseTrustedProxy(t *testing.T) {
	for _, tt := range []struct {
		in, want string
	}{
		{in: "10.0.0.0/8", want: "10.0.0.0/8"},
		{in: "10.1.2.3/8", want: "10.0.0.0/8"},
		{in: "2001:db8::1/32", want: "2001:db8::/32"},
		{in: "::ffff:10.0.0.0/104", want: "10.0.0.0/8"},
		{in: "::ffff:192.168.0.0/112", want: "192.168.0.0/16"},
		{in: "::ffff:10.0.0.0/90", want: "0.0.0.0/0"},
		{in: "10.0.0.1"},
		{in: "fe80::1%eth0/64"},
		{in: "unknown"},
	} {
		got, err := ParseTrustedProxy(tt.in)
		if tt.want == "" {
			if err == nil {
				t.Errorf("ParseTrustedProxy(%q) = %v; want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got.String() != tt.want {
			t.Errorf("ParseTrustedProxy(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

// FuzzParseTrustedProxy: a document's entry is untrusted input. Whatever
// parses is canonical (masked, never IPv4-mapped) and reads back unchanged,
// and the mapped and unmapped forms of an address are trusted alike.
func FuzzParseTrustedProxy(f *testing.F) {
	for _, s := range []string{"10.0.0.0/8", "::ffff:10.0.0.0/104", "::ffff:0:0/80", "fd00::/8", "0.0.0.0/0", "::/0", "1.2.3.4/33", ""} {
		f.Add(s, "10.1.2.3")
	}
	f.Fuzz(func(t *testing.T, s, addr string) {
		p, err := ParseTrustedProxy(s)
		if err != nil {
			return
		}
		if !p.IsValid() || p != p.Masked() || p.Addr().Is4In6() {
			t.Fatalf("ParseTrustedProxy(%q) = %v: not canonical", s, p)
		}
		if back, err := ParseTrustedProxy(p.String()); err != nil || back != p {
			t.Fatalf("ParseTrustedProxy(%q) = %v reads back as %v, %v", s, p, back, err)
		}
		a, err := netip.ParseAddr(addr)
		if err != nil || !a.Is4() {
			return
		}
		if raw := netip.MustParsePrefix(s); raw.Addr().Is4In6() {
			if mapped, plain := raw.Masked().Contains(netip.AddrFrom16(a.As16())), p.Contains(a); mapped != plain {
				t.Fatalf("%q contains ::ffff:%s: %v, but %v contains %s: %v", s, a, mapped, p, a, plain)
			}
		}
	})
}
