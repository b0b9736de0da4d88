package topk

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// check verifies the sketch's promises against the true counts: every
// reported key within [Count-Err, Count], Err ≤ N/k, and every key heavier
// than Min reported.
func check(t *testing.T, s Summary, truth map[string]uint64) {
	t.Helper()
	var n uint64
	for _, c := range truth {
		n += c
	}
	if s.Total != n {
		t.Fatalf("total %d, want %d", s.Total, n)
	}
	reported := map[string]bool{}
	for _, it := range s.Items {
		reported[it.Key] = true
		tc := truth[it.Key]
		if it.Count < tc || it.Count-it.Err > tc {
			t.Errorf("%s: true %d outside [%d, %d]", it.Key, tc, it.Count-it.Err, it.Count)
		}
		if it.Err*uint64(s.Capacity) > n {
			t.Errorf("%s: err %d above N/k = %d/%d", it.Key, it.Err, n, s.Capacity)
		}
	}
	for key, c := range truth {
		if c > s.Min && !reported[key] {
			t.Errorf("%s: true count %d > min %d, not reported", key, c, s.Min)
		}
	}
}

func TestSketch(t *testing.T) {
	cases := []struct {
		name   string
		k      int
		stream []string
		want   []Item // Top(-1)
	}{
		{name: "empty", k: 3, want: []Item{}},
		{name: "fewer keys than k: exact", k: 3, stream: []string{"a", "b", "a", "c", "a", "b"},
			want: []Item{{"a", 3, 0}, {"b", 2, 0}, {"c", 1, 0}}},
		{name: "a new key takes the smallest count as its error", k: 2, stream: []string{"a", "a", "b", "c"},
			want: []Item{{"a", 2, 0}, {"c", 2, 1}}},
		{name: "k=1 keeps the last key with everything", k: 1, stream: []string{"a", "b", "c"},
			want: []Item{{"c", 3, 2}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := New(tc.k)
			truth := map[string]uint64{}
			for _, k := range tc.stream {
				s.Add(k, 1)
				truth[k]++
			}
			got := s.Top(-1)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			check(t, s.Summary(), truth)
		})
	}
}

// TestHeavyHitterAmong10000: 10,000 clients each send once, then a Zipf
// mix of them sends the rest of 200,000 events; halfway through, one new
// client starts and sends 4,000 of them (2%). A sketch of k=64 (bound
// N/k = 3,125) reports the late heavy hitter with its count within the
// bound, and keeps every promise for every key. The paired naive sketch,
// "count the first k keys seen", misses it.
func TestHeavyHitterAmong10000(t *testing.T) {
	const k, n, clients = 64, 200_000, 10_000
	rng := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rng, 1.1, 1, clients-1)
	s := New(k)
	truth := map[string]uint64{}
	naive := map[string]uint64{}
	for i := range n {
		key := fmt.Sprintf("h:client-%d", zipf.Uint64())
		switch {
		case i < clients:
			key = fmt.Sprintf("h:client-%d", i)
		case i >= n/2 && i%25 == 7:
			key = "h:heavy"
		}
		s.Add(key, 1)
		truth[key]++
		if _, ok := naive[key]; ok || len(naive) < k {
			naive[key]++
		}
	}
	if len(truth) != clients+1 {
		t.Fatalf("only %d distinct clients", len(truth))
	}
	sum := s.Summary()
	check(t, sum, truth)
	var found *Item
	for i := range sum.Items {
		if sum.Items[i].Key == "h:heavy" {
			found = &sum.Items[i]
		}
	}
	if found == nil {
		t.Fatalf("heavy hitter (%d events) not reported; top %v", truth["h:heavy"], sum.Items[:5])
	}
	t.Logf("heavy: true %d, reported %d ± %d (bound N/k = %d); %d distinct clients; min %d",
		truth["h:heavy"], found.Count, found.Err, n/k, len(truth), sum.Min)
	if _, ok := naive["h:heavy"]; ok {
		t.Error("the naive first-k table found the heavy hitter: the test proves nothing")
	}
}

// TestMerge: sketches of several sidecars, merged, keep the promises for the
// union of their streams.
func TestMerge(t *testing.T) {
	const k = 16
	rng := rand.New(rand.NewPCG(3, 4))
	truth := map[string]uint64{}
	var sums []Summary
	for pod := range 3 {
		s := New(k)
		for i := range 20_000 {
			key := fmt.Sprintf("c%d", rng.IntN(2000))
			switch {
			case i%10 == 0:
				key = "everywhere"
			case i%25 == 1 && pod == 2:
				key = "only-on-pod-2"
			}
			s.Add(key, 1)
			truth[key]++
		}
		sums = append(sums, s.Summary())
	}
	m := Merge(k, sums...)
	check(t, m, truth)
	if len(m.Items) > k || m.Items[0].Key != "everywhere" {
		t.Errorf("merged %v", m.Items)
	}
	// Merging exact summaries is exact.
	a, b := New(4), New(4)
	a.Add("x", 3)
	b.Add("x", 2)
	b.Add("y", 1)
	if got := Merge(4, a.Summary(), b.Summary()); fmt.Sprint(got.Items) != "[{x 5 0} {y 1 0}]" || got.Min != 0 {
		t.Errorf("exact merge %+v", got)
	}
}
