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
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
)

// epoch is the creation time of the oldest policy of the budget tests.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// sized is a valid policy of namespace shop created `second` seconds after
// epoch, with `prefixes` path prefixes of `length` bytes (none: no match).
func sized(name string, second, prefixes, length int) v1alpha1.RateLimitPolicy {
	p := v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", CreationTimestamp: metav1.NewTime(epoch.Add(time.Duration(second) * time.Second))},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "checkout"}},
			Window:         "1s", Limit: 10,
			Key: v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal},
		},
	}
	if prefixes > 0 {
		p.Spec.Match = &v1alpha1.RequestMatch{}
		for j := range prefixes {
			head := fmt.Sprintf("/%s/%02d/", name, j)
			p.Spec.Match.PathPrefixes = append(p.Spec.Match.PathPrefixes, v1alpha1.PathPrefix(head+strings.Repeat("x", max(length-len(head), 0))))
		}
	}
	return p
}

// encodedSize is the size of the document Render and Encode make of
// policies.
func encodedSize(t *testing.T, opts render.Options, policies ...v1alpha1.RateLimitPolicy) int {
	t.Helper()
	cfg, err := render.Render(policies, opts)
	if err != nil {
		t.Fatal(err)
	}
	data, _, err := render.Encode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return len(data)
}

func names(policies []v1alpha1.RateLimitPolicy) []string {
	var out []string
	for _, p := range policies {
		out = append(out, p.Name)
	}
	return out
}

func leftNames(left []*render.ConfigTooLargeError) []string {
	var out []string
	for _, e := range left {
		out = append(out, e.Name)
	}
	return out
}

// TestFit: which policies a document holds under a budget. New cases go
// here: the policies (name, creation second, prefixes), the budget as a
// function of the sizes of documents, and who fits.
func TestFit(t *testing.T) {
	opts := render.Options{Namespace: "shop"}
	a, b, c := sized("a", 2, 8, 100), sized("b", 1, 8, 100), sized("c", 0, 8, 100)
	same1, same2 := sized("same-1", 5, 8, 100), sized("same-2", 5, 8, 100)
	big, small := sized("big", 1, 32, 1000), sized("small", 2, 0, 0)
	tests := []struct {
		name     string
		policies []v1alpha1.RateLimitPolicy
		maxBytes int // 0: the default
		wantFit  []string
		wantLeft []string
	}{
		{name: "none", wantFit: nil},
		{name: "all fit the default budget", policies: []v1alpha1.RateLimitPolicy{a, b, c}, wantFit: []string{"a", "b", "c"}},
		{name: "exactly the budget fits", policies: []v1alpha1.RateLimitPolicy{a, b, c},
			maxBytes: encodedSize(t, opts, a, b, c), wantFit: []string{"a", "b", "c"}},
		{name: "one byte short: the newest is left out, whatever its name", policies: []v1alpha1.RateLimitPolicy{a, b, c},
			maxBytes: encodedSize(t, opts, a, b, c) - 1, wantFit: []string{"b", "c"}, wantLeft: []string{"a"}},
		{name: "room for one: the oldest", policies: []v1alpha1.RateLimitPolicy{a, b, c},
			maxBytes: encodedSize(t, opts, c), wantFit: []string{"c"}, wantLeft: []string{"b", "a"}},
		{name: "created in the same second: by name", policies: []v1alpha1.RateLimitPolicy{same2, same1},
			maxBytes: encodedSize(t, opts, same1), wantFit: []string{"same-1"}, wantLeft: []string{"same-2"}},
		{name: "a large policy left out, a later small one still fits", policies: []v1alpha1.RateLimitPolicy{c, big, small},
			maxBytes: encodedSize(t, opts, c, small), wantFit: []string{"c", "small"}, wantLeft: []string{"big"}},
		{name: "alone over the budget", policies: []v1alpha1.RateLimitPolicy{big},
			maxBytes: encodedSize(t, opts, big) - 1, wantLeft: []string{"big"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := opts
			opts.MaxBytes = tt.maxBytes
			fit, left, err := render.Fit(tt.policies, opts)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantFit, names(fit)); diff != "" {
				t.Errorf("fit (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantLeft, leftNames(left)); diff != "" {
				t.Errorf("left out (-want +got):\n%s", diff)
			}
			// The order of input does not matter.
			rev := slices.Clone(tt.policies)
			slices.Reverse(rev)
			fit2, left2, err := render.Fit(rev, opts)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(leftNames(left), leftNames(left2)) || !slices.Equal(slices.Sorted(slices.Values(names(fit))), slices.Sorted(slices.Values(names(fit2)))) {
				t.Errorf("reversed input: fit %v left %v; want %v, %v", names(fit2), leftNames(left2), names(fit), leftNames(left))
			}
			// What fits renders within the budget.
			if len(fit) > 0 {
				budget := tt.maxBytes
				if budget == 0 {
					budget = render.DefaultMaxBytes
				}
				if n := encodedSize(t, opts, fit...); n > budget {
					t.Errorf("the policies that fit encode to %d bytes, over the budget of %d", n, budget)
				}
			}
		})
	}
}

// TestFitSizesAreExact: the sizes Fit counts and reports are the bytes of
// the document Encode writes (replicas at their widest), for documents with
// trusted proxies, escaped characters and a policy alone or among others;
// with the real, narrower replicas the document is smaller still. The
// budget sits on exact bytes, so a test of "fits" at the boundary could not
// tell a byte off: this one can.
func TestFitSizesAreExact(t *testing.T) {
	escaped := sized("escaped", 3, 2, 40)
	escaped.Spec.Match.PathPrefixes[0] = "/a&b<c>\u00e9" // HTML-escaped by encoding/json
	escaped.Spec.TargetSelector.MatchExpressions = []v1alpha1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"web", "api"}}}
	// A policy that verifies tokens: with goldenOptions its key set is
	// rendered, without it an empty one; both are counted as written.
	verified := sized("p5", 5, 0, 0)
	verified.Spec.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceJWTClaim, Name: "sub", JWT: &v1alpha1.JWTVerification{
		Issuer: "https://auth.example.com/", Audiences: []string{"api"}, JWKS: &v1alpha1.JWKSSource{ConfigMapKey: "auth.json"}}}
	policies := []v1alpha1.RateLimitPolicy{sized("p1", 0, 0, 0), sized("p2", 1, 3, 200), escaped, sized("p4", 4, 32, 1024), verified}
	for _, opts := range []render.Options{{Namespace: "shop"}, goldenOptions} {
		for n := 1; n <= len(policies); n++ {
			ps := policies[:n]
			want := encodedSize(t, opts, ps...)
			opts.MaxBytes = want
			fit, left, err := render.Fit(ps, opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(fit) != n || len(left) != 0 {
				t.Fatalf("%d policies in exactly their size: fit %v, left %v", n, names(fit), leftNames(left))
			}
			opts.MaxBytes = want - 1
			_, left, err = render.Fit(ps, opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(left) != 1 || left[0].Name != ps[n-1].Name || left[0].TotalBytes != want || left[0].MaxBytes != want-1 {
				t.Fatalf("%d policies one byte short: left %+v; want %s with a total of %d", n, left, ps[n-1].Name, want)
			}
			if n > 1 {
				if got := want - encodedSize(t, opts, ps[:n-1]...); left[0].PolicyBytes != got {
					t.Errorf("%s counted as %d bytes, adds %d", ps[n-1].Name, left[0].PolicyBytes, got)
				}
			}
		}
	}
}

// TestFitNaiveSumIsWrong shows why Fit counts each policy where it sits in
// the document: the sum of the policies' own indented encodings misses their
// deeper indentation and the separators, so a budget check on it would let
// a document over the budget through.
func TestFitNaiveSumIsWrong(t *testing.T) {
	opts := render.Options{Namespace: "shop"}
	ps := []v1alpha1.RateLimitPolicy{sized("p1", 0, 4, 10), sized("p2", 1, 4, 10)}
	naive := encodedSize(t, opts)
	for i := range ps {
		rp, err := render.Policy(&ps[i])
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.MarshalIndent(rp, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		naive += len(b)
	}
	exact := encodedSize(t, opts, ps...)
	if naive >= exact {
		t.Fatalf("the naive sum %d is not below the exact size %d; the test shows nothing", naive, exact)
	}
	opts.MaxBytes = naive
	if fit, _, _ := render.Fit(ps, opts); len(fit) == 2 {
		t.Errorf("Fit let two policies of %d bytes into a budget of %d", exact, naive)
	}
}

func TestConfigTooLargeMessage(t *testing.T) {
	err := &render.ConfigTooLargeError{Namespace: "shop", Name: "p39", PolicyBytes: 33_456, TotalBytes: 1_021_402, MaxBytes: 1_000_000, Ahead: 29}
	want := "policy shop/p39 (33,456 bytes) does not fit: with it the sidecar configuration would be 1,021,402 bytes, " +
		"over the 1,000,000-byte budget of ConfigMap slidegate-sidecar-config (the API server refuses more than 1 MiB); " +
		"the 29 policies that come before it (created earlier, or at the same second and earlier by name) fill 987,946 bytes"
	if got := err.Error(); got != want {
		t.Errorf("message:\n got %s\nwant %s", got, want)
	}
}

// TestLargestPolicyFitsAlone: the largest policy the schema admits (the
// bounds of api/v1alpha1, with label keys and values as long as Kubernetes
// allows) renders to a fraction of the budget, so no valid policy is left
// out on its own account.
func TestLargestPolicyFitsAlone(t *testing.T) {
	label := strings.Repeat("p", 63)
	prefix := label + "." + label + "." + label + "." + strings.Repeat("p", 61) // 253
	key := func(i int) string {
		name := fmt.Sprintf("n%03d", i)
		return prefix + "/" + name + strings.Repeat("n", 63-len(name))
	}
	value := func(i int) string {
		v := fmt.Sprintf("v%05d", i)
		return v + strings.Repeat("v", 63-len(v))
	}
	p := sized("largest-"+strings.Repeat("x", 253-len("largest-")), 0, 32, 1024)
	p.Spec.Match.Methods = []v1alpha1.HTTPMethod{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"}
	p.Spec.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceQueryParameter, Name: strings.Repeat("k", 256), OnMissing: v1alpha1.MissingKeyRemoteAddress}
	p.Spec.TargetSelector = &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{}}
	for i := range 32 {
		p.Spec.TargetSelector.MatchLabels[key(i)] = v1alpha1.LabelValue(value(i))
	}
	for i := range 16 {
		e := v1alpha1.LabelSelectorRequirement{Key: key(100 + i), Operator: metav1.LabelSelectorOpNotIn}
		for j := range 64 {
			e.Values = append(e.Values, value(j))
		}
		p.Spec.TargetSelector.MatchExpressions = append(p.Spec.TargetSelector.MatchExpressions, e)
	}
	size := encodedSize(t, render.Options{Namespace: "shop"}, p)
	t.Logf("the largest policy the schema admits: %d bytes in a document of its own; %d of them fit in %d bytes",
		size, render.DefaultMaxBytes/size, render.DefaultMaxBytes)
	if size > render.DefaultMaxBytes/4 {
		t.Errorf("the largest policy takes %d bytes, over a quarter of the budget", size)
	}
	// A 65th value is refused by the schema; a 64-character value is left
	// to the renderer, which rejects it.
	p.Spec.TargetSelector.MatchExpressions[0].Values[0] += "v"
	if _, err := render.Policy(&p); err == nil {
		t.Error("a label value of 64 characters rendered")
	}
}

// TestFitIssue13 is the case of issue 13: 40 policies of one namespace, each
// with 32 path prefixes of 1,000 bytes, render to more than a ConfigMap
// holds. The oldest ones fit in the default budget, the rest are left out.
func TestFitIssue13(t *testing.T) {
	var policies []v1alpha1.RateLimitPolicy
	for i := range 40 {
		policies = append(policies, sized(fmt.Sprintf("p%02d", i), i, 32, 1000))
	}
	opts := render.Options{Namespace: "shop"}
	all := encodedSize(t, opts, policies...)
	fit, left, err := render.Fit(policies, opts)
	if err != nil {
		t.Fatal(err)
	}
	got := encodedSize(t, opts, fit...)
	t.Logf("40 policies: %d bytes; %d fit in %d bytes, %d left out; first left out: %v", all, len(fit), got, len(left), left[0])
	if all <= 1<<20 {
		t.Fatalf("40 policies take %d bytes, within the 1 MiB of a ConfigMap: the case shows nothing", all)
	}
	if got > render.DefaultMaxBytes || len(fit)+len(left) != 40 || len(left) == 0 {
		t.Errorf("%d fit in %d bytes, %d left out", len(fit), got, len(left))
	}
	if !slices.Equal(names(fit), names(policies[:len(fit)])) {
		t.Errorf("fit %v, want the oldest", names(fit))
	}
}
