package jwtverify_test

import (
	"fmt"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/slidegate/slidegate/internal/jwtverify"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestCachedTokenStillExpires: a token verified once is remembered, and
// still refused once it has expired; failures are not remembered.
func TestCachedTokenStillExpires(t *testing.T) {
	k := testsupport.NewJWTKey("k1", jose.ES256)
	v := verifierOf(t, k)
	tok := k.Sign(claims(func(c map[string]any) { c["exp"] = now.Add(time.Minute).Unix() }))
	for range 3 {
		if got, f := v.Verify(tok, now); f != "" || string(got["sub"]) != `"alice"` {
			t.Fatalf("verify: %q %v", f, got)
		}
	}
	if n := jwtverify.CachedTokens(v); n != 1 {
		t.Errorf("%d tokens cached, want 1", n)
	}
	if _, f := v.Verify(tok, now.Add(time.Minute+jwtverify.Leeway-time.Second)); f != "" {
		t.Errorf("within the leeway after exp: %q", f)
	}
	if _, f := v.Verify(tok, now.Add(time.Minute+jwtverify.Leeway+time.Second)); f != jwtverify.FailureExpired {
		t.Errorf("a cached token past exp: %q, want expired", f)
	}
	if n := jwtverify.CachedTokens(v); n != 0 {
		t.Errorf("the expired token is still cached (%d)", n)
	}
	for range 5 {
		_, _ = v.Verify(testsupport.UnsignedToken("k1", claims(nil)), now)
		_, _ = v.Verify(testsupport.NewJWTKey("k1", jose.ES256).Sign(claims(nil)), now)
	}
	if n := jwtverify.CachedTokens(v); n != 0 {
		t.Errorf("failures cached: %d", n)
	}
}

// TestCacheIsBounded: however many tokens verify, at most the cache's
// size are remembered, and a token in use stays (it moves to the newer
// generation when found).
func TestCacheIsBounded(t *testing.T) {
	k := testsupport.NewJWTKey("k1", jose.EdDSA)
	v := verifierOf(t, k)
	jwtverify.SetCacheSize(v, 10)
	hot := k.Sign(claims(nil))
	for i := range 50 {
		c := claims(nil)
		c["sub"] = fmt.Sprint("user-", i)
		if _, f := v.Verify(k.Sign(c), now); f != "" {
			t.Fatal(f)
		}
		if _, f := v.Verify(hot, now); f != "" {
			t.Fatal(f)
		}
		if n := jwtverify.CachedTokens(v); n > 10 {
			t.Fatalf("%d tokens cached, over the size of 10", n)
		}
	}
}
