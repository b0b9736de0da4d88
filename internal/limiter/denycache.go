package limiter

import (
	"sync"
	"time"
)

// denyCache remembers the keys Redis reported exhausted, until the moment
// Redis itself would admit again, so that their requests are rejected
// without a round trip. A denial changes nothing in Redis, so the cached
// answer is the one Redis would give:
//
//   - The entry ends at start+RetryAfter, where start is when the decision
//     was queued, before the script ran on the server: the key's next admit
//     is at (script time)+RetryAfter ≥ start+RetryAfter, so the cache never
//     denies a request Redis would admit because an entry left its window.
//   - An entry holds the rule's limit, window and algorithm and applies only
//     to the same ones: a reload that changes the policy makes it miss.
//
// What it cannot see is budget returned early: an undo (a cross-slot
// request denied elsewhere) or a key deleted by hand. The cache then
// rejects for at most the rest of that RetryAfter what Redis would admit;
// it never admits what Redis would reject.
//
// Memory is bounded by max entries; when full, expired entries are swept
// and, if none expired, the new denial is simply not cached.
type denyCache struct {
	mu        sync.Mutex
	max       int
	entries   map[string]denyEntry
	nextSweep time.Time
	// ignoreRule is the naive cache, for the test that shows why an entry
	// must carry its rule: it then matches whatever the rule has become.
	ignoreRule bool
}

type denyEntry struct {
	until, resetUntil time.Time
	limit             int64
	window            time.Duration
	algorithm         Algorithm
}

func newDenyCache(maxEntries int) *denyCache {
	return &denyCache{max: maxEntries, entries: make(map[string]denyEntry)}
}

// get returns the cached denial of key for rule at now, if any.
func (c *denyCache) get(key string, r *Rule, now time.Time) (Decision, bool) {
	c.mu.Lock()
	e, ok := c.entries[key]
	c.mu.Unlock()
	if !ok || !now.Before(e.until) {
		return Decision{}, false
	}
	if !c.ignoreRule && (e.limit != r.Limit || e.window != r.Window || e.algorithm != r.Algorithm) {
		return Decision{}, false
	}
	return Decision{
		Limit:      r.Limit,
		RetryAfter: e.until.Sub(now),
		ResetAfter: max(e.resetUntil.Sub(now), e.until.Sub(now)),
		Source:     SourceDenyCache,
	}, true
}

// put caches Redis's denial of key for rule, decided by a script queued at
// start.
func (c *denyCache) put(key string, r *Rule, start time.Time, d *Decision) {
	if d.RetryAfter <= 0 {
		return
	}
	e := denyEntry{
		until: start.Add(d.RetryAfter), resetUntil: start.Add(d.ResetAfter),
		limit: r.Limit, window: r.Window, algorithm: r.Algorithm,
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.max {
		// Full: sweep the expired entries, at most once a second, so that
		// a flood of new denied keys costs no scan per request.
		if start.Before(c.nextSweep) {
			return
		}
		c.nextSweep = start.Add(time.Second)
		for k, old := range c.entries {
			if !start.Before(old.until) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= c.max {
			return
		}
	}
	c.entries[key] = e
}

// len is for tests.
func (c *denyCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
