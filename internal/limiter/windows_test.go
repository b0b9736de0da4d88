package limiter

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// Several windows of one rule for one client (a policy's
// additionalLimits): each window is a Rule with its own Variant, and a
// request asks about all of them in one Decide.

// windowRules are a short and a long window of one rule, the long one a
// Variant: 3 admits in any 400ms and 7 in any 1.6s.
func windowRules(alg Algorithm) []Rule {
	short := Rule{ID: "shop/api", Limit: 3, Window: 400 * time.Millisecond, Algorithm: alg, FailMode: FailOpen}
	long := short
	long.Limit, long.Window, long.Variant = 7, 1600*time.Millisecond, "1600"
	return []Rule{short, long}
}

func windowLimits(rules []Rule) []testsupport.Limit {
	var out []testsupport.Limit
	for _, r := range rules {
		out = append(out, testsupport.Limit{Limit: int(r.Limit), Window: r.Window})
	}
	return out
}

// driveWindows sends requests of two clients from 6 goroutines for four
// long windows, round-robin over deciders, each asking about every window
// through decide, and returns what the clients saw.
func driveWindows(deciders int, decide func(i int, client string) bool, long time.Duration) []testsupport.Decision {
	return testsupport.Paced(6, []string{"client-0", "client-1"}, 4*long, func(w, n int, client string) (bool, bool) {
		return decide((w+n)%deciders, client), true
	})
}

// judgeWindows fails t unless ds are exact for every window of rules: no
// window ever held more than its limit, and no request was denied while
// every window had room. It returns the denials that were wrong.
func judgeWindows(t *testing.T, ds []testsupport.Decision, rules []Rule) []string {
	t.Helper()
	admitted := testsupport.Admitted(ds)
	for _, r := range rules {
		if most, where := testsupport.BusiestWindow(ds, r.Window); most > int(r.Limit) {
			t.Errorf("window %v: %d admits in one window, limit %d: %s", r.Window, most, r.Limit, where)
		}
	}
	if len(ds) < 200 {
		t.Fatalf("%d requests: too few to judge", len(ds))
	}
	t.Logf("%d requests, %d admitted", len(ds), admitted)
	return testsupport.DenialsBelowLimits(ds, windowLimits(rules))
}

func windowRequests(rules []Rule, client string) []Request {
	reqs := make([]Request, len(rules))
	for i, r := range rules {
		reqs[i] = Request{Rule: r, Client: client}
	}
	return reqs
}

func allAllowed(ds []Decision) bool {
	for _, d := range ds {
		if !d.Allowed || d.Source != SourceRedis {
			return false
		}
	}
	return true
}

// TestSeveralWindowsExact: three limiters on one Redis (standalone, and
// a 3-master Cluster, where a rule's windows share a slot) decide a short
// and a long window of each request together: exact for each window, and
// never a denial while both had room.
func TestSeveralWindowsExact(t *testing.T) {
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			rdbs := windowClients(t, mode)
			rules := windowRules(SlidingLog)
			prefix := "w" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
			var lims []*Limiter
			for _, rdb := range rdbs {
				lims = append(lims, newLimiter(t, rdb, Options{Timeout: 10 * time.Second, Prefix: prefix}))
			}
			// The windows of a client are keys of one slot.
			k0 := lims[0].keyOf(&Request{Rule: rules[0], Client: "client-0"})
			k1 := lims[0].keyOf(&Request{Rule: rules[1], Client: "client-0"})
			if k0 == k1 || redisschema.Slot(k0) != redisschema.Slot(k1) {
				t.Fatalf("keys %q and %q: want two keys of one slot", k0, k1)
			}
			ds := driveWindows(len(lims), func(i int, client string) bool {
				return allAllowed(lims[i].Decide(context.Background(), windowRequests(rules, client)))
			}, rules[1].Window)
			if wrong := judgeWindows(t, ds, rules); len(wrong) > 0 {
				t.Errorf("%d of %d denials with room in every window, first: %s", len(wrong), len(ds), wrong[0])
			}
			// Too few admits would be denials with room, judged above; the
			// windows must have refused some for the run to show anything.
			if n := testsupport.Admitted(ds); n == 0 || n == len(ds) {
				t.Errorf("%d of %d admitted: the limits never bound", n, len(ds))
			}
		})
	}
}

// TestSeveralWindowsNaiveApartFails is what TestSeveralWindowsExact
// guards against: each window decided on its own (one Decide per window,
// admitted when all admit) counts a request in the windows that admitted
// it even when another refused it, so the short window fills with
// requests that were turned away and denies while every window has room.
func TestSeveralWindowsNaiveApartFails(t *testing.T) {
	rdbs := windowClients(t, "standalone")
	rules := windowRules(SlidingLog)
	var lims []*Limiter
	for _, rdb := range rdbs {
		lims = append(lims, newLimiter(t, rdb, Options{Timeout: 10 * time.Second, Prefix: "naive:"}))
	}
	ds := driveWindows(len(lims), func(i int, client string) bool {
		ok := true
		for _, r := range windowRequests(rules, client) {
			ok = allAllowed(lims[i].Decide(context.Background(), []Request{r})) && ok
		}
		return ok
	}, rules[1].Window)
	if wrong := judgeWindows(t, ds, rules); len(wrong) == 0 {
		t.Errorf("deciding each window apart was judged exact over %d requests; the judge cannot tell", len(ds))
	} else {
		t.Logf("deciding each window apart: %d of %d requests denied with room in every window, first: %s", len(wrong), len(ds), wrong[0])
	}
}

// windowClients are three Redis clients, as three sidecars have, of a
// fresh standalone Redis or of the shared Cluster.
func windowClients(t *testing.T, mode string) []redis.UniversalClient {
	var cfg redisconn.Config
	if mode == "cluster" {
		cfg = redisconn.Config{Mode: redisconn.Cluster, Addrs: sharedCluster(t).Addrs()}
	} else {
		cfg = redisconn.Config{Addrs: []string{testsupport.StartRedis(t).Addr}}
	}
	var out []redis.UniversalClient
	for range 3 {
		rdb := client(t, cfg)
		loadLibrary(t, rdb)
		out = append(out, rdb)
	}
	return out
}

// TestFallbackCountsWindowsApart: while Redis is away, the windows of one
// rule (same ID, a Variant each) are counted apart, as their keys are in
// Redis, and decided together: 3 in any 400ms and 7 in any 1.6s admit 3,
// 3 and then 1 over three short windows. One entry for both (keyed by the
// rule's ID alone) would count each request twice and reshape itself to
// whichever window asked last.
func TestFallbackCountsWindowsApart(t *testing.T) {
	f, now := fakeFallback(100)
	rules := windowRules(SlidingLog)
	decide := func() bool {
		ds := make([]Decision, len(rules))
		reqs := make([]fbReq, len(rules))
		for i := range rules {
			reqs[i] = fbReq{rule: &rules[i], client: "c", share: rules[i].Limit, out: &ds[i]}
		}
		return f.decide(reqs, true)
	}
	var got []int
	for range 3 {
		n := 0
		for range 10 {
			if decide() {
				n++
			}
		}
		got = append(got, n)
		*now += int64(rules[0].Window)
	}
	if fmt.Sprint(got) != "[3 3 1]" {
		t.Errorf("admits per short window %v, want [3 3 1]", got)
	}
	if tracked, _ := f.size(); tracked != 2 {
		t.Errorf("%d entries tracked, want one per window", tracked)
	}
}

// TestVariantChecked: a variant is part of a key after its hash tag, so
// only what cannot make it another rule's key is taken.
func TestVariantChecked(t *testing.T) {
	for _, tc := range []struct {
		variant  string
		weighted bool
		ok       bool
	}{
		{"3600000", false, true},
		{"1h", false, true},
		{"", true, true},
		{"3600000", true, false},
		{"1H", false, false},
		{"a}b", false, false},
		{"x@y", false, false},
		{"12345678901234567", false, false},
	} {
		r := Rule{ID: "shop/api", Limit: 1, Window: time.Second, Variant: tc.variant, Weighted: tc.weighted}
		if err := validRule(&r); (err == nil) != tc.ok {
			t.Errorf("variant %q weighted %v: %v, want ok %v", tc.variant, tc.weighted, err, tc.ok)
		}
	}
}

// TestSeveralWindowsFullAnswerEach: when every window of a request is
// full, each answers with its own wait (a front end retries after the
// longest), not only the first that refused: a client told the second's
// wait would be refused again by the hour.
func TestSeveralWindowsFullAnswerEach(t *testing.T) {
	rdb := windowClients(t, "standalone")[0]
	l := newLimiter(t, rdb, Options{Timeout: 10 * time.Second, DenyCacheMax: -1})
	short := Rule{ID: "shop/api", Limit: 2, Window: time.Second}
	long := short
	long.Window, long.Variant = time.Hour, "3600000"
	reqs := windowRequests([]Rule{short, long}, "c")
	for i := range 2 {
		if !allAllowed(l.Decide(context.Background(), reqs)) {
			t.Fatalf("admit %d refused", i)
		}
	}
	ds := l.Decide(context.Background(), reqs)
	if ds[0].Allowed || ds[1].Allowed || ds[0].RetryAfter > time.Second || ds[1].RetryAfter < 59*time.Minute {
		t.Errorf("both full: %+v and %+v, want the second's and the hour's waits", ds[0], ds[1])
	}
}
