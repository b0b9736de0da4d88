package limiter

import (
	"sync"
	"time"
)

// view remembers, per key, the last answer Redis gave this process: how
// many admits the key's window held and until when, and, for a denial,
// until when Redis would deny. It serves two purposes:
//
//   - The deny cache. A denial changes nothing in Redis, so while Redis
//     said a key is exhausted until T, its requests are denied locally
//     until T, without a round trip. T is start+RetryAfter, where start is
//     when the decision was queued, before the script ran on the server:
//     the key's next admit is at (script time)+RetryAfter ≥ T, so the cache
//     never denies a request Redis would admit because an entry left its
//     window.
//   - The fallback's starting point: while Redis cannot answer, a key's
//     local window starts from what Redis last said about it (see
//     fallback.seedOf), not from empty.
//
// An entry holds the rule's limit, window and algorithm and applies only to
// the same ones: a reload that changes the policy makes it miss.
//
// What it cannot see is budget returned early: an undo (a cross-slot
// request denied elsewhere) or a key deleted by hand. The cache then denies
// for at most the rest of that RetryAfter what Redis would admit; it never
// admits what Redis would reject.
//
// Memory is bounded by max entries. When full, entries whose window holds
// nothing any more are swept (at most once a second); a denial then still
// takes the place of a remembered admit, since denials are what save round
// trips, and an admit that finds no room is not remembered.
type view struct {
	mu        sync.Mutex
	max       int
	entries   map[string]viewEntry
	nextSweep time.Time
	// ignoreRule is the naive cache, for the test that shows why an entry
	// must carry its rule: it then matches whatever the rule has become.
	ignoreRule bool
}

type viewEntry struct {
	learned    time.Time // when the decision was queued
	count      int64     // admits in the window after the decision
	resetUntil time.Time // from then on the window holds none of them
	denyUntil  time.Time // Redis denies until then (zero: it admitted)
	limit      int64
	window     time.Duration
	algorithm  Algorithm
}

func newView(maxEntries int) *view {
	return &view{max: maxEntries, entries: make(map[string]viewEntry)}
}

// get returns what Redis last said about key under rule.
func (v *view) get(key string, r *Rule) (viewEntry, bool) {
	v.mu.Lock()
	e, ok := v.entries[key]
	v.mu.Unlock()
	if !ok || (!v.ignoreRule && (e.limit != r.Limit || e.window != r.Window || e.algorithm != r.Algorithm)) {
		return viewEntry{}, false
	}
	return e, true
}

// denied returns the cached denial of key under rule at now, if any.
func (v *view) denied(key string, r *Rule, now time.Time) (Decision, bool) {
	e, ok := v.get(key, r)
	if !ok || !now.Before(e.denyUntil) {
		return Decision{}, false
	}
	return Decision{
		Limit:      r.Limit,
		RetryAfter: e.denyUntil.Sub(now),
		ResetAfter: max(e.resetUntil.Sub(now), e.denyUntil.Sub(now)),
		Source:     SourceDenyCache,
	}, true
}

// put remembers Redis's answer d for key under rule, for a decision queued
// at start.
func (v *view) put(key string, r *Rule, start time.Time, d *Decision) {
	e := viewEntry{
		learned: start, count: max(0, r.Limit-d.Remaining), resetUntil: start.Add(d.ResetAfter),
		limit: r.Limit, window: r.Window, algorithm: r.Algorithm,
	}
	if !d.Allowed && d.RetryAfter > 0 {
		e.denyUntil = start.Add(d.RetryAfter)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	old, ok := v.entries[key]
	if ok && old.limit == e.limit && old.window == e.window && old.algorithm == e.algorithm {
		// Answers may come back out of order. A denial stays true until its
		// time whatever came after it (admits only fill the window), and
		// the newest decision knows the count best.
		if old.denyUntil.After(e.denyUntil) {
			e.denyUntil = old.denyUntil
		}
		if old.learned.After(start) {
			e.learned, e.count, e.resetUntil = old.learned, old.count, old.resetUntil
		}
	}
	if !ok && len(v.entries) >= v.max && !v.makeRoom(start, !e.denyUntil.IsZero()) {
		return
	}
	v.entries[key] = e
}

// makeRoom frees an entry for a new key; the caller holds v.mu.
func (v *view) makeRoom(now time.Time, denial bool) bool {
	if !now.Before(v.nextSweep) {
		v.nextSweep = now.Add(time.Second)
		for k, e := range v.entries {
			if !now.Before(e.resetUntil) && !now.Before(e.denyUntil) {
				delete(v.entries, k)
			}
		}
		if len(v.entries) < v.max {
			return true
		}
	}
	if !denial {
		return false
	}
	for k, e := range v.entries {
		if !now.Before(e.denyUntil) {
			delete(v.entries, k)
			return true
		}
	}
	return false
}

// len is for tests.
func (v *view) len() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.entries)
}
