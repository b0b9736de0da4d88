package limiter

import (
	"container/heap"
	"math"
	"sync"
	"time"
)

// fallback is the in-memory sliding-window limiter that decides fail-open
// rules while Redis cannot. It enforces each replica's share of the limit,
// ceil(limit/replicas), so the replicas together stay near the limit.
//
// A SlidingLog rule keeps one timestamp per local admit, in a log that grows
// with the admits still in the window: exact at any share, with memory
// bounded by the admits (8 bytes each), not by the share. A
// SlidingWindowCounter rule keeps its two fixed-window counters, like in
// Redis.
//
// Each key starts from what Redis last said about it (seed): a key Redis
// reported exhausted is denied until its retry time, and this replica's
// part of the admits Redis counted, ceil(count/replicas), is taken from its
// share until they leave the window.
//
// Memory is bounded by maxClients entries. An entry is evicted only when its
// newest admit has left its window: such a client has its full budget
// anyway, so eviction never hands a denied client a fresh one. When the
// table is full of clients that still count, a new client shares one
// overflow budget per rule with all other untracked clients.
//
// The logs together are bounded by maxLogBytes (their capacity, the memory
// they hold): without it, 10,000 clients at the largest share (limit
// 1,000,000, replicas 1) could log 80 GB during an outage. A log that would
// grow past the budget turns into a sliding-window counter (demote), which
// keeps every admit it counted, so the bound costs precision (it errs
// towards denying), never a client's share. docs/operations.md states the
// whole bound; TestFallbackMemoryBounded measures it.
type fallback struct {
	mu         sync.Mutex
	start      time.Time
	maxClients int
	entries    map[fbKey]*fbEntry
	overflow   map[string]*fbEntry // by rule id; not counted in maxClients
	byExpiry   expiryHeap          // tracked entries, soonest fully-expired first
	clock      func() int64        // ns; tests replace it
	// maxLogBytes bounds logBytes, the capacity of all logs (tracked and
	// overflow entries) in bytes.
	maxLogBytes, logBytes int64
	// blind is the naive fallback, for the test that shows why seeds
	// matter: it starts every key empty.
	blind bool
}

type fbKey struct{ rule, client string }

// fbEntry is one client's local window: a log of admit times (SlidingLog),
// or two fixed-window counters (SlidingWindowCounter); plus what Redis last
// said about the key.
type fbEntry struct {
	key    fbKey
	window int64 // ns
	share  int64
	// log mode: log[head:] are the admits in the window, oldest first
	log  []int64
	head int
	// counter mode
	counter   bool
	idx       int64
	cur, prev int64

	// demoted: a log that the byte budget turned into a counter; it stays
	// one until the entry is evicted.
	demoted bool
	// logBytes is the log capacity counted in fallback.logBytes.
	logBytes int64

	seed      fbSeed
	lastAdmit int64 // ns since fallback start; -1 never
	heapIdx   int   // -1 when not in the heap (overflow entries)
}

// fbSeed is what Redis last said about a key, on the fallback's clock.
type fbSeed struct {
	learned   int64 // when (0: nothing known)
	n         int64 // this replica's part of the admits Redis counted
	until     int64 // when those have all left the window
	denyUntil int64 // Redis denies until then
}

// fallbackEntryBytes is what one tracked entry holds besides its log (the
// entry, its keys, its map and heap slots), rounded up from the 250-odd
// bytes TestFallbackMemoryBounded measures with hashed client keys: the
// per-client term of the bound in docs/operations.md.
const fallbackEntryBytes = 512

func newFallback(maxClients int, maxLogBytes int64) *fallback {
	return &fallback{
		start:       time.Now(),
		maxClients:  maxClients,
		maxLogBytes: maxLogBytes,
		entries:     make(map[fbKey]*fbEntry),
		overflow:    make(map[string]*fbEntry),
	}
}

func (f *fallback) now() int64 {
	if f.clock != nil {
		return f.clock()
	}
	return int64(time.Since(f.start))
}

// seedOf converts a remembered Redis answer for a rule shared by replicas.
func (f *fallback) seedOf(e viewEntry, replicas int64) fbSeed {
	s := fbSeed{
		learned: int64(e.learned.Sub(f.start)),
		n:       ceilDiv(e.count, max(1, replicas)),
		until:   int64(e.resetUntil.Sub(f.start)),
	}
	if !e.denyUntil.IsZero() {
		s.denyUntil = int64(e.denyUntil.Sub(f.start))
	}
	s.learned = max(s.learned, 1) // 0 means nothing known
	return s
}

// fbReq is one request the fallback must decide.
type fbReq struct {
	rule   *Rule
	client string
	dryRun bool
	hits   int64 // 0 counts as 1 (OpDecide)
	op     Op    // a Weighted rule's OpCheck or OpCharge
	share  int64
	seed   fbSeed
	out    *Decision
	err    error // why Redis did not decide it, for out.Err
}

// decide decides reqs together: it admits into every allowed one only if
// commit is true and no non-dry-run request denies. It returns whether the
// requests pass (no non-dry-run denial).
func (f *fallback) decide(reqs []fbReq, commit bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	entries := make([]*fbEntry, len(reqs))
	pass := true
	for i := range reqs {
		r := &reqs[i]
		if r.op == OpDecide {
			r.hits = max(r.hits, 1)
		}
		e := f.entry(r, now)
		if r.seed.learned > e.seed.learned && e.key.client != "" && !f.blind {
			e.seed = r.seed
		}
		entries[i] = e
		ok, _ := r.check(e, now)
		if !ok && !r.dryRun {
			pass = false
		}
	}
	for i := range reqs {
		r, e := &reqs[i], entries[i]
		ok, retry := r.check(e, now)
		if ok && pass && commit && r.hits > 0 {
			f.budget(e, r.hits, now)
			e.admit(now, r.hits)
			if e.heapIdx >= 0 {
				heap.Fix(&f.byExpiry, e.heapIdx)
			}
		}
		*r.out = Decision{
			Allowed:    ok,
			Limit:      e.share,
			Remaining:  e.remaining(now),
			RetryAfter: time.Duration(retry),
			ResetAfter: e.resetAfter(now),
			Source:     SourceFallback,
			Err:        r.err,
		}
		f.account(e) // check, admit and remaining trim and grow logs
	}
	return pass
}

// check is e.check for r's op: a check needs room for 1, a charge none.
func (r *fbReq) check(e *fbEntry, now int64) (bool, int64) {
	switch r.op {
	case OpCheck:
		return e.check(now, 1)
	case OpCharge:
		return true, 0
	}
	return e.check(now, r.hits)
}

// entry finds or makes the entry of r; the caller holds f.mu. A Weighted
// rule counts in the counter mode whatever its algorithm: a log keeps a
// time per unit of cost, and a cost may be 10^9.
func (f *fallback) entry(r *fbReq, now int64) *fbEntry {
	id := r.rule.ID
	if r.rule.Variant != "" {
		// Each window of a rule counts apart, as its keys in Redis do.
		id += "@" + r.rule.Variant
	}
	k := fbKey{id, r.client}
	window := int64(r.rule.Window)
	counter := r.rule.Algorithm == SlidingWindowCounter || r.rule.Weighted || r.rule.Calendar != nil
	if e, ok := f.entries[k]; ok {
		e.reshape(window, r.share, counter || e.demoted, now)
		f.account(e)
		return e
	}
	if len(f.entries) >= f.maxClients {
		// Only an entry whose admits have all left their window may go.
		if len(f.byExpiry) == 0 || f.byExpiry[0].expiry() > now {
			o, ok := f.overflow[id]
			if !ok {
				o = newEntry(fbKey{id, ""}, window, r.share, counter, now)
				f.overflow[id] = o
			}
			o.reshape(window, r.share, counter || o.demoted, now)
			f.account(o)
			return o
		}
		old := heap.Pop(&f.byExpiry).(*fbEntry)
		delete(f.entries, old.key)
		f.logBytes -= old.logBytes
	}
	e := newEntry(k, window, r.share, counter, now)
	f.entries[k] = e
	heap.Push(&f.byExpiry, e)
	return e
}

// account brings f.logBytes in line with the capacity of e's log after e
// changed; the caller holds f.mu.
func (f *fallback) account(e *fbEntry) {
	b := int64(cap(e.log)) * 8
	f.logBytes += b - e.logBytes
	e.logBytes = b
}

// budget demotes e to a counter when admitting h into its log could take
// the logs past maxLogBytes: when the log must grow, append may allocate
// up to twice what it then holds. The caller holds f.mu.
func (f *fallback) budget(e *fbEntry, h, now int64) {
	if e.counter || f.maxLogBytes <= 0 {
		return
	}
	need := int64(len(e.log)) + h
	if need <= int64(cap(e.log)) {
		return // no allocation
	}
	if f.logBytes-e.logBytes+2*need*8 <= f.maxLogBytes {
		return
	}
	e.reshape(e.window, e.share, true, now)
	e.demoted = true
	f.account(e)
}

func newEntry(k fbKey, window, share int64, counter bool, now int64) *fbEntry {
	e := &fbEntry{key: k, lastAdmit: -1, heapIdx: -1, counter: !counter}
	e.reshape(window, share, counter, now)
	return e
}

// reshape follows a change of the rule or of the replica count without
// forgetting admits that still count: a log keeps its times, a counter
// keeps its counts (folded into the current window when the window length
// changes), and a counter turning into a log records its counted admits as
// made now. All of these err towards denying.
func (e *fbEntry) reshape(window, share int64, counter bool, now int64) {
	if e.window == window && e.share == share && e.counter == counter {
		return
	}
	switch {
	case counter && e.counter:
		if window != e.window {
			e.cur, e.prev, e.idx = e.cur+e.prev, 0, now/window
		}
	case counter:
		n := int64(0)
		for _, t := range e.log[e.head:] {
			if t > now-window {
				n++
			}
		}
		e.log, e.head = nil, 0
		e.idx, e.cur, e.prev = now/window, n, 0
	case e.counter:
		for range min(e.cur+e.prev, share) {
			e.log = append(e.log, now)
		}
		e.idx, e.cur, e.prev = 0, 0, 0
	}
	// A shrinking share keeps every admit of a log, so growing it back
	// later hands out nothing extra.
	e.window, e.share, e.counter = window, share, counter
}

func (e *fbEntry) expiry() int64 {
	if e.lastAdmit < 0 {
		return -1 << 62
	}
	return e.lastAdmit + e.window
}

// trim drops the admits that left the window, and compacts the log when
// most of it is dropped, so its memory follows the admits in the window.
func (e *fbEntry) trim(now int64) {
	for e.head < len(e.log) && e.log[e.head] <= now-e.window {
		e.head++
	}
	if e.head == len(e.log) {
		e.log, e.head = e.log[:0], 0
	} else if e.head > 64 && e.head > len(e.log)/2 {
		e.log = append(e.log[:0], e.log[e.head:]...)
		e.head = 0
	}
	if cap(e.log) > 64 && cap(e.log) > 4*len(e.log) {
		e.log = append([]int64(nil), e.log...)
	}
}

// roll moves the counters to the fixed window of now.
func (e *fbEntry) roll(now int64) {
	x := now / e.window
	switch x {
	case e.idx:
	case e.idx + 1:
		e.prev, e.cur = e.cur, 0
	default:
		e.prev, e.cur = 0, 0
	}
	e.idx = x
}

func (e *fbEntry) estimate(now int64) float64 {
	e.roll(now)
	elapsed := now - e.idx*e.window
	return float64(e.prev)*float64(e.window-elapsed)/float64(e.window) + float64(e.cur)
}

// check says whether h more admits fit, and otherwise in how many ns.
func (e *fbEntry) check(now, h int64) (bool, int64) {
	if now < e.seed.denyUntil {
		return false, e.seed.denyUntil - now
	}
	if e.share < h {
		return false, e.window
	}
	seeded := int64(0)
	if now < e.seed.until {
		seeded = e.seed.n
	}
	if e.counter {
		if seeded > 0 && e.estimate(now)+float64(seeded)+float64(h) > float64(e.share) {
			// Redis's admits first: wait until they have left.
			return false, e.seed.until - now
		}
		est := e.estimate(now)
		if est+float64(h) <= float64(e.share) {
			return true, 0
		}
		elapsed := now - e.idx*e.window
		room := float64(e.share - h - e.cur)
		if e.prev > 0 && room >= 0 {
			need := float64(e.window) * (1 - room/float64(e.prev))
			return false, max(1, int64(math.Ceil(need))-elapsed)
		}
		var need float64
		if float64(e.cur) > float64(e.share-h) {
			need = float64(e.window) * (1 - float64(e.share-h)/float64(e.cur))
		}
		return false, max(1, e.window-elapsed+int64(math.Ceil(need)))
	}
	e.trim(now)
	used := int64(len(e.log)-e.head) + seeded
	if used+h <= e.share {
		return true, 0
	}
	// The (used+h-share)-th departure, in time order, of the local admits
	// (each at its time + window) and the seeded ones (all at seed.until).
	k := used + h - e.share
	for _, t := range e.log[e.head:] {
		if seeded > 0 && e.seed.until <= t+e.window {
			if k <= seeded {
				return false, e.seed.until - now
			}
			k -= seeded
			seeded = 0
		}
		if k == 1 {
			return false, t + e.window - now
		}
		k--
	}
	return false, e.seed.until - now
}

func (e *fbEntry) admit(now, h int64) {
	if e.counter {
		e.roll(now)
		e.cur += h
	} else {
		for range h {
			e.log = append(e.log, now)
		}
	}
	e.lastAdmit = now
}

func (e *fbEntry) remaining(now int64) int64 {
	seeded := int64(0)
	if now < e.seed.until {
		seeded = e.seed.n
	}
	if e.counter {
		return max(0, int64(float64(e.share-seeded)-e.estimate(now)))
	}
	e.trim(now)
	return max(0, e.share-int64(len(e.log)-e.head)-seeded)
}

func (e *fbEntry) resetAfter(now int64) time.Duration {
	if e.lastAdmit < 0 || e.lastAdmit+e.window <= now {
		return 0
	}
	return time.Duration(e.lastAdmit + e.window - now)
}

// expiryHeap orders tracked entries by the time their last admit leaves
// the window.
type expiryHeap []*fbEntry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].expiry() < h[j].expiry() }
func (h expiryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx = i
	h[j].heapIdx = j
}
func (h *expiryHeap) Push(x any) {
	e := x.(*fbEntry)
	e.heapIdx = len(*h)
	*h = append(*h, e)
}
func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.heapIdx = -1
	return e
}

// size reports the tracked entries, for tests.
func (f *fallback) size() (tracked, overflow int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.entries), len(f.overflow)
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return a
	}
	return (a + b - 1) / b
}
