package redisschema

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestPackedCallMatchesBruteForce: a packed call's answers, decoded, equal
// a brute-force log's decided in the call's order at the clock the call
// replies, on Redis's own clock: random calls of 1 to 30 decisions of 1 to
// 3 keys over keys of three rules (windows of 20 to 200 ms, so that
// admits leave during the test), a key several times in one call, hits
// past the limit and decisions that only decide. A decision of several
// keys is all or nothing: committed only when every key allows it. The
// same calls with every key a decision of its own write on the keys that
// allow, whatever the others answer: the brute-force log, judging
// decisions, disagrees with them (the pair that shows the grouping is
// what the test sees).
func TestPackedCallMatchesBruteForce(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	stats, err := runPackedCalls(rdb, "pc", true)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(stats)
	if _, err := runPackedCalls(rdb, "naive", false); err == nil {
		t.Error("the calls with every key a decision of its own agreed with the brute-force log: the grouping is not what the test sees")
	} else {
		t.Logf("every key a decision of its own, as expected, disagrees: %v", err)
	}
}

// runPackedCalls sends random calls for about 1.5 s, their keys named
// from prefix, and compares every answer with the brute-force log's. Not
// grouped, each key is sent as a decision of its own (the naive way),
// still judged as its decision's. It returns what it saw, or the first
// difference.
func runPackedCalls(rdb *redis.Client, prefix string, grouped bool) (string, error) {
	ctx := context.Background()
	script := redis.NewScript(packedCallScript)
	rng := rand.New(rand.NewPCG(39, 2)) //nolint:gosec // test input
	rules := []PackedRule{
		{Limit: 1, Window: 20 * time.Millisecond, Hits: 1},
		{Limit: 7, Window: 50 * time.Millisecond, Hits: 2},
		{Limit: 1000, Window: 200 * time.Millisecond, Hits: 1},
	}
	const keys = 9 // key k decides under rules[k%3] (a key has one rule)
	logs := make([]bruteLog, keys)
	var call PackedCall
	call.Margin = 50 * time.Millisecond
	admitted, denied, partial := 0, 0, 0
	deadline := time.Now().Add(1500 * time.Millisecond)
	for n := 0; time.Now().Before(deadline) || n < 50; n++ {
		call.Reset()
		type pick struct {
			k     int
			rule  PackedRule
			first bool // the first key of its decision
		}
		var picks []pick
		var commits []bool // per pick: its decision's
		for range 1 + rng.IntN(30) {
			commit := rng.IntN(10) > 0
			member := fmt.Sprintf("%08x", rng.Uint32())
			for i, k := range rng.Perm(keys)[:1+rng.IntN(3)] {
				rule := rules[k%3]
				if rng.IntN(8) == 0 {
					rule.Hits = 1 + rng.Int64N(min(rule.Limit+1, 1000)) // up to one past the limit
				}
				key := fmt.Sprintf("%s%d", prefix, k)
				var err error
				if i == 0 || !grouped {
					err = call.Add(key, member, rule, commit)
				} else {
					err = call.AddKey(key, rule)
				}
				if err != nil {
					return "", err
				}
				picks = append(picks, pick{k, rule, i == 0})
				commits = append(commits, commit)
			}
		}
		ks, args := call.Args()
		reply, err := script.Run(ctx, rdb, ks, args...).Result()
		if err != nil {
			return "", err
		}
		now, answers, err := call.Decode(reply, nil)
		if err != nil {
			return "", err
		}
		for i := 0; i < len(picks); {
			e := i + 1
			for e < len(picks) && !picks[e].first {
				e++
			}
			// Judge every key, then admit on all of them or none.
			all := true
			wants := make([][5]int64, e-i)
			for x := i; x < e; x++ {
				p := picks[x]
				wants[x-i] = logs[p.k].decide(p.rule.Limit, p.rule.Window.Microseconds(), p.rule.Hits, false, now)
				all = all && wants[x-i][0] == 1
			}
			commit := all && commits[i]
			for x := i; x < e; x++ {
				p := picks[x]
				if commit {
					logs[p.k].decide(p.rule.Limit, p.rule.Window.Microseconds(), p.rule.Hits, true, now)
				}
				a := answers[x]
				got := [5]int64{0, a.Remaining, a.RetryAfter.Microseconds(), a.ResetAfter.Microseconds(), a.Instant}
				if a.Allowed {
					got[0] = 1
				}
				if got != wants[x-i] || a.Committed != commit {
					return "", fmt.Errorf("call %d, key %d of a decision of %d (key %d, %+v, commit %v) at %d: got %v committed %v, want %v committed %v",
						n, x-i, e-i, p.k, p.rule, commits[i], now, got, a.Committed, wants[x-i], commit)
				}
				if got[0] == 1 {
					admitted++
				} else {
					denied++
				}
			}
			if !all && e-i > 1 && slices.ContainsFunc(wants, func(w [5]int64) bool { return w[0] == 1 }) {
				partial++ // some keys allowed, written on none
			}
			i = e
		}
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
	}
	// Both answers, and decisions some of whose keys allowed and others
	// did not, must have been seen for the comparison to mean much.
	if admitted == 0 || denied == 0 || partial == 0 {
		return "", fmt.Errorf("%d admitted, %d denied, %d decisions allowed by some keys only: the calls did not reach every case", admitted, denied, partial)
	}
	return fmt.Sprintf("%d keys allowed, %d denied, %d decisions allowed by some of their keys and written on none; every answer the brute-force log's", admitted, denied, partial), nil
}

// TestPackedCallArguments: what a call sends and refuses.
func TestPackedCallArguments(t *testing.T) {
	t.Parallel()
	var c PackedCall
	c.Margin = time.Second
	a := PackedRule{Limit: 10, Window: time.Second, Hits: 1}
	b := PackedRule{Limit: 5, Window: time.Minute, Hits: 2}
	for _, d := range []struct {
		rule   PackedRule
		commit bool
	}{{a, true}, {b, false}, {a, false}, {b, true}} {
		if err := c.Add("k", "member-"+strconv.Itoa(len(c.keys)), d.rule, d.commit); err != nil {
			t.Fatal(err)
		}
	}
	keys, args := c.Args()
	got := fmt.Sprint(len(keys), args)
	// Each rule once; a byte per decision, 0x80 on those that only
	// decide; the members, 8 bytes each.
	want := fmt.Sprint(4, []any{"1000", "0", "\x00\x81\x80\x01", "member-0member-1member-2member-3", "10", "1000000", "1", "5", "60000000", "2"})
	if got != want {
		t.Errorf("Args: %q, want %q", got, want)
	}
	if _, _, err := c.Decode(strings.Repeat("x", 7+packedAnswerSize*3), nil); err == nil {
		t.Error("a reply one answer short decoded without an error")
	}
	if _, _, err := c.Decode(int64(1), nil); err == nil {
		t.Error("an integer reply decoded without an error")
	}
	c.Reset()
	if err := c.Add("k", "short", a, true); err == nil {
		t.Error("a member of 5 bytes was added")
	}
	for i := range maxPackedRules {
		if err := c.Add("k", "12345678", PackedRule{Limit: int64(i + 1), Window: time.Second, Hits: 1}, true); err != nil {
			t.Fatalf("rule %d: %v", i+1, err)
		}
	}
	if err := c.Add("k", "12345678", PackedRule{Limit: 1000, Window: time.Second, Hits: 1}, true); !errors.Is(err, ErrPackedCallFull) {
		t.Errorf("a call's 129th rule: %v, want ErrPackedCallFull", err)
	}
	if err := c.Add("k", "12345678", PackedRule{Limit: 1, Window: time.Second, Hits: 1}, true); err != nil {
		t.Errorf("a rule the full call names already: %v", err)
	}
}
