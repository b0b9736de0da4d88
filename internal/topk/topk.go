// Package topk finds the heaviest keys of a stream in bounded memory: the
// Space-Saving sketch (Metwally, Agrawal, El Abbadi, "Efficient Computation
// of Frequent and Top-k Elements in Data Streams", 2005), and the merge of
// such sketches (Agarwal et al., "Mergeable Summaries", 2012).
//
// # Error bound
//
// A sketch of capacity k that has counted N events keeps at most k keys.
// For every key it reports, Count overestimates the key's true count by at
// most Err, and Err ≤ N/k:
//
//	Count - Err ≤ true count ≤ Count
//
// Every key whose true count exceeds N/k is reported. A key not reported
// has a true count of at most Min() ≤ N/k.
//
// A merge of summaries keeps both bounds per item (Count-Err ≤ true ≤
// Count) and reports every key whose true count exceeds the merged Min;
// Min is then at most the sum of the summaries' Min (each ≤ Ni/k, so at
// most N/k in all) or the largest count it dropped.
//
// The sidecar counts its 429s per policy by hashed client key with it, so
// `kubectl slidegate top` can name the clients a policy limits most without
// a Prometheus label per client.
package topk

import (
	"cmp"
	"slices"
)

// Item is one key's estimate.
type Item struct {
	Key string `json:"key"`
	// Count is an upper bound of the key's true count, Count-Err a lower
	// bound.
	Count uint64 `json:"count"`
	Err   uint64 `json:"err"`
}

// Sketch is a Space-Saving sketch. It is not safe for concurrent use.
type Sketch struct {
	k     int
	total uint64
	// items is a min-heap by Count; index maps a key to its position.
	items []Item
	index map[string]int
}

// New returns a sketch of capacity k (at least 1).
func New(k int) *Sketch {
	k = max(k, 1)
	return &Sketch{k: k, items: make([]Item, 0, k), index: make(map[string]int, k)}
}

// Capacity is k.
func (s *Sketch) Capacity() int { return s.k }

// Total is the number of events counted (N).
func (s *Sketch) Total() uint64 { return s.total }

// Min is the smallest count kept once the sketch is full (0 before): an
// upper bound of the true count of every key it does not report.
func (s *Sketch) Min() uint64 {
	if len(s.items) < s.k {
		return 0
	}
	return s.items[0].Count
}

// Add counts n events of key. A new key on a full sketch replaces the key
// with the smallest count and inherits that count as its error.
func (s *Sketch) Add(key string, n uint64) {
	s.total += n
	if i, ok := s.index[key]; ok {
		s.items[i].Count += n
		s.down(i)
		return
	}
	if len(s.items) < s.k {
		s.items = append(s.items, Item{Key: key, Count: n})
		s.index[key] = len(s.items) - 1
		s.up(len(s.items) - 1)
		return
	}
	low := s.items[0]
	delete(s.index, low.Key)
	s.items[0] = Item{Key: key, Count: low.Count + n, Err: low.Count}
	s.index[key] = 0
	s.down(0)
}

// Top returns up to n items, heaviest first (ties by key).
func (s *Sketch) Top(n int) []Item {
	out := slices.Clone(s.items)
	sortItems(out)
	if n >= 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

func sortItems(items []Item) {
	slices.SortFunc(items, func(a, b Item) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
}

func (s *Sketch) less(i, j int) bool { return s.items[i].Count < s.items[j].Count }

func (s *Sketch) swap(i, j int) {
	s.items[i], s.items[j] = s.items[j], s.items[i]
	s.index[s.items[i].Key] = i
	s.index[s.items[j].Key] = j
}

func (s *Sketch) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *Sketch) down(i int) {
	for {
		l, small := 2*i+1, i
		if l < len(s.items) && s.less(l, small) {
			small = l
		}
		if r := l + 1; r < len(s.items) && s.less(r, small) {
			small = r
		}
		if small == i {
			return
		}
		s.swap(i, small)
		i = small
	}
}

// Summary is a sketch's content, as the sidecar serves it and the plugin
// merges it.
type Summary struct {
	Capacity int    `json:"capacity"`
	Total    uint64 `json:"total"`
	// Min bounds the true count of every key not in Items.
	Min   uint64 `json:"min"`
	Items []Item `json:"items"`
}

// Summary returns the whole sketch, heaviest first.
func (s *Sketch) Summary() Summary {
	return Summary{Capacity: s.k, Total: s.total, Min: s.Min(), Items: s.Top(-1)}
}

// Merge combines summaries of disjoint streams (one per sidecar, or one per
// period) into one of capacity k. A key missing from a summary may still
// have up to that summary's Min there: Merge adds Min to the key's Count
// and Err, so Count stays an upper bound and Count-Err a lower one, and
// Err ≤ N/k, N the total of all summaries. It keeps the k heaviest; the
// merged Min bounds the true count of every key it does not report.
func Merge(k int, sums ...Summary) Summary {
	k = max(k, 1)
	type acc struct {
		Item
		seen int // summaries that hold the key
	}
	keys := map[string]*acc{}
	var out Summary
	out.Capacity = k
	for _, s := range sums {
		out.Total += s.Total
		for _, it := range s.Items {
			a := keys[it.Key]
			if a == nil {
				a = &acc{Item: Item{Key: it.Key}}
				keys[it.Key] = a
			}
			a.Count += it.Count
			a.Err += it.Err
			a.seen++
		}
	}
	items := make([]Item, 0, len(keys))
	for _, a := range keys {
		if a.seen < len(sums) {
			for _, s := range sums {
				if !holds(s, a.Key) {
					a.Count += s.Min
					a.Err += s.Min
				}
			}
		}
		items = append(items, a.Item)
	}
	sortItems(items)
	var sumMin uint64
	for _, s := range sums {
		sumMin += s.Min
	}
	if len(items) > k {
		// What is dropped counts as the merged minimum: a dropped key's
		// upper bound is at most the k-th heaviest count.
		sumMin = max(sumMin, items[k].Count)
		items = items[:k]
	}
	out.Min = sumMin
	out.Items = items
	return out
}

func holds(s Summary, key string) bool {
	for _, it := range s.Items {
		if it.Key == key {
			return true
		}
	}
	return false
}
