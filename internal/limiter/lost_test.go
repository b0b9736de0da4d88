package limiter

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// Decisions whose scripts Redis runs after the caller gave up: what such a
// decision admitted must not stand.

// TestGivenUpAdmitIsUndone: the caller of a decision gave up on Redis
// (timeout, cancelled context) and took its answer elsewhere, while its
// script, already written, runs when Redis resumes. Its admit must not
// stand: undone from the reply when one comes back (undoLate), else
// cancelled (cancelLost, SlidingLog only).
func TestGivenUpAdmitIsUndone(t *testing.T) {
	// The limit-1 hour rules would deny the next request for an hour.
	hour := func(id string, alg Algorithm, fm FailMode) Rule {
		return Rule{ID: id, Limit: 1, Window: time.Hour, Algorithm: alg, FailMode: fm}
	}
	t.Run("standalone/timeout/no reply", func(t *testing.T) {
		r := testsupport.StartRedis(t)
		l := newLimiter(t, standalone(t, r.Addr), Options{Timeout: 100 * time.Millisecond, DenyCacheMax: -1})
		rule := hour("ns/late", SlidingLog, FailClosed)
		one(l, Rule{ID: "ns/warm", Limit: 9, Window: time.Hour}, "w") // a connection, the script loaded
		if err := r.Pause(); err != nil {
			t.Fatal(err)
		}
		d := one(l, rule, "c") // Redis paused throughout: it cannot answer
		_ = r.Resume()
		if d.Source != SourceFailedClosed {
			t.Fatalf("decision while Redis paused: %+v", d)
		}
		if took, ok := eventually(5*time.Second, func() bool { return counted(t, l, rule, "c") == 0 }); !ok {
			t.Fatalf("a failed-closed request still counted %v after Redis resumed", took)
		}
		if d := one(l, rule, "c"); !d.Allowed {
			t.Errorf("the next request: %+v", d)
		}
	})
	// Rule a is on server 0, rule b on server 1, which is paused.
	cross := []struct {
		name   string
		a, b   Rule
		denyA  bool // exhaust a first: the request is denied by a
		cancel bool // the caller cancels its context (else it times out)
	}{
		// The caller cancels; the reply comes back later: undoLate.
		{name: "log/cancelled/late reply", a: hour("ns/xa", SlidingLog, ""), b: hour("ns/xb", SlidingLog, ""), cancel: true},
		{name: "counter/cancelled/late reply", a: hour("ns/xa", SlidingLog, ""), b: hour("ns/xb", SlidingWindowCounter, ""), cancel: true},
		// a denies, b times out and its round trip too: cancelLost.
		{name: "log/a denies/b times out", a: hour("ns/xa", SlidingLog, ""), b: hour("ns/xb", SlidingLog, ""), denyA: true},
	}
	for _, tc := range cross {
		t.Run("cross-slot/"+tc.name, func(t *testing.T) {
			r0, r1 := testsupport.StartRedis(t), testsupport.StartRedis(t)
			rdb := slotsCluster(t, r0.Addr, r1.Addr)
			opts := Options{Timeout: 100 * time.Millisecond, DenyCacheMax: -1}
			if tc.cancel {
				// Patience outlasting the pause: only the caller gives up.
				opts.Timeout = 2 * time.Second
			}
			l := newLimiter(t, rdb, opts)
			cli := ""
			for i := 0; cli == ""; i++ {
				c := "c" + strconv.Itoa(i)
				if redisschema.Slot(l.keyOf(&Request{Rule: tc.a, Client: c})) < 8192 && redisschema.Slot(l.keyOf(&Request{Rule: tc.b, Client: c})) >= 8192 {
					cli = c
				}
			}
			if tc.denyA {
				one(l, tc.a, cli)
			}
			// Connections to both, the scripts loaded.
			l.Decide(context.Background(), []Request{{Rule: tc.a, Client: "w" + cli}, {Rule: tc.b, Client: "w" + cli}})
			if err := r1.Pause(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				time.AfterFunc(50*time.Millisecond, cancel)
			}
			ds := l.Decide(ctx, []Request{{Rule: tc.a, Client: cli}, {Rule: tc.b, Client: cli}})
			_ = r1.Resume()
			t.Logf("a: %+v; b: %+v", ds[0], ds[1])
			if ds[1].Source == SourceRedis {
				t.Fatalf("b was decided by a paused Redis: %+v", ds[1])
			}
			if took, ok := eventually(5*time.Second, func() bool { return counted(t, l, tc.b, cli) == 0 }); !ok {
				t.Fatalf("b still counts a request whose caller gave up on Redis, %v after it resumed", took)
			}
		})
	}
}

// TestCancelScript: a cancel takes back the decision's admits when its
// script ran first, and keeps the script from admitting when it runs
// later, without counting for anyone else.
func TestCancelScript(t *testing.T) {
	r := testsupport.StartRedis(t)
	rdb := standalone(t, r.Addr)
	l := newLimiter(t, rdb, Options{DenyCacheMax: -1})
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		hits        int64
		scriptFirst bool
	}{
		{"script first", 1, true},
		{"script first/3 hits", 3, true},
		{"cancel first", 1, false},
		{"cancel first/3 hits", 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rule := Rule{ID: "ns/cancel/" + tc.name, Limit: 5, Window: time.Hour}
			reqs := []Request{{Rule: rule, Client: "c", Hits: tc.hits}}
			keys := []string{l.keyOf(&reqs[0])}
			decide := asEval(decideArgs(nil, api{}, reqs, []int{0}, keys, l.nextMember(), l.marginMs, true), &decideLua)
			cancel := asEval(cancelArgs(decide), &cancelLua)
			first, second := cancel, decide
			if tc.scriptFirst {
				first, second = decide, cancel
			}
			if err := rdb.Do(ctx, first...).Err(); err != nil {
				t.Fatal(err)
			}
			if ttl, _ := r.Do("PTTL", keys[0]); !tc.scriptFirst && ttl == "-1" {
				t.Errorf("a cancel that ran first left its key without expiry")
			}
			if err := rdb.Do(ctx, second...).Err(); err != nil {
				t.Fatal(err)
			}
			if n := counted(t, l, rule, "c"); n != 0 {
				t.Errorf("counts %d after the cancel", n)
			}
			if d := one(l, rule, "c"); !d.Allowed || d.Remaining != rule.Limit-1 {
				t.Errorf("the next request: %+v", d)
			}
		})
	}
}
