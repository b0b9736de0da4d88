package render_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

func i64(v int64) *int64 { return &v }

// tokenPolicy is a sidecar policy limiting tokens per minute.
func tokenPolicy(name string, c *v1alpha1.Cost) v1alpha1.RateLimitPolicy {
	return v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: &v1alpha1.LabelSelector{},
			Window:         "1m",
			Limit:          100_000,
			Key:            v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal},
			Cost:           c,
		},
	}
}

// TestPolicyCost: table of what spec.cost renders to in the sidecars'
// document (the defaults written out), or why it cannot. New cases go at
// the end.
func TestPolicyCost(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cost    *v1alpha1.Cost
		want    *sidecarconfig.Cost
		wantErr string
	}{
		{name: "no cost: a count policy", cost: nil, want: nil},
		{name: "constant", cost: &v1alpha1.Cost{Request: &v1alpha1.RequestCost{Constant: i64(10)}},
			want: &sidecarconfig.Cost{Request: &sidecarconfig.RequestCost{Constant: i64(10)}}},
		{name: "constant 0 stays", cost: &v1alpha1.Cost{Request: &v1alpha1.RequestCost{Constant: i64(0)}},
			want: &sidecarconfig.Cost{Request: &sidecarconfig.RequestCost{Constant: i64(0)}}},
		{name: "header: default 1 written out", cost: &v1alpha1.Cost{Request: &v1alpha1.RequestCost{Header: "X-Estimated-Tokens"}},
			want: &sidecarconfig.Cost{Request: &sidecarconfig.RequestCost{Header: "X-Estimated-Tokens", Default: i64(1)}}},
		{name: "header with default 0", cost: &v1alpha1.Cost{Request: &v1alpha1.RequestCost{Header: "X-Estimated-Tokens", Default: i64(0)}},
			want: &sidecarconfig.Cost{Request: &sidecarconfig.RequestCost{Header: "X-Estimated-Tokens", Default: i64(0)}}},
		{name: "response: fields sorted, default kept", cost: &v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{"usage.output_tokens", "message.usage.input_tokens"}, Default: i64(7)}},
			want: &sidecarconfig.Cost{Response: &sidecarconfig.ResponseCost{JSONFields: []string{"message.usage.input_tokens", "usage.output_tokens"}, Default: 7}}},
		{name: "response: a path twice counts once", cost: &v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{"usage.total_tokens", "usage.total_tokens"}}},
			want: &sidecarconfig.Cost{Response: &sidecarconfig.ResponseCost{JSONFields: []string{"usage.total_tokens"}}}},
		{name: "request and response", cost: &v1alpha1.Cost{Request: &v1alpha1.RequestCost{Constant: i64(1)}, Response: &v1alpha1.ResponseCost{Header: "X-Usage-Tokens"}},
			want: &sidecarconfig.Cost{Request: &sidecarconfig.RequestCost{Constant: i64(1)}, Response: &sidecarconfig.ResponseCost{Header: "X-Usage-Tokens"}}},
		{name: "response: alternatives in one order", cost: &v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{"usage.output_tokens", "usage.input_tokens|message.usage.input_tokens"}}},
			want: &sidecarconfig.Cost{Response: &sidecarconfig.ResponseCost{JSONFields: []string{"message.usage.input_tokens|usage.input_tokens", "usage.output_tokens"}}}},
		{name: "response: a path in two entries", cost: &v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{"usage.input_tokens", "usage.input_tokens|message.usage.input_tokens"}}},
			wantErr: `cost.response.jsonFields: the path "usage.input_tokens" is named twice: its value would count twice`},
		{name: "empty cost", cost: &v1alpha1.Cost{}, wantErr: "cost needs request, response or both"},
		{name: "request without a source (rateLimitService's form)", cost: &v1alpha1.Cost{Request: &v1alpha1.RequestCost{}}, wantErr: "cost.request needs constant or header"},
		{name: "response without a source", cost: &v1alpha1.Cost{Response: &v1alpha1.ResponseCost{}}, wantErr: "cost.response needs header, jsonFields or both"},
		{name: "constant with default", cost: &v1alpha1.Cost{Request: &v1alpha1.RequestCost{Constant: i64(1), Default: i64(2)}}, wantErr: "cost.request.default applies only with header"},
		{name: "constant over the bound", cost: &v1alpha1.Cost{Request: &v1alpha1.RequestCost{Constant: i64(sidecarconfig.MaxCost + 1)}}, wantErr: "cost.request.constant 1000000001 is outside 0..1000000000"},
		{name: "bad header", cost: &v1alpha1.Cost{Response: &v1alpha1.ResponseCost{Header: "X Usage"}}, wantErr: `cost.response.header "X Usage" is not a valid header name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tokenPolicy("p", tc.cost)
			got, err := render.Policy(&p)
			if tc.wantErr != "" {
				var invalid *render.InvalidPolicyError
				if !errors.As(err, &invalid) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want an InvalidPolicyError containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.Cost); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if want := map[bool]int{true: 2, false: 0}[tc.cost != nil]; sidecarconfig.MinMinor(&got) != want {
				t.Errorf("MinMinor = %d, want %d", sidecarconfig.MinMinor(&got), want)
			}
		})
	}
}

// TestCostHeldBackForFirstReleaseSidecars: while a sidecar of the first
// release (minor 0) runs in the namespace, a cost policy is held back (it
// needs minor 2) and a count policy is not.
func TestCostHeldBackForFirstReleaseSidecars(t *testing.T) {
	tokens := tokenPolicy("tokens", &v1alpha1.Cost{Response: &v1alpha1.ResponseCost{JSONFields: []v1alpha1.JSONFieldPath{"usage.total_tokens"}}})
	count := tokenPolicy("count", nil)
	kept, held := render.HoldBack([]v1alpha1.RateLimitPolicy{count, tokens}, 0)
	if len(kept) != 1 || kept[0].Name != "count" || held["tokens"] != 2 {
		t.Errorf("kept %d (%v), held %v; want count kept, tokens held for minor 2", len(kept), kept, held)
	}
	if _, held := render.HoldBack([]v1alpha1.RateLimitPolicy{count, tokens}, sidecarconfig.Minor); len(held) != 0 {
		t.Errorf("held %v for sidecars of this minor", held)
	}
}

// TestRLSPolicyCost: spec.cost for the rate limit service: request: {} or
// response: {}, rendered as they are, in a v1.2 document; anything more
// is refused. New cases go at the end.
func TestRLSPolicyCost(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cost    *v1alpha1.Cost
		want    *rlsconfig.Cost
		wantErr string
	}{
		{name: "no cost", cost: nil, want: nil},
		{name: "request", cost: &v1alpha1.Cost{Request: &v1alpha1.RequestCost{}}, want: &rlsconfig.Cost{Request: &rlsconfig.RequestCost{}}},
		{name: "response", cost: &v1alpha1.Cost{Response: &v1alpha1.ResponseCost{}}, want: &rlsconfig.Cost{Response: &rlsconfig.ResponseCost{}}},
		{name: "both", cost: &v1alpha1.Cost{Request: &v1alpha1.RequestCost{}, Response: &v1alpha1.ResponseCost{}}, wantErr: "cost: set request or response, not both"},
		{name: "empty", cost: &v1alpha1.Cost{}, wantErr: "cost needs request or response"},
		{name: "request header", cost: &v1alpha1.Cost{Request: &v1alpha1.RequestCost{Header: "X-Cost"}}, wantErr: "cost.request must be empty: the gateway sends the cost as hits_addend"},
		{name: "request constant", cost: &v1alpha1.Cost{Request: &v1alpha1.RequestCost{Constant: i64(0)}}, wantErr: "cost.request must be empty"},
		{name: "response fields", cost: &v1alpha1.Cost{Response: &v1alpha1.ResponseCost{JSONFields: []v1alpha1.JSONFieldPath{"usage.total_tokens"}}}, wantErr: "cost.response must be empty"},
		{name: "response default", cost: &v1alpha1.Cost{Response: &v1alpha1.ResponseCost{Default: i64(1)}}, wantErr: "cost.response must be empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := rlsPolicy("shop", "p", func(s *v1alpha1.RateLimitPolicySpec) { s.Cost = tc.cost })
			got, err := render.RLSPolicy(&p)
			if tc.wantErr != "" {
				var invalid *render.InvalidPolicyError
				if !errors.As(err, &invalid) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want an InvalidPolicyError containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.Cost); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			cfg, err := render.RLS([]v1alpha1.RateLimitPolicy{rlsPolicy("shop", "count"), p})
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]string{true: "v1.2", false: "v1"}[tc.cost != nil]; cfg.Version != want {
				t.Errorf("document version %s, want %s", cfg.Version, want)
			}
		})
	}
}

// TestCostBoundsMatchTheAPI: the CRD's bounds and path form are the
// documents' (the markers cannot refer to the constants).
func TestCostBoundsMatchTheAPI(t *testing.T) {
	if v1alpha1.JSONFieldPattern != sidecarconfig.JSONFieldPattern {
		t.Errorf("v1alpha1.JSONFieldPattern %q, sidecarconfig.JSONFieldPattern %q", v1alpha1.JSONFieldPattern, sidecarconfig.JSONFieldPattern)
	}
	if v1alpha1.MaxCost != sidecarconfig.MaxCost {
		t.Errorf("v1alpha1.MaxCost %d, sidecarconfig.MaxCost %d", v1alpha1.MaxCost, sidecarconfig.MaxCost)
	}
}
