package sidecar

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// The phases of ServeHTTP (gather → decide → verdict → record → respond)
// on plain values, without a server; handler_test.go covers them end to end.

// gatherSidecar is a sidecar reduced to what gather reads: the policies of
// cfg with their counters bound, and the peer counts.
func gatherSidecar(t *testing.T, policies ...sidecarconfig.Policy) (*Sidecar, *state) {
	t.Helper()
	st, err := compile(testConfig([]string{"10.0.0.0/8"}, policies...), nil, [32]byte{}, [32]byte{})
	if err != nil {
		t.Fatal(err)
	}
	s := &Sidecar{metrics: newMetrics(func() float64 { return 0 }, func(func(string, int)) {})}
	s.bindCounters(st, nil)
	return s, st
}

// TestGather: which policies of a request become limiter requests, and
// what happens to those the request has no client key for. New cases go
// at the end.
func TestGather(t *testing.T) {
	type counted struct {
		policy, decision string
	}
	tests := []struct {
		name     string
		policies []sidecarconfig.Policy
		peers    map[string]int
		path     string
		header   http.Header
		// want are the gathered policies and their clients ("ip" for the
		// address key); wantMissing the policy the request is refused for,
		// wantAmbiguous whether for an ambiguous key (else a missing one).
		want          [][2]string
		wantMissing   string
		wantAmbiguous bool
		wantCounted   []counted
	}{
		{
			name:     "a policy that does not match the path is not asked",
			policies: []sidecarconfig.Policy{testPolicy("api", 5, withPrefix("/api/")), testPolicy("all", 5)},
			path:     "/static/x",
			want:     [][2]string{{"all", "global"}},
		},
		{
			name: "config order, every key source",
			policies: []sidecarconfig.Policy{
				testPolicy("a-ip", 5, withKey("RemoteAddress", "", "Deny")),
				testPolicy("b-user", 5, withKey("Header", "X-User", "Deny")),
				testPolicy("c-fallback", 5, withKey("QueryParameter", "k", "RemoteAddress")),
			},
			path:   "/",
			header: http.Header{"X-User": {"alice"}},
			want:   [][2]string{{"a-ip", "ip"}, {"b-user", hashKey(keyPrefixHeader, "alice")}, {"c-fallback", "ip"}},
		},
		{
			name: "no key, onMissing Allow: skipped and counted",
			policies: []sidecarconfig.Policy{
				testPolicy("all", 5), testPolicy("user", 5, withKey("Header", "X-User", "Allow")),
			},
			path:        "/",
			want:        [][2]string{{"all", "global"}},
			wantCounted: []counted{{"user", DecisionSkipped}},
		},
		{
			name: "no key, onMissing Deny: the first enforced policy rejects, a DryRun one only counts",
			policies: []sidecarconfig.Policy{
				testPolicy("a-dry", 5, dryRun, withKey("Header", "X-A", "Deny")),
				testPolicy("b-user", 5, withKey("Header", "X-User", "Deny")),
				testPolicy("c-key", 5, withKey("QueryParameter", "k", "Deny")),
				testPolicy("d-all", 5),
			},
			path:        "/",
			want:        [][2]string{{"d-all", "global"}},
			wantMissing: "b-user",
			wantCounted: []counted{{"a-dry", DecisionMissingKey}, {"b-user", DecisionMissingKey}},
		},
		{
			name: "ambiguous key: refused by the first enforced policy whatever its onMissing, before a missing one; a DryRun one only counts",
			policies: []sidecarconfig.Policy{
				testPolicy("a-missing", 5, withKey("Header", "X-Other", "Deny")),
				testPolicy("b-dry", 5, dryRun, withKey("Header", "X-User", "Deny")),
				testPolicy("c-user", 5, withKey("Header", "X-User", "Allow")),
				testPolicy("d-query", 5, withKey("QueryParameter", "k", "RemoteAddress")),
				testPolicy("e-all", 5),
			},
			path:          "/?k=1&k=2",
			header:        http.Header{"X-User": {"random", "real"}},
			want:          [][2]string{{"e-all", "global"}},
			wantMissing:   "c-user",
			wantAmbiguous: true,
			wantCounted:   []counted{{"b-dry", DecisionAmbiguousKey}, {"c-user", DecisionAmbiguousKey}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, st := gatherSidecar(t, tt.policies...)
			r, err := http.NewRequest("GET", tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			r.RemoteAddr = "192.0.2.1:1234"
			for k, v := range tt.header {
				r.Header[k] = v
			}
			reqs, pols, refused := s.gather(st, r, nil)
			if len(reqs) != len(pols) || len(reqs) != len(tt.want) {
				t.Fatalf("%d requests, %d policies, want %d", len(reqs), len(pols), len(tt.want))
			}
			for i, w := range tt.want {
				client := w[1]
				if client == "ip" {
					client = keyPrefixIP + "192.0.2.1"
				}
				if pols[i].name != w[0] || reqs[i].Client != client || reqs[i].Rule != pols[i].rule || reqs[i].DryRun != pols[i].dryRun {
					t.Errorf("request %d: %s %+v, want %s for client %s with its rule", i, pols[i].name, reqs[i], w[0], client)
				}
			}
			if got := nameOf(refused.policy); got != tt.wantMissing || refused.ambiguous != tt.wantAmbiguous {
				t.Errorf("refused by %q (ambiguous %v), want %q (ambiguous %v)", got, refused.ambiguous, tt.wantMissing, tt.wantAmbiguous)
			}
			for _, p := range st.policies {
				for i, d := range decisions {
					want := 0.0
					for _, c := range tt.wantCounted {
						if c.policy == p.name && c.decision == d {
							want = 1
						}
					}
					if got := testutil.ToFloat64(p.counters[i]); got != want {
						t.Errorf("%s %s = %v, want %v", p.name, d, got, want)
					}
				}
			}
		})
	}
}

// TestGatherPeers: a rule's replicas come from the last peer count through
// Redis when there is one, from the config when not.
func TestGatherPeers(t *testing.T) {
	s, st := gatherSidecar(t, testPolicy("counted", 5), testPolicy("uncounted", 5, func(p *sidecarconfig.Policy) { p.Replicas = 2 }))
	s.peers.Store(testNamespace+"/counted", 3)
	r, _ := http.NewRequest("GET", "/", nil)
	reqs, _, _ := s.gather(st, r, nil)
	if len(reqs) != 2 || reqs[0].Rule.Replicas != 3 || reqs[1].Rule.Replicas != 2 {
		t.Fatalf("requests %+v, want replicas 3 (counted) and 2 (configured)", reqs)
	}
	if st.policies[0].rule.Replicas != 0 {
		t.Error("the peer count was written into the policy's own rule")
	}
}

func withPrefix(prefix string) func(*sidecarconfig.Policy) {
	return func(p *sidecarconfig.Policy) { p.Match.PathPrefixes = []string{prefix} }
}

func nameOf(p *policy) string {
	if p == nil {
		return ""
	}
	return p.name
}

// TestVerdict: which policy answers for a rejected request. New cases go at
// the end.
func TestVerdict(t *testing.T) {
	redisDown := errors.New("connection refused")
	allow := limiter.Decision{Allowed: true, Source: limiter.SourceRedis}
	deny := func(wait time.Duration) limiter.Decision {
		return limiter.Decision{RetryAfter: wait, Source: limiter.SourceRedis}
	}
	closed := func(wait time.Duration) limiter.Decision {
		return limiter.Decision{RetryAfter: wait, Source: limiter.SourceFailedClosed, Err: redisDown}
	}
	tests := []struct {
		name           string
		dryRun         []bool
		ds             []limiter.Decision
		closed, denied int
		wantErr        error
		rejected       bool
	}{
		{"all admitted", []bool{false, false}, []limiter.Decision{allow, allow}, -1, -1, nil, false},
		{"a DryRun denial rejects nothing", []bool{true, false}, []limiter.Decision{deny(time.Second), allow}, -1, -1, nil, false},
		// The first denial would do for one policy; with two, a client
		// retrying after the shorter wait would be denied again.
		{"the longest wait, not the first denial", []bool{false, false, false},
			[]limiter.Decision{deny(time.Second), deny(3 * time.Second), deny(2 * time.Second)}, -1, 1, nil, true},
		{"failed closed is its own, beside a denial", []bool{false, false, false},
			[]limiter.Decision{deny(5 * time.Second), closed(time.Second), closed(2 * time.Second)}, 2, 0, redisDown, true},
		{"a Redis error on an admitted fail-open decision is kept", []bool{false},
			[]limiter.Decision{{Allowed: true, Source: limiter.SourceFallback, Err: redisDown}}, -1, -1, redisDown, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reqs := make([]limiter.Request, len(tt.dryRun))
			for i, d := range tt.dryRun {
				reqs[i].DryRun = d
			}
			dec := decided{requests: reqs, decisions: tt.ds}
			v := dec.verdict()
			if v.failedClosed != tt.closed || v.denied != tt.denied || !errors.Is(v.redisErr, tt.wantErr) {
				t.Errorf("verdict %+v, want failedClosed %d denied %d error %v", v, tt.closed, tt.denied, tt.wantErr)
			}
			if v.rejected() != tt.rejected {
				t.Errorf("rejected = %v", v.rejected())
			}
		})
	}
}

// TestPolicyDecision: the decision label each policy counts.
func TestPolicyDecision(t *testing.T) {
	allow := limiter.Decision{Allowed: true, Source: limiter.SourceRedis}
	deny := limiter.Decision{Source: limiter.SourceRedis}
	closed := limiter.Decision{Source: limiter.SourceFailedClosed}
	tests := []struct {
		dryRun   bool
		d        limiter.Decision
		rejected bool
		want     string
	}{
		{false, allow, false, DecisionAllowed},
		// Another policy rejected the request, so this admit was undone.
		{false, allow, true, DecisionNotCounted},
		{false, deny, true, DecisionRejected},
		{false, closed, true, DecisionFailedClosed},
		{true, allow, true, DecisionAllowed},
		{true, deny, false, DecisionDryRunRejected},
		{true, closed, false, DecisionDryRunRejected},
	}
	for _, tt := range tests {
		if got := decisions[policyDecision(tt.dryRun, &tt.d, tt.rejected)]; got != tt.want {
			t.Errorf("dryRun %v, %+v, rejected %v: %s, want %s", tt.dryRun, tt.d, tt.rejected, got, tt.want)
		}
	}
}

// TestAdmittedFields: the RateLimit fields of an admitted request name the
// enforced policies only.
func TestAdmittedFields(t *testing.T) {
	_, st := gatherSidecar(t, testPolicy("a", 5), testPolicy("b-dry", 5, dryRun), testPolicy("c", 10))
	dec := decided{
		policies: st.policies,
		requests: []limiter.Request{{}, {DryRun: true}, {}},
		decisions: []limiter.Decision{
			{Allowed: true, Remaining: 4, ResetAfter: 30 * time.Second},
			{Allowed: true, Remaining: 1, ResetAfter: time.Second},
			{Allowed: true, Remaining: 9, ResetAfter: 1500 * time.Millisecond},
		},
	}
	f := dec.admittedFields()
	if got, want := f.Policy(), `"a";q=5;w=60, "c";q=10;w=60`; got != want {
		t.Errorf("RateLimit-Policy %s, want %s", got, want)
	}
	if got, want := f.RateLimit(), `"a";r=4;t=30, "c";r=9;t=2`; got != want {
		t.Errorf("RateLimit %s, want %s", got, want)
	}
	dec.requests = []limiter.Request{{DryRun: true}, {DryRun: true}, {DryRun: true}}
	if f := dec.admittedFields(); f.Len() != 0 {
		t.Errorf("only DryRun policies: %d items, want none", f.Len())
	}
}
