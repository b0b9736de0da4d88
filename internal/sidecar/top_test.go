package sidecar

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestTopCountsRejectionsByKey: live requests through the sidecar and a
// real redis-server; /debug/top names the limited clients by the keys the
// request path derived, with their 429 counts (exact below the sketch's
// capacity), and nothing for admitted requests.
func TestTopCountsRejectionsByKey(t *testing.T) {
	t.Parallel()
	rl := &recordingLimiter{Limiter: redisLimiter(t, testsupport.StartRedis(t), 1, exactTimeout)}
	h := newHarness(t, rl, testConfig(nil, testPolicy("per-user", 2, withKey("Header", "X-User", "Deny")), testPolicy("site-wide", 1000)))
	admin := newTestServer(t, h.s.AdminHandler()).URL
	for user, n := range map[string]int{"heavy": 10, "light": 3, "quiet": 1} {
		for range n {
			h.do(t, http.MethodGet, "/", map[string]string{"X-User": user})
		}
	}
	get := func(policy string) (int, TopResponse) {
		resp, err := http.Get(admin + "/debug/top?policy=" + policy)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		var tr TopResponse
		if resp.StatusCode == http.StatusOK {
			if err := json.Unmarshal(body, &tr); err != nil {
				t.Fatalf("%v: %s", err, body)
			}
		}
		return resp.StatusCode, tr
	}
	code, tr := get("per-user")
	want := fmt.Sprintf("[{%s 8 0} {%s 1 0}]", hashKey(keyPrefixHeader, "heavy"), hashKey(keyPrefixHeader, "light"))
	if code != 200 || fmt.Sprint(tr.Items) != want || tr.Total != 9 || tr.Min != 0 || tr.Capacity != topCapacity {
		t.Errorf("per-user: %d %+v, want items %s", code, tr, want)
	}
	if code, tr := get("site-wide"); code != 200 || tr.Total != 0 || tr.Items == nil {
		t.Errorf("site-wide: %d %+v", code, tr)
	}
	if code, _ := get("nope"); code != http.StatusNotFound {
		t.Errorf("unknown policy: %d", code)
	}
}

// TestTopPeriods: the answer covers the current and the previous period,
// then forgets.
func TestTopPeriods(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	top := newLimitedTop()
	top.now = func() time.Time { return now }
	top.add("p", "a")
	now = now.Add(topPeriod + time.Second)
	top.add("p", "b")
	top.add("p", "b")
	if s, since := top.summary("p"); fmt.Sprint(s.Items) != "[{b 2 0} {a 1 0}]" || !since.Equal(now.Add(-topPeriod-time.Second)) {
		t.Errorf("two periods: %v since %v", s.Items, since)
	}
	now = now.Add(topPeriod)
	if s, _ := top.summary("p"); fmt.Sprint(s.Items) != "[{b 2 0}]" {
		t.Errorf("a period later: %v", s.Items)
	}
	now = now.Add(2 * topPeriod)
	if s, _ := top.summary("p"); len(s.Items) != 0 || s.Total != 0 {
		t.Errorf("two periods later: %+v", s)
	}
}

// BenchmarkTopAdd is the cost a 429 pays for being counted, with every
// core rejecting at once (one lock per sidecar).
func BenchmarkTopAdd(b *testing.B) {
	top := newLimitedTop()
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = hashKey(keyPrefixHeader, fmt.Sprint(i))
	}
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			top.add("p", keys[i%len(keys)])
			i += 7
		}
	})
}
