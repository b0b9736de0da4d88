package sidecar

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/jwtverify"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// Verified tokens (issue 23): a JWTClaim policy keys on a claim only of a
// token that verifies; any other token is missing, and onMissing decides.

const (
	testIssuer   = "https://auth.example.com/"
	testAudience = "api"
)

// verifiedPolicy is a policy of limit limit keyed on sub of tokens from
// testIssuer for testAudience, verified with the canonical key set of keys.
func verifiedPolicy(t testing.TB, name string, limit int64, onMissing string, keys ...*testsupport.JWTKey) sidecarconfig.Policy {
	t.Helper()
	return testPolicy(name, limit, func(p *sidecarconfig.Policy) {
		p.Key = sidecarconfig.Key{Source: sidecarconfig.SourceJWTClaim, Name: "sub", OnMissing: onMissing,
			JWT: &sidecarconfig.JWT{Issuer: testIssuer, Audiences: []string{testAudience}, JWKS: keySet(t, keys...)}}
	})
}

// keySet is the canonical key set of keys, as the controller renders it.
func keySet(t testing.TB, keys ...*testsupport.JWTKey) []byte {
	t.Helper()
	if len(keys) == 0 {
		return jwtverify.EmptySet
	}
	canonical, _, err := jwtverify.Normalize(testsupport.JWKSet(keys...))
	if err != nil {
		t.Fatal(err)
	}
	return canonical
}

func claimsFor(sub string, mod ...func(map[string]any)) map[string]any {
	c := testsupport.JWTClaims(testIssuer, testAudience, sub, time.Now())
	for _, m := range mod {
		m(c)
	}
	return c
}

// forgerKey is an RSA key of the forger's own, made once.
var forgerKey = sync.OnceValue(func() *testsupport.JWTKey { return testsupport.NewRSAJWTKey("forger", 2048) })

// forgedTokens are the ways a client mints a token for a subject of its
// choosing, or stretches one it was given, against the key of kid.
func forgedTokens(key *testsupport.JWTKey, sub string) map[string]string {
	other := *forgerKey()
	other.KID = key.KID
	return map[string]string{
		"alg none":                    testsupport.UnsignedToken(key.KID, claimsFor(sub)),
		"HS256 with the public key":   testsupport.SignHMAC(key.PublicDER(), key.KID, claimsFor(sub)),
		"another key under its kid":   other.Sign(claimsFor(sub)),
		"a kid it does not know":      testsupport.NewJWTKey("rotated-away", jose.ES256).Sign(claimsFor(sub)),
		"expired":                     key.Sign(claimsFor(sub, func(c map[string]any) { c["exp"] = time.Now().Add(-time.Hour).Unix() })),
		"not valid yet":               key.Sign(claimsFor(sub, func(c map[string]any) { c["nbf"] = time.Now().Add(time.Hour).Unix() })),
		"no expiry":                   key.Sign(claimsFor(sub, func(c map[string]any) { delete(c, "exp") })),
		"another issuer":              key.Sign(claimsFor(sub, func(c map[string]any) { c["iss"] = "https://evil.example/" })),
		"another audience":            key.Sign(claimsFor(sub, func(c map[string]any) { c["aud"] = "billing" })),
		"the unverified test payload": jwt(`{"sub":"` + sub + `","iss":"` + testIssuer + `","aud":"api","exp":9999999999}`),
	}
}

// TestVerifiedClaimKey: a valid token is keyed on its claim; every forged
// one counts as missing (onMissing RemoteAddress: the client address).
// The same tokens against a policy that does not verify (the opt-out, and
// every JWTClaim policy before issue 23) are keyed on the forged subject:
// the way around that verification closes.
func TestVerifiedClaimKey(t *testing.T) {
	key := testsupport.NewJWTKey("k1", jose.RS256)
	verified := compiledPolicy(t, verifiedPolicy(t, "p", 1, sidecarconfig.MissingRemoteAddress, key))
	unverified := compiledPolicy(t, testPolicy("p", 1, withKey(sidecarconfig.SourceJWTClaim, "sub", sidecarconfig.MissingRemoteAddress)))
	keyOf := func(p *policy, token string) string {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "192.0.2.1:1234"
		r.Header.Set("Authorization", "Bearer "+token)
		ri := reqInfo{r: r}
		k, ks := ri.key(p)
		if ks != keyFound {
			t.Fatalf("no key (%d)", ks)
		}
		return k
	}
	if got, want := keyOf(verified, key.Sign(claimsFor("alice"))), hashKey(keyPrefixClaim, "alice"); got != want {
		t.Errorf("valid token: key %q, want alice's %q", got, want)
	}
	for name, tok := range forgedTokens(key, "mallory-1") {
		t.Run(name, func(t *testing.T) {
			if got := keyOf(verified, tok); got != "ip:192.0.2.1" {
				t.Errorf("verified policy: key %q, want the client address", got)
			}
			// Today's reading (no verification) lets most of them choose
			// the bucket; expiry and audience were never checked either.
			if name != "a kid it does not know" && name != "another key under its kid" {
				if got := keyOf(unverified, tok); got != hashKey(keyPrefixClaim, "mallory-1") {
					t.Errorf("unverified policy: key %q, want the forged subject's", got)
				}
			}
		})
	}
}

// TestForgedSubjectsEndToEnd: a policy as a user writes it (limit 2 per
// subject, onMissing defaulted to RemoteAddress), rendered as the
// controller renders it, enforced by a sidecar. A client that mints a new
// subject for every request gets the budget of its address, not one per
// subject; a client with a valid token gets its subject's own budget.
func TestForgedSubjectsEndToEnd(t *testing.T) {
	key := testsupport.NewJWTKey("k1", jose.ES256)
	p := apiPolicy(func(s *v1alpha1.RateLimitPolicySpec) {
		s.Limit = 2
		s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceJWTClaim, Name: "sub", JWT: &v1alpha1.JWTVerification{
			Issuer: testIssuer, Audiences: []string{testAudience}, JWKS: &v1alpha1.JWKSSource{ConfigMapKey: "auth.json"}}}
	})
	cfg, err := render.Render([]v1alpha1.RateLimitPolicy{p}, render.Options{Namespace: testNamespace,
		KeySets: map[string][]byte{"configMap:auth.json": keySet(t, key)}})
	if err != nil {
		t.Fatal(err)
	}
	for name := range forgedTokens(key, "x") {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, newMemLimiter(), cfg)
			admitted := 0
			for i := range 6 {
				tok := forgedTokens(key, fmt.Sprintf("mallory-%d", i))[name]
				if resp, _ := h.do(t, "GET", "/", map[string]string{"Authorization": "Bearer " + tok}); resp.StatusCode == http.StatusOK {
					admitted++
				}
			}
			if admitted != 2 {
				t.Errorf("%d of 6 requests with a new forged subject each admitted, want 2 (the address's budget)", admitted)
			}
			alice := key.Sign(claimsFor("alice"))
			for i, want := range []int{200, 200, 429} {
				if resp, _ := h.do(t, "GET", "/", map[string]string{"Authorization": "Bearer " + alice}); resp.StatusCode != want {
					t.Errorf("alice's request %d: status %d, want %d", i+1, resp.StatusCode, want)
				}
			}
		})
	}
}

// TestKeyRotationWithoutRestart: the issuer rotates its key while one
// sidecar runs, and the sidecar follows each step of the rendered config
// by hot reload: the old key alone, then old and new side by side (tokens
// of both verify, whatever signs the next one), then the new key alone
// (the old key's tokens count as missing: onMissing Deny refuses them).
func TestKeyRotationWithoutRestart(t *testing.T) {
	oldKey := testsupport.NewJWTKey("2026-04", jose.RS256)
	newKey := testsupport.NewJWTKey("2026-05", jose.ES256)
	config := func(keys ...*testsupport.JWTKey) []byte {
		return marshalConfig(t, testConfig(nil, verifiedPolicy(t, "p", 1000, sidecarconfig.MissingDeny, keys...)))
	}
	h := newHarness(t, newMemLimiter(), nil)
	h.cfg.write(t, map[string][]byte{sidecarconfig.FileName: config(oldKey)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); h.s.WatchConfig(ctx) }()
	defer func() { cancel(); <-done }()

	status := func(k *testsupport.JWTKey) int {
		resp, _ := h.do(t, "GET", "/", map[string]string{"Authorization": "Bearer " + k.Sign(claimsFor("alice"))})
		return resp.StatusCode
	}
	until := func(what string, oldWant, newWant int) {
		t.Helper()
		eventually(t, 10*time.Second, what, func() bool { return status(oldKey) == oldWant && status(newKey) == newWant })
	}
	until("the old key alone", 200, 429)
	pid := h.s.state.Load()

	h.cfg.write(t, map[string][]byte{sidecarconfig.FileName: config(oldKey, newKey)})
	until("both keys", 200, 200)
	h.cfg.write(t, map[string][]byte{sidecarconfig.FileName: config(newKey)})
	until("the new key alone", 429, 200)

	if h.s.state.Load() == pid {
		t.Error("the state in force did not change: no reload happened")
	}
	// The rotation shows in the metrics: the old key's tokens as unknown_key.
	if got := testutil.ToFloat64(h.s.metrics.jwtTokens.WithLabelValues("p", string(jwtverify.FailureUnknownKey))); got < 1 {
		t.Errorf("jwt_tokens_total{result=unknown_key} = %v after the old key went", got)
	}
	if got := testutil.ToFloat64(h.s.metrics.jwtTokens.WithLabelValues("p", TokenVerified)); got < 3 {
		t.Errorf("jwt_tokens_total{result=verified} = %v", got)
	}
}

// TestNoKeysYet: a verified policy rendered before its keys are known (no
// key) verifies no token, so onMissing decides: the limit holds by client
// address rather than by forged subjects.
func TestNoKeysYet(t *testing.T) {
	key := testsupport.NewJWTKey("k1", jose.ES256)
	h := newHarness(t, newMemLimiter(), testConfig(nil, verifiedPolicy(t, "p", 1, sidecarconfig.MissingRemoteAddress)))
	for i, want := range []int{200, 429} {
		resp, _ := h.do(t, "GET", "/", map[string]string{"Authorization": "Bearer " + key.Sign(claimsFor(fmt.Sprint("u", i)))})
		if resp.StatusCode != want {
			t.Errorf("request %d: status %d, want %d", i+1, resp.StatusCode, want)
		}
	}
}

// TestVerifierSharedPerConfig: policies with the same settings share one
// verifier, parsed once when the config loads, and a request verifies its
// token once for them.
func TestVerifierSharedPerConfig(t *testing.T) {
	key := testsupport.NewJWTKey("k1", jose.ES256)
	st, err := compile(testConfig(nil,
		verifiedPolicy(t, "a", 5, "Deny", key),
		verifiedPolicy(t, "b", 5, "Deny", key),
		verifiedPolicy(t, "c", 5, "Deny", key, testsupport.NewJWTKey("k2", jose.ES256)),
	), nil, [32]byte{}, [32]byte{})
	if err != nil {
		t.Fatal(err)
	}
	if st.policies[0].jwt != st.policies[1].jwt || st.policies[0].jwt == st.policies[2].jwt {
		t.Fatal("verifiers not shared by settings")
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer "+key.Sign(claimsFor("alice")))
	ri := reqInfo{r: r}
	for _, p := range st.policies {
		if _, ks := ri.key(p); ks != keyFound {
			t.Fatalf("%s: no key", p.name)
		}
	}
	if len(ri.verifiedBy) != 2 {
		t.Errorf("%d verifications for 2 distinct verifiers", len(ri.verifiedBy))
	}
}
