package limiter

import (
	"fmt"
	"testing"
	"time"
)

// fakeFallback returns a fallback on a clock the test moves.
func fakeFallback(maxClients, logMax int) (*fallback, *int64) {
	f := newFallback(maxClients, logMax)
	now := new(int64)
	f.clock = func() int64 { return *now }
	return f, now
}

func fbDecide(f *fallback, rule Rule, client string, replicas int64) Decision {
	var d Decision
	f.decide([]fbReq{{rule: &rule, client: client, share: ceilDiv(rule.Limit, replicas), out: &d}}, true)
	return d
}

func TestFallbackEnforcesShare(t *testing.T) {
	for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			f, now := fakeFallback(100, 128)
			rule := Rule{ID: "r", Limit: 10, Window: time.Second, Algorithm: alg}
			// 3 replicas: share ceil(10/3) = 4.
			for i := range 4 {
				d := fbDecide(f, rule, "c", 3)
				if !d.Allowed || d.Limit != 4 || d.Remaining != int64(3-i) || d.Source != SourceFallback {
					t.Fatalf("admit %d: %+v", i, d)
				}
				*now += int64(10 * time.Millisecond)
			}
			d := fbDecide(f, rule, "c", 3)
			if d.Allowed || d.RetryAfter <= 0 {
				t.Fatalf("5th: %+v", d)
			}
			*now += int64(d.RetryAfter) - 1
			if d := fbDecide(f, rule, "c", 3); d.Allowed {
				t.Fatalf("admitted 1ns before the retry-after: %+v", d)
			}
			*now++
			if d := fbDecide(f, rule, "c", 3); !d.Allowed {
				t.Fatalf("denied at the retry-after: %+v", d)
			}
		})
	}
}

// TestFallbackNeverEvictsACountedClient: with the table full of clients
// that still have admits in their window, a denied client stays denied (it
// is not evicted and re-created with a fresh budget) and newcomers share
// one overflow budget.
func TestFallbackNeverEvictsACountedClient(t *testing.T) {
	f, now := fakeFallback(3, 128)
	rule := Rule{ID: "r", Limit: 2, Window: time.Second}
	for _, c := range []string{"a", "b", "c"} {
		fbDecide(f, rule, c, 1)
		fbDecide(f, rule, c, 1)
	}
	if d := fbDecide(f, rule, "a", 1); d.Allowed {
		t.Fatal("a not denied after its share")
	}
	// A flood of new clients while a, b, c are still counted.
	admitted := 0
	for i := range 1000 {
		if fbDecide(f, rule, fmt.Sprintf("new-%d", i), 1).Allowed {
			admitted++
		}
		if d := fbDecide(f, rule, "a", 1); d.Allowed {
			t.Fatalf("a got a fresh budget after %d new clients", i+1)
		}
	}
	if admitted != 2 {
		t.Errorf("new clients admitted %d times, want the one overflow share of 2", admitted)
	}
	if tracked, overflow := f.size(); tracked != 3 || overflow != 1 {
		t.Errorf("tracked %d overflow %d, want 3 and 1", tracked, overflow)
	}
	// Once a's admits leave the window it may be evicted for a newcomer:
	// that hands out nothing a did not have anyway.
	*now += int64(time.Second)
	if d := fbDecide(f, rule, "z", 1); !d.Allowed {
		t.Fatalf("newcomer after the window: %+v", d)
	}
	if _, ok := f.entries[fbKey{"r", "z"}]; !ok {
		t.Error("the newcomer did not get a tracked entry after the window")
	}
}

func TestFallbackAllOrNothing(t *testing.T) {
	f, _ := fakeFallback(10, 128)
	a := Rule{ID: "a", Limit: 5, Window: time.Second}
	b := Rule{ID: "b", Limit: 1, Window: time.Second}
	decide := func() (bool, Decision, Decision) {
		var da, db Decision
		pass := f.decide([]fbReq{
			{rule: &a, client: "c", share: 5, out: &da},
			{rule: &b, client: "c", share: 1, out: &db},
		}, true)
		return pass, da, db
	}
	if pass, _, _ := decide(); !pass {
		t.Fatal("first request denied")
	}
	for range 3 {
		if pass, da, db := decide(); pass || !da.Allowed || db.Allowed {
			t.Fatalf("pass %v a %+v b %+v", pass, da, db)
		}
	}
	// The denied requests took nothing from a.
	if _, da, _ := decide(); da.Remaining != 4 {
		t.Errorf("a remaining %d, want 4", da.Remaining)
	}
	// commit=false (Redis already denied the request) admits nothing.
	var d Decision
	f.decide([]fbReq{{rule: &a, client: "d", share: 5, out: &d}}, false)
	if !d.Allowed || d.Remaining != 5 {
		t.Errorf("uncommitted: %+v", d)
	}
}

// TestFallbackReshapeKeepsAdmits: a change of the replica count (share) or
// of the algorithm keeps the admits already counted.
func TestFallbackReshapeKeepsAdmits(t *testing.T) {
	f, _ := fakeFallback(10, 4)
	rule := Rule{ID: "r", Limit: 8, Window: time.Second}
	for range 3 {
		fbDecide(f, rule, "c", 2) // share 4: log
	}
	if d := fbDecide(f, rule, "c", 4); d.Allowed { // share 2: still 3 counted
		t.Fatalf("share shrank to 2 yet admitted: %+v", d)
	}
	if d := fbDecide(f, rule, "c", 1); !d.Allowed || d.Remaining != 4 { // share 8 > logMax: counter
		t.Fatalf("share 8: %+v", d)
	}
	if d := fbDecide(f, rule, "c", 2); d.Allowed { // back to a log of 4, 4 counted
		t.Fatalf("back to share 4: %+v", d)
	}
}

func TestBreaker(t *testing.T) {
	b := newBreaker(3)
	for range 2 {
		b.failure(ErrTimeout)
	}
	b.success()
	for range 2 {
		b.failure(ErrTimeout)
	}
	if !b.allow() {
		t.Fatal("opened without 3 consecutive failures")
	}
	b.failure(ErrTimeout)
	if b.allow() || b.opens.Load() != 1 {
		t.Fatal("not open after 3 consecutive failures")
	}
	select {
	case <-b.wake:
	default:
		t.Fatal("prober not woken")
	}
	b.close()
	if !b.allow() {
		t.Fatal("still open after close")
	}
}
