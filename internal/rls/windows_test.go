package rls

import (
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestSeveralWindows: a policy for the rate limit service with an
// additional window decides both together for a descriptor: the status
// of a call the hour refuses carries the hour's limit and wait, the
// headers one item per window while admitted, and each call counts once
// in the policy's series.
func TestSeveralWindows(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	p := pol("per-ip", 2, time.Second, entry("remote_address"))
	p.AdditionalLimits = []rlsconfig.Limit{{WindowMillis: 3_600_000, Limit: 3}}
	rep := startReplica(t, standaloneConfig(r.Addr), writeConfig(t, p), limiter.Options{Timeout: 5 * time.Second})
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "10.0.0.1")}}
	hour := func(code rlsv3.RateLimitResponse_Code, rem uint32, reset int64) statusView {
		return statusView{Code: code, Name: "t/per-ip/1h", PerUnit: 3, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR, Remaining: rem, ResetSecs: reset}
	}
	second := func(code rlsv3.RateLimitResponse_Code, rem uint32) statusView {
		return statusView{Code: code, Name: "t/per-ip", PerUnit: 2, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND, Remaining: rem, ResetSecs: 1}
	}

	resp := ask(t, rep.client, req)
	if d := cmp.Diff([]statusView{second(ok, 1)}, view(resp)); d != "" {
		t.Errorf("first call (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]string{
		"RateLimit-Policy": `"t/per-ip";q=2;w=1, "t/per-ip/1h";q=3;w=3600`,
		"RateLimit":        `"t/per-ip";r=1;t=1, "t/per-ip/1h";r=2;t=3600`,
	}, headerMap(resp)); d != "" {
		t.Errorf("first call's headers (-want +got):\n%s", d)
	}
	ask(t, rep.client, req)
	if resp := ask(t, rep.client, req); resp.GetOverallCode() != over || view(resp)[0].Name != "t/per-ip" {
		t.Fatalf("third call in the second: %v %+v, want the second's window over its limit", resp.GetOverallCode(), view(resp))
	}
	time.Sleep(1100 * time.Millisecond)
	if resp := ask(t, rep.client, req); resp.GetOverallCode() != ok {
		t.Fatalf("a second later: %v", resp.GetOverallCode())
	}
	resp = ask(t, rep.client, req)
	v := view(resp)
	if len(v) != 1 || v[0].ResetSecs < 3590 {
		t.Fatalf("the hour's refusal: %+v", v)
	}
	if d := cmp.Diff([]statusView{hour(over, 0, v[0].ResetSecs)}, v); resp.GetOverallCode() != over || d != "" {
		t.Errorf("the hour's refusal (-want +got):\n%s", d)
	}
	if got := headerMap(resp)["RateLimit-Policy"]; got != `"t/per-ip/1h";q=3;w=3600` {
		t.Errorf("the hour's refusal: RateLimit-Policy %q", got)
	}
	id := rlsconfig.PolicyID("t", "per-ip")
	for o, want := range map[enforce.Outcome]float64{enforce.Allowed: 3, enforce.Rejected: 2, enforce.NotCounted: 0} {
		if got := testMetric(t, rep.srv, "slidegate_rls_requests_total", map[string]string{"policy": id, "decision": o.String()}); got != want {
			t.Errorf("%s: %v, want %v (each call once)", o, got, want)
		}
	}
}
