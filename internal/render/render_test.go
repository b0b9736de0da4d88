/*
Copyright 2026 The slidegate Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package render_test

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// goldenOptions are the options of every golden case: the namespace of the
// documents and two trusted proxy ranges, given unsorted with a duplicate.
var goldenOptions = render.Options{
	Namespace: "shop",
	TrustedProxies: []netip.Prefix{
		netip.MustParsePrefix("2001:db8::/32"),
		netip.MustParsePrefix("10.1.2.3/8"),
		netip.MustParsePrefix("10.0.0.0/8"),
	},
	// The key set of ConfigMap key auth.json (testdata/jwt-verified.yaml):
	// RFC 7515's example P-256 key, canonical.
	KeySets: map[string][]byte{"configMap:auth.json": []byte(exampleKeySet)},
}

const exampleKeySet = `{"keys":[{"crv":"P-256","kid":"k1","kty":"EC","use":"sig","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}`

// TestRenderGolden renders each testdata/*.yaml (a stream of RateLimitPolicy
// documents) and compares with testdata/*.golden: the exact config.json the
// sidecar loads, or "error: ..." for input Render rejects. The goldens double
// as fixtures for the sidecar. Regenerate with: go test ./internal/render -update
func TestRenderGolden(t *testing.T) {
	inputs, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no golden inputs: %v", err)
	}
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".yaml")
		t.Run(name, func(t *testing.T) {
			policies := readPolicies(t, in)
			got := renderOutput(policies)

			golden := strings.TrimSuffix(in, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run: go test ./internal/render -update)", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("Render(%s) differs from %s (-want +got):\n%s", in, golden, diff)
			}

			// Order of input does not matter: reversed input, same bytes.
			reversed := make([]v1alpha1.RateLimitPolicy, len(policies))
			for i := range policies {
				reversed[len(policies)-1-i] = policies[i]
			}
			if again := renderOutput(reversed); !bytes.Equal(again, got) {
				t.Errorf("Render of the reversed input differs:\n%s", cmp.Diff(string(got), string(again)))
			}
			// A good document survives the sidecar's strict parser unchanged.
			if !bytes.HasPrefix(got, []byte("error: ")) {
				cfg, err := sidecarconfig.Parse(got)
				if err != nil {
					t.Fatalf("the sidecar would reject the rendered document: %v", err)
				}
				back, err := sidecarconfig.Marshal(cfg)
				if err != nil || !bytes.Equal(back, got) {
					t.Errorf("parse+marshal is not the identity (err %v)", err)
				}
			}
		})
	}
}

func renderOutput(policies []v1alpha1.RateLimitPolicy) []byte {
	cfg, err := render.Render(policies, goldenOptions)
	if err != nil {
		return []byte("error: " + err.Error() + "\n")
	}
	data, _, err := render.Encode(cfg)
	if err != nil {
		return []byte("error: " + err.Error() + "\n")
	}
	return data
}

func readPolicies(t *testing.T, path string) []v1alpha1.RateLimitPolicy {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	var out []v1alpha1.RateLimitPolicy
	for {
		var p v1alpha1.RateLimitPolicy
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if p.Name == "" { // an empty document (comments only)
			continue
		}
		out = append(out, p)
	}
}

func TestParseWindow(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr string
	}{
		{in: "1ms", want: time.Millisecond},
		{in: "500ms", want: 500 * time.Millisecond},
		{in: "10s", want: 10 * time.Second},
		{in: "1m30s", want: 90 * time.Second},
		{in: "1h30m15s250ms", want: time.Hour + 30*time.Minute + 15*time.Second + 250*time.Millisecond},
		{in: "24h", want: 24 * time.Hour},
		{in: "86400000ms", want: 24 * time.Hour},
		{in: "23h59m59s999ms", want: 24*time.Hour - time.Millisecond},
		// Rejected instead of truncated or rounded.
		{in: "500us", wantErr: "is not a duration like"},
		{in: "1.5s", wantErr: "is not a duration like"},
		{in: "1500000ns", wantErr: "is not a duration like"},
		{in: "0", wantErr: "is not a duration like"},
		{in: "", wantErr: "is not a duration like"},
		{in: "abc", wantErr: "is not a duration like"},
		{in: "-1s", wantErr: "is not a duration like"},
		{in: "30m1h", wantErr: "is not a duration like"},
		{in: "0s", wantErr: "is not from 1ms to 24h"},
		{in: "0ms", wantErr: "is not from 1ms to 24h"},
		{in: "25h", wantErr: "is not from 1ms to 24h"},
		{in: "24h1ms", wantErr: "is not from 1ms to 24h"},
		{in: "99h9999m99999s99999999ms", wantErr: "is not from 1ms to 24h"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := render.ParseWindow(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseWindow(%q) = %v, %v; want error containing %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseWindow(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
		})
	}
}

// TestParseWindowNaiveTruncates shows why ParseWindow exists: the naive
// time.ParseDuration(...).Milliseconds() silently turns "500us" into a 0ms
// window and "1.0005s" into 1s, instead of rejecting them.
func TestParseWindowNaiveTruncates(t *testing.T) {
	for _, s := range []string{"500us", "1.0005s"} {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		if time.Duration(d.Milliseconds())*time.Millisecond == d {
			t.Fatalf("naive parse of %q is exact; the test shows nothing", s)
		}
		if _, err := render.ParseWindow(s); err == nil {
			t.Errorf("ParseWindow(%q) accepted a window it would have to truncate", s)
		}
	}
}

func FuzzParseWindow(f *testing.F) {
	for _, s := range []string{"1ms", "500ms", "1m30s", "24h", "25h", "500us", "1.5s", "0", "abc", "99h9999m99999s99999999ms"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := render.ParseWindow(s)
		if err != nil {
			return
		}
		if d < time.Millisecond || d > 24*time.Hour || d%time.Millisecond != 0 {
			t.Fatalf("ParseWindow(%q) = %v: out of bounds or below millisecond precision", s, d)
		}
		if want, err := time.ParseDuration(s); err != nil || want != d {
			t.Fatalf("ParseWindow(%q) = %v, but time.ParseDuration says %v, %v", s, d, want, err)
		}
	})
}

// TestRenderTrustedProxies: prefixes handed to Render directly, not
// through sidecarconfig.ParseTrustedProxies, are rendered canonical too: an
// IPv4-mapped prefix as the IPv4 prefix the sidecar matches with.
func TestRenderTrustedProxies(t *testing.T) {
	cfg, err := render.Render(nil, render.Options{Namespace: "shop", TrustedProxies: []netip.Prefix{
		netip.MustParsePrefix("::ffff:10.0.0.0/104"), netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.0.0.0/8", "fd00::/8"}, cfg.TrustedProxies); diff != "" {
		t.Errorf("trustedProxies (-want +got):\n%s", diff)
	}
}

// TestRevision pins the revision algorithm (the sidecar may compute it) and
// shows that any byte of difference changes it.
func TestRevision(t *testing.T) {
	if got, want := render.Revision([]byte("{}\n")), "ca3d163bab055381"; got != want {
		t.Errorf("Revision = %q, want %q (first 16 hex digits of SHA-256)", got, want)
	}
	if render.Revision([]byte("a")) == render.Revision([]byte("b")) {
		t.Error("different content, same revision")
	}
}

// TestPolicyErrorsAreTyped lets the controller tell a bad policy (Accepted
// False, no retry) from a bug.
func TestPolicyErrorsAreTyped(t *testing.T) {
	policies := readPolicies(t, filepath.Join("testdata", "invalid.yaml"))
	for i := range policies {
		_, err := render.Policy(&policies[i])
		var invalid *render.InvalidPolicyError
		if !errors.As(err, &invalid) || invalid.Name != policies[i].Name {
			t.Errorf("Policy(%s) error %v is not an *InvalidPolicyError for it", policies[i].Name, err)
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("error of %s spans lines (it goes into a condition message): %q", policies[i].Name, err)
		}
	}
}

func TestRenderNeedsNamespace(t *testing.T) {
	if _, err := render.Render(nil, render.Options{}); err == nil {
		t.Fatal("Render without a namespace succeeded")
	}
}

// TestSamplesRender: the sample policies of config/samples render together,
// as they would in their namespace.
func TestSamplesRender(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "config", "samples", "ratelimit_v1alpha1_*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no samples: %v", err)
	}
	var policies []v1alpha1.RateLimitPolicy
	for _, f := range files {
		for _, p := range readPolicies(t, f) {
			p.Namespace = "slidegate-demo"
			policies = append(policies, p)
		}
	}
	cfg, err := render.Render(policies, render.Options{Namespace: "slidegate-demo"})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Policies) != len(files) {
		t.Errorf("rendered %d policies from %d samples", len(cfg.Policies), len(files))
	}
}

// TestPolicyRevisions: a policy's revision follows what the sidecars enforce
// for it and nothing else; the document's revision, which the status carried
// before, moves with every neighbour (the paired case).
func TestPolicyRevisions(t *testing.T) {
	mk := func(name string, limit int32) v1alpha1.RateLimitPolicy {
		return v1alpha1.RateLimitPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"},
			Spec: v1alpha1.RateLimitPolicySpec{
				TargetSelector: &v1alpha1.LabelSelector{},
				Window:         "1s", Limit: limit,
				Key: v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal},
			},
		}
	}
	revisions := func(opts render.Options, ps ...v1alpha1.RateLimitPolicy) (map[string]string, string) {
		t.Helper()
		cfg, err := render.Render(ps, opts)
		if err != nil {
			t.Fatal(err)
		}
		_, doc, err := render.Encode(cfg)
		if err != nil {
			t.Fatal(err)
		}
		revs, err := render.PolicyRevisions(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return revs, doc
	}
	opts := render.Options{Namespace: "shop"}
	base, baseDoc := revisions(opts, mk("a", 10))
	for _, tc := range []struct {
		name    string
		opts    render.Options
		ps      []v1alpha1.RateLimitPolicy
		aMoves  bool
		docMove bool
	}{
		{"nothing changed", opts, []v1alpha1.RateLimitPolicy{mk("a", 10)}, false, false},
		{"a neighbour added", opts, []v1alpha1.RateLimitPolicy{mk("a", 10), mk("b", 5)}, false, true},
		{"its limit changed", opts, []v1alpha1.RateLimitPolicy{mk("a", 11)}, true, true},
		{"trusted proxies changed", render.Options{Namespace: "shop", TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
			[]v1alpha1.RateLimitPolicy{mk("a", 10)}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			revs, doc := revisions(tc.opts, tc.ps...)
			if moved := revs["a"] != base["a"]; moved != tc.aMoves {
				t.Errorf("a's revision moved: %v (%s → %s), want %v", moved, base["a"], revs["a"], tc.aMoves)
			}
			if moved := doc != baseDoc; moved != tc.docMove {
				t.Errorf("the document's revision moved: %v, want %v", moved, tc.docMove)
			}
			if len(revs) != len(tc.ps) {
				t.Errorf("%d revisions for %d policies", len(revs), len(tc.ps))
			}
		})
	}
}

// TestNetworkPolicyGolden renders the NetworkPolicy of every
// testdata/networkpolicy/*.yaml policy (issue 23: traffic to the pods' IPs)
// and compares it with its .golden file ("" for none); -update rewrites them.
func TestNetworkPolicyGolden(t *testing.T) {
	inputs, err := filepath.Glob("testdata/networkpolicy/*.yaml")
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no inputs: %v", err)
	}
	for _, in := range inputs {
		t.Run(filepath.Base(in), func(t *testing.T) {
			raw, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			var p v1alpha1.RateLimitPolicy
			if err := sigsyaml.UnmarshalStrict(raw, &p); err != nil {
				t.Fatal(err)
			}
			var got []byte
			if np := render.NetworkPolicy(&p, render.NetworkPolicyOptions{ListenPort: 15280, AdminPort: 15290}); np != nil {
				if got, err = sigsyaml.Marshal(np); err != nil {
					t.Fatal(err)
				}
			}
			golden := strings.TrimSuffix(in, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run: go test ./internal/render -update)", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("NetworkPolicy(%s) differs from %s (-want +got):\n%s", in, golden, diff)
			}
		})
	}
}

// TestNetworkPolicyName: the name is slidegate-<policy>, and a policy name
// too long for that gets a name that still is a valid object name, unique
// to it.
func TestNetworkPolicyName(t *testing.T) {
	if got := render.NetworkPolicyName("per-user"); got != "slidegate-per-user" {
		t.Errorf("NetworkPolicyName(per-user) = %q", got)
	}
	long := strings.Repeat("a", 240) + "." + strings.Repeat("b", 12)
	other := strings.Repeat("a", 240) + "." + strings.Repeat("c", 12)
	a, b := render.NetworkPolicyName(long), render.NetworkPolicyName(other)
	for _, n := range []string{a, b} {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			t.Errorf("%q: %v", n, errs)
		}
	}
	if a == b {
		t.Errorf("two long names share the name %q", a)
	}
}
