package e2e

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/debugapi"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/kubectlplugin"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestDemoFlow runs what `make demo` runs, against the binaries built from
// this tree, and asserts the numbers the demo prints.
func TestDemoFlow(t *testing.T) {
	if _, err := testsupport.EnvtestAssets(); err != nil {
		testsupport.Missing(t, "envtest control plane", err)
	}
	if _, err := testsupport.RedisServerPath(); err != nil {
		testsupport.Missing(t, "redis-server", err)
	}
	if _, err := exec.LookPath("kubectl"); err != nil {
		testsupport.Missing(t, "kubectl", err)
	}
	root, err := testsupport.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	// Built as make demo builds them (hack/goenv.sh: static, -trimpath),
	// whatever this test binary was built with (-race needs cgo): so the
	// build cache of make demo, vet and the linters serves, instead of a
	// second compile of every dependency with cgo.
	build := exec.Command("go", "build", "-o", bin+string(filepath.Separator),
		filepath.Join(root, "cmd", "manager"), filepath.Join(root, "cmd", "sidecar"))
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-trimpath")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := Run(ctx, Options{ManagerBin: filepath.Join(bin, "manager"), SidecarBin: filepath.Join(bin, "sidecar"), Out: &out})
	t.Log("demo output:\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range Check(res) {
		t.Error(p)
	}
	// What Check does not cover: the injected pod is the one the webhook
	// made, with the sidecar first and the port taken over.
	if res.Injected.Spec.InitContainers[0].Name != inject.ContainerName {
		t.Errorf("first init container is %s", res.Injected.Spec.InitContainers[0].Name)
	}
	if !strings.Contains(out.String(), "kubectl get rlp") || !strings.Contains(out.String(), "per-user") {
		t.Error("the demo output lacks the policy status table")
	}
	if _, err := os.Stat(filepath.Join(bin, "manager")); err != nil {
		t.Error(err)
	}
}

// goodResult is a Result as the samples promise it: Check finds nothing.
func goodResult() *Result {
	r := &Result{
		Limit: 5, Round1: map[string]Counts{}, Round2: Counts{Admitted: RaisedLimit, Rejected: 2},
		UpstreamSeen: 15,
		Sample429: &http.Response{Header: http.Header{
			"Retry-After": {"7"}, "Ratelimit-Policy": {`"per-user";q=5;w=10`}, "Ratelimit": {`"per-user";r=0;t=7`},
		}},
		Sample429Body: "slidegate: rate limit exceeded; retry in 7s\n",
		RedisKeys:     []KeyTTL{{Key: "k", TTL: time.Second}},
		Metrics:       []string{`slidegate_sidecar_requests_total{decision="dry_run_rejected",policy="per-user-strict-dry-run"} 9`},
		Policies:      []PolicyStatus{{Name: UserPolicy, Ready: "True", Accepted: "True", Enforced: "True", MatchedPods: 1, EnforcedPods: 1}},
		Tokens: &TokenResult{
			Limit: 100000, Window: time.Minute, Admitted: 3, Rejected: 2, Remaining: []int64{100000, 60000, 20000},
			Tokens: 120000, Whole: 3, UpstreamSeen: 3, Since429: 20 * time.Millisecond, SinceWhy: 30 * time.Millisecond,
			Sample429: &http.Response{Header: http.Header{"Retry-After": {"60"}, "Ratelimit": {`"tokens-per-key";r=0;t=60`}}},
			Why: &kubectlplugin.WhyResult{WhyResponse: debugapi.WhyResponse{Policies: []debugapi.WhyPolicy{{
				Name: TokenPolicy, Target: true,
				Window: &debugapi.WhyWindow{InWindow: 120000, Unit: "cost", RetryAfterSeconds: 59.99},
			}}}},
		},
	}
	for _, c := range Clients {
		r.Round1[c] = Counts{Admitted: 5, Rejected: 3, RejectedBy: map[string]int{UserPolicy: 3}}
	}
	return r
}

// TestCheckCatchesWrongNumbers shows Check is not vacuous: it passes the
// promised numbers and fails each way of missing them, among them the
// naive ways of limiting tokens (counting requests, showing admits).
func TestCheckCatchesWrongNumbers(t *testing.T) {
	if p := Check(goodResult()); len(p) > 0 {
		t.Fatalf("Check failed the promised result: %v", p)
	}
	for _, tc := range []struct {
		name string
		edit func(r *Result)
	}{
		{"a client admitted over its limit", func(r *Result) {
			r.Round1["alice"] = Counts{Admitted: 6, Rejected: 2, RejectedBy: map[string]int{UserPolicy: 2}}
		}},
		{"no token step", func(r *Result) { r.Tokens = nil }},
		{"tokens counted as requests", func(r *Result) {
			// What the sidecar does when the render drops spec.cost: five
			// requests under a limit of 100,000.
			r.Tokens.Admitted, r.Tokens.Rejected, r.Tokens.Tokens, r.Tokens.Whole, r.Tokens.UpstreamSeen = 5, 0, 200000, 5, 5
			r.Tokens.Remaining = []int64{99999, 99998, 99997, 99996, 99995}
			r.Tokens.Sample429 = nil
		}},
		{"a stream cut short", func(r *Result) { r.Tokens.Whole = 2 }},
		{"the window's tokens not in RateLimit", func(r *Result) { r.Tokens.Remaining[2] = 99998 }},
		{"Retry-After past the window", func(r *Result) { r.Tokens.Sample429.Header.Set("Retry-After", "61") }},
		{"Retry-After earlier than the first charge leaves", func(r *Result) { r.Tokens.Sample429.Header.Set("Retry-After", "30") }},
		{"why shows admits", func(r *Result) { r.Tokens.Why.Policies[0].Window.Unit = "" }},
		{"why shows no debt", func(r *Result) { r.Tokens.Why.Policies[0].Window.InWindow = 100000 }},
		{"why allows the key", func(r *Result) { r.Tokens.Why.Policies[0].Window.Allowed = true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := goodResult()
			tc.edit(r)
			if len(Check(r)) == 0 {
				t.Fatal("Check accepted it")
			}
		})
	}
}
