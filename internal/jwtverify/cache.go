package jwtverify

import (
	"crypto/sha256"
	"encoding/json"
	"sync"
	"time"
)

// A client sends the same token with every request for the token's
// lifetime (minutes to hours), and verifying it costs tens of
// microseconds (an RSA or ECDSA signature check, 20 times the sidecar's
// other per-request work). So a Verifier remembers the tokens it verified,
// by their SHA-256, with their claims and expiry: a token seen again is
// checked for expiry only. Only successes are kept: a failure costs the
// full check every time, so that garbage cannot crowd out the clients'
// tokens. The memory is bounded: two generations of at most half the
// capacity each; when the newer fills, the older is dropped, and an entry
// found in the older one moves to the newer.

// DefaultCacheSize is the number of verified tokens a Verifier keeps.
const DefaultCacheSize = 10_000

type tokenCache struct {
	mu       sync.Mutex
	cur, old map[[sha256.Size]byte]*verified
	half     int
}

// verified is a token that verified: its claims (read-only, shared by the
// requests that bring it) and its expiry.
type verified struct {
	claims map[string]json.RawMessage
	exp    time.Time
}

func newTokenCache(size int) *tokenCache {
	half := max(size/2, 1)
	return &tokenCache{cur: make(map[[sha256.Size]byte]*verified), half: half}
}

func (c *tokenCache) get(sum [sha256.Size]byte) *verified {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.cur[sum]; ok {
		return v
	}
	v, ok := c.old[sum]
	if ok {
		delete(c.old, sum)
		c.putLocked(sum, v)
	}
	return v
}

func (c *tokenCache) put(sum [sha256.Size]byte, v *verified) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(sum, v)
}

func (c *tokenCache) putLocked(sum [sha256.Size]byte, v *verified) {
	if len(c.cur) >= c.half {
		c.old, c.cur = c.cur, make(map[[sha256.Size]byte]*verified, c.half)
	}
	c.cur[sum] = v
}

func (c *tokenCache) drop(sum [sha256.Size]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.cur, sum)
	delete(c.old, sum)
}

func (c *tokenCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.cur) + len(c.old)
}
