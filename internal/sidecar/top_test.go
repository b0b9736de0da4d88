package sidecar

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/clienthash"
	"github.com/slidegate/slidegate/internal/debugapi"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
	"github.com/slidegate/slidegate/internal/topk"
)

// TestTopCountsRejectionsByKey: live requests through the sidecar and a
// real redis-server; /debug/top names the limited clients by keyed hashes
// of the keys the request path derived (never an address, never the
// unkeyed hash of a value, which anyone could compute from a guess), with
// their 429 counts (exact below the sketch's capacity), and nothing for
// admitted requests.
func TestTopCountsRejectionsByKey(t *testing.T) {
	t.Parallel()
	const key = "0123456789abcdef0123456789abcdef"
	rl := &recordingLimiter{Limiter: redisLimiter(t, testsupport.StartRedis(t), 1, exactTimeout)}
	h := newHarness(t, rl, testConfig(nil,
		testPolicy("per-ip", 1, withKey(sidecarconfig.SourceRemoteAddress, "", sidecarconfig.MissingDeny)),
		testPolicy("per-user", 2, withKey("Header", "X-User", "Deny")),
		testPolicy("site-wide", 1000)),
		withHashKey(t, key))
	debug := newTestServer(t, h.s.DebugHandler()).URL
	for user, n := range map[string]int{"heavy": 10, "light": 3, "quiet": 1} {
		for range n {
			h.do(t, http.MethodGet, "/", map[string]string{"X-User": user})
		}
	}
	get := func(policy string) (int, debugapi.TopResponse, string) {
		resp, err := http.Get(debug + "/debug/top?policy=" + policy)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		var tr debugapi.TopResponse
		if resp.StatusCode == http.StatusOK {
			if err := json.Unmarshal(body, &tr); err != nil {
				t.Fatalf("%v: %s", err, body)
			}
		}
		return resp.StatusCode, tr, string(body)
	}
	hasher, err := clienthash.New(key)
	if err != nil {
		t.Fatal(err)
	}
	// per-ip admitted the first request, then limited 127.0.0.1 13 times.
	code, tr, body := get("per-ip")
	want := fmt.Sprintf("[{%s 13 0}]", hasher.Sum(keyPrefixIP+"127.0.0.1"))
	if code != 200 || fmt.Sprint(tr.Items) != want || strings.Contains(body, "127.0.0.1") || tr.HashKeyID != hasher.ID() {
		t.Errorf("per-ip: %d %s, want items %s and no address", code, body, want)
	}
	// per-ip rejected all but the first request: per-user never reached
	// its limit.
	if code, tr, _ := get("per-user"); code != 200 || tr.Total != 0 {
		t.Errorf("per-user under per-ip: %d %+v", code, tr)
	}
	if code, tr, _ := get("site-wide"); code != 200 || tr.Total != 0 || tr.Items == nil {
		t.Errorf("site-wide: %d %+v", code, tr)
	}
	if code, _, _ := get("nope"); code != http.StatusNotFound {
		t.Errorf("unknown policy: %d", code)
	}
}

// TestTopHashesAreKeyed: header values are counted under keyed hashes,
// the same in every sidecar of a namespace (one key), different from the
// unkeyed SHA-256 of the value and under another key.
func TestTopHashesAreKeyed(t *testing.T) {
	t.Parallel()
	const key = "0123456789abcdef0123456789abcdef"
	r := testsupport.StartRedis(t)
	cfg := testConfig(nil, testPolicy("per-user", 2, withKey("Header", "X-User", "Deny")))
	items := func(hashKey string) []topk.Item {
		h := newHarness(t, redisLimiter(t, r, 1, exactTimeout), cfg, withHashKey(t, hashKey))
		for range 3 {
			h.do(t, http.MethodGet, "/", map[string]string{"X-User": "alice-" + hashKey[:4]})
		}
		sum, _, _ := h.s.top.summary("per-user")
		return sum.Items
	}
	hasher, _ := clienthash.New(key)
	got := items(key)
	if len(got) != 1 || got[0].Key != hasher.Sum(hashKey(keyPrefixHeader, "alice-0123")) || got[0].Key == hashKey(keyPrefixHeader, "alice-0123") {
		t.Errorf("items %+v, want the keyed hash of alice's key", got)
	}
	if other := items("fedcba9876543210fedcba9876543210"); len(other) != 1 || other[0].Key == hasher.Sum(hashKey(keyPrefixHeader, "alice-fedc")) {
		t.Errorf("another key hashes alike: %+v", other)
	}
}

// TestTopPeriods: the answer covers the current and the previous period,
// then forgets.
func TestTopPeriods(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	top := newLimitedTop()
	top.now = func() time.Time { return now }
	top.add("p", "a", "")
	now = now.Add(topPeriod + time.Second)
	top.add("p", "b", "")
	top.add("p", "b", "")
	if s, since, _ := top.summary("p"); fmt.Sprint(s.Items) != "[{b 2 0} {a 1 0}]" || !since.Equal(now.Add(-topPeriod-time.Second)) {
		t.Errorf("two periods: %v since %v", s.Items, since)
	}
	now = now.Add(topPeriod)
	if s, _, _ := top.summary("p"); fmt.Sprint(s.Items) != "[{b 2 0}]" {
		t.Errorf("a period later: %v", s.Items)
	}
	now = now.Add(2 * topPeriod)
	if s, _, _ := top.summary("p"); len(s.Items) != 0 || s.Total != 0 {
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
			top.add("p", keys[i%len(keys)], "")
			i += 7
		}
	})
}
