package jwtverify_test

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/slidegate/slidegate/internal/jwtverify"
	"github.com/slidegate/slidegate/internal/testsupport"
)

const (
	issuer   = "https://issuer.example"
	audience = "api"
)

var now = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// verifierOf is a verifier for issuer and audience over the keys' set,
// normalized as the controller renders it.
func verifierOf(t testing.TB, keys ...*testsupport.JWTKey) *jwtverify.Verifier {
	t.Helper()
	canonical, _, err := jwtverify.Normalize(testsupport.JWKSet(keys...))
	if err != nil {
		t.Fatal(err)
	}
	set, err := jwtverify.Parse(canonical)
	if err != nil {
		t.Fatal(err)
	}
	v, err := jwtverify.NewVerifier(issuer, []string{audience, "other-api"}, set)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func claims(mod func(map[string]any)) map[string]any {
	c := testsupport.JWTClaims(issuer, audience, "alice", now)
	if mod != nil {
		mod(c)
	}
	return c
}

// TestVerify: a valid token gives its claims; every way of forging or
// stretching one is refused, with the reason the metrics name.
func TestVerify(t *testing.T) {
	rs := testsupport.NewJWTKey("rs-1", jose.RS256)
	es := testsupport.NewJWTKey("es-1", jose.ES256)
	ed := testsupport.NewJWTKey("ed-1", jose.EdDSA)
	other := testsupport.NewRSAJWTKey("rs-1", 2048) // same kid, another key: a forger's
	v := verifierOf(t, rs, es, ed)

	tamper := func(tok string) string {
		parts := strings.Split(tok, ".")
		parts[1] = base64.RawURLEncoding.EncodeToString([]byte(`{"iss":"` + issuer + `","aud":"api","sub":"mallory","exp":9999999999}`))
		return strings.Join(parts, ".")
	}
	tests := []struct {
		name  string
		token string
		want  jwtverify.Failure // "": verifies
	}{
		{"RS256", rs.Sign(claims(nil)), ""},
		{"ES256", es.Sign(claims(nil)), ""},
		{"EdDSA", ed.Sign(claims(nil)), ""},
		{"audience in a list", rs.Sign(claims(func(c map[string]any) { c["aud"] = []string{"x", "other-api"} })), ""},
		{"expired within the leeway", rs.Sign(claims(func(c map[string]any) { c["exp"] = now.Add(-jwtverify.Leeway + time.Second).Unix() })), ""},
		{"nbf within the leeway", rs.Sign(claims(func(c map[string]any) { c["nbf"] = now.Add(jwtverify.Leeway - time.Second).Unix() })), ""},

		{"alg none", testsupport.UnsignedToken("rs-1", claims(nil)), jwtverify.FailureAlgorithm},
		{"HS256 signed with the public key (confusion)", testsupport.SignHMAC(rs.PublicDER(), "rs-1", claims(nil)), jwtverify.FailureAlgorithm},
		{"HS256 signed with the JWK's n", testsupport.SignHMAC([]byte(jwkN(t, rs)), "rs-1", claims(nil)), jwtverify.FailureAlgorithm},
		{"ES256 header on the RSA key's kid", withHeader(t, rs.Sign(claims(nil)), `{"alg":"ES256","kid":"rs-1"}`), jwtverify.FailureUnknownKey},
		{"PS256 header on an RS256 key", withHeader(t, rs.Sign(claims(nil)), `{"alg":"PS256","kid":"rs-1"}`), jwtverify.FailureUnknownKey},
		{"another key, same kid", other.Sign(claims(nil)), jwtverify.FailureSignature},
		{"unknown kid", testsupport.NewJWTKey("rs-9", jose.RS256).Sign(claims(nil)), jwtverify.FailureUnknownKey},
		{"payload changed after signing", tamper(rs.Sign(claims(nil))), jwtverify.FailureSignature},
		{"signature cut off", strings.TrimRight(rs.Sign(claims(nil)), "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"), jwtverify.FailureSignature},
		{"expired", rs.Sign(claims(func(c map[string]any) { c["exp"] = now.Add(-jwtverify.Leeway - time.Second).Unix() })), jwtverify.FailureExpired},
		{"no exp", rs.Sign(claims(func(c map[string]any) { delete(c, "exp") })), jwtverify.FailureExpired},
		{"nbf in the future", rs.Sign(claims(func(c map[string]any) { c["nbf"] = now.Add(time.Hour).Unix() })), jwtverify.FailureNotYetValid},
		{"iat in the future", rs.Sign(claims(func(c map[string]any) { c["iat"] = now.Add(time.Hour).Unix() })), jwtverify.FailureNotYetValid},
		{"wrong issuer", rs.Sign(claims(func(c map[string]any) { c["iss"] = "https://evil.example" })), jwtverify.FailureIssuer},
		{"issuer in another case", rs.Sign(claims(func(c map[string]any) { c["iss"] = strings.ToUpper(issuer) })), jwtverify.FailureIssuer},
		{"no issuer", rs.Sign(claims(func(c map[string]any) { delete(c, "iss") })), jwtverify.FailureIssuer},
		{"wrong audience", rs.Sign(claims(func(c map[string]any) { c["aud"] = "billing" })), jwtverify.FailureAudience},
		{"no audience", rs.Sign(claims(func(c map[string]any) { delete(c, "aud") })), jwtverify.FailureAudience},
		{"not a token", "hello", jwtverify.FailureMalformed},
		{"empty", "", jwtverify.FailureMalformed},
		{"JWE-like, five parts", "a.b.c.d.e", jwtverify.FailureMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, failure := v.Verify(tt.token, now)
			if failure != tt.want {
				t.Fatalf("failure %q, want %q", failure, tt.want)
			}
			if tt.want == "" && string(got["sub"]) != `"alice"` {
				t.Errorf("sub = %s, want \"alice\"", got["sub"])
			}
			if tt.want != "" && got != nil && failure != jwtverify.FailureExpired && failure != jwtverify.FailureIssuer &&
				failure != jwtverify.FailureAudience && failure != jwtverify.FailureNotYetValid {
				t.Errorf("claims returned for an unverified token: %v", got)
			}
		})
	}
}

// TestVerifyKeyWithoutKid: a key that names no kid verifies the tokens of
// its algorithm whatever kid they name; at most a few keys are tried.
func TestVerifyKeyWithoutKid(t *testing.T) {
	anon := testsupport.NewJWTKey("", jose.ES256)
	v := verifierOf(t, anon)
	if _, f := v.Verify(anon.Sign(claims(nil)), now); f != "" {
		t.Errorf("token without kid: %q", f)
	}
	named := *anon
	named.KID = "whatever"
	if _, f := v.Verify(named.Sign(claims(nil)), now); f != "" {
		t.Errorf("token with a kid, key without: %q", f)
	}
	// Six anonymous ES256 keys and a token signed by the sixth: only the
	// first four are tried.
	var keys []*testsupport.JWTKey
	for range 6 {
		keys = append(keys, testsupport.NewJWTKey("", jose.ES256))
	}
	v = verifierOf(t, keys...)
	tried := 0
	for _, k := range keys {
		if _, f := v.Verify(k.Sign(claims(nil)), now); f == "" {
			tried++
		}
	}
	if tried != 4 {
		t.Errorf("%d of 6 anonymous keys verify, want the 4 tried (maxCandidates)", tried)
	}
}

// TestEmptySetVerifiesNothing: the set a policy renders while its keys are
// unavailable.
func TestEmptySetVerifiesNothing(t *testing.T) {
	set, err := jwtverify.Parse(jwtverify.EmptySet)
	if err != nil {
		t.Fatal(err)
	}
	v, err := jwtverify.NewVerifier(issuer, []string{audience}, set)
	if err != nil {
		t.Fatal(err)
	}
	if _, f := v.Verify(testsupport.NewJWTKey("k", jose.ES256).Sign(claims(nil)), now); f != jwtverify.FailureUnknownKey {
		t.Errorf("failure %q, want unknown_key", f)
	}
	if _, err := jwtverify.NewVerifier("", []string{audience}, set); err == nil {
		t.Error("a verifier without an issuer")
	}
	if _, err := jwtverify.NewVerifier(issuer, nil, set); err == nil {
		t.Error("a verifier without an audience")
	}
}

func jwkN(t *testing.T, k *testsupport.JWTKey) string {
	b, err := json.Marshal(k.JWK())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]string
	_ = json.Unmarshal(b, &m)
	return m["n"]
}

// withHeader replaces a token's protected header, keeping its payload and
// signature.
func withHeader(t *testing.T, tok, header string) string {
	parts := strings.Split(tok, ".")
	parts[0] = base64.RawURLEncoding.EncodeToString([]byte(header))
	return strings.Join(parts, ".")
}
