package jwtverify_test

import (
	"testing"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/slidegate/slidegate/internal/jwtverify"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// BenchmarkVerify is one token's verification by algorithm, against a set
// of two keys: in full (parse, signature, claims: a token seen for the
// first time, or any token that fails), and remembered (the same token
// again: its hash, a lookup and its expiry).
//
//	go test -run XXX -bench Verify ./internal/jwtverify
func BenchmarkVerify(b *testing.B) {
	for _, alg := range []jose.SignatureAlgorithm{jose.RS256, jose.ES256, jose.EdDSA} {
		for _, cached := range []bool{false, true} {
			name := string(alg) + "/full"
			if cached {
				name = string(alg) + "/remembered"
			}
			b.Run(name, func(b *testing.B) {
				k := testsupport.NewJWTKey("k1", alg)
				v := verifierOf(b, k, testsupport.NewJWTKey("k2", jose.ES256))
				if !cached {
					jwtverify.DisableCache(v)
				}
				tok := k.Sign(claims(nil))
				b.ReportAllocs()
				for b.Loop() {
					if _, f := v.Verify(tok, now); f != "" {
						b.Fatal(f)
					}
				}
			})
		}
	}
}
