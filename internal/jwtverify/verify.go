package jwtverify

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Leeway is the clock skew allowed when checking exp, nbf and iat: small,
// since the issuer and the sidecar both keep time by NTP, and every second
// of it lets an expired token in for that long.
const Leeway = 30 * time.Second

// maxCandidates bounds the keys one token is tried against, so that a
// token that names no key id cannot make a sidecar run a signature check
// per key of a large set.
const maxCandidates = 4

// asymmetric are the algorithms a token may name at all: those of the key
// types a set may hold. "none" and the HMACs fail here (FailureAlgorithm);
// one of these that no key of the set verifies is FailureUnknownKey, the
// sign of a key the sidecar has not got.
var asymmetric = []jose.SignatureAlgorithm{jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512, jose.EdDSA}

// Failure is why a token does not verify: a bounded set, for metrics.
type Failure string

// The failures, each a metric label value.
const (
	// FailureMalformed: not a JWS compact token with a JSON payload.
	FailureMalformed Failure = "malformed"
	// FailureAlgorithm: its alg is not an asymmetric signature ("none",
	// HS256, the confusion of a public key for an HMAC secret, an unknown
	// one).
	FailureAlgorithm Failure = "algorithm"
	// FailureUnknownKey: no key of the set has its key id (and algorithm):
	// a key the sidecar has not got yet, during a rotation, shows here.
	FailureUnknownKey Failure = "unknown_key"
	// FailureSignature: no candidate key verifies the signature.
	FailureSignature Failure = "signature"
	// FailureExpired: exp is past (beyond Leeway), or missing.
	FailureExpired Failure = "expired"
	// FailureNotYetValid: nbf or iat is in the future (beyond Leeway).
	FailureNotYetValid Failure = "not_yet_valid"
	// FailureIssuer: iss is not the expected issuer.
	FailureIssuer Failure = "issuer"
	// FailureAudience: aud names none of the expected audiences.
	FailureAudience Failure = "audience"
)

// Failures lists every Failure, for metrics.
var Failures = []Failure{FailureMalformed, FailureAlgorithm, FailureUnknownKey, FailureSignature,
	FailureExpired, FailureNotYetValid, FailureIssuer, FailureAudience}

// Verifier verifies the tokens of one issuer for some audiences against a
// key set. It is immutable and safe for concurrent use.
type Verifier struct {
	issuer    string
	audiences jwt.Audience
	set       *KeySet
	cache     *tokenCache
}

// NewVerifier is a verifier of tokens from issuer for any of audiences,
// signed by a key of set. issuer and audiences must not be empty: an empty
// expectation would pass any token.
func NewVerifier(issuer string, audiences []string, set *KeySet) (*Verifier, error) {
	if issuer == "" || len(audiences) == 0 || set == nil {
		return nil, errors.New("a verifier needs an issuer, at least one audience and a key set")
	}
	for _, a := range audiences {
		if a == "" {
			return nil, errors.New("an audience is empty")
		}
	}
	return &Verifier{issuer: issuer, audiences: jwt.Audience(audiences), set: set, cache: newTokenCache(DefaultCacheSize)}, nil
}

// cached is the number of verified tokens v remembers (for tests).
func (v *Verifier) cached() int {
	if v.cache == nil {
		return 0
	}
	return v.cache.len()
}

// Verify checks token's signature against the key set and its claims (iss,
// aud, exp, which must be present, nbf and iat) at time now, and returns
// its claims. Any input gives a claims map or a Failure, never a panic.
func (v *Verifier) Verify(token string, now time.Time) (map[string]json.RawMessage, Failure) {
	if len(v.set.keys) == 0 {
		return nil, FailureUnknownKey
	}
	if v.cache == nil {
		claims, _, failure := v.verify(token, now)
		return claims, failure
	}
	sum := sha256.Sum256([]byte(token))
	if hit := v.cache.get(sum); hit != nil {
		// Verified before with these keys: only time has moved since, and
		// it can only have made the token expire (nbf and iat were past).
		if now.Add(-Leeway).After(hit.exp) {
			v.cache.drop(sum)
			return nil, FailureExpired
		}
		return hit.claims, ""
	}
	claims, exp, failure := v.verify(token, now)
	if failure != "" {
		return nil, failure
	}
	v.cache.put(sum, &verified{claims: claims, exp: exp})
	return claims, ""
}

// verify is Verify without the cache.
func (v *Verifier) verify(token string, now time.Time) (map[string]json.RawMessage, time.Time, Failure) {
	tok, err := jwt.ParseSigned(token, asymmetric)
	if err != nil {
		if _, ok := errors.AsType[*jose.ErrUnexpectedSignatureAlgorithm](err); ok {
			return nil, time.Time{}, FailureAlgorithm
		}
		return nil, time.Time{}, FailureMalformed
	}
	if len(tok.Headers) != 1 {
		return nil, time.Time{}, FailureMalformed
	}
	h := tok.Headers[0]
	alg := jose.SignatureAlgorithm(h.Algorithm)
	tried := 0
	for i := range v.set.keys {
		k := &v.set.keys[i]
		// A key with an id verifies only the tokens that name it; one
		// without verifies any token of its algorithm.
		if k.alg != alg || k.kid != "" && k.kid != h.KeyID {
			continue
		}
		if tried == maxCandidates {
			break
		}
		tried++
		var std jwt.Claims
		var claims map[string]json.RawMessage
		if err := tok.Claims(k.pub, &std, &claims); err != nil {
			if errors.Is(err, jose.ErrCryptoFailure) {
				continue // another key of the same id and algorithm may
			}
			// Verified, but the payload is not a JSON object of claims.
			return nil, time.Time{}, FailureMalformed
		}
		if f := v.checkClaims(&std, now); f != "" {
			return nil, time.Time{}, f
		}
		return claims, std.Expiry.Time(), ""
	}
	if tried == 0 {
		return nil, time.Time{}, FailureUnknownKey
	}
	return nil, time.Time{}, FailureSignature
}

// checkClaims checks the registered claims of a verified token; "" when
// they are fine.
func (v *Verifier) checkClaims(c *jwt.Claims, now time.Time) Failure {
	if c.Expiry == nil {
		// A token that never expires is a credential that cannot be
		// taken back; the policy documents that exp is required.
		return FailureExpired
	}
	err := c.ValidateWithLeeway(jwt.Expected{Issuer: v.issuer, AnyAudience: v.audiences, Time: now}, Leeway)
	switch {
	case err == nil:
		return ""
	case errors.Is(err, jwt.ErrInvalidIssuer):
		return FailureIssuer
	case errors.Is(err, jwt.ErrInvalidAudience):
		return FailureAudience
	case errors.Is(err, jwt.ErrExpired):
		return FailureExpired
	default: // ErrNotValidYet, ErrIssuedInTheFuture
		return FailureNotYetValid
	}
}
