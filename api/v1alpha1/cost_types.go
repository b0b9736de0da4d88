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

package v1alpha1

// Limits by cost (issue 27): spec.cost's types. The rules that depend on
// whether the policy is for the sidecars or for the rate limit service are
// on RateLimitPolicySpec.

// MaxCost bounds a cost: a constant, a default, and (enforced by whoever
// reads it) a cost read from a header or a response. It is Envoy's own
// bound on hits_addend, and it keeps the window's sum an exact number in
// Redis's Lua (a double) for up to 9 million admits at that cost.
const MaxCost = 1_000_000_000

// Cost says what a request costs against the limit: known when the request
// arrives (request), known only when the response ends (response), or both,
// in which case the two add up.
// +kubebuilder:validation:XValidation:rule="has(self.request) || has(self.response)",message="cost needs request (the cost known when the request arrives), response (the cost known when the response ends), or both"
type Cost struct {
	// request is the cost known when the request arrives. A request is
	// admitted only if its cost fits: when the cost already in its
	// client's window plus its own is at most limit; then its cost counts
	// at once. A request whose cost is more than limit is never admitted.
	//
	// With targetSelector, set constant or header. With rateLimitService,
	// write request: {}: the gateway computes the cost and sends it as the
	// descriptor's hits_addend (its request-level hits_addend, or the
	// descriptor's own), up to 1000000000; a hits_addend of 0 set on the
	// descriptor admits the request while the window's cost is under the
	// limit and counts nothing.
	// +optional
	Request *RequestCost `json:"request,omitempty"`

	// response is the cost known only when the response ends, such as the
	// tokens a model server reports in its response. The request is
	// admitted while the cost in its client's window is under the limit
	// (counting nothing then), and the response's cost is charged when the
	// response ends, even past the limit: the budget goes into debt, and
	// the client's later requests wait until enough cost has left the
	// window (Retry-After says how long). Concurrent requests of one client
	// may therefore all be admitted while the window is under the limit and
	// together overshoot it by their costs.
	//
	// With request too, both costs count: request's when the request is
	// admitted, response's when it ends (request is then a cost of its own,
	// not an estimate that response corrects).
	//
	// The cost is charged when the response ends, complete or not: a client
	// that disconnects mid-stream is charged what the response had reported
	// by then, or default when it had reported nothing. An upstream that
	// never reports a cost (for instance an OpenAI-style stream without
	// stream_options.include_usage) is charged default for every response.
	//
	// With targetSelector, set header, jsonFields or both. With
	// rateLimitService, write response: {}: the gateway's request (with
	// hits_addend 0 set on the descriptor) admits while the window's cost is
	// under the limit and counts nothing, and Envoy's apply_on_stream_done
	// call, made when the stream is done, charges the response cost, its
	// hits_addend, even past the limit (every hits_addend above 0 for this
	// policy is such a charge).
	// +optional
	Response *ResponseCost `json:"response,omitempty"`
}

// RequestCost is the cost of a request known when it arrives: a constant or
// the value of a request header (for the sidecars), or nothing at all for
// the rate limit service, where the gateway sends the cost.
// +kubebuilder:validation:XValidation:rule="!(has(self.constant) && has(self.header))",message="set constant or header, not both: the cost is a fixed number or read from a request header"
// +kubebuilder:validation:XValidation:rule="!has(self.default) || has(self.header)",message="default applies only with header: it is the cost of a request whose header is missing or not a whole number"
type RequestCost struct {
	// constant is the cost of every request, from 0 to 1000000000, e.g. 10
	// for an endpoint that costs ten times a plain call. 0 admits the
	// request while the window's cost is under the limit and counts
	// nothing.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000
	Constant *int64 `json:"constant,omitempty"`

	// header is the request header whose value is the request's cost, a
	// whole number in decimal digits (above 1000000000, it counts as
	// 1000000000), e.g. X-Estimated-Tokens. The client controls it, unless
	// a trusted proxy in front of the pods sets it (replacing the client's
	// own): a client that sends 0 is admitted while the window's cost is
	// under the limit and counts nothing, so use it only behind such a
	// proxy, or for costs the client has no reason to understate. A header
	// given more than once, or whose value is not a whole number in
	// decimal digits, counts as missing.
	// +optional
	Header HeaderName `json:"header,omitempty"`

	// default is the cost of a request whose header is missing, given more
	// than once or not a whole number, from 0 to 1000000000; defaults to 1.
	// Only with header.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000
	Default *int64 `json:"default,omitempty"`
}

// ResponseCost is where a response reports its cost (for the sidecars), or
// nothing at all for the rate limit service, where the gateway sends it.
// +kubebuilder:validation:XValidation:rule="!has(self.default) || has(self.header) || has(self.jsonFields)",message="default applies only with header or jsonFields: it is charged when the response reports no cost"
// +kubebuilder:validation:XValidation:rule="has(self.default) || !(has(self.header) || has(self.jsonFields))",message="default is required with header or jsonFields: it is what a response that reports no cost is charged (a stream without usage, a client that hangs up first, a WebSocket), which a client can choose; write the most a response costs, or 0 to let such responses pass free"
type ResponseCost struct {
	// header is the response header that carries the cost, a whole number
	// in decimal digits (above 1000000000, it counts as 1000000000), e.g.
	// X-Usage-Tokens. When the response headers lack it, the trailers (sent
	// after the body, as gRPC and streaming servers can) are read; of
	// several values, the first. With jsonFields too, the header is used
	// when the response has it, the fields otherwise.
	// +optional
	Header HeaderName `json:"header,omitempty"`

	// jsonFields are the fields of a JSON response body that carry the
	// cost, each a dot path of field names from the top-level object, e.g.
	// usage.total_tokens; the cost is the sum of their values (a value
	// above 1000000000 counts as 1000000000). Each field counts with its last value that is a whole
	// number in plain digits: in a JSON body, or in a Server-Sent Events
	// stream (Content-Type text/event-stream), whose events' data are each
	// read as JSON, the value in the last event where it is one (a later
	// null leaves it). A field that never has a whole number adds nothing;
	// when none of them has one, default is charged. A field may name two
	// alternative paths separated by '|', for one number that a server
	// reports in different places: whichever is seen last counts. A path
	// may appear in one field only (it would be counted twice). The
	// response passes through unbuffered, streams included; a body with a
	// Content-Encoding (gzip, br) is not read, so only header or default
	// can then give its cost.
	//
	// Common model servers:
	// OpenAI and OpenAI-compatible servers (vLLM, llama.cpp's server, ...):
	// ["usage.total_tokens"], in JSON responses and in streams whose
	// request asks for stream_options.include_usage (the last event
	// carries it).
	// Anthropic: ["usage.input_tokens", "usage.output_tokens"] in JSON
	// responses. Its streams put the input tokens in the message_start
	// event (message.usage.input_tokens, and in some message_delta events
	// again, counted up, at usage.input_tokens) and the output tokens,
	// counted up, in message_delta events (usage.output_tokens): for
	// streams alone ["message.usage.input_tokens", "usage.output_tokens"];
	// for both, counting each number once,
	// ["usage.input_tokens|message.usage.input_tokens", "usage.output_tokens"].
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	JSONFields []JSONFieldPath `json:"jsonFields,omitempty"`

	// default is charged when the response reports no cost: the upstream
	// never reports one, the response ended (the client disconnected, the
	// upstream failed) before it did, or it is a protocol switch
	// (WebSocket), whose usage cannot be read. From 0 to 1000000000.
	// Required with header or jsonFields, and never assumed: a client can
	// choose a response that reports nothing (an OpenAI-style stream
	// without stream_options.include_usage, a hang-up before the last
	// event), so this is what such a client pays. The most a response can
	// cost (e.g. the model's max_tokens) charges the worst case; 0 lets
	// such responses pass free.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000
	Default *int64 `json:"default,omitempty"`
}

// HeaderName is the name of an HTTP header (an RFC 9110 token), matched
// case-insensitively, e.g. X-Usage-Tokens.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=256
// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9!#$%&*+.^_|~-]+$')",message="a header name may contain only letters, digits and !#$%&*+-.^_|~, e.g. X-Usage-Tokens"
type HeaderName string

// JSONFieldPath is a dot path to a field of a JSON object: field names of
// letters, digits and '_' (not starting with a digit), separated by '.',
// at most 8 of them, e.g. usage.total_tokens; or two such paths separated
// by '|', alternatives for one number that a server reports in different
// places. Array elements cannot be named.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=256
// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*){0,7}([|][A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*){0,7})?$')",message="a JSON field must be a dot path of at most 8 field names, each of letters, digits and '_' not starting with a digit, e.g. usage.total_tokens, or two such paths separated by '|', e.g. usage.input_tokens|message.usage.input_tokens"
type JSONFieldPath string

// JSONFieldPattern is the form of JSONFieldPath (the marker cannot refer
// to the constant; TestJSONFieldPatternInCRD ties them together).
const JSONFieldPattern = `^[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*){0,7}([|][A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*){0,7})?$`
