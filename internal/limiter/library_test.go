package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestFunctionsMissing: a limiter calling the functions on a Redis without
// them (a restart without persistence) decides by each rule's fail mode,
// with ErrNoFunctions, and by Redis again once the library is loaded.
func TestFunctionsMissing(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	l := newLimiter(t, rdb, Options{Functions: true, ProbeInterval: 20 * time.Millisecond})
	open := Rule{ID: "ns/missing-open", Limit: 5, Window: time.Minute}
	closed := Rule{ID: "ns/missing-closed", Limit: 5, Window: time.Minute, FailMode: FailClosed}
	for i := range 8 {
		for _, rule := range []Rule{open, closed} {
			d := one(l, rule, "c")
			want := SourceFallback
			if rule.FailMode == FailClosed {
				want = SourceFailedClosed
			}
			if d.Source != want {
				t.Fatalf("decision %d of %s without the library: %+v", i, rule.ID, d)
			}
			// The breaker may have opened: its error then names the cause.
			if !errors.Is(d.Err, ErrNoFunctions) {
				t.Fatalf("decision %d: error %v, want ErrNoFunctions", i, d.Err)
			}
		}
	}
	if _, err := l.Peek(context.Background(), open, "c"); !errors.Is(err, ErrNoFunctions) {
		t.Errorf("Peek without the library: %v", err)
	}
	if _, err := l.Announce(context.Background(), []string{open.ID}, time.Second); !errors.Is(err, ErrNoFunctions) {
		t.Errorf("Announce without the library: %v", err)
	}
	loadLibrary(t, rdb)
	took, ok := eventually(5*time.Second, func() bool { return one(l, open, "c").Source == SourceRedis })
	if !ok {
		t.Fatal("decisions did not return to Redis after the library was loaded")
	}
	t.Logf("decisions back to Redis %v after the library was loaded", took)
}

// TestFunctionsMatchScripts: Peek and Announce through the functions
// answer what the scripts answer, on the same keys.
func TestFunctionsMatchScripts(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	loadLibrary(t, rdb)
	fn := newLimiter(t, rdb, Options{Functions: true})
	ev := newLimiter(t, rdb, Options{})
	ctx := context.Background()
	for _, alg := range []Algorithm{SlidingLog, SlidingWindowCounter} {
		rule := Rule{ID: "ns/match-" + string(alg), Limit: 3, Window: time.Minute, Algorithm: alg}
		for i := range 4 {
			l := []*Limiter{fn, ev}[i%2]
			one(l, rule, "c")
		}
		a, err := fn.Peek(ctx, rule, "c")
		if err != nil {
			t.Fatal(err)
		}
		b, err := ev.Peek(ctx, rule, "c")
		if err != nil {
			t.Fatal(err)
		}
		// Times move between the two reads.
		a.Now, a.RetryAfter, b.RetryAfter, a.ResetAfter, b.ResetAfter, a.OldestAge, b.OldestAge, a.TTL, b.TTL = b.Now, 0, 0, 0, 0, 0, 0, 0, 0
		if a != b || a.Count != 3 || a.Allowed {
			t.Errorf("%s: functions peek %+v, scripts peek %+v", alg, a, b)
		}
	}
	counts, err := fn.Announce(ctx, []string{"ns/match"}, time.Minute)
	if err != nil || counts["ns/match"] != 1 {
		t.Fatalf("Announce through the function: %v, %v", counts, err)
	}
	if counts, err = ev.Announce(ctx, []string{"ns/match"}, time.Minute); err != nil || counts["ns/match"] != 2 {
		t.Fatalf("Announce through the script after the function: %v, %v (want 2 members)", counts, err)
	}
}

// TestFunctionArgumentsBounded: the functions (and the scripts) refuse
// arguments that would make one call loop or allocate without bound — a
// namespace's identity may FCALL them directly with anything — and refuse
// them at once.
func TestFunctionArgumentsBounded(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	loadLibrary(t, rdb)
	ctx := context.Background()
	many := make([]string, maxScriptKeys+1)
	for i := range many {
		many[i] = "slidegate:{ns/p:" + strconv.Itoa(i) + "}"
	}
	manyDecideArgs := []any{"m", "1000", "1"}
	for range many {
		manyDecideArgs = append(manyDecideArgs, 10, 1000000, "0", "1")
	}
	k := []string{"slidegate:{ns/p:c}"}
	// A batch of 1024 one-key decisions of 1000 hits each: every decision
	// within bounds, the call's 1,024,000 hits not.
	manyBatchArgs := []any{"1000"}
	for i := range many[:maxScriptKeys] {
		manyBatchArgs = append(manyBatchArgs, "m"+strconv.Itoa(i), "1", "1", 10, 1000000, "0", "1000")
	}
	k2 := []string{"slidegate:{ns/p:c}", "slidegate:{ns/p:d}"}
	for _, tc := range []struct {
		name string
		fn   string
		keys []string
		args []any
	}{
		{"decide, 10^9 hits", decideLua.fn, k, []any{"m", "1000", "1", 10, 1000000, "0", "1000000000"}},
		{"decide, no window", decideLua.fn, k, []any{"m", "1000", "1", 10, 0, "1", "1"}},
		{"decide, a window of 10^6 years", decideLua.fn, k, []any{"m", "1000", "1", 10, "31536000000000000000", "0", "1"}},
		{"decide, missing arguments", decideLua.fn, k, []any{"m", "1000", "1", 10}},
		{"decide, too many keys", decideLua.fn, many, manyDecideArgs},
		{"decide batch, 10^9 hits", decideBatchLua.fn, k, []any{"1000", "m", "1", "1", 10, 1000000, "0", "1000000000"}},
		{"decide batch, 1,024,000 hits in all", decideBatchLua.fn, many[:maxScriptKeys], manyBatchArgs},
		{"decide batch, too many keys", decideBatchLua.fn, many, append(manyBatchArgs, "m", "1", "1", 10, 1000000, "0", "1")},
		{"decide batch, a decision of more keys than given", decideBatchLua.fn, k, []any{"1000", "m", "1", "2", 10, 1000000, "0", "1", 10, 1000000, "0", "1"}},
		{"decide batch, keys no decision takes", decideBatchLua.fn, k2, []any{"1000", "m", "1", "1", 10, 1000000, "0", "1"}},
		{"decide batch, a decision of no keys", decideBatchLua.fn, k, []any{"1000", "m", "1", "0", "m", "1", "1", 10, 1000000, "0", "1"}},
		{"decide batch, a decision of 0.5 keys", decideBatchLua.fn, k, []any{"1000", "m", "1", "0.5", 10, 1000000, "0", "1"}},
		{"decide batch, missing arguments", decideBatchLua.fn, k, []any{"1000", "m", "1", "1", 10, 1000000, "0"}},
		{"decide batch, no margin", decideBatchLua.fn, k, []any{"x", "m", "1", "1", 10, 1000000, "0", "1"}},
		{"undo, 10^9 hits", undoLua.fn, k, []any{"m", "", "1000000000"}},
		{"cancel, 10^9 hits", cancelLua.fn, k, []any{"m", "1000", "1000000000", 1000000}},
		{"announce, no ttl", announceLua.fn, k, []any{"m", "0"}},
		{"peek, no window", peekLua.fn, k, []any{10, 0, "0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			cmd := "fcall"
			if tc.fn == peekLua.fn {
				cmd = "fcall_ro"
			}
			err := rdb.Do(ctx, append([]any{cmd, tc.fn, len(tc.keys)}, append(stringsToAny(tc.keys), tc.args...)...)...).Err()
			if err == nil || !strings.Contains(err.Error(), "slidegate:") {
				t.Errorf("FCALL %s: %v, want the function's refusal", tc.fn, err)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("the refusal took %v", took)
			}
		})
	}
	// The scripts check the same (one case; they share the functions' Lua).
	if err := rdb.Eval(ctx, redisschema.Undo.Body, k, "m", "", "1000000000").Err(); err == nil || !strings.Contains(err.Error(), "slidegate:") {
		t.Errorf("EVAL of the undo script with 10^9 hits: %v", err)
	}
	// The one-key command of a real decision still passes.
	if err := rdb.Do(ctx, "fcall", decideLua.fn, 1, k[0], "m", "1000", "1", 10, 1000000, "0", "1").Err(); err != nil {
		t.Errorf("a valid decide call: %v", err)
	}
	if err := rdb.Do(ctx, "fcall", decideBatchLua.fn, 2, k2[0], k2[1], "1000", "m", "1", "1", 10, 1000000, "0", "1", "n", "0", "1", 10, 1000000, "1", "1").Err(); err != nil {
		t.Errorf("a valid decide batch call: %v", err)
	}
}

func stringsToAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// TestLargeGroupsSplit: a request of more rules than one script takes
// (maxScriptKeys) is decided in several scripts, all or nothing as rules
// in different slots are.
func TestLargeGroupsSplit(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	loadLibrary(t, rdb)
	l := newLimiter(t, rdb, Options{Functions: true, Timeout: 5 * time.Second})
	reqs := make([]Request, maxScriptKeys+10)
	for i := range reqs {
		reqs[i] = Request{Rule: Rule{ID: "ns/split-" + strconv.Itoa(i), Limit: 2, Window: time.Minute}, Client: "c"}
	}
	// The last rule allows one admit only: the second request is denied by
	// it, and its admits in every other rule (in the other script) undone.
	reqs[len(reqs)-1].Rule.Limit = 1
	for i, wantAllowed := range []bool{true, false} {
		ds := l.Decide(context.Background(), reqs)
		for j, d := range ds {
			if d.Source != SourceRedis {
				t.Fatalf("request %d, rule %d: %+v", i, j, d)
			}
		}
		if got := ds[len(ds)-1].Allowed; got != wantAllowed {
			t.Fatalf("request %d: last rule allowed %v", i, got)
		}
	}
	if n, err := rdb.ZCard(context.Background(), Key(defaultPrefix, "ns/split-0", "c")).Result(); err != nil || n != 1 {
		t.Errorf("the first rule holds %d admits (%v), want 1: the denied request's admit was not undone", n, err)
	}
	if st := l.Stats(); st.Undos == 0 {
		t.Error("no compensating call: the request was not split")
	}
}

// TestFunctionsOverACLUser: a Redis identity of FunctionACLRules decides,
// peeks and announces through the functions on its own keys — a rule ID
// long enough to be hashed included — and runs no EVAL.
func TestFunctionsOverACLUser(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	admin := standalone(t, r.Addr)
	loadLibrary(t, admin)
	long := "shop/" + strings.Repeat("p", 140)
	if !redisschema.HashedRuleID(long) {
		t.Fatal("the long rule ID is not hashed")
	}
	rules := redisschema.FunctionACLRules(redisschema.KeyPatterns("", "shop", []string{"shop/short", long}, ""))
	if _, err := r.Do(append([]string{"ACL", "SETUSER", "shop", "on", ">s3cret"}, rules...)...); err != nil {
		t.Fatal(err)
	}
	rdb := client(t, redisconn.Config{Addrs: []string{r.Addr}, Username: "shop", Password: "s3cret"})
	l := newLimiter(t, rdb, Options{Functions: true})
	ctx := context.Background()
	month, _ := NewCalendar(Month, time.UTC)
	for _, rule := range []Rule{
		{ID: "shop/short", Limit: 2, Window: time.Minute},
		{ID: "shop/counter", Limit: 2, Window: time.Minute, Algorithm: SlidingWindowCounter, Durable: false},
		{ID: long, Limit: 2, Window: time.Minute},
		// Additional windows' keys (a Variant after the hash tag), a
		// hashed rule ID's included, are the namespace's too.
		{ID: "shop/short", Limit: 2, Window: time.Hour, Variant: "3600000"},
		{ID: "shop/counter", Limit: 2, Window: time.Hour, Algorithm: SlidingWindowCounter, Variant: "3600000"},
		{ID: long, Limit: 2, Window: time.Hour, Variant: "3600000"},
		// Quotas' keys (a period after the variant), too.
		{ID: "shop/short", Limit: 2, Calendar: month, Variant: "month"},
		{ID: long, Limit: 2, Calendar: month, Variant: "month"},
	} {
		for i := range 3 {
			if d := one(l, rule, "c"); d.Source != SourceRedis || d.Allowed != (i < 2) {
				t.Fatalf("%s decision %d: %+v", rule.ID, i, d)
			}
		}
		if w, err := l.Peek(ctx, rule, "c"); err != nil || w.Count != 2 {
			t.Fatalf("Peek %s: %+v, %v", rule.ID, w, err)
		}
	}
	if c, err := l.Announce(ctx, []string{"shop/short"}, time.Minute); err != nil || c["shop/short"] != 1 {
		t.Fatalf("Announce: %v, %v", c, err)
	}
	// The scripts are not its to run.
	ev := newLimiter(t, rdb, Options{})
	if d := one(ev, Rule{ID: "shop/eval", Limit: 2, Window: time.Minute}, "c"); d.Source == SourceRedis || d.Err == nil || !strings.Contains(d.Err.Error(), "NOPERM") {
		t.Fatalf("EVALSHA as the namespace's identity: %+v", d)
	}
	if err := rdb.Eval(ctx, "return 1", nil).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("EVAL as the namespace's identity: %v", err)
	}
	// Another namespace's rule, through the very same function: refused.
	if d := one(l, Rule{ID: "other/p", Limit: 2, Window: time.Minute}, "c"); d.Source == SourceRedis || d.Err == nil || !strings.Contains(d.Err.Error(), "NOPERM") {
		t.Fatalf("another namespace's key: %+v", d)
	}
}

// TestOlderLibraryServesNewSidecars: a Redis whose library is of the
// release before (the decide function, not the batch one) still decides a
// new limiter's decisions through Redis, exactly: while a fleet is
// upgraded the new sidecars start before the new manager leads and loads
// its library. Before olderLibrary every decision went by its fail mode
// (ErrNoFunctions) until then.
func TestOlderLibraryServesNewSidecars(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	ctx := context.Background()
	// Revision 1: the library without the batch function.
	var b strings.Builder
	fmt.Fprintf(&b, "#!lua name=%s\n-- slidegate library revision 1\n", redisschema.LibraryName)
	for _, f := range []redisschema.Function{redisschema.Decide, redisschema.Undo, redisschema.Cancel, redisschema.Announce, redisschema.Peek} {
		fmt.Fprintf(&b, "\nredis.register_function{function_name='%s', callback=function(KEYS, ARGV)\n%s\nend", f.Name, strings.TrimSpace(f.Body))
		if f.NoWrites {
			b.WriteString(", flags={'no-writes'}")
		}
		b.WriteString("}\n")
	}
	if err := rdb.FunctionLoadReplace(ctx, b.String()).Err(); err != nil {
		t.Fatal(err)
	}
	l := newLimiter(t, rdb, Options{Functions: true})
	rule := Rule{ID: "ns/older-library", Limit: 5, Window: time.Minute}
	admitted := 0
	for i := range 8 {
		d := one(l, rule, "c")
		if d.Source != SourceRedis && d.Source != SourceDenyCache { // what Redis said
			t.Fatalf("decision %d on the older library: %+v", i, d)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 5 {
		t.Errorf("admitted %d of 8, want the limit 5", admitted)
	}
	if l.Stats().OlderLibrary == 0 {
		t.Error("no batch call met the older library: the case did not test it")
	}
	// Once the current library is there, batch calls resume after the pause.
	loadLibrary(t, rdb)
	l.oneCallUntil.Store(0)
	before := l.Stats().OlderLibrary
	if d := one(l, rule, "d"); d.Source != SourceRedis {
		t.Fatalf("on the current library: %+v", d)
	}
	if got := l.Stats().OlderLibrary; got != before {
		t.Errorf("the current library sent the decision one call at a time again (%d → %d)", before, got)
	}
}
