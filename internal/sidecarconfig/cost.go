package sidecarconfig

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Limits by cost (issue 27): a policy's spec.cost in plain data, shared by
// the sidecars' document and the rate limit service's (rlsconfig.Policy
// holds the same Cost; what it may carry there is rlsconfig's rule).
//
// Every field is literal: the renderer writes the API's defaults out, so a
// reader applies none of its own (an absent ResponseCost.Default is 0).

// Bounds of a cost, as the CRD's.
const (
	// MaxCost bounds a constant, a default, and a cost read from a header
	// or a response: Envoy's own bound on hits_addend, which keeps a
	// window's sum exact in Redis's Lua (a double).
	MaxCost = 1_000_000_000
	// MaxJSONFields bounds ResponseCost.JSONFields.
	MaxJSONFields = 8
	// MaxJSONFieldBytes bounds one of them.
	MaxJSONFieldBytes = 256
)

// JSONFieldPattern is the form of a ResponseCost.JSONFields entry: a dot
// path of at most 8 field names of letters, digits and '_', not starting
// with a digit, or two such paths separated by '|' (alternatives: the one
// seen last counts), as internal/respcost reads them
// (v1alpha1.JSONFieldPattern; a render test ties the two).
const JSONFieldPattern = `^[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*){0,7}([|][A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*){0,7})?$`

var jsonField = regexp.MustCompile(JSONFieldPattern)

// Cost is what a request of a policy costs against its limit. A policy
// without one (nil) counts every request as 1: a count policy, as before
// cost existed. A policy with one is weighted: its limit is the cost
// allowed in any window.
//
// A sidecar of minor version 1 or older does not know this field and so
// leaves a policy that has it out (version.go) instead of counting its
// requests against a limit meant for their cost.
type Cost struct {
	// Request is the cost known when the request arrives: admitted only if
	// it fits (window's cost + cost ≤ limit), and then counted at once.
	Request *RequestCost `json:"request,omitempty" minor:"2"`
	// Response is the cost known when the response ends: the request is
	// admitted while the window's cost is under the limit (counting
	// nothing), and the cost is charged when the response ends, even past
	// the limit. With Request too, both count.
	Response *ResponseCost `json:"response,omitempty" minor:"2"`
}

// RequestCost is a request's cost known when it arrives. In the sidecars'
// document: exactly one of Constant and Header, and Default exactly with
// Header. In the rate limit service's: empty (the gateway sends the cost
// as hits_addend).
type RequestCost struct {
	// Constant is every request's cost, 0 to MaxCost.
	Constant *int64 `json:"constant,omitempty" minor:"2"`
	// Header is the request header whose value, a whole number in
	// decimal digits (above MaxCost: MaxCost), is the cost. The client
	// controls it unless a trusted proxy sets it.
	Header string `json:"header,omitempty" minor:"2"`
	// Default is the cost when Header is missing, given more than once,
	// or not a whole number: 0 to MaxCost, always written with Header (the
	// API's default is 1).
	Default *int64 `json:"default,omitempty" minor:"2"`
}

// ResponseCost is where a response reports its cost. In the sidecars'
// document: Header, JSONFields or both. In the rate limit service's:
// empty (Envoy's apply_on_stream_done call charges the cost it sends as
// hits_addend).
type ResponseCost struct {
	// Header is the response header, else trailer, whose value (as
	// RequestCost.Header's) is the cost. With JSONFields too, it is used
	// when the response has it, the fields otherwise.
	Header string `json:"header,omitempty" minor:"2"`
	// JSONFields are dot paths (JSONFieldPattern) into a JSON body, or
	// into the JSON data of each event of a Server-Sent Events stream;
	// the cost is the sum, at most MaxCost, of each entry's last whole
	// number (of either alternative, "a|b", the one seen last): what
	// respcost.Spec.JSONFields reads. Sorted; no path in two entries.
	JSONFields []string `json:"jsonFields,omitempty" minor:"2"`
	// Default is charged when the response reports no cost (the upstream
	// never does, or the response ended before it did): 0 to MaxCost;
	// absent, 0.
	Default int64 `json:"default,omitempty" minor:"2"`
}

// validate checks a sidecar policy's cost: each part says where its cost
// comes from.
func (c *Cost) validate() []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Request == nil && c.Response == nil {
		add("cost needs request, response or both")
	}
	if r := c.Request; r != nil {
		switch {
		case r.Constant != nil && r.Header != "":
			add("cost.request: set constant or header, not both")
		case r.Constant == nil && r.Header == "":
			add("cost.request needs constant or header")
		case r.Constant != nil:
			if err := checkCost("cost.request.constant", *r.Constant); err != nil {
				errs = append(errs, err)
			}
			if r.Default != nil {
				add("cost.request.default applies only with header")
			}
		default:
			if !headerName.MatchString(r.Header) {
				add("cost.request.header %q is not a valid header name", r.Header)
			}
			if r.Default == nil {
				add("cost.request.default is required with header")
			} else if err := checkCost("cost.request.default", *r.Default); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if r := c.Response; r != nil {
		if r.Header == "" && len(r.JSONFields) == 0 {
			add("cost.response needs header, jsonFields or both")
		}
		if r.Header != "" && !headerName.MatchString(r.Header) {
			add("cost.response.header %q is not a valid header name", r.Header)
		}
		if err := checkJSONFields(r.JSONFields); err != nil {
			errs = append(errs, err)
		}
		if err := checkCost("cost.response.default", r.Default); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func checkCost(field string, v int64) error {
	if v < 0 || v > MaxCost {
		return fmt.Errorf("%s %d is outside 0..%d", field, v, MaxCost)
	}
	return nil
}

// checkJSONFields: at most MaxJSONFields entries of the pattern, sorted,
// and no path in two of them (its value would count twice).
func checkJSONFields(fields []string) error {
	var errs []error
	if len(fields) > MaxJSONFields {
		errs = append(errs, fmt.Errorf("cost.response.jsonFields has %d entries, at most %d", len(fields), MaxJSONFields))
	}
	seen := map[string]bool{}
	for i, f := range fields {
		if len(f) > MaxJSONFieldBytes || !jsonField.MatchString(f) {
			errs = append(errs, fmt.Errorf("cost.response.jsonFields: %q is not a dot path of at most 8 field names (letters, digits and '_', not starting with a digit), or two separated by '|'", f))
			continue
		}
		if i > 0 && fields[i-1] >= f {
			errs = append(errs, errors.New("cost.response.jsonFields are not sorted, or list an entry twice"))
		}
		for _, path := range strings.Split(f, "|") {
			if seen[path] {
				errs = append(errs, fmt.Errorf("cost.response.jsonFields: the path %q is named twice: its value would count twice", path))
			}
			seen[path] = true
		}
	}
	return errors.Join(errs...)
}
