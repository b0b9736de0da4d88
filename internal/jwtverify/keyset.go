// Package jwtverify verifies bearer tokens (JWS compact JWTs) against a JSON
// Web Key Set, for the policies that key clients on a token claim (issue 23:
// an unverified token let a client mint a new subject, and so a new budget,
// per request). It is the one home of what a usable key is: the controller
// normalizes the key sets it renders with it (from a ConfigMap or the
// issuer's URL), sidecarconfig validates a rendered set with it, and the
// sidecar verifies with it. The cryptography is go-jose's; this package only
// chooses which keys and algorithms are acceptable and checks the claims.
//
// Only public, asymmetric signing keys are usable (RSA of at least 2048
// bits, EC P-256/P-384/P-521, Ed25519): the sidecar configuration is a
// ConfigMap, readable by more people than a signing secret should be, and a
// shared (HMAC) secret would let every reader mint tokens. Each key verifies
// only the algorithms of its own type (and only its "alg" when it names
// one), so "alg": "none" and the HS256-with-a-public-key confusion never
// reach a verifier.
package jwtverify

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	_ "crypto/sha256" // crypto.SHA256, for thumbprints
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	jose "github.com/go-jose/go-jose/v4"
)

// Bounds of a key set.
const (
	// MaxInputBytes bounds a key set document as read (a ConfigMap value,
	// an issuer's response): certificates (x5c) and unusable keys count
	// here, and are dropped from what is rendered.
	MaxInputBytes = 256 << 10
	// MaxKeys bounds the usable keys of a set: a sidecar tries at most
	// maxCandidates of them per token, but every key costs ConfigMap space.
	MaxKeys = 32
	// MaxCanonicalBytes bounds a normalized set, what a policy renders into
	// its namespace's sidecar configuration (which holds 1,000,000 bytes
	// for all its policies). 32 keys of RSA-4096 fit.
	MaxCanonicalBytes = 32 << 10
	// MinRSABits is the smallest RSA modulus accepted.
	MinRSABits = 2048
)

// EmptySet is the canonical set with no key: no token verifies against it.
var EmptySet = []byte(`{"keys":[]}`)

// key is one usable public key and the one algorithm it verifies.
type key struct {
	kid string
	alg jose.SignatureAlgorithm
	pub any // *rsa.PublicKey, *ecdsa.PublicKey or ed25519.PublicKey
}

// Normalize reads a JSON Web Key Set (RFC 7517, section 5) and returns its
// usable keys in canonical form: public parts only, without certificates,
// each with the algorithm it verifies, sorted (so that a set re-ordered by
// its issuer renders to the same bytes). Keys that cannot verify a token
// (encryption keys, symmetric keys, unknown types, weak RSA) are left out,
// and skipped says which and why. It fails when no usable key is left, or
// the input or the result exceeds its bound.
func Normalize(data []byte) (canonical []byte, skipped []string, err error) {
	if len(data) > MaxInputBytes {
		return nil, nil, fmt.Errorf("the key set is %d bytes, more than %d", len(data), MaxInputBytes)
	}
	var doc struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, nil, fmt.Errorf("not a JSON Web Key Set: %w", err)
	}
	if doc.Keys == nil {
		return nil, nil, errors.New(`not a JSON Web Key Set: no "keys" list`)
	}
	var usable []jose.JSONWebKey
	for i, raw := range doc.Keys {
		k, why := usableKey(raw)
		if why != "" {
			skipped = append(skipped, fmt.Sprintf("key %d%s: %s", i, kidNote(k.KeyID), why))
			continue
		}
		usable = append(usable, k)
	}
	if len(usable) == 0 {
		if len(skipped) == 0 {
			return nil, nil, errors.New("the key set has no key")
		}
		return nil, skipped, fmt.Errorf("the key set has no usable signing key (%s)", strings.Join(skipped, "; "))
	}
	if len(usable) > MaxKeys {
		return nil, skipped, fmt.Errorf("the key set has %d usable signing keys, more than %d", len(usable), MaxKeys)
	}
	canonical, err = marshalSet(usable)
	if err != nil {
		return nil, skipped, err
	}
	if len(canonical) > MaxCanonicalBytes {
		return nil, skipped, fmt.Errorf("the key set's usable keys take %d bytes, more than %d", len(canonical), MaxCanonicalBytes)
	}
	return canonical, skipped, nil
}

// kidNote names a key id in a message, bounded.
func kidNote(kid string) string {
	if kid == "" {
		return ""
	}
	if len(kid) > 64 {
		kid = kid[:64] + "…"
	}
	return fmt.Sprintf(" (kid %q)", kid)
}

// usableKey parses one key of a set and returns it as it is rendered, or
// why it is not usable.
func usableKey(raw json.RawMessage) (jose.JSONWebKey, string) {
	var k jose.JSONWebKey
	if err := k.UnmarshalJSON(raw); err != nil {
		return k, "unreadable: " + boundedError(err)
	}
	if k.Use != "" && k.Use != "sig" {
		return k, fmt.Sprintf("its use is %q, not sig", k.Use)
	}
	pub := k.Public() // drops private parts; invalid for a symmetric key
	if pub.Key == nil || !pub.Valid() {
		if _, symmetric := k.Key.([]byte); symmetric {
			return k, "a symmetric (shared secret) key: only public keys can be given to the sidecars"
		}
		return k, "not a public key of a known type"
	}
	algs := algorithmsOf(pub.Key)
	if len(algs) == 0 {
		return k, "not an RSA (2048 bits or more), EC P-256/P-384/P-521 or Ed25519 key"
	}
	if k.Algorithm != "" && !slices.Contains(algs, jose.SignatureAlgorithm(k.Algorithm)) {
		return k, fmt.Sprintf("its alg %q is not one its key type verifies", boundedString(k.Algorithm))
	}
	// "alg" stays as the set named it; absent, the key verifies every
	// algorithm of its type.
	return jose.JSONWebKey{Key: pub.Key, KeyID: k.KeyID, Algorithm: k.Algorithm, Use: "sig"}, ""
}

// algorithmsOf lists the signature algorithms a public key verifies: those
// of its type only, never an HMAC.
func algorithmsOf(pub any) []jose.SignatureAlgorithm {
	switch p := pub.(type) {
	case *rsa.PublicKey:
		if p.N.BitLen() < MinRSABits {
			return nil
		}
		return []jose.SignatureAlgorithm{jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512}
	case *ecdsa.PublicKey:
		switch p.Curve {
		case elliptic.P256():
			return []jose.SignatureAlgorithm{jose.ES256}
		case elliptic.P384():
			return []jose.SignatureAlgorithm{jose.ES384}
		case elliptic.P521():
			return []jose.SignatureAlgorithm{jose.ES512}
		}
	case ed25519.PublicKey:
		return []jose.SignatureAlgorithm{jose.EdDSA}
	}
	return nil
}

// marshalSet writes keys as a canonical set: compact JSON, each key's
// fields in sorted order, the keys sorted by key id and then by thumbprint,
// duplicates dropped.
func marshalSet(keys []jose.JSONWebKey) ([]byte, error) {
	type entry struct {
		kid, thumb string
		json       []byte
	}
	entries := make([]entry, 0, len(keys))
	for _, k := range keys {
		b, err := k.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("writing a key: %w", err)
		}
		// go-jose's encoder is deterministic, but re-encode through
		// encoding/json so the field order is the sorted one and the
		// form cannot drift with the library.
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, err
		}
		if b, err = json.Marshal(m); err != nil {
			return nil, err
		}
		tp, err := k.Thumbprint(crypto.SHA256)
		if err != nil {
			return nil, fmt.Errorf("a key's thumbprint: %w", err)
		}
		entries = append(entries, entry{k.KeyID, string(tp), b})
	}
	slices.SortFunc(entries, func(a, b entry) int {
		if c := strings.Compare(a.kid, b.kid); c != 0 {
			return c
		}
		return strings.Compare(a.thumb, b.thumb)
	})
	entries = slices.CompactFunc(entries, func(a, b entry) bool { return bytes.Equal(a.json, b.json) })
	var buf bytes.Buffer
	buf.WriteString(`{"keys":[`)
	for i, e := range entries {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(e.json)
	}
	buf.WriteString(`]}`)
	return buf.Bytes(), nil
}

// KeySet is a parsed canonical key set, ready to verify with.
type KeySet struct {
	keys []key
}

// Len is the number of keys.
func (s *KeySet) Len() int { return len(s.keys) }

// Parse reads a canonical key set, as Normalize writes it (and as a
// sidecar configuration carries it): every key must be usable, so that a
// hand-edited set that would verify less than it seems to is an error, not
// a silent loss. An empty set is valid: it verifies no token.
func Parse(canonical []byte) (*KeySet, error) {
	if len(canonical) > MaxCanonicalBytes {
		return nil, fmt.Errorf("the key set is %d bytes, more than %d", len(canonical), MaxCanonicalBytes)
	}
	var doc struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(canonical, &doc); err != nil {
		return nil, fmt.Errorf("not a JSON Web Key Set: %w", err)
	}
	if doc.Keys == nil {
		return nil, errors.New(`not a JSON Web Key Set: no "keys" list`)
	}
	if len(doc.Keys) > MaxKeys {
		return nil, fmt.Errorf("the key set has %d keys, more than %d", len(doc.Keys), MaxKeys)
	}
	set := &KeySet{}
	for i, raw := range doc.Keys {
		var k jose.JSONWebKey
		if err := k.UnmarshalJSON(raw); err != nil {
			return nil, fmt.Errorf("key %d: unreadable: %s", i, boundedError(err))
		}
		if !k.IsPublic() || len(k.Certificates) > 0 {
			return nil, fmt.Errorf("key %d%s: a rendered key set holds public keys only, without certificates", i, kidNote(k.KeyID))
		}
		_, why := usableKey(raw)
		if why != "" {
			return nil, fmt.Errorf("key %d%s: %s", i, kidNote(k.KeyID), why)
		}
		algs := algorithmsOf(k.Key)
		if k.Algorithm != "" {
			algs = []jose.SignatureAlgorithm{jose.SignatureAlgorithm(k.Algorithm)}
		}
		for _, a := range algs {
			set.keys = append(set.keys, key{kid: k.KeyID, alg: a, pub: k.Key})
		}
	}
	return set, nil
}

// boundedError is err's message cut to a length a status condition can
// carry; the key set may come from anywhere, and its text is not ours to
// repeat at length.
func boundedError(err error) string {
	return boundedString(err.Error())
}

func boundedString(s string) string {
	const limit = 120
	if len(s) > limit {
		return s[:limit] + "…"
	}
	return s
}
