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
// request denied elsewhere), a reset (Limiter.Reset, on another replica)
// or a key deleted by hand. So a denial is served from the cache for at
// most hold (Options.DenyCacheHold) after Redis gave it, even when its
// RetryAfter is a month away (a quota): then the next request asks Redis
// again. The cache denies what Redis would admit for at most hold; it
// never admits what Redis would reject.
//
// Memory is bounded by max entries, and so is the work: a put that finds
// the cache full looks at no more than roomScan entries, under attack too,
// when every entry is a live denial (issue 25: it used to scan the whole
// map then, under the one lock every decision takes). The entries sit in a
// dense slice, and makeRoom goes round it like a clock hand, a few slots
// per call: the first entry it meets that holds nothing any more (its
// window empty, no denial) is evicted; for a new denial, failing that, the
// first remembered admit it met is (denials are what save round trips). A
// live denial is never evicted, and an entry that finds no room is not
// remembered. So a cache full of live denials keeps them until they
// expire; a new key's request then simply goes to Redis, which decides
// exactly: a miss costs a round trip, never a looser limit. A call that
// finds no room moves the hand on by roomScan slots, so an entry that has
// expired is met within len/roomScan such calls.
type view struct {
	mu    sync.Mutex
	max   int
	hold  time.Duration  // how long a denial is served; 0: until its time
	index map[string]int // key → its slot
	slots []viewSlot     // the entries, in no order
	hand  int            // the slot makeRoom looks at next
	// visits counts the slots makeRoom looked at, for
	// TestViewWorkIsBounded.
	visits int
	// ignoreRule is the naive cache, for the test that shows why an entry
	// must carry its rule: it then matches whatever the rule has become.
	ignoreRule bool
}

// roomScan is how many slots makeRoom looks at, at most, per call: enough
// for a full cache of mixed entries to find room at once, few enough that
// a put costs about as much as a map lookup (BenchmarkViewUnderAttack).
const roomScan = 8

type viewSlot struct {
	key string
	viewEntry
}

type viewEntry struct {
	learned    time.Time // when the decision was queued
	count      int64     // admits in the window after the decision
	resetUntil time.Time // from then on the window holds none of them
	denyUntil  time.Time // Redis denies until then (zero: it admitted)
	holdUntil  time.Time // the cache serves the denial until then (≤ denyUntil)
	limit      int64
	window     time.Duration
	algorithm  Algorithm
}

func newView(maxEntries int) *view {
	return &view{max: maxEntries, index: make(map[string]int)}
}

// get returns what Redis last said about key under rule.
func (v *view) get(key string, r *Rule) (viewEntry, bool) {
	v.mu.Lock()
	i, ok := v.index[key]
	var e viewEntry
	if ok {
		e = v.slots[i].viewEntry
	}
	v.mu.Unlock()
	if !ok || (!v.ignoreRule && (e.limit != r.Limit || e.window != r.Window || e.algorithm != r.Algorithm)) {
		return viewEntry{}, false
	}
	return e, true
}

// denied returns the cached denial of key under rule at now, if any.
func (v *view) denied(key string, r *Rule, now time.Time) (Decision, bool) {
	e, ok := v.get(key, r)
	if !ok || !now.Before(e.holdUntil) {
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
		e.holdUntil = e.denyUntil
		if v.hold > 0 && d.RetryAfter > v.hold {
			e.holdUntil = start.Add(v.hold)
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if i, ok := v.index[key]; ok {
		old := &v.slots[i].viewEntry
		if old.limit == e.limit && old.window == e.window && old.algorithm == e.algorithm {
			// Answers may come back out of order. A denial stays true until
			// its time whatever came after it (admits only fill the
			// window), and the newest decision knows the count best.
			if old.denyUntil.After(e.denyUntil) {
				e.denyUntil = old.denyUntil
			}
			if old.holdUntil.After(e.holdUntil) {
				e.holdUntil = old.holdUntil
			}
			if old.learned.After(start) {
				e.learned, e.count, e.resetUntil = old.learned, old.count, old.resetUntil
			}
		}
		*old = e
		return
	}
	if len(v.slots) >= v.max && !v.makeRoom(start, !e.denyUntil.IsZero()) {
		return
	}
	v.index[key] = len(v.slots)
	v.slots = append(v.slots, viewSlot{key: key, viewEntry: e})
}

// makeRoom frees a slot for a new key, looking at roomScan slots at most;
// the caller holds v.mu.
func (v *view) makeRoom(now time.Time, denial bool) bool {
	admit := -1 // the first remembered admit met, for a denial
	for range min(roomScan, len(v.slots)) {
		if v.hand >= len(v.slots) {
			v.hand = 0
		}
		e := &v.slots[v.hand].viewEntry
		v.visits++
		if now.Before(e.holdUntil) { // a live denial: kept
			v.hand++
			continue
		}
		if !now.Before(e.resetUntil) { // holds nothing any more
			v.remove(v.hand)
			return true
		}
		if admit < 0 {
			admit = v.hand
		}
		v.hand++
	}
	if !denial || admit < 0 {
		return false
	}
	v.remove(admit)
	// The last slot moved into admit's, behind the hand: look at it next.
	v.hand = admit
	return true
}

// forget drops what the view holds of key (Limiter.Reset).
func (v *view) forget(key string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if i, ok := v.index[key]; ok {
		v.remove(i)
	}
}

// remove deletes slot i, moving the last slot into its place; the caller
// holds v.mu.
func (v *view) remove(i int) {
	last := len(v.slots) - 1
	delete(v.index, v.slots[i].key)
	if i != last {
		v.slots[i] = v.slots[last]
		v.index[v.slots[i].key] = i
	}
	v.slots[last] = viewSlot{} // the key's memory goes with it
	v.slots = v.slots[:last]
}

// len is for tests.
func (v *view) len() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.slots)
}
