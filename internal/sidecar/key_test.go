package sidecar

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

func jwt(payload string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(payload)) + ".c2lnbmF0dXJl"
}

func compiledPolicy(t testing.TB, p sidecarconfig.Policy) *policy {
	t.Helper()
	st, err := compile(testConfig(nil, p), nil, [32]byte{}, [32]byte{})
	if err != nil || len(st.policies) != 1 {
		t.Fatalf("compile: %v", err)
	}
	return st.policies[0]
}

func TestClientKey(t *testing.T) {
	tests := []struct {
		name    string
		key     sidecarconfig.Key
		url     string
		headers map[string]string
		header  http.Header // lines added as they are
		want    string      // "" = missing; "ambiguous"; "ip" = the remote address key; "hash:<prefix><value>"
	}{
		{name: "global", key: sidecarconfig.Key{Source: "Global", OnMissing: "Deny"}, want: "global"},
		{name: "remote address", key: sidecarconfig.Key{Source: "RemoteAddress", OnMissing: "Deny"}, want: "ip"},
		{name: "header", key: sidecarconfig.Key{Source: "Header", Name: "x-api-key", OnMissing: "Deny"},
			headers: map[string]string{"X-Api-Key": " secret-1 "}, want: "hash:h:secret-1"},
		{name: "header missing, Deny", key: sidecarconfig.Key{Source: "Header", Name: "X-Api-Key", OnMissing: "Deny"}, want: ""},
		{name: "header empty, Allow", key: sidecarconfig.Key{Source: "Header", Name: "X-Api-Key", OnMissing: "Allow"},
			headers: map[string]string{"X-Api-Key": "  "}, want: ""},
		{name: "header missing, RemoteAddress", key: sidecarconfig.Key{Source: "Header", Name: "X-Api-Key", OnMissing: "RemoteAddress"}, want: "ip"},
		{name: "query", key: sidecarconfig.Key{Source: "QueryParameter", Name: "api_key", OnMissing: "Deny"},
			url: "/x?a=1&api_key=k%20ey&b", want: "hash:q:k ey"},
		{name: "query escaped name", key: sidecarconfig.Key{Source: "QueryParameter", Name: "api key", OnMissing: "Deny"},
			url: "/x?api+key=v", want: "hash:q:v"},
		{name: "query undecodable value used raw", key: sidecarconfig.Key{Source: "QueryParameter", Name: "k", OnMissing: "Deny"},
			url: "/x?k=%zz", want: "hash:q:%zz"},
		{name: "query missing", key: sidecarconfig.Key{Source: "QueryParameter", Name: "api_key", OnMissing: "Deny"},
			url: "/x?api_keyx=1&api_key=", want: ""},
		{name: "jwt string claim", key: sidecarconfig.Key{Source: "JWTClaim", Name: "sub", OnMissing: "Deny"},
			headers: map[string]string{"Authorization": "Bearer " + jwt(`{"sub":"alice","n":1}`)}, want: "hash:jwt:alice"},
		{name: "jwt numeric claim", key: sidecarconfig.Key{Source: "JWTClaim", Name: "uid", OnMissing: "Deny"},
			headers: map[string]string{"Authorization": "bearer " + jwt(`{"uid":42}`)}, want: "hash:jwt:42"},
		{name: "jwt namespaced claim", key: sidecarconfig.Key{Source: "JWTClaim", Name: "https://example.com/tenant", OnMissing: "Deny"},
			headers: map[string]string{"Authorization": "Bearer " + jwt(`{"https://example.com/tenant":"t1"}`)}, want: "hash:jwt:t1"},
		{name: "jwt object claim is missing", key: sidecarconfig.Key{Source: "JWTClaim", Name: "sub", OnMissing: "Deny"},
			headers: map[string]string{"Authorization": "Bearer " + jwt(`{"sub":{"a":1}}`)}, want: ""},
		{name: "jwt padded payload", key: sidecarconfig.Key{Source: "JWTClaim", Name: "sub", OnMissing: "Deny"},
			headers: map[string]string{"Authorization": "Bearer e30." + base64.URLEncoding.EncodeToString([]byte(`{"sub":"bob"}`)) + ".x"}, want: "hash:jwt:bob"},
		{name: "jwt not bearer", key: sidecarconfig.Key{Source: "JWTClaim", Name: "sub", OnMissing: "Deny"},
			headers: map[string]string{"Authorization": "Basic " + jwt(`{"sub":"alice"}`)}, want: ""},
		{name: "jwt garbage falls back", key: sidecarconfig.Key{Source: "JWTClaim", Name: "sub", OnMissing: "RemoteAddress"},
			headers: map[string]string{"Authorization": "Bearer a.!!!.b"}, want: "ip"},
		{name: "jwt over-long token is missing", key: sidecarconfig.Key{Source: "JWTClaim", Name: "sub", OnMissing: "Deny"},
			headers: map[string]string{"Authorization": "Bearer " + jwt(`{"sub":"alice","pad":"`+strings.Repeat("x", maxBearerBytes)+`"}`)}, want: ""},

		// Issue 23: more than one value is ambiguous, whatever onMissing
		// says; the client must not choose its bucket.
		{name: "header in two lines", key: sidecarconfig.Key{Source: "Header", Name: "X-User", OnMissing: "RemoteAddress"},
			header: http.Header{"X-User": {"random", "real"}}, want: "ambiguous"},
		{name: "header in two lines, one empty", key: sidecarconfig.Key{Source: "Header", Name: "X-User", OnMissing: "Allow"},
			header: http.Header{"X-User": {"", "real"}}, want: "ambiguous"},
		{name: "header values joined by a comma", key: sidecarconfig.Key{Source: "Header", Name: "X-User", OnMissing: "Allow"},
			header: http.Header{"X-User": {"random, real"}}, want: "ambiguous"},
		{name: "header also with an underscore", key: sidecarconfig.Key{Source: "Header", Name: "X-User-Id", OnMissing: "Allow"},
			header: http.Header{"X-User-Id": {"real"}, "X_user_id": {"random"}}, want: "ambiguous"},
		{name: "header only with an underscore", key: sidecarconfig.Key{Source: "Header", Name: "X-User-Id", OnMissing: "Allow"},
			header: http.Header{"X_user-Id": {"random"}}, want: "ambiguous"},
		{name: "another header with an underscore is not the key", key: sidecarconfig.Key{Source: "Header", Name: "X-User-Id", OnMissing: "Deny"},
			header: http.Header{"X-User-Id": {"real"}, "X_user_ix": {"random"}}, want: "hash:h:real"},
		{name: "query twice", key: sidecarconfig.Key{Source: "QueryParameter", Name: "key", OnMissing: "RemoteAddress"},
			url: "/x?key=random&key=real", want: "ambiguous"},
		{name: "query twice, once empty", key: sidecarconfig.Key{Source: "QueryParameter", Name: "key", OnMissing: "Allow"},
			url: "/x?key=&key=real", want: "ambiguous"},
		{name: "query twice, split by ';'", key: sidecarconfig.Key{Source: "QueryParameter", Name: "key", OnMissing: "Allow"},
			url: "/x?key=real;key=random", want: "ambiguous"},
		{name: "query value ends at ';'", key: sidecarconfig.Key{Source: "QueryParameter", Name: "key", OnMissing: "Deny"},
			url: "/x?key=real;x=random", want: "hash:q:real"},
		{name: "query twice, once encoded", key: sidecarconfig.Key{Source: "QueryParameter", Name: "key", OnMissing: "Allow"},
			url: "/x?k%65y=random&key=real", want: "ambiguous"},
		{name: "query in another case", key: sidecarconfig.Key{Source: "QueryParameter", Name: "key", OnMissing: "Allow"},
			url: "/x?KEY=random", want: "ambiguous"},
		{name: "query with PHP's '.' for '_'", key: sidecarconfig.Key{Source: "QueryParameter", Name: "api_key", OnMissing: "Allow"},
			url: "/x?api_key=real&api.key=random", want: "ambiguous"},
		// PHP drops a name's leading spaces, reads an unclosed '[' as '_',
		// and a closed one as an array of the name before it: alone, each
		// would be no key to the sidecar (onMissing) and the key to PHP.
		{name: "query with PHP's leading space", key: sidecarconfig.Key{Source: "QueryParameter", Name: "key", OnMissing: "Allow"},
			url: "/x?+key=real", want: "ambiguous"},
		{name: "query with PHP's unclosed '[' for '_'", key: sidecarconfig.Key{Source: "QueryParameter", Name: "api_key", OnMissing: "Allow"},
			url: "/x?api[key=real", want: "ambiguous"},
		{name: "query as a PHP array", key: sidecarconfig.Key{Source: "QueryParameter", Name: "key", OnMissing: "Allow"},
			url: "/x?key%5B0%5D=real", want: "ambiguous"},
		{name: "query, PHP's '[' keeps what follows", key: sidecarconfig.Key{Source: "QueryParameter", Name: "a_b_c", OnMissing: "Deny"},
			url: "/x?a[b.c=random&a_b_c=real", want: "hash:q:real"},
		{name: "query, a longer name is not the key", key: sidecarconfig.Key{Source: "QueryParameter", Name: "key", OnMissing: "Deny"},
			url: "/x?keys=random&key=real", want: "hash:q:real"},
		{name: "jwt in two Authorization lines", key: sidecarconfig.Key{Source: "JWTClaim", Name: "sub", OnMissing: "Allow"},
			header: http.Header{"Authorization": {"Bearer " + jwt(`{"sub":"random"}`), "Bearer " + jwt(`{"sub":"real"}`)}}, want: "ambiguous"},
		{name: "jwt, two tokens in one line", key: sidecarconfig.Key{Source: "JWTClaim", Name: "sub", OnMissing: "Allow"},
			header: http.Header{"Authorization": {"Bearer " + jwt(`{"sub":"random"}`) + ", Bearer " + jwt(`{"sub":"real"}`)}}, want: "ambiguous"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := compiledPolicy(t, testPolicy("p", 1, withKey(tt.key.Source, tt.key.Name, tt.key.OnMissing)))
			u := tt.url
			if u == "" {
				u = "/"
			}
			r := httptest.NewRequest("GET", u, nil)
			r.RemoteAddr = "192.0.2.1:1234"
			for k, v := range tt.headers {
				r.Header.Set(k, v)
			}
			for k, v := range tt.header {
				r.Header[k] = v
			}
			ri := reqInfo{r: r}
			got, ks := ri.key(p)
			if want := tt.want == "ambiguous"; want != (ks == keyAmbiguous) {
				t.Fatalf("key = %q (state %d), want ambiguous %v", got, ks, want)
			}
			ok := ks == keyFound
			want := tt.want
			if want == "ambiguous" {
				want = ""
			}
			switch {
			case want == "ip":
				want = "ip:192.0.2.1"
			case strings.HasPrefix(want, "hash:"):
				v := strings.TrimPrefix(want, "hash:")
				prefix, value, _ := strings.Cut(v, ":")
				want = hashKey(prefix+":", value)
			}
			if (want == "") == ok || got != want {
				t.Errorf("key = %q (ok %v), want %q", got, ok, want)
			}
		})
	}
}

// TestClientKeyWholeValue: the whole value is hashed, so values that differ
// only after a long common prefix are distinct clients, and the key stays
// short and free of the value however long the value is.
func TestClientKeyWholeValue(t *testing.T) {
	prefix1K := strings.Repeat("k", 1024)
	long := strings.Repeat("a", 100_000)
	tests := []struct {
		name     string
		key      sidecarconfig.Key
		url      func(v string) string
		a, b     string
		wantSame bool
	}{
		{name: "header, 1,024-byte common prefix", key: sidecarconfig.Key{Source: "Header", Name: "X-User-ID", OnMissing: "Deny"},
			a: prefix1K + "A", b: prefix1K + "B"},
		{name: "header, 100,000-byte common prefix", key: sidecarconfig.Key{Source: "Header", Name: "X-User-ID", OnMissing: "Deny"},
			a: long, b: long + "different tail"},
		{name: "header, same long value", key: sidecarconfig.Key{Source: "Header", Name: "X-User-ID", OnMissing: "Deny"},
			a: long, b: long, wantSame: true},
		{name: "query, 1,024-byte common prefix", key: sidecarconfig.Key{Source: "QueryParameter", Name: "user", OnMissing: "Deny"},
			url: func(v string) string { return "/?user=" + v }, a: prefix1K + "A", b: prefix1K + "B"},
		{name: "claim, 1,024-byte common prefix", key: sidecarconfig.Key{Source: "JWTClaim", Name: "sub", OnMissing: "Deny"},
			a: prefix1K + "A", b: prefix1K + "B"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := compiledPolicy(t, testPolicy("p", 1, withKey(tt.key.Source, tt.key.Name, tt.key.OnMissing)))
			keyOf := func(v string) string {
				u := "/"
				if tt.url != nil {
					u = tt.url(v)
				}
				r := httptest.NewRequest("GET", u, nil)
				switch tt.key.Source {
				case "Header":
					r.Header.Set(tt.key.Name, v)
				case "JWTClaim":
					r.Header.Set("Authorization", "Bearer "+jwt(`{"sub":"`+v+`"}`))
				}
				ri := reqInfo{r: r}
				k, ks := ri.key(p)
				if ks != keyFound {
					t.Fatalf("no key for a %d-byte value", len(v))
				}
				// Values are never stored in clear: a secret in a header
				// does not reach Redis or the logs.
				if len(k) > 32 || strings.Contains(k, "kkkk") || strings.Contains(k, "aaaa") {
					t.Errorf("key %q is not a short hash of the value", k)
				}
				return k
			}
			if ka, kb := keyOf(tt.a), keyOf(tt.b); (ka == kb) != tt.wantSame {
				t.Errorf("keys %q and %q: same = %v, want %v", ka, kb, ka == kb, tt.wantSame)
			}
		})
	}
}

func TestPolicyMatches(t *testing.T) {
	p := compiledPolicy(t, testPolicy("p", 1, func(p *sidecarconfig.Policy) {
		p.Match = sidecarconfig.Match{Methods: []string{"POST"}, PathPrefixes: []string{"/admin/", "/api"}}
	}))
	tests := []struct {
		method, target string
		want           bool
	}{
		{"POST", "/admin/users", true},
		{"GET", "/admin/users", false},
		{"POST", "/apiv2", true}, // a plain string prefix
		{"POST", "/public", false},
		{"POST", "/public/../admin/x", true},
		{"POST", "//admin/x", true},
		{"POST", "/./admin/", true},
		{"POST", "/admin", false},
		{"POST", "/%61dmin/x", true}, // decoded before matching
		{"POST", "/Admin/x", false},  // case-sensitive, as documented
	}
	for _, tt := range tests {
		r := httptest.NewRequest(tt.method, "http://x"+tt.target, nil)
		if got := p.matches(&reqInfo{r: r}); got != tt.want {
			t.Errorf("%s %s: matches = %v, want %v", tt.method, tt.target, got, tt.want)
		}
	}
}

// TestReplicasReachTheLimiter: the controller's count of enforcing pods is
// passed to the limiter as the rule's fail-open share divisor.
func TestReplicasReachTheLimiter(t *testing.T) {
	p := testPolicy("p", 10)
	p.Replicas = 3
	if got := compiledPolicy(t, p).rule.Replicas; got != 3 {
		t.Fatalf("rule.Replicas = %d, want 3", got)
	}
}

// TestAddressKey: IPv6 clients are counted by their network of the
// policy's prefix length (issue 23: a /64 held 2^64 budgets; the default,
// sidecarconfig.Key.IPv6Prefix), IPv4 ones by address.
func TestAddressKey(t *testing.T) {
	tests := []struct {
		addr string
		bits int
		want string
	}{
		{"192.0.2.1", 64, "ip:192.0.2.1"},
		{"2001:db8:1:2:3:4:5:6", 128, "ip:2001:db8:1:2:3:4:5:6"},
		{"2001:db8:1:2:3:4:5:6", 64, "ip:2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff:ffff:ffff:ffff", 64, "ip:2001:db8:1:2::/64"},
		{"2001:db8:1:3::1", 64, "ip:2001:db8:1:3::/64"},
		{"2001:db8:1:2ff::1", 56, "ip:2001:db8:1:200::/56"},
		{"64:ff9b::c000:201", 64, "ip:192.0.2.1"}, // NAT64: the IPv4 client
		{"64:ff9b::c000:201", 128, "ip:64:ff9b::c000:201"},
		{"64:ff9b:1::c000:201", 64, "ip:64:ff9b:1::/64"},
	}
	for _, tt := range tests {
		if got := addressKey(netip.MustParseAddr(tt.addr), tt.bits); got != tt.want {
			t.Errorf("addressKey(%s, %d) = %q, want %q", tt.addr, tt.bits, got, tt.want)
		}
	}
}

// TestRemoteKeyPerPolicy: two policies of one state read the client address
// each from its own header and count it by its own prefix.
func TestRemoteKeyPerPolicy(t *testing.T) {
	cfg := testConfig([]string{"10.0.0.0/8"},
		testPolicy("a-xff", 1, func(p *sidecarconfig.Policy) {
			p.Key = sidecarconfig.Key{Source: "RemoteAddress", OnMissing: "RemoteAddress", ForwardedHeader: "X-Forwarded-For", IPv6PrefixLength: 64}
		}),
		testPolicy("b-fwd", 1, func(p *sidecarconfig.Policy) {
			p.Key = sidecarconfig.Key{Source: "RemoteAddress", OnMissing: "RemoteAddress", ForwardedHeader: "Forwarded", IPv6PrefixLength: 48}
		}),
		testPolicy("c-default", 1, withKey("RemoteAddress", "", "RemoteAddress")),
	)
	st, err := compile(cfg, nil, [32]byte{}, [32]byte{})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.1:1"
	r.Header.Set("X-Forwarded-For", "2001:db8:a:b::1")
	r.Header.Set("Forwarded", `for="[2001:db8:c:d::1]"`)
	ri := reqInfo{r: r, trusted: st.trusted}
	want := []string{"ip:2001:db8:a:b::/64", "ip:2001:db8:c::/48", "ip:2001:db8:a:b::/64"}
	for i, p := range st.policies {
		if got, ks := ri.key(p); ks != keyFound || got != want[i] {
			t.Errorf("%s: key %q (%d), want %q", p.name, got, ks, want[i])
		}
	}
}
