package testsupport

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// JWTKey is a signing key for tests (of this package, the sidecar, the
// controller and the benchmarks): it signs tokens and gives its public JWK.
// Not for production: it exists so that every test builds tokens one way.
type JWTKey struct {
	KID  string
	Alg  jose.SignatureAlgorithm
	priv crypto.Signer
}

var (
	rsaOnce sync.Once
	rsaKeys []*rsa.PrivateKey
)

// NewJWTKey makes a key of alg (RS256, PS256, ES256, ES384, EdDSA) named
// kid. RSA keys come from a small pool generated once per process, so that
// tests do not spend seconds generating them.
func NewJWTKey(kid string, alg jose.SignatureAlgorithm) *JWTKey {
	k := &JWTKey{KID: kid, Alg: alg}
	var err error
	switch alg {
	case jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512:
		rsaOnce.Do(func() {
			for range 4 {
				rk, err := rsa.GenerateKey(rand.Reader, 2048)
				if err != nil {
					panic(err)
				}
				rsaKeys = append(rsaKeys, rk)
			}
		})
		k.priv = rsaKeys[int(fnv(kid))%len(rsaKeys)]
	case jose.ES256:
		k.priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case jose.ES384:
		k.priv, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case jose.EdDSA:
		_, k.priv, err = ed25519.GenerateKey(rand.Reader)
	default:
		panic("NewJWTKey: unsupported algorithm " + string(alg))
	}
	if err != nil {
		panic(err)
	}
	return k
}

// NewRSAJWTKey is an RS256 key of its own (not from the pool): for tests
// that need two RSA keys to differ for sure.
func NewRSAJWTKey(kid string, bits int) *JWTKey {
	rk, err := rsa.GenerateKey(rand.Reader, bits)
	if err != nil {
		panic(err)
	}
	return &JWTKey{KID: kid, Alg: jose.RS256, priv: rk}
}

func fnv(s string) uint32 {
	h := uint32(2166136261)
	for i := range len(s) {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return h
}

// JWK is the public key as a JWK (with kid, alg and use).
func (k *JWTKey) JWK() jose.JSONWebKey {
	return jose.JSONWebKey{Key: k.priv.Public(), KeyID: k.KID, Algorithm: string(k.Alg), Use: "sig"}
}

// PublicDER is the public key in DER (PKIX) form, what an attacker
// would try as an HMAC secret.
func (k *JWTKey) PublicDER() []byte {
	b, err := x509.MarshalPKIXPublicKey(k.priv.Public())
	if err != nil {
		panic(err)
	}
	return b
}

// JWKSet is the JWK Set of the public keys of keys, as an issuer
// publishes it.
func JWKSet(keys ...*JWTKey) []byte {
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{}}
	for _, k := range keys {
		set.Keys = append(set.Keys, k.JWK())
	}
	b, err := json.Marshal(set)
	if err != nil {
		panic(err)
	}
	return b
}

// Sign signs claims with k, naming its kid (unless it is empty).
func (k *JWTKey) Sign(claims map[string]any) string {
	return k.SignWithHeader(claims, nil)
}

// SignWithHeader signs claims with k, with extra protected header fields.
func (k *JWTKey) SignWithHeader(claims map[string]any, extra map[jose.HeaderKey]any) string {
	opts := (&jose.SignerOptions{}).WithType("JWT")
	if k.KID != "" {
		opts = opts.WithHeader("kid", k.KID)
	}
	for h, v := range extra {
		opts = opts.WithHeader(h, v)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: k.Alg, Key: k.priv}, opts)
	if err != nil {
		panic(err)
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		panic(err)
	}
	obj, err := s.Sign(payload)
	if err != nil {
		panic(err)
	}
	tok, err := obj.CompactSerialize()
	if err != nil {
		panic(err)
	}
	return tok
}

// SignHMAC signs claims with HS256 and secret, naming kid: the algorithm
// confusion attack when secret is a public key's bytes.
func SignHMAC(secret []byte, kid string, claims map[string]any) string {
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: secret}, (&jose.SignerOptions{}).WithHeader("kid", kid))
	if err != nil {
		panic(err)
	}
	payload, _ := json.Marshal(claims)
	obj, err := s.Sign(payload)
	if err != nil {
		panic(err)
	}
	tok, _ := obj.CompactSerialize()
	return tok
}

// UnsignedToken is a token with "alg": "none" and no signature.
func UnsignedToken(kid string, claims map[string]any) string {
	enc := base64.RawURLEncoding.EncodeToString
	h, _ := json.Marshal(map[string]string{"alg": "none", "kid": kid, "typ": "JWT"})
	p, _ := json.Marshal(claims)
	return enc(h) + "." + enc(p) + "."
}

// JWTClaims are the registered claims of a valid token for issuer and
// audience at now, with sub, valid for an hour.
func JWTClaims(issuer, audience, sub string, now time.Time) map[string]any {
	return map[string]any{
		"iss": issuer, "aud": audience, "sub": sub,
		"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(time.Hour).Unix(),
	}
}

// String describes k for a test log.
func (k *JWTKey) String() string { return fmt.Sprintf("%s/%s", k.KID, k.Alg) }
