package sidecarconfig

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func policy(mod func(*Policy)) *Config {
	p := Policy{
		Name: "p", ID: "shop/p", WindowMillis: 1000, Limit: 1,
		Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce",
		Key: Key{Source: SourceRemoteAddress, OnMissing: MissingRemoteAddress},
	}
	mod(&p)
	return &Config{Version: Version, Namespace: "shop", Policies: []Policy{p}}
}

// TestValidateIssue23Fields: the optional fields of issue 23 are checked
// when present; absent, they are valid (an older controller's document).
func TestValidateIssue23Fields(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(*Policy)
		wantErr string
	}{
		{name: "absent", mod: func(*Policy) {}},
		{name: "all set", mod: func(p *Policy) {
			p.Key.ForwardedHeader, p.Key.IPv6PrefixLength = ForwardedRFC7239, 56
			p.Match = Match{PathPrefixes: []string{"/api/"}, PathCase: PathCaseInsensitive}
		}},
		{name: "forwardedHeader X-Real-IP", mod: func(p *Policy) { p.Key.ForwardedHeader = "X-Real-IP" },
			wantErr: `key.forwardedHeader "X-Real-IP" is not X-Forwarded-For or Forwarded`},
		{name: "ipv6PrefixLength 129", mod: func(p *Policy) { p.Key.IPv6PrefixLength = 129 },
			wantErr: "key.ipv6PrefixLength 129 is outside 1..128"},
		{name: "ipv6PrefixLength -1", mod: func(p *Policy) { p.Key.IPv6PrefixLength = -1 },
			wantErr: "key.ipv6PrefixLength -1 is outside 1..128"},
		{name: "pathCase lower", mod: func(p *Policy) { p.Match.PathCase = "lower" },
			wantErr: `match.pathCase "lower" is not Sensitive or Insensitive`},
		// Verified tokens.
		{name: "jwt", mod: withJWT(func(*JWT) {})},
		{name: "jwt with no keys", mod: withJWT(func(j *JWT) { j.JWKS = json.RawMessage(`{"keys":[]}`) })},
		{name: "jwt on a header key", mod: func(p *Policy) {
			withJWT(func(*JWT) {})(p)
			p.Key.Source, p.Key.Name = SourceHeader, "X-User"
		}, wantErr: "key.jwt applies to the source JWTClaim only"},
		{name: "jwt without issuer", mod: withJWT(func(j *JWT) { j.Issuer = "" }), wantErr: "key.jwt: issuer is required"},
		{name: "jwt without audiences", mod: withJWT(func(j *JWT) { j.Audiences = nil }), wantErr: "key.jwt: audiences: from 1 to 16 are required"},
		{name: "jwt with an empty audience", mod: withJWT(func(j *JWT) { j.Audiences = []string{"a", ""} }), wantErr: "an audience is empty"},
		{name: "jwt without jwks", mod: withJWT(func(j *JWT) { j.JWKS = nil }), wantErr: "key.jwt: jwks: not a JSON Web Key Set"},
		{name: "jwt with a symmetric key", mod: withJWT(func(j *JWT) { j.JWKS = json.RawMessage(`{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`) }),
			wantErr: "key.jwt: jwks: key 0: a rendered key set holds public keys only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := policy(tt.mod).Validate()
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("Validate() = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestIssue23FieldsOmittedWhenUnset: a policy that does not use the new
// fields is written as before them, byte for byte.
func TestIssue23FieldsOmittedWhenUnset(t *testing.T) {
	b, err := Marshal(policy(func(*Policy) {}))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"forwardedHeader", "ipv6PrefixLength", "pathCase", "jwt"} {
		if bytes.Contains(b, []byte(f)) {
			t.Errorf("%s written while unset:\n%s", f, b)
		}
	}
}

// esJWKS is a canonical key set of one P-256 key (RFC 7515's example key).
const esJWKS = `{"keys":[{"crv":"P-256","kid":"k1","kty":"EC","use":"sig","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}`

// withJWT makes the policy a verified JWTClaim one, then applies mod.
func withJWT(mod func(*JWT)) func(*Policy) {
	return func(p *Policy) {
		p.Key = Key{Source: SourceJWTClaim, Name: "sub", OnMissing: MissingDeny,
			JWT: &JWT{Issuer: "https://issuer.example", Audiences: []string{"api"}, JWKS: json.RawMessage(esJWKS)}}
		mod(p.Key.JWT)
	}
}

// TestJWTNeedsMinor1: a verified policy is of minor version 1, so that a
// first-release sidecar, which would read the token unverified, never
// gets it (the controller holds it back).
func TestJWTNeedsMinor1(t *testing.T) {
	c := policy(withJWT(func(*JWT) {}))
	if m := MinMinor(&c.Policies[0]); m != 1 {
		t.Errorf("MinMinor = %d, want 1", m)
	}
	c.Version = VersionOf(0)
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "needs version") {
		t.Errorf("a minor 0 document with key.jwt: %v", err)
	}
}

func TestUsesRemoteAddress(t *testing.T) {
	tests := []struct {
		k    Key
		want bool
	}{
		{Key{Source: SourceRemoteAddress, OnMissing: MissingRemoteAddress}, true},
		{Key{Source: SourceGlobal, OnMissing: MissingRemoteAddress}, false},
		{Key{Source: SourceHeader, Name: "X", OnMissing: MissingRemoteAddress}, true},
		{Key{Source: SourceQueryParameter, Name: "k", OnMissing: MissingAllow}, false},
		{Key{Source: SourceJWTClaim, Name: "sub", OnMissing: MissingDeny}, false},
	}
	for _, tt := range tests {
		if got := tt.k.UsesRemoteAddress(); got != tt.want {
			t.Errorf("%+v: UsesRemoteAddress = %v, want %v", tt.k, got, tt.want)
		}
	}
}
