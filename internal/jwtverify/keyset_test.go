package jwtverify_test

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/slidegate/slidegate/internal/jwtverify"
	"github.com/slidegate/slidegate/internal/testsupport"
)

func jwkJSON(t *testing.T, k jose.JSONWebKey) string {
	t.Helper()
	b, err := k.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func set(keys ...string) []byte {
	return []byte(`{"keys":[` + strings.Join(keys, ",") + `]}`)
}

// TestNormalize: what a key set renders to. Only public signing keys of
// the supported types are kept, without private parts or certificates, in
// an order that does not depend on the issuer's.
func TestNormalize(t *testing.T) {
	rs := testsupport.NewJWTKey("rs", jose.RS256)
	es := testsupport.NewJWTKey("es", jose.ES256)
	small := testsupport.NewRSAJWTKey("small", 1024)
	rsJWK := jwkJSON(t, rs.JWK())
	esJWK := jwkJSON(t, es.JWK())

	priv, _ := rsa.GenerateKey(rand.Reader, 2048)
	privJWK := jwkJSON(t, jose.JSONWebKey{Key: priv, KeyID: "priv", Algorithm: "RS256"})
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "idp"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	certJWK := jwkJSON(t, jose.JSONWebKey{Key: &priv.PublicKey, KeyID: "cert", Certificates: []*x509.Certificate{cert}})
	encJWK := strings.Replace(jwkJSON(t, testsupport.NewJWTKey("enc", jose.RS256).JWK()), `"use":"sig"`, `"use":"enc"`, 1)

	tests := []struct {
		name     string
		in       []byte
		wantKids []string // in the canonical order
		skipped  int
		wantErr  string
	}{
		{name: "two keys", in: set(rsJWK, esJWK), wantKids: []string{"es", "rs"}},
		{name: "the same keys in another order", in: set(esJWK, rsJWK), wantKids: []string{"es", "rs"}},
		{name: "a key twice", in: set(esJWK, esJWK), wantKids: []string{"es"}},
		{name: "a private key becomes its public part", in: set(privJWK), wantKids: []string{"priv"}},
		{name: "certificates are dropped", in: set(certJWK), wantKids: []string{"cert"}},
		{name: "an encryption key is skipped", in: set(encJWK, esJWK), wantKids: []string{"es"}, skipped: 1},
		{name: "a symmetric key is skipped", in: set(`{"kty":"oct","kid":"hs","k":"c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"}`, esJWK), wantKids: []string{"es"}, skipped: 1},
		{name: "RSA below 2048 bits is skipped", in: set(jwkJSON(t, small.JWK()), esJWK), wantKids: []string{"es"}, skipped: 1},
		{name: "an alg its key cannot verify is skipped", in: set(strings.Replace(rsJWK, `"alg":"RS256"`, `"alg":"HS256"`, 1), esJWK), wantKids: []string{"es"}, skipped: 1},
		{name: "an unknown key type is skipped", in: set(`{"kty":"XYZ","kid":"x"}`, esJWK), wantKids: []string{"es"}, skipped: 1},
		{name: "only a symmetric key", in: set(`{"kty":"oct","kid":"hs","k":"c2VjcmV0"}`), wantErr: "no usable signing key (key 0 (kid \"hs\"): a symmetric (shared secret) key"},
		{name: "no key", in: set(), wantErr: "the key set has no key"},
		{name: "not a set", in: []byte(`[1,2]`), wantErr: "not a JSON Web Key Set"},
		{name: "no keys list", in: []byte(`{"kty":"RSA"}`), wantErr: `no "keys" list`},
		{name: "too large", in: append(set(esJWK), bytes.Repeat([]byte(" "), jwtverify.MaxInputBytes)...), wantErr: "more than 262144"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			canonical, skipped, err := jwtverify.Normalize(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(skipped) != tt.skipped {
				t.Errorf("skipped %q, want %d", skipped, tt.skipped)
			}
			var doc struct{ Keys []map[string]any }
			if err := json.Unmarshal(canonical, &doc); err != nil {
				t.Fatal(err)
			}
			var kids []string
			for _, k := range doc.Keys {
				kids = append(kids, fmt.Sprint(k["kid"]))
				for _, f := range []string{"d", "p", "q", "dp", "dq", "qi", "k", "x5c", "x5t", "x5t#S256"} {
					if _, ok := k[f]; ok {
						t.Errorf("key %v keeps %q", k["kid"], f)
					}
				}
			}
			if fmt.Sprint(kids) != fmt.Sprint(tt.wantKids) {
				t.Errorf("kids %v, want %v", kids, tt.wantKids)
			}
			if _, err := jwtverify.Parse(canonical); err != nil {
				t.Errorf("the canonical set does not parse: %v", err)
			}
			again, _, err := jwtverify.Normalize(canonical)
			if err != nil || !bytes.Equal(again, canonical) {
				t.Errorf("not idempotent:\n%s\n%s", canonical, again)
			}
		})
	}
}

// TestNormalizeBounds: a set renders at most MaxKeys keys.
func TestNormalizeBounds(t *testing.T) {
	var keys []string
	for i := range jwtverify.MaxKeys + 1 {
		keys = append(keys, jwkJSON(t, testsupport.NewJWTKey(fmt.Sprintf("k%02d", i), jose.ES256).JWK()))
	}
	if _, _, err := jwtverify.Normalize(set(keys[:jwtverify.MaxKeys]...)); err != nil {
		t.Errorf("%d keys: %v", jwtverify.MaxKeys, err)
	}
	if _, _, err := jwtverify.Normalize(set(keys...)); err == nil || !strings.Contains(err.Error(), "more than 32") {
		t.Errorf("%d keys: %v", len(keys), err)
	}
}

// TestParseRefusesWhatNormalizeDrops: a rendered set edited by hand to hold
// a private key, a certificate or a key that verifies nothing is refused,
// so the sidecar never verifies with less than the document seems to say.
func TestParseRefusesWhatNormalizeDrops(t *testing.T) {
	priv, _ := rsa.GenerateKey(rand.Reader, 2048)
	for name, in := range map[string]string{
		"private key":   jwkJSON(t, jose.JSONWebKey{Key: priv, KeyID: "p"}),
		"symmetric key": `{"kty":"oct","k":"c2VjcmV0"}`,
		"encryption":    strings.Replace(jwkJSON(t, testsupport.NewJWTKey("e", jose.ES256).JWK()), `"use":"sig"`, `"use":"enc"`, 1),
		"unreadable":    `{"kty":"EC","crv":"P-256","x":"AA","y":"AA"}`,
	} {
		if _, err := jwtverify.Parse(set(in)); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}
