package redisschema

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestPackedCallMatchesBruteForce: a packed call's answers, decoded, equal
// a brute-force log's decided one by one in the call's order at the clock
// the call replies, on Redis's own clock: random calls of 1 to 40
// decisions over keys of three rules (windows of 20 to 200 ms, so that
// admits leave during the test), a key several times in one call, hits
// past the limit and decisions that only decide.
func TestPackedCallMatchesBruteForce(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
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
	admitted, denied := 0, 0
	deadline := time.Now().Add(1500 * time.Millisecond)
	for n := 0; time.Now().Before(deadline) || n < 50; n++ {
		call.Reset()
		type pick struct {
			k      int
			rule   PackedRule
			commit bool
		}
		var picks []pick
		for range 1 + rng.IntN(40) {
			k := rng.IntN(keys)
			rule := rules[k%3]
			if rng.IntN(8) == 0 {
				rule.Hits = 1 + rng.Int64N(min(rule.Limit+1, 1000)) // up to one past the limit
			}
			p := pick{k, rule, rng.IntN(10) > 0}
			if err := call.Add(fmt.Sprintf("pc%d", k), fmt.Sprintf("%08x", rng.Uint32()), p.rule, p.commit); err != nil {
				t.Fatal(err)
			}
			picks = append(picks, p)
		}
		ks, args := call.Args()
		reply, err := script.Run(ctx, rdb, ks, args...).Result()
		if err != nil {
			t.Fatal(err)
		}
		now, answers, err := call.Decode(reply, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range picks {
			w := p.rule.Window.Microseconds()
			want := logs[p.k].decide(p.rule.Limit, w, p.rule.Hits, p.commit, now)
			a := answers[i]
			got := [5]int64{0, a.Remaining, a.RetryAfter.Microseconds(), a.ResetAfter.Microseconds(), a.Instant}
			if a.Allowed {
				got[0] = 1
			}
			if got != want {
				t.Fatalf("call %d, decision %d (key %d, %+v, commit %v) at %d: got %v, want %v", n, i, p.k, p.rule, p.commit, now, got, want)
			}
			if got[0] == 1 {
				admitted++
			} else {
				denied++
			}
		}
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
	}
	// Both answers must have been seen for the comparison to mean much.
	if admitted == 0 || denied == 0 {
		t.Fatalf("%d admitted and %d denied: the calls did not reach both answers", admitted, denied)
	}
	t.Logf("%d admitted, %d denied, every answer the brute-force log's", admitted, denied)
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
	want := fmt.Sprint(4, []any{"1000", "\x00\x81\x80\x01", "member-0member-1member-2member-3", "10", "1000000", "1", "5", "60000000", "2"})
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
