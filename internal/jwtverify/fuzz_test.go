package jwtverify_test

import (
	"bytes"
	"testing"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/slidegate/slidegate/internal/jwtverify"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// FuzzVerify: no input panics, and none verifies with a subject the keys
// did not sign: a forger cannot mint a new client key. The seeds are valid
// tokens and each attack of TestVerify.
//
//	go test ./internal/jwtverify -run '^$' -fuzz FuzzVerify -fuzztime 1m
func FuzzVerify(f *testing.F) {
	rs := testsupport.NewJWTKey("rs-1", jose.RS256)
	es := testsupport.NewJWTKey("es-1", jose.ES256)
	v := verifierOf(f, rs, es)
	f.Add(rs.Sign(claims(nil)))
	f.Add(es.Sign(claims(nil)))
	f.Add(testsupport.UnsignedToken("rs-1", claims(nil)))
	f.Add(testsupport.SignHMAC(rs.PublicDER(), "rs-1", claims(nil)))
	f.Add(testsupport.NewJWTKey("x", jose.ES256).Sign(claims(nil)))
	f.Add("e30.e30.")
	f.Fuzz(func(t *testing.T, token string) {
		got, failure := v.Verify(token, now)
		if failure == "" && string(got["sub"]) != `"alice"` {
			t.Fatalf("verified with sub %s", got["sub"])
		}
	})
}

// FuzzNormalize: no key set panics; a set that normalizes parses, and
// normalizes to itself.
//
//	go test ./internal/jwtverify -run '^$' -fuzz FuzzNormalize -fuzztime 1m
func FuzzNormalize(f *testing.F) {
	f.Add(testsupport.JWKSet(testsupport.NewJWTKey("rs", jose.RS256), testsupport.NewJWTKey("ed", jose.EdDSA)))
	f.Add([]byte(`{"keys":[{"kty":"oct","k":"AA"},{"kty":"EC","crv":"P-256","x":"AA","y":"AA"}]}`))
	f.Add([]byte(`{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		canonical, _, err := jwtverify.Normalize(data)
		if err != nil {
			return
		}
		if _, err := jwtverify.Parse(canonical); err != nil {
			t.Fatalf("normalized set does not parse: %v\n%s", err, canonical)
		}
		again, _, err := jwtverify.Normalize(canonical)
		if err != nil || !bytes.Equal(again, canonical) {
			t.Fatalf("not idempotent: %v\n%s\n%s", err, canonical, again)
		}
	})
}
