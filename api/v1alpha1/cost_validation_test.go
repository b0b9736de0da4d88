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

package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/testsupport"
)

func ptr[T any](v T) *T { return &v }

// withCost sets spec.cost.
func withCost(c v1alpha1.Cost) func(*v1alpha1.RateLimitPolicySpec) {
	return func(s *v1alpha1.RateLimitPolicySpec) { s.Cost = &c }
}

// rlsWithCost is a policy for the rate limit service with spec.cost.
func rlsWithCost(c v1alpha1.Cost) func(*v1alpha1.RateLimitPolicySpec) {
	return func(s *v1alpha1.RateLimitPolicySpec) {
		rls(s)
		s.Cost = &c
	}
}

// TestValidationCost: spec.cost (issue 27, limits by cost) against the real
// API server. New cases for cost go here, the rest of the spec's in
// TestValidation.
func TestValidationCost(t *testing.T) {
	header := &v1alpha1.RequestCost{Header: "X-Estimated-Tokens"}
	openAI := &v1alpha1.ResponseCost{JSONFields: []v1alpha1.JSONFieldPath{"usage.total_tokens"}, Default: ptr[int64](4096)}
	fields := func(n int) []v1alpha1.JSONFieldPath {
		var out []v1alpha1.JSONFieldPath
		for i := range n {
			out = append(out, v1alpha1.JSONFieldPath(fmt.Sprintf("usage.f%d", i)))
		}
		return out
	}
	for i, tt := range []validationCase{
		// Valid shapes: the and the model servers' of the docs.
		{name: "request constant", mutate: withCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{Constant: ptr[int64](10)}})},
		{name: "request constant 0", mutate: withCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{Constant: ptr[int64](0)}})},
		{name: "request constant 1e9", mutate: withCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{Constant: ptr[int64](1_000_000_000)}})},
		{name: "request header with default", mutate: withCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{Header: "X-Estimated-Tokens", Default: ptr[int64](0)}})},
		{name: "response OpenAI", mutate: withCost(v1alpha1.Cost{Response: openAI})},
		{name: "response Anthropic, stream", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{"message.usage.input_tokens", "usage.output_tokens"}, Default: ptr[int64](0)}})},
		{name: "response header, jsonFields and default", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			Header: "X-Usage-Tokens", JSONFields: []v1alpha1.JSONFieldPath{"usage.total_tokens"}, Default: ptr[int64](1_000_000_000)}})},
		{name: "request and response", mutate: withCost(v1alpha1.Cost{Request: header, Response: openAI})},
		{name: "8 json fields", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{JSONFields: fields(8), Default: ptr[int64](1)}})},
		{name: "json field of 8 names", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{"a.b.c.d.e.f.g._h9"}, Default: ptr[int64](1)}})},
		{name: "json field with an alternative (Anthropic, JSON and stream)", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{"usage.input_tokens|message.usage.input_tokens", "usage.output_tokens"}, Default: ptr[int64](8192)}})},
		{name: "rate limit service, request", mutate: rlsWithCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{}})},
		{name: "rate limit service, response", mutate: rlsWithCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{}})},

		// Cost as a whole.
		{name: "empty cost", mutate: withCost(v1alpha1.Cost{}),
			wantErr: []string{"cost needs request (the cost known when the request arrives), response (the cost known when the response ends), or both"}},
		{name: "rate limit service, empty cost", mutate: rlsWithCost(v1alpha1.Cost{}),
			wantErr: []string{"cost needs request"}},

		// request.
		{name: "request without constant or header", mutate: withCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{}}),
			wantErr: []string{"cost.request needs constant (the same cost for every request) or header (a request header that carries the cost)"}},
		{name: "request constant and header", mutate: withCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{Constant: ptr[int64](1), Header: "X-Cost"}}),
			wantErr: []string{"set constant or header, not both"}},
		{name: "request constant with default", mutate: withCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{Constant: ptr[int64](1), Default: ptr[int64](1)}}),
			wantErr: []string{"default applies only with header"}},
		{name: "request constant -1", mutate: withCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{Constant: ptr[int64](-1)}}),
			wantErr: []string{"spec.cost.request.constant", "greater than or equal to 0"}},
		{name: "request constant 1e9+1", mutate: withCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{Constant: ptr[int64](1_000_000_001)}}),
			wantErr: []string{"spec.cost.request.constant", "less than or equal to 1000000000"}},
		{name: "request default 1e9+1", mutate: withCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{Header: "X-Cost", Default: ptr[int64](1_000_000_001)}}),
			wantErr: []string{"spec.cost.request.default", "less than or equal to 1000000000"}},
		{name: "request header with a space", mutate: withCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{Header: "X Cost"}}),
			wantErr: []string{"a header name may contain only letters, digits and !#$%&*+-.^_|~, e.g. X-Usage-Tokens"}},
		{name: "request header with a colon", mutate: withCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{Header: ":authority"}}),
			wantErr: []string{"a header name may contain only"}},
		{name: "request header of 257 characters", mutate: withCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{Header: v1alpha1.HeaderName(strings.Repeat("x", 257))}}),
			wantErr: []string{"spec.cost.request.header", "may not be more than 256"}},

		// response.
		{name: "response without header or jsonFields", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{}}),
			wantErr: []string{"cost.response needs header (a response header or trailer that carries the cost), jsonFields (fields of a JSON response that carry it, e.g. usage.total_tokens) or both"}},
		// A response that reports no cost is charged default: never a
		// silent 0 that a client could choose (a stream without usage, a
		// hang-up, a WebSocket).
		{name: "response jsonFields without default", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{JSONFields: []v1alpha1.JSONFieldPath{"usage.total_tokens"}}}),
			wantErr: []string{"spec.cost.response", "default is required with header or jsonFields: it is what a response that reports no cost is charged"}},
		{name: "response header without default", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{Header: "X-Usage"}}),
			wantErr: []string{"default is required with header or jsonFields"}},
		{name: "response default alone", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{Default: ptr[int64](5)}}),
			wantErr: []string{"default applies only with header or jsonFields"}},
		{name: "response default -1", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{Header: "X-Usage", Default: ptr[int64](-1)}}),
			wantErr: []string{"spec.cost.response.default", "greater than or equal to 0"}},
		{name: "response header bad", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{Header: "X-Usage\r\nX-Evil"}}),
			wantErr: []string{"a header name may contain only"}},
		{name: "9 json fields", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{JSONFields: fields(9)}}),
			wantErr: []string{"spec.cost.response.jsonFields", "must have at most 8 items"}},
		{name: "json field twice", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{"usage.total_tokens", "usage.total_tokens"}}}),
			wantErr: []string{"spec.cost.response.jsonFields[1]", "Duplicate value"}},
		{name: "json field of 9 names", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{"a.b.c.d.e.f.g.h.i"}}}),
			wantErr: []string{"a JSON field must be a dot path of at most 8 field names, each of letters, digits and '_' not starting with a digit, e.g. usage.total_tokens"}},
		{name: "json field with three alternatives", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{"a|b|c"}}}),
			wantErr: []string{"or two such paths separated by '|', e.g. usage.input_tokens|message.usage.input_tokens"}},
		{name: "json field with an empty alternative", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{"usage.total_tokens|"}}}),
			wantErr: []string{"a JSON field must be a dot path"}},
		{name: "json field with an index", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{"choices[0].usage"}}}),
			wantErr: []string{"a JSON field must be a dot path"}},
		{name: "json field with a leading dot", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{".usage"}}}),
			wantErr: []string{"a JSON field must be a dot path"}},
		{name: "json field with an empty name", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{"usage..total"}}}),
			wantErr: []string{"a JSON field must be a dot path"}},
		{name: "json field starting with a digit", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{"usage.0"}}}),
			wantErr: []string{"a JSON field must be a dot path"}},
		{name: "json field empty", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{""}}}),
			wantErr: []string{"spec.cost.response.jsonFields[0]", "at least 1 chars long"}},
		{name: "json field of 257 characters", mutate: withCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{
			JSONFields: []v1alpha1.JSONFieldPath{v1alpha1.JSONFieldPath(strings.Repeat("a", 257))}}}),
			wantErr: []string{"spec.cost.response.jsonFields[0]", "may not be more than 256"}},

		// With rateLimitService, the gateway computes the cost.
		{name: "rate limit service, request constant", mutate: rlsWithCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{Constant: ptr[int64](1)}}),
			wantErr: []string{"with rateLimitService the gateway computes the cost and sends it as hits_addend: write cost.request: {} (no constant, header or default)"}},
		{name: "rate limit service, request header", mutate: rlsWithCost(v1alpha1.Cost{Request: header}),
			wantErr: []string{"write cost.request: {}"}},
		{name: "rate limit service, request default", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			// Only the rule of the rate limit service speaks here; the type's
			// own (default only with header) speaks too.
			rlsWithCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{Default: ptr[int64](1)}})(s)
		}, wantErr: []string{"write cost.request: {}"}},
		{name: "rate limit service, response jsonFields", mutate: rlsWithCost(v1alpha1.Cost{Response: openAI}),
			wantErr: []string{"with rateLimitService the gateway computes the cost and sends it as hits_addend: write cost.response: {} (no header, jsonFields or default); Envoy's apply_on_stream_done call charges the response cost"}},
		{name: "rate limit service, response header", mutate: rlsWithCost(v1alpha1.Cost{Response: &v1alpha1.ResponseCost{Header: "X-Usage"}}),
			wantErr: []string{"write cost.response: {}"}},
		{name: "rate limit service, request and response", mutate: rlsWithCost(v1alpha1.Cost{Request: &v1alpha1.RequestCost{}, Response: &v1alpha1.ResponseCost{}}),
			wantErr: []string{"with rateLimitService set cost.request or cost.response, not both"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := &v1alpha1.RateLimitPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cost-case-%d", i), Namespace: "default"},
				Spec:       validSpec(),
			}
			tt.mutate(&p.Spec)
			err := k.Create(context.Background(), p, client.DryRunAll)
			if err != nil {
				t.Log(err)
			}
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("valid policy rejected: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("invalid policy accepted, want an error containing %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestValidationCostEmptyJSONFields: jsonFields: [] (which the Go types
// cannot send: omitempty) is refused rather than read as "no fields".
func TestValidationCostEmptyJSONFields(t *testing.T) {
	spec := validSpec()
	spec.Cost = &v1alpha1.Cost{Response: &v1alpha1.ResponseCost{Header: "X-Usage", Default: ptr[int64](1)}}
	p := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "cost-empty-fields", Namespace: "default"}, Spec: spec}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedSlice(obj, []any{}, "spec", "cost", "response", "jsonFields"); err != nil {
		t.Fatal(err)
	}
	u := &unstructuredPolicy{u: unstructured.Unstructured{Object: obj}}
	err = k.Create(context.Background(), u.obj(), client.DryRunAll)
	if err == nil || !strings.Contains(err.Error(), "spec.cost.response.jsonFields") || !strings.Contains(err.Error(), "should have at least 1 items") {
		t.Errorf("jsonFields: []: %v, want an error that it needs at least 1 item", err)
	}
}

// TestCostHasNoSchemaDefaults: request.default is not filled in by the
// schema (the renderer applies 1): a schema default would put a default
// into request: {} of a policy for the rate limit service, which its rules
// refuse, and into a constant request, where default does not apply.
// (response.default is required where it applies.)
func TestCostHasNoSchemaDefaults(t *testing.T) {
	ctx := context.Background()
	p := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "cost-defaults", Namespace: "default"}, Spec: validSpec()}
	p.Spec.Cost = &v1alpha1.Cost{Request: &v1alpha1.RequestCost{Header: "X-Cost"}, Response: &v1alpha1.ResponseCost{Header: "X-Usage", Default: ptr[int64](7)}}
	if err := k.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Delete(context.Background(), p) })
	var got v1alpha1.RateLimitPolicy
	if err := k.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
		t.Fatal(err)
	}
	if c := got.Spec.Cost; c == nil || c.Request == nil || c.Response == nil || c.Request.Default != nil || c.Response.Default == nil || *c.Response.Default != 7 {
		t.Errorf("stored cost %+v: want request without a default, response's as given", c)
	}
}

// TestJSONFieldPatternInCRD: the CRD's JSON field rule and the renderer
// share v1alpha1.JSONFieldPattern (the marker cannot refer to the
// constant).
func TestJSONFieldPatternInCRD(t *testing.T) {
	root, err := testsupport.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	crd, err := os.ReadFile(filepath.Join(root, "config", "crd", "bases", "ratelimit.slidegate.dev_ratelimitpolicies.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(crd), "self.matches('"+v1alpha1.JSONFieldPattern+"')"); n != 1 {
		t.Errorf("the CRD uses JSONFieldPattern in %d rules, want 1", n)
	}
}
