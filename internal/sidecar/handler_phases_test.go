package sidecar

import (
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidegate/slidegate/internal/enforce"
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
		policy   string
		decision enforce.Outcome
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
			wantCounted: []counted{{"user", enforce.Skipped}},
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
			wantCounted: []counted{{"a-dry", enforce.MissingKey}, {"b-user", enforce.MissingKey}},
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
			wantCounted:   []counted{{"b-dry", enforce.AmbiguousKey}, {"c-user", enforce.AmbiguousKey}},
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
				for d := range enforce.NumOutcomes {
					want := 0.0
					for _, c := range tt.wantCounted {
						if c.policy == p.name && c.decision == d {
							want = 1
						}
					}
					if got := testutil.ToFloat64(p.counters[d]); got != want {
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
