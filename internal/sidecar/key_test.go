package sidecar

import (
	"encoding/base64"
	"net/http/httptest"
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
		want    string // "" = missing; "ip" = the remote address key; "hash:<prefix><value>"
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
			url: "/x?a=1&api_key=k%20ey&api_key=second", want: "hash:q:k ey"},
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
			ri := reqInfo{r: r}
			got, ok := ri.key(p)
			want := tt.want
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
				k, ok := ri.key(p)
				if !ok {
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
