package sidecarconfig

import (
	"bytes"
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
	for _, f := range []string{"forwardedHeader", "ipv6PrefixLength", "pathCase"} {
		if bytes.Contains(b, []byte(f)) {
			t.Errorf("%s written while unset:\n%s", f, b)
		}
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
