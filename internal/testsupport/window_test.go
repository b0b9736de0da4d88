package testsupport

import (
	"testing"
	"time"
)

func TestWindowJudges(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// req is a request of key k in flight from ms to ms+10.
	req := func(k string, ms int, admitted bool) Decision {
		return Decision{Key: k, Sent: at(ms), Done: at(ms + 10), Admitted: admitted}
	}
	const limit, window = 2, time.Second
	for _, tc := range []struct {
		name      string
		ds        []Decision
		most      int
		belowDeny int
	}{
		{"none", nil, 0, 0},
		{"exact: two admits, then denied until the first leaves the window", []Decision{
			req("a", 0, true), req("a", 100, true), req("a", 200, false), req("a", 990, false),
			req("a", 1100, true), // the first admit (decided by 10 ms) has left
		}, 2, 0},
		{"over-admit: a third admit in the window", []Decision{
			req("a", 0, true), req("a", 100, true), req("a", 200, true),
		}, 3, 0},
		{"keys are apart", []Decision{
			req("a", 0, true), req("a", 100, true), req("b", 150, true), req("b", 160, true), req("b", 170, false),
		}, 2, 0},
		{"latency hides, never adds: admits whose flights straddle a window's edge are not proven together", []Decision{
			{Key: "a", Sent: at(0), Done: at(500), Admitted: true},
			req("a", 600, true),
			{Key: "a", Sent: at(1100), Done: at(1200), Admitted: true}, // the first may have been decided at 0
		}, 2, 0},
		{"under-admit: denied with one admit in the window", []Decision{
			req("a", 0, true), req("a", 100, false),
		}, 1, 1},
		{"under-admit: denied after the window emptied", []Decision{
			req("a", 0, true), req("a", 100, true), req("a", 1500, false),
		}, 2, 1},
		{"a denial may count admits decided while it was in flight", []Decision{
			req("a", 0, true),
			{Key: "a", Sent: at(5), Done: at(200), Admitted: false},
			req("a", 100, true),
		}, 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			most, where := BusiestWindow(tc.ds, window)
			if most != tc.most {
				t.Errorf("BusiestWindow = %d (%s), want %d", most, where, tc.most)
			}
			if (most > 0) != (where != "") {
				t.Errorf("BusiestWindow %d described as %q", most, where)
			}
			if got := DenialsBelowLimit(tc.ds, limit, window); len(got) != tc.belowDeny {
				t.Errorf("DenialsBelowLimit = %q, want %d of them", got, tc.belowDeny)
			}
		})
	}
}
