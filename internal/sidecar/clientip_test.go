package sidecar

import (
	"net/http/httptest"
	"strings"
	"testing"
)

func TestClientIP(t *testing.T) {
	trusted, err := parseTrustedProxies([]string{"10.0.0.0/8", "fd00::/8", "::ffff:192.168.0.0/112"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		peer    string
		headers map[string][]string
		// mode is the header read; forwardedXFF (no key.forwardedHeader)
		// unless set.
		mode forwardedMode
		want string
	}{
		{name: "untrusted peer: headers ignored", peer: "203.0.113.9:4000",
			headers: map[string][]string{"X-Forwarded-For": {"1.1.1.1"}}, want: "203.0.113.9"},
		{name: "untrusted peer forging a trusted chain", peer: "203.0.113.9:4000",
			headers: map[string][]string{"X-Forwarded-For": {"1.1.1.1, 10.0.0.1"}}, want: "203.0.113.9"},
		{name: "trusted peer, no headers", peer: "10.1.2.3:4000", want: "10.1.2.3"},
		{name: "trusted peer: right-most hop", peer: "10.1.2.3:4000",
			headers: map[string][]string{"X-Forwarded-For": {"198.51.100.7"}}, want: "198.51.100.7"},
		{name: "forged left part is ignored", peer: "10.1.2.3:4000",
			headers: map[string][]string{"X-Forwarded-For": {"6.6.6.6, 198.51.100.7"}}, want: "198.51.100.7"},
		{name: "chain of trusted proxies", peer: "10.1.2.3:4000",
			headers: map[string][]string{"X-Forwarded-For": {"6.6.6.6, 198.51.100.7, 10.9.9.9, 10.8.8.8"}}, want: "198.51.100.7"},
		{name: "several header lines", peer: "10.1.2.3:4000",
			headers: map[string][]string{"X-Forwarded-For": {"6.6.6.6, 198.51.100.7", "10.9.9.9"}}, want: "198.51.100.7"},
		{name: "all hops trusted: left-most", peer: "10.1.2.3:4000",
			headers: map[string][]string{"X-Forwarded-For": {"10.7.7.7, 10.9.9.9"}}, want: "10.7.7.7"},
		{name: "hop with port", peer: "10.1.2.3:4000",
			headers: map[string][]string{"X-Forwarded-For": {"198.51.100.7:5555"}}, want: "198.51.100.7"},
		{name: "IPv6 hop", peer: "[fd00::1]:4000",
			headers: map[string][]string{"X-Forwarded-For": {"2001:db8::7"}}, want: "2001:db8::7"},
		{name: "bracketed IPv6 hop with port", peer: "10.1.2.3:4000",
			headers: map[string][]string{"X-Forwarded-For": {"[2001:db8::7]:443"}}, want: "2001:db8::7"},
		{name: "IPv4-mapped peer is unmapped", peer: "[::ffff:10.1.2.3]:4000",
			headers: map[string][]string{"X-Forwarded-For": {"198.51.100.7"}}, want: "198.51.100.7"},
		{name: "IPv4-mapped trusted prefix", peer: "192.168.5.5:4000",
			headers: map[string][]string{"X-Forwarded-For": {"198.51.100.7"}}, want: "198.51.100.7"},
		{name: "garbage hop stops at the trusted proxy", peer: "10.1.2.3:4000",
			headers: map[string][]string{"X-Forwarded-For": {"198.51.100.7, garbage"}}, want: "10.1.2.3"},
		{name: "empty elements are skipped", peer: "10.1.2.3:4000",
			headers: map[string][]string{"X-Forwarded-For": {" , 198.51.100.7,, "}}, want: "198.51.100.7"},
		{name: "Forwarded", peer: "10.1.2.3:4000", mode: forwardedRFC7239,
			headers: map[string][]string{"Forwarded": {`for=6.6.6.6, for="[2001:db8::7]:4711";proto=https, for=10.2.2.2;by=10.0.0.1`}}, want: "2001:db8::7"},
		{name: "Forwarded quoted comma does not split", peer: "10.1.2.3:4000", mode: forwardedRFC7239,
			headers: map[string][]string{"Forwarded": {`for="6.6.6.6,10.2.2.2", For=198.51.100.7`}}, want: "198.51.100.7"},
		{name: "Forwarded unknown stops", peer: "10.1.2.3:4000", mode: forwardedRFC7239,
			headers: map[string][]string{"Forwarded": {`for=unknown`}}, want: "10.1.2.3"},
		{name: "X-Forwarded-For wins over Forwarded", peer: "10.1.2.3:4000",
			headers: map[string][]string{"X-Forwarded-For": {"198.51.100.7"}, "Forwarded": {"for=6.6.6.6"}}, want: "198.51.100.7"},
		{name: "zone is dropped", peer: "[fe80::1%eth0]:4000", want: "fe80::1"},

		// Issue 23: the header the trusted proxy writes decides, never the
		// one the client sent. Without a setting, X-Forwarded-For only (the
		// first release read Forwarded when there was no X-Forwarded-For,
		// so the client's own X-Forwarded-For won over the proxy's
		// Forwarded).
		{name: "Forwarded: the client's X-Forwarded-For is ignored", peer: "10.1.2.3:4000", mode: forwardedRFC7239,
			headers: map[string][]string{"X-Forwarded-For": {"6.6.6.6"}, "Forwarded": {"for=198.51.100.7"}}, want: "198.51.100.7"},
		{name: "Forwarded: a forged left part is ignored", peer: "10.1.2.3:4000", mode: forwardedRFC7239,
			headers: map[string][]string{"Forwarded": {"for=6.6.6.6, for=198.51.100.7;proto=https"}}, want: "198.51.100.7"},
		{name: "Forwarded: none written, the peer", peer: "10.1.2.3:4000", mode: forwardedRFC7239,
			headers: map[string][]string{"X-Forwarded-For": {"6.6.6.6"}}, want: "10.1.2.3"},
		{name: "X-Forwarded-For: the client's Forwarded is ignored", peer: "10.1.2.3:4000", mode: forwardedXFF,
			headers: map[string][]string{"X-Forwarded-For": {"198.51.100.7"}, "Forwarded": {"for=6.6.6.6"}}, want: "198.51.100.7"},
		{name: "X-Forwarded-For: none written, the client's Forwarded is not read", peer: "10.1.2.3:4000", mode: forwardedXFF,
			headers: map[string][]string{"Forwarded": {"for=6.6.6.6"}}, want: "10.1.2.3"},
		{name: "X-Forwarded-For: untrusted peer, headers ignored", peer: "203.0.113.9:4000", mode: forwardedXFF,
			headers: map[string][]string{"X-Forwarded-For": {"1.1.1.1"}}, want: "203.0.113.9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tt.peer
			for k, v := range tt.headers {
				r.Header[k] = v
			}
			got, ok := trusted.clientIP(r, tt.mode)
			if !ok || got.String() != tt.want {
				t.Errorf("clientIP = %v (ok %v), want %s", got, ok, tt.want)
			}
		})
	}
}

func TestClientIPLongChainIsBounded(t *testing.T) {
	trusted, _ := parseTrustedProxies([]string{"10.0.0.0/8"})
	hops := make([]string, 10000)
	for i := range hops {
		hops[i] = "10.0.0.7"
	}
	hops[0] = "6.6.6.6"
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.1:1"
	r.Header.Set("X-Forwarded-For", strings.Join(hops, ","))
	got, ok := trusted.clientIP(r, forwardedXFF)
	// The walk stops after maxForwardedHops trusted hops, on a trusted
	// address: never on the forged left-most one.
	if !ok || got.String() != "10.0.0.7" {
		t.Errorf("clientIP = %v, want 10.0.0.7", got)
	}
}

func TestClientIPNoTrustedProxies(t *testing.T) {
	var none trustedProxies
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "127.0.0.1:1"
	r.Header.Set("X-Forwarded-For", "1.2.3.4")
	if got, _ := none.clientIP(r, forwardedXFF); got.String() != "127.0.0.1" {
		t.Errorf("got %v, want the peer", got)
	}
	r.RemoteAddr = "pipe"
	if _, ok := none.clientIP(r, forwardedXFF); ok {
		t.Error("a non-IP peer must not parse")
	}
}
