package sidecarconfig

import (
	"strings"
	"testing"
)

func withCost(c Cost) func(*Policy) { return func(p *Policy) { p.Cost = &c } }

func i64(v int64) *int64 { return &v }

// TestValidateCost: spec.cost as the sidecars' document carries it (issue
// 27), checked by Parse behind the CRD: a hand-edited ConfigMap with a bad
// cost is refused, and the sidecar keeps its last good document.
func TestValidateCost(t *testing.T) {
	header := &RequestCost{Header: "X-Estimated-Tokens", Default: i64(1)}
	for _, tt := range []struct {
		name    string
		mod     func(*Policy)
		wantErr string
	}{
		{name: "absent", mod: func(*Policy) {}},
		{name: "request constant", mod: withCost(Cost{Request: &RequestCost{Constant: i64(10)}})},
		{name: "request constant 0", mod: withCost(Cost{Request: &RequestCost{Constant: i64(0)}})},
		{name: "request header", mod: withCost(Cost{Request: header})},
		{name: "response, everything", mod: withCost(Cost{Request: header, Response: &ResponseCost{
			Header: "X-Usage-Tokens", JSONFields: []string{"message.usage.input_tokens", "usage.output_tokens"}, Default: MaxCost}})},

		{name: "empty", mod: withCost(Cost{}), wantErr: "cost needs request, response or both"},
		{name: "request empty", mod: withCost(Cost{Request: &RequestCost{}}), wantErr: "cost.request needs constant or header"},
		{name: "request constant and header", mod: withCost(Cost{Request: &RequestCost{Constant: i64(1), Header: "X-Cost", Default: i64(1)}}),
			wantErr: "cost.request: set constant or header, not both"},
		{name: "request constant with default", mod: withCost(Cost{Request: &RequestCost{Constant: i64(1), Default: i64(1)}}),
			wantErr: "cost.request.default applies only with header"},
		{name: "request constant -1", mod: withCost(Cost{Request: &RequestCost{Constant: i64(-1)}}),
			wantErr: "cost.request.constant -1 is outside 0..1000000000"},
		{name: "request constant 1e9+1", mod: withCost(Cost{Request: &RequestCost{Constant: i64(MaxCost + 1)}}),
			wantErr: "cost.request.constant 1000000001 is outside 0..1000000000"},
		{name: "request header without default", mod: withCost(Cost{Request: &RequestCost{Header: "X-Cost"}}),
			wantErr: "cost.request.default is required with header"},
		{name: "request header bad", mod: withCost(Cost{Request: &RequestCost{Header: "X Cost", Default: i64(1)}}),
			wantErr: `cost.request.header "X Cost" is not a valid header name`},
		{name: "request default too large", mod: withCost(Cost{Request: &RequestCost{Header: "X-Cost", Default: i64(MaxCost + 1)}}),
			wantErr: "cost.request.default 1000000001 is outside 0..1000000000"},
		{name: "response empty", mod: withCost(Cost{Response: &ResponseCost{Default: 1}}),
			wantErr: "cost.response needs header, jsonFields or both"},
		{name: "response header bad", mod: withCost(Cost{Response: &ResponseCost{Header: "X-Usage:"}}),
			wantErr: `cost.response.header "X-Usage:" is not a valid header name`},
		{name: "response default -1", mod: withCost(Cost{Response: &ResponseCost{Header: "X-Usage", Default: -1}}),
			wantErr: "cost.response.default -1 is outside 0..1000000000"},
		{name: "response alternatives", mod: withCost(Cost{Response: &ResponseCost{JSONFields: []string{"message.usage.input_tokens|usage.input_tokens", "usage.output_tokens"}}})},
		{name: "response 9 fields", mod: withCost(Cost{Response: &ResponseCost{JSONFields: strings.Split("a b c d e f g h i", " ")}}),
			wantErr: "cost.response.jsonFields has 9 entries, at most 8"},
		{name: "response three alternatives", mod: withCost(Cost{Response: &ResponseCost{JSONFields: []string{"a|b|c"}}}),
			wantErr: `"a|b|c" is not a dot path`},
		{name: "response empty alternative", mod: withCost(Cost{Response: &ResponseCost{JSONFields: []string{"a|"}}}),
			wantErr: `"a|" is not a dot path`},
		{name: "response path in two entries", mod: withCost(Cost{Response: &ResponseCost{JSONFields: []string{"a|usage.x", "usage.x"}}}),
			wantErr: `the path "usage.x" is named twice`},
		{name: "response path twice in one entry", mod: withCost(Cost{Response: &ResponseCost{JSONFields: []string{"usage.x|usage.x"}}}),
			wantErr: `the path "usage.x" is named twice`},
		{name: "response field with an index", mod: withCost(Cost{Response: &ResponseCost{JSONFields: []string{"choices[0].usage"}}}),
			wantErr: `cost.response.jsonFields: "choices[0].usage" is not a dot path`},
		{name: "response field of 9 names", mod: withCost(Cost{Response: &ResponseCost{JSONFields: []string{"a.b.c.d.e.f.g.h.i"}}}),
			wantErr: `"a.b.c.d.e.f.g.h.i" is not a dot path`},
		{name: "response field too long", mod: withCost(Cost{Response: &ResponseCost{JSONFields: []string{strings.Repeat("a", MaxJSONFieldBytes+1)}}}),
			wantErr: "is not a dot path"},
		{name: "response field twice", mod: withCost(Cost{Response: &ResponseCost{JSONFields: []string{"usage.total_tokens", "usage.total_tokens"}}}),
			wantErr: "cost.response.jsonFields are not sorted, or list an entry twice"},
		{name: "response fields unsorted", mod: withCost(Cost{Response: &ResponseCost{JSONFields: []string{"usage.output_tokens", "message.usage.input_tokens"}}}),
			wantErr: "cost.response.jsonFields are not sorted"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := policy(tt.mod)
			err := c.Validate()
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("Validate() = %v, want %q", err, tt.wantErr)
			}
			// Parse refuses what Validate refuses.
			data, merr := MarshalCanonical(c)
			if merr != nil {
				t.Fatal(merr)
			}
			if _, perr := Parse(data); (perr != nil) != (tt.wantErr != "") {
				t.Errorf("Parse() = %v, want an error: %v", perr, tt.wantErr != "")
			}
		})
	}
}
