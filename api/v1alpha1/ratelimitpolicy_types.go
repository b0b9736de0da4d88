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

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KeySource says where the client key of a request comes from.
// +kubebuilder:validation:Enum=RemoteAddress;Header;QueryParameter;JWTClaim;Global
type KeySource string

const (
	// KeySourceRemoteAddress identifies clients by IP address (IPv6 clients
	// by network, see ClientAddress). The forwarding header of
	// ClientAddress is believed only when the connection comes from one of
	// the trusted proxy ranges configured on the operator
	// (--trusted-proxies); otherwise the peer address is used.
	KeySourceRemoteAddress KeySource = "RemoteAddress"
	// KeySourceHeader identifies clients by the value of a request header.
	KeySourceHeader KeySource = "Header"
	// KeySourceQueryParameter identifies clients by a URL query parameter.
	KeySourceQueryParameter KeySource = "QueryParameter"
	// KeySourceJWTClaim identifies clients by a claim of the bearer token.
	KeySourceJWTClaim KeySource = "JWTClaim"
	// KeySourceGlobal puts every request in one shared bucket.
	KeySourceGlobal KeySource = "Global"
)

// MissingKeyAction says what happens to a request that lacks its client key.
// +kubebuilder:validation:Enum=Deny;Allow;RemoteAddress
type MissingKeyAction string

const (
	// MissingKeyDeny rejects the request (429 in Enforce mode).
	MissingKeyDeny MissingKeyAction = "Deny"
	// MissingKeyAllow lets the request through; the policy does not count it.
	MissingKeyAllow MissingKeyAction = "Allow"
	// MissingKeyRemoteAddress counts the request against its client IP
	// address instead, as if the key source were RemoteAddress.
	MissingKeyRemoteAddress MissingKeyAction = "RemoteAddress"
)

// ForwardedHeader names the header that trusted proxies write the client's
// address in.
// +kubebuilder:validation:Enum=X-Forwarded-For;Forwarded
type ForwardedHeader string

const (
	// ForwardedHeaderXForwardedFor is X-Forwarded-For, which most ingress
	// controllers, cloud load balancers and Envoy write.
	ForwardedHeaderXForwardedFor ForwardedHeader = "X-Forwarded-For"
	// ForwardedHeaderForwarded is Forwarded (RFC 7239), its for= parameter.
	ForwardedHeaderForwarded ForwardedHeader = "Forwarded"
)

// ClientAddress says how a request's client address becomes its client key.
type ClientAddress struct {
	// forwardedHeader is the header the trusted proxies (the operator's
	// --trusted-proxies) write the client's address in: X-Forwarded-For
	// (the default) or Forwarded (RFC 7239). Only that header is read, and
	// only when the connection comes from a trusted proxy; the other one
	// is whatever the client sent and is ignored. Without it the trusted
	// proxy itself is the client. It is a setting of the policy, not of
	// the operator, because it depends on the gateway in front of the
	// policy's pods, which can differ between namespaces; a wrong choice
	// weakens only this policy.
	// +optional
	// +kubebuilder:default=X-Forwarded-For
	ForwardedHeader ForwardedHeader `json:"forwardedHeader,omitempty"`

	// ipv6PrefixLength is the length of the network an IPv6 client is
	// counted by, from 32 to 128; defaults to 64. A host is usually given a
	// whole /64 (and a site a /48 or /56), so counting single addresses
	// would give it 2^64 budgets; 128 counts each address on its own. An
	// address of the NAT64 prefix 64:ff9b::/96 counts as the IPv4 address
	// it carries. IPv4 clients are counted by address.
	// +optional
	// +kubebuilder:default=64
	// +kubebuilder:validation:Minimum=32
	// +kubebuilder:validation:Maximum=128
	IPv6PrefixLength int32 `json:"ipv6PrefixLength,omitempty"`
}

// PathCase says whether path prefixes match regardless of letter case.
// +kubebuilder:validation:Enum=Sensitive;Insensitive
type PathCase string

const (
	// PathCaseSensitive matches path prefixes as written.
	PathCaseSensitive PathCase = "Sensitive"
	// PathCaseInsensitive matches path prefixes in any letter case.
	PathCaseInsensitive PathCase = "Insensitive"
)

// FailMode says what a policy does when Redis cannot answer in time.
// +kubebuilder:validation:Enum=Open;Closed
type FailMode string

const (
	// FailOpen keeps serving: each sidecar decides locally, enforcing its
	// share of the limit, until Redis answers again.
	FailOpen FailMode = "Open"
	// FailClosed rejects requests while Redis cannot answer.
	FailClosed FailMode = "Closed"
)

// Algorithm selects how requests are counted.
// +kubebuilder:validation:Enum=SlidingLog;SlidingWindowCounter
type Algorithm string

const (
	// AlgorithmSlidingLog keeps one entry per admitted request: exact, with
	// memory proportional to the limit.
	AlgorithmSlidingLog Algorithm = "SlidingLog"
	// AlgorithmSlidingWindowCounter weights two fixed-window counters: constant
	// memory per client, approximate near window boundaries.
	AlgorithmSlidingWindowCounter Algorithm = "SlidingWindowCounter"
)

// Mode says whether a policy rejects requests.
// +kubebuilder:validation:Enum=Enforce;DryRun
type Mode string

const (
	// ModeEnforce rejects requests over the limit with 429 Too Many Requests.
	ModeEnforce Mode = "Enforce"
	// ModeDryRun counts requests and reports would-be rejections (metrics and
	// logs) but rejects nothing.
	ModeDryRun Mode = "DryRun"
)

// HTTPMethod is an HTTP request method.
// +kubebuilder:validation:Enum=GET;HEAD;POST;PUT;PATCH;DELETE;OPTIONS;CONNECT;TRACE
type HTTPMethod string

// PathPrefix is the beginning of a request path, e.g. "/api/".
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=1024
// +kubebuilder:validation:XValidation:rule="self.startsWith('/')",message="a path prefix must start with '/'"
// +kubebuilder:validation:XValidation:rule="!self.contains('?') && !self.contains('#')",message="a path prefix must not contain '?' or '#' (it matches the path only, not the query or fragment)"
type PathPrefix string

// ClientKey says how a request's client is identified: every client has its
// own sliding window.
// +kubebuilder:validation:XValidation:rule="!(self.source in ['Header', 'QueryParameter', 'JWTClaim']) || has(self.name)",message="name is required when source is Header, QueryParameter or JWTClaim"
// +kubebuilder:validation:XValidation:rule="!(self.source in ['RemoteAddress', 'Global']) || !has(self.name)",message="name must not be set when source is RemoteAddress or Global"
// +kubebuilder:validation:XValidation:rule="self.source != 'Header' || !has(self.name) || self.name.matches('^[A-Za-z0-9!#$%&*+.^_|~-]+$')",message="a header name may contain only letters, digits and !#$%&*+-.^_|~, e.g. X-User-ID"
// +kubebuilder:validation:XValidation:rule="!(self.source in ['RemoteAddress', 'Global']) || !has(self.onMissing)",message="onMissing applies only when source is Header, QueryParameter or JWTClaim"
// +kubebuilder:validation:XValidation:rule="!has(self.remoteAddress) || self.source == 'RemoteAddress' || (self.source in ['Header', 'QueryParameter', 'JWTClaim'] && (!has(self.onMissing) || self.onMissing == 'RemoteAddress'))",message="remoteAddress applies only when the client address is used: source RemoteAddress, or onMissing RemoteAddress (the default for Header, QueryParameter and JWTClaim)"
// +kubebuilder:validation:XValidation:rule="!has(self.jwt) || self.source == 'JWTClaim'",message="jwt applies only when source is JWTClaim"
// +kubebuilder:validation:XValidation:rule="self.source != 'JWTClaim' || has(self.jwt)",message="source JWTClaim needs jwt: the issuer, audiences and jwks to verify tokens with, or insecureSkipVerification: VerifiedUpstream when a gateway in front of the pods verifies every token (an unverified token lets a client choose its own claim, and so its own budget)"
type ClientKey struct {
	// source is where the client key comes from:
	// RemoteAddress (the client IP, IPv6 clients by network; see
	// remoteAddress for the forwarding header believed from the trusted
	// proxy ranges configured on the operator),
	// Header (the value of the request header called name),
	// QueryParameter (the value of the URL query parameter called name),
	// JWTClaim (the claim called name in the payload of the
	// "Authorization: Bearer" token, once the sidecar has verified the
	// token as jwt says; a token that does not verify counts as missing),
	// or Global (one bucket shared by every request).
	// +required
	Source KeySource `json:"source"`

	// name is the header, query parameter or claim name, for the sources
	// Header, QueryParameter and JWTClaim (required there, not allowed for
	// the others). Header names are matched case-insensitively; claim names
	// are top-level claims of the token payload, e.g. "sub".
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name,omitempty"`

	// onMissing is what happens to a request that has no such header, query
	// parameter or claim: Deny rejects it, Allow lets it through uncounted,
	// RemoteAddress counts it against its client IP address instead.
	// Defaults to RemoteAddress. Only for the sources Header, QueryParameter
	// and JWTClaim.
	//
	// A request that gives more than one value is refused with 400 Bad
	// Request, whatever onMissing says, so that the client cannot choose
	// its bucket: a header in several lines, or in one line with a comma
	// (any hop may join repeated lines with commas), or also under a name
	// with '_' for '-' (which CGI-style servers read as the same header);
	// a query parameter given twice (PHP and Rails read the last value,
	// Flask the first; '&' and ';' both separate), or in another letter
	// case, or with '.' or ' ' for '_'; several Authorization lines or
	// bearer tokens. A gateway that adds the identity header must replace
	// a client's own (Envoy: append_action OVERWRITE_IF_EXISTS_OR_ADD, not
	// the default append), or every request that brings one is refused.
	// +optional
	OnMissing MissingKeyAction `json:"onMissing,omitempty"`

	// remoteAddress says how the client address is read and counted: for
	// the source RemoteAddress, and for requests that onMissing
	// RemoteAddress counts by address. Unset, the defaults of its fields
	// apply.
	// +optional
	RemoteAddress *ClientAddress `json:"remoteAddress,omitempty"`

	// jwt, for the source JWTClaim (required there), says which bearer
	// tokens count: either issuer, audiences and jwks (all three), or
	// insecureSkipVerification alone.
	//
	// A token counts only when its signature verifies with one of the jwks
	// keys (RS256/384/512 and PS256/384/512 for RSA keys of 2048 bits or
	// more, ES256/384/512 for EC keys, EdDSA for Ed25519 keys; a key's
	// "alg", when it has one, is the only algorithm it verifies; "none" and
	// HMAC algorithms never), its iss is issuer, its aud names one of
	// audiences, it has an exp that has not passed, and its nbf and iat
	// have come, allowing 30 seconds of clock skew. A token that does not
	// verify, for whatever reason, counts as missing: onMissing decides
	// (its default, RemoteAddress, counts the request against its client
	// address). The sidecar makes no network call: the manager renders the
	// keys into the namespace's sidecar configuration, and a change of keys
	// reaches running sidecars within the kubelet's ConfigMap sync (about a
	// minute), without a restart; while the keys are unavailable, no token
	// verifies, and Ready is False with reason JWTKeysUnavailable.
	//
	// Key rotation: publish the new key beside the old one first, and sign
	// with it only once the sidecars have it (the policy's status.revision
	// changes; allow the kubelet's sync); remove the old key once the last
	// token it signed has expired. Tokens signed by a key a sidecar does not
	// have yet show as unknown_key in slidegate_sidecar_jwt_tokens_total.
	// +optional
	JWT *JWTVerification `json:"jwt,omitempty"`
}

// RequestMatch restricts a policy to some requests. A request matches when
// its method is one of methods (or methods is empty) and its path starts with
// one of pathPrefixes (or pathPrefixes is empty).
// +kubebuilder:validation:XValidation:rule="!has(self.pathCase) || self.pathCase != 'Insensitive' || (has(self.pathPrefixes) && size(self.pathPrefixes) > 0)",message="pathCase Insensitive applies to pathPrefixes: list at least one"
type RequestMatch struct {
	// methods are the HTTP methods the policy applies to, e.g. ["POST"].
	// Empty means every method. A request's method matches in any letter
	// case, HEAD matches where GET is listed (servers run the GET handler
	// for it), and method overrides count: a request matches too when a
	// method it names in an X-HTTP-Method-Override, X-HTTP-Method or
	// X-Method-Override header or a _method query parameter is listed, as
	// Rails, Laravel, Spring, ASP.NET Core and Express's method-override
	// serve it as that method. A _method field in a form body is not read
	// (the sidecar does not read bodies): where the application honours
	// one, list POST too.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=9
	Methods []HTTPMethod `json:"methods,omitempty"`

	// pathPrefixes are the beginnings of the request paths the policy
	// applies to, e.g. ["/api/"]: a plain prefix of the request path
	// (without the query string), so "/api" also matches "/apis". Empty
	// means every path. A request matches when its path as received
	// (decoded, or raw) or its normalised form begins with a prefix, so
	// that no spelling an application server routes under the prefix slips
	// past it. Normalised: percent-decoded ("%61" is "a", "%2F" is "/"),
	// "\" read as "/", repeated slashes merged and dot segments resolved
	// ("//api", "/x/../api" and "/api/x/.." are under "/api/"); and that
	// once more after removing segment parameters before decoding, as
	// Servlet containers (Tomcat, Jetty, Spring) route ("/api;jsessionid=1/users"
	// and "/.;/api/users" are "/api/users"). Decoded once, as those servers
	// do: "/%2561pi" is "/%61pi", not under "/api/", so an application that
	// decodes a path twice routes requests the policy does not see. Letter
	// case counts unless pathCase is Insensitive.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	PathPrefixes []PathPrefix `json:"pathPrefixes,omitempty"`

	// pathCase is Sensitive (the default: "/api/" does not match
	// "/API/users") or Insensitive (it does, in any letter case, as
	// case-insensitive routers such as ASP.NET Core's serve it). Set
	// Insensitive when the application routes paths regardless of case.
	// +optional
	// +kubebuilder:default=Sensitive
	PathCase PathCase `json:"pathCase,omitempty"`
}

// WindowPattern is the form of a Duration (RateLimitPolicySpec.Window):
// whole numbers of hours, minutes, seconds and milliseconds, largest unit
// first. Every string it accepts parses with time.ParseDuration to a whole
// number of milliseconds, and none overflows.
const WindowPattern = `^([0-9]{1,2}h)?([0-9]{1,4}m)?([0-9]{1,5}s)?([0-9]{1,8}ms)?$`

// Duration is a length of time as a policy states it: whole numbers of
// hours, minutes, seconds and milliseconds, largest unit first, without
// spaces or a sign (WindowPattern), at most 32 characters.
//
// Valid: "500ms", "10s", "1m30s", "1h", "1h0m5s250ms". Invalid: "1.5s" (a
// fraction), "90" (no unit), "1d" (days), "30s1m" (a smaller unit first),
// "-1s" (a sign), "1 m" (a space). Where a Duration is used, the field
// states its own bounds (a window: 1ms to 24h).
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=32
// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,2}h)?([0-9]{1,4}m)?([0-9]{1,5}s)?([0-9]{1,8}ms)?$')",message="window must be a duration like '500ms', '10s', '1m30s' or '1h': whole numbers with the units h, m, s and ms, largest unit first"
type Duration string

// LabelSelector selects pods by their labels, as a Kubernetes label
// selector (same fields, same meaning), with bounds and formats the API
// server checks: at most 32 matchLabels and 16 matchExpressions of at most
// 64 values each, keys and values as Kubernetes labels allow them. Every
// policy of a namespace is rendered into one ConfigMap, which holds at most
// 1 MiB, so select pods by a label they share rather than by listing them.
// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, !(e.operator in ['In', 'NotIn']) || (has(e.values) && size(e.values) > 0))",message="matchExpressions with the operator In or NotIn need values"
// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, !(e.operator in ['Exists', 'DoesNotExist']) || !has(e.values) || size(e.values) == 0)",message="matchExpressions with the operator Exists or DoesNotExist take no values"
type LabelSelector struct {
	// matchLabels selects pods whose label key has exactly this value.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.size() <= 317 && !format.qualifiedName().validate(k.contains('/') ? k.substring(k.indexOf('/') + 1) : k).hasValue() && (!k.contains('/') || (k.indexOf('/') <= 253 && !format.dns1123Subdomain().validate(k.substring(0, k.indexOf('/'))).hasValue())))",message="a matchLabels key must be a label key: a name of at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit, optionally prefixed by a DNS subdomain and '/'"
	MatchLabels map[string]LabelValue `json:"matchLabels,omitempty"`
	// matchExpressions are label requirements; all of them must hold.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	MatchExpressions []LabelSelectorRequirement `json:"matchExpressions,omitempty"`
}

// LabelValue is the value of a Kubernetes label. Its bound lets the API
// server afford checking its format.
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:XValidation:rule="!format.labelValue().validate(self).hasValue()",message="a label value has at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit (or is empty)"
type LabelValue string

// LabelSelectorRequirement is a key, an operator and values, as in a
// Kubernetes label selector.
type LabelSelectorRequirement struct {
	// key is the label key.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:XValidation:rule="!format.qualifiedName().validate(self.contains('/') ? self.substring(self.indexOf('/') + 1) : self).hasValue() && (!self.contains('/') || (self.indexOf('/') <= 253 && !format.dns1123Subdomain().validate(self.substring(0, self.indexOf('/'))).hasValue()))",message="key must be a label key: a name of at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit, optionally prefixed by a DNS subdomain and '/'"
	Key string `json:"key"`
	// operator is In, NotIn, Exists or DoesNotExist.
	// +required
	// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist
	Operator metav1.LabelSelectorOperator `json:"operator"`
	// values for In and NotIn (at least one); none for Exists and
	// DoesNotExist.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.all(v, !format.labelValue().validate(v).hasValue())",message="values must be label values: at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit (or empty)"
	// +listType=atomic
	Values []string `json:"values,omitempty"`
}

// AsMeta is the selector as Kubernetes' own type, for labels.Selector. A
// nil selector (a policy for the rate limit service) is nil, which
// metav1.LabelSelectorAsSelector turns into a selector that matches nothing.
func (s *LabelSelector) AsMeta() *metav1.LabelSelector {
	if s == nil {
		return nil
	}
	out := &metav1.LabelSelector{}
	if s.MatchLabels != nil {
		out.MatchLabels = make(map[string]string, len(s.MatchLabels))
		for k, v := range s.MatchLabels {
			out.MatchLabels[k] = string(v)
		}
	}
	for _, e := range s.MatchExpressions {
		out.MatchExpressions = append(out.MatchExpressions, metav1.LabelSelectorRequirement{Key: e.Key, Operator: e.Operator, Values: e.Values})
	}
	return out
}

// DescriptorEntry is one entry of an Envoy rate limit descriptor: a key
// and, optionally, the value it must have.
type DescriptorEntry struct {
	// key is the entry's key as the gateway's rate limit actions produce it,
	// e.g. "remote_address", "generic_key", or the descriptor_key of a
	// request_headers action.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Key string `json:"key"`
	// value is the value the entry must have. Unset, any value matches, and
	// the value identifies the client: each value has its own window.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Value string `json:"value,omitempty"`
}

// RateLimitServiceTarget says which requests of Envoy gateways a policy
// limits, through slidegate's rate limit service (Envoy's RLS v3 API,
// config/components/rls): the gateway's rate limit filter sends, per
// request, a domain and descriptors built by its rate limit actions.
// docs/rls.md maps Envoy's actions to descriptor entries and shows how
// Istio, Contour and Envoy Gateway are pointed at the service.
type RateLimitServiceTarget struct {
	// domain is the domain the gateway's rate limit filter sends, e.g.
	// "edge". ratelimit.slidegate.dev is reserved for policies with
	// targetRefs.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self != 'ratelimit.slidegate.dev'",message="the domain ratelimit.slidegate.dev is reserved for policies with targetRefs"
	Domain string `json:"domain"`
	// descriptor is what a request's descriptor must be for the policy to
	// count the request: the same keys in the same order, with the given
	// value wherever an entry has one. The values of the entries without a
	// value identify the client (e.g. [{key: remote_address}]: one window per
	// client address); when every entry has a value, all matching requests
	// share one window.
	// +required
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	Descriptor []DescriptorEntry `json:"descriptor"`
}

// RateLimitPolicySpec is the desired behaviour of a rate limit.
// +kubebuilder:validation:XValidation:rule="[has(self.targetSelector), has(self.rateLimitService), has(self.targetRefs)].filter(b, b).size() == 1",message="set exactly one of targetSelector (pods that carry the sidecar), rateLimitService (requests of Envoy gateways, by descriptor) and targetRefs (Gateway API routes and gateways)"
// +kubebuilder:validation:XValidation:rule="has(self.rateLimitService) || has(self.key)",message="key is required with targetSelector and targetRefs"
// +kubebuilder:validation:XValidation:rule="!has(self.targetRefs) || !has(self.key) || self.key.source in ['RemoteAddress', 'Header', 'QueryParameter', 'Global']",message="with targetRefs the key source is RemoteAddress, Header, QueryParameter or Global: the gateway builds the key, and it verifies no JWT for slidegate"
// +kubebuilder:validation:XValidation:rule="!has(self.targetRefs) || !has(self.key) || !(self.key.source in ['Header', 'QueryParameter']) || (has(self.key.onMissing) && self.key.onMissing == 'Allow')",message="with targetRefs write key.onMissing: Allow: the gateway asks nothing about a request without the header or query parameter, so it passes uncounted"
// +kubebuilder:validation:XValidation:rule="!has(self.targetRefs) || !has(self.key) || !has(self.key.remoteAddress)",message="key.remoteAddress does not apply with targetRefs: the gateway reads the client address, trusting its own configured hops"
// +kubebuilder:validation:XValidation:rule="!has(self.targetRefs) || !has(self.match)",message="match does not apply with targetRefs: the route's own matches choose the requests; target one rule of an HTTPRoute (sectionName) to limit some of them"
// +kubebuilder:validation:XValidation:rule="!has(self.targetRefs) || !has(self.cost)",message="cost is not supported with targetRefs yet: use rateLimitService with the gateway's hits_addend"
// +kubebuilder:validation:XValidation:rule="!has(self.rateLimitService) || (!has(self.key) && !has(self.match))",message="key and match do not apply with rateLimitService: the descriptor entries without a value identify the client, and the gateway's rate limit actions choose the requests"
// +kubebuilder:validation:XValidation:rule="!has(self.networkPolicy) || has(self.targetSelector)",message="networkPolicy applies only with targetSelector: it admits traffic to the selected pods"
// +kubebuilder:validation:XValidation:rule="!has(self.targetSelector) || !has(self.cost) || !has(self.cost.request) || has(self.cost.request.constant) || has(self.cost.request.header)",message="cost.request needs constant (the same cost for every request) or header (a request header that carries the cost)"
// +kubebuilder:validation:XValidation:rule="!has(self.targetSelector) || !has(self.cost) || !has(self.cost.response) || has(self.cost.response.header) || has(self.cost.response.jsonFields)",message="cost.response needs header (a response header or trailer that carries the cost), jsonFields (fields of a JSON response that carry it, e.g. usage.total_tokens) or both"
// +kubebuilder:validation:XValidation:rule="!has(self.rateLimitService) || !has(self.cost) || !has(self.cost.request) || !(has(self.cost.request.constant) || has(self.cost.request.header) || has(self.cost.request.default))",message="with rateLimitService the gateway computes the cost and sends it as hits_addend: write cost.request: {} (no constant, header or default)"
// +kubebuilder:validation:XValidation:rule="!has(self.rateLimitService) || !has(self.cost) || !has(self.cost.response) || !(has(self.cost.response.header) || has(self.cost.response.jsonFields) || has(self.cost.response.default))",message="with rateLimitService the gateway computes the cost and sends it as hits_addend: write cost.response: {} (no header, jsonFields or default); Envoy's apply_on_stream_done call charges the response cost"
// +kubebuilder:validation:XValidation:rule="!has(self.rateLimitService) || !has(self.cost) || !(has(self.cost.request) && has(self.cost.response))",message="with rateLimitService set cost.request or cost.response, not both: Envoy's apply_on_stream_done call looks like any other request, so every hits_addend above 0 of a policy with cost.response is charged as a response cost; give the request cost a policy of its own with another descriptor (e.g. a generic_key entry)"
// +kubebuilder:validation:XValidation:rule="!has(self.additionalLimits) || !has(self.cost)",message="additionalLimits cannot be used with cost: a policy limits either the number of requests in several windows or their cost in one"
// +kubebuilder:validation:XValidation:rule="!has(self.additionalLimits) || !self.window.matches('^([0-9]{1,2}h)?([0-9]{1,4}m)?([0-9]{1,5}s)?([0-9]{1,8}ms)?$') || self.additionalLimits.all(l, !l.window.matches('^([0-9]{1,2}h)?([0-9]{1,4}m)?([0-9]{1,5}s)?([0-9]{1,8}ms)?$') || duration(l.window) != duration(self.window))",message="each window of additionalLimits must differ from window"
// +kubebuilder:validation:XValidation:rule="!has(self.quotas) || !has(self.cost)",message="quotas cannot be used with cost: a quota counts requests"
type RateLimitPolicySpec struct {
	// targetSelector selects the pods of this namespace that enforce the
	// policy, by their labels. The pods must carry the slidegate sidecar:
	// their namespace is labelled ratelimit.slidegate.dev/injection=enabled.
	// An empty selector selects every pod of the namespace. Exactly one of
	// targetSelector, rateLimitService and targetRefs is set.
	// +optional
	TargetSelector *LabelSelector `json:"targetSelector,omitempty"`

	// rateLimitService makes the policy limit the requests that Envoy
	// gateways ask slidegate's rate limit service about, instead of the
	// traffic of pods. Exactly one of targetSelector, rateLimitService and
	// targetRefs is set; key and match do not apply. docs/rls.md maps Envoy's rate limit
	// actions to descriptor entries and shows how Istio, Contour and Envoy
	// Gateway are pointed at the service.
	// +optional
	RateLimitService *RateLimitServiceTarget `json:"rateLimitService,omitempty"`

	// targetRefs attaches the policy to Gateway API objects of its
	// namespace (GEP-713 policy attachment): HTTPRoutes, or rules of them
	// (sectionName), and Gateways, or listeners of them. Their gateways
	// ask slidegate's rate limit service about each request they route
	// through a target, and the policy limits those requests by key
	// (RemoteAddress, Header, QueryParameter or Global); match does not
	// apply (target a rule, by sectionName, instead). The controller
	// writes status.ancestors, one entry per
	// Gateway. Exactly one of targetSelector, rateLimitService and
	// targetRefs is set. docs/rls.md shows what the gateway needs.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(a, self.exists_one(b, a.kind == b.kind && a.name == b.name && (has(a.sectionName) ? a.sectionName : '') == (has(b.sectionName) ? b.sectionName : '')))",message="each target may be listed once"
	TargetRefs []PolicyTargetReference `json:"targetRefs,omitempty"`

	// targetPort is the name of the application's container port whose
	// traffic the sidecar takes over, e.g. "http". Defaults to "http".
	// +optional
	// +kubebuilder:default=http
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && self.matches('[a-z]') && !self.contains('--')",message="targetPort must be a container port name: at most 15 lower-case letters, digits and '-', with at least one letter, e.g. http"
	TargetPort string `json:"targetPort,omitempty"`

	// window is the length of the sliding window: whole hours, minutes,
	// seconds and milliseconds, largest unit first, e.g. "500ms", "10s",
	// "1m30s" or "1h"; from 1ms to 24h. A request is admitted when fewer
	// than limit requests of its client were admitted in the window that
	// ends at that request.
	// +required
	// +kubebuilder:validation:XValidation:rule="size(self) == 0 || !self.matches('^([0-9]{1,2}h)?([0-9]{1,4}m)?([0-9]{1,5}s)?([0-9]{1,8}ms)?$') || (duration(self) >= duration('1ms') && duration(self) <= duration('24h'))",message="window must be from 1ms to 24h"
	Window Duration `json:"window"`

	// limit is the number of requests a client may make in any window, from
	// 1 to 1000000 (the exact algorithm stores one entry per admitted
	// request). With cost, it is the cost a client may use in any window,
	// e.g. 100000 for 100000 tokens per minute with window "1m".
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	Limit int32 `json:"limit"`

	// additionalLimits are more windows for the same clients, each with its
	// own limit, e.g. window "1s" with limit 10 and here {window: "1h",
	// limit: 1000}: a request is admitted only when every window has room
	// (decided together, all or nothing, exactly for each window), and a
	// rejected one waits (Retry-After) until all of them have room again.
	// Each window is one more key per client in Redis. Windows differ from
	// each other and from window. Not with cost. Sidecars and rate limit
	// service servers of a release before additionalLimits do not enforce
	// a policy with them (slidegate_sidecar_config_policies_skipped,
	// slidegate_rls_config_policies_skipped) rather than enforce its first
	// window alone.
	// +optional
	// +listType=map
	// +listMapKey=window
	// +kubebuilder:validation:MaxItems=4
	// +kubebuilder:validation:XValidation:rule="self.all(a, !a.window.matches('^([0-9]{1,2}h)?([0-9]{1,4}m)?([0-9]{1,5}s)?([0-9]{1,8}ms)?$') || self.exists_one(b, b.window.matches('^([0-9]{1,2}h)?([0-9]{1,4}m)?([0-9]{1,5}s)?([0-9]{1,8}ms)?$') && duration(b.window) == duration(a.window)))",message="the windows of additionalLimits must differ from each other (e.g. '60s' and '1m' are the same window)"
	AdditionalLimits []AdditionalLimit `json:"additionalLimits,omitempty"`

	// quotas are limits per calendar day or month for the same clients,
	// e.g. {period: Month, limit: 10000000, timeZone: "Europe/Berlin"}: at
	// most limit requests from the first's midnight to the next first's in
	// that zone, daylight-saving changes included, then a fresh count. A
	// request is admitted only when the window, every additional window
	// and every quota have room (decided together, all or nothing); a
	// request refused by a quota waits (Retry-After) until the period ends.
	// The count is exact for every period at any limit: one counter per
	// client and period in Redis, about 100 bytes, not a log, and the
	// period is the one Redis's clock is in. One quota per period; not
	// with cost. Sidecars and rate limit service servers of a release
	// before quotas do not enforce a policy with them
	// (slidegate_sidecar_config_policies_skipped,
	// slidegate_rls_config_policies_skipped) rather than enforce it without
	// its quotas.
	// +optional
	// +listType=map
	// +listMapKey=period
	// +kubebuilder:validation:MaxItems=2
	Quotas []Quota `json:"quotas,omitempty"`

	// key says how a request's client is identified; required with
	// targetSelector, not allowed with rateLimitService.
	// +optional
	Key ClientKey `json:"key,omitzero"`

	// failMode is what the policy does when Redis cannot answer in time:
	// Open (the default) keeps serving with a local per-replica limit,
	// Closed rejects requests.
	// +optional
	// +kubebuilder:default=Open
	FailMode FailMode `json:"failMode,omitempty"`

	// algorithm is how requests are counted: SlidingLog (the default) is
	// exact; SlidingWindowCounter uses constant memory per client and is
	// approximate near window boundaries.
	// +optional
	// +kubebuilder:default=SlidingLog
	Algorithm Algorithm `json:"algorithm,omitempty"`

	// match restricts the policy to some HTTP methods and path prefixes.
	// Unset, the policy applies to every request. When several policies
	// select a pod, a request must pass every policy that matches it.
	// +optional
	Match *RequestMatch `json:"match,omitempty"`

	// mode is Enforce (the default: requests over the limit get 429 Too Many
	// Requests) or DryRun (requests are counted and would-be rejections are
	// reported in metrics and logs, but nothing is rejected).
	// +optional
	// +kubebuilder:default=Enforce
	Mode Mode `json:"mode,omitempty"`

	// Traffic to the pods' IPs (issue 23; the types are in
	// networkpolicy_types.go).

	// networkPolicy, when set, makes the controller keep a NetworkPolicy
	// (named slidegate-<policy name>, owned by this policy) that admits
	// traffic to the selected pods only on the sidecar's ports and the
	// ports listed here, so that a client dialing a pod's IP on the app's
	// port is refused instead of passing around the sidecar. It needs a
	// network plugin that enforces NetworkPolicy (docs/operations.md), and
	// adds up with the namespace's other NetworkPolicies that select the
	// same pods: one of them admitting the app's port opens it again, which
	// the status reports (Enforced False, reason NetworkPolicyAdmitsApp).
	// Only with targetSelector. Unset: no NetworkPolicy.
	// +optional
	NetworkPolicy *PodNetworkPolicy `json:"networkPolicy,omitempty"`

	// Limits by cost (issue 27; the types are in cost_types.go).

	// cost makes the policy limit the cost of requests in a window instead
	// of their number: limit is then the cost a client may use in any
	// window, e.g. LLM tokens per minute. Unset, every request costs 1.
	// A request's cost can be known when it arrives (request: a constant
	// or a request header), or only when its response ends (response: a
	// response header or trailer, or fields of a JSON response, Server-Sent
	// Events streams included), or both.
	//
	// Sidecars and rate limit service servers of a release before cost
	// existed do not enforce a policy with cost (they leave it out and say
	// so: slidegate_sidecar_config_policies_skipped,
	// slidegate_rls_config_policies_skipped) rather than count its
	// requests against a limit meant for their cost.
	// +optional
	Cost *Cost `json:"cost,omitempty"`

	// Durable admits (issue 24). Kept in a block of its own.

	// durability is when a request's admit counts. Primary (also when
	// unset): once the Redis master has it. Redis replicates
	// asynchronously, so a failover to a replica that had not received the
	// last admits lets that budget be used again. Replicated: only once a
	// replica has it too (Redis WAIT, once per round trip to Redis), so a
	// failover forgets no admit that let a request through; an admit no
	// replica acknowledges within 100ms is taken back and failMode decides
	// the request, which is every request while the master has no replica
	// (after a failover, until the old master is back as a replica). See
	// docs/operations.md, "What happens during a failover, a reshard".
	// +optional
	Durability Durability `json:"durability,omitempty"`
}

// AdditionalLimit is one more window of a policy, with its limit, for the
// same clients (RateLimitPolicySpec.AdditionalLimits).
type AdditionalLimit struct {
	// window is the length of this sliding window, as the policy's window:
	// whole hours, minutes, seconds and milliseconds, largest unit first,
	// from 1ms to 24h.
	// +required
	// +kubebuilder:validation:XValidation:rule="!self.matches('^([0-9]{1,2}h)?([0-9]{1,4}m)?([0-9]{1,5}s)?([0-9]{1,8}ms)?$') || (duration(self) >= duration('1ms') && duration(self) <= duration('24h'))",message="window must be from 1ms to 24h"
	Window Duration `json:"window"`

	// limit is the number of requests a client may make in any such
	// window, from 1 to 1000000.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	Limit int32 `json:"limit"`
}

// QuotaPeriod is the calendar period of a quota.
// +kubebuilder:validation:Enum=Day;Month
type QuotaPeriod string

// The quota periods.
const (
	// QuotaPeriodDay is a calendar day, midnight to midnight.
	QuotaPeriodDay QuotaPeriod = "Day"
	// QuotaPeriodMonth is a calendar month, from the first's midnight.
	QuotaPeriodMonth QuotaPeriod = "Month"
)

// Quota is a limit per calendar period (RateLimitPolicySpec.Quotas).
type Quota struct {
	// period is Day or Month.
	// +required
	Period QuotaPeriod `json:"period"`

	// limit is the number of requests a client may make in each period,
	// from 1 to 1000000000000.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000000
	Limit int64 `json:"limit"`

	// timeZone is the IANA time zone whose midnight starts a period, e.g.
	// "America/New_York"; UTC when unset. A name the manager's time zone
	// database does not know keeps the policy from being accepted.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$`
	TimeZone string `json:"timeZone,omitempty"`
}

// RateLimitPolicyStatus is the observed state of a RateLimitPolicy.
type RateLimitPolicyStatus struct {
	// observedGeneration is the metadata.generation that the status
	// describes. It is 0 until the controller has processed the policy, so
	// that kstatus-based tools (Flux, Argo CD) see the policy in progress.
	// +optional
	// +kubebuilder:default=0
	ObservedGeneration int64 `json:"observedGeneration"`

	// conditions are Ready, Accepted, Enforced and, for a failure only a
	// person can fix, Stalled.
	// Ready means the controller has done its part: the policy is accepted,
	// its configuration is published to the namespace's sidecars and their
	// Redis credentials are in place. It does not mean that any pod enforces
	// it: that is Enforced (all selected pods carry the sidecar; the message
	// counts them, or names why some do not), shown beside Ready by kubectl
	// get.
	// Accepted is False with reason Invalid for a spec the controller cannot
	// render, or ConfigTooLarge when the namespace's policies together exceed
	// what one ConfigMap holds and this one is left out, older policies
	// taking precedence (for the rate limit service, whose one ConfigMap all
	// namespaces share: when the namespace's policies exceed its share of
	// it), or DomainNotAllowed for a policy for the rate limit service on a
	// domain that its namespace may not use (docs/rls.md).
	// Ready is False with reason RedisCredentialsUnavailable while the
	// Secret named by the manager's --redis-secret-name is missing; after a
	// minute Stalled is True too (kstatus: Failed), since only its owner can
	// bring it.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// matchedPods is the number of pods, neither being deleted nor finished
	// (phase Succeeded or Failed, such as an evicted pod), that
	// targetSelector selects. For a policy with rateLimitService: the ready
	// rate limit service servers, 0 while the policy is not accepted.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=0
	MatchedPods int32 `json:"matchedPods"`

	// enforcedPods is the number of matched pods whose spec shows the
	// sidecar in front of targetPort with no way around it (no other
	// container holding that port name, the app's port not on the node).
	// The ratelimit.slidegate.dev/injected annotation is not read: any pod
	// author can write it.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=0
	EnforcedPods int32 `json:"enforcedPods"`

	// ancestors are, for a policy with targetRefs, the Gateways its
	// targets are attached to, each with an Accepted condition (GEP-713's
	// ancestor status, which Gateway API tools read).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Ancestors []PolicyAncestorStatus `json:"ancestors,omitempty"`

	// revision is the content hash of this policy as rendered into the
	// ConfigMap slidegate-sidecar-config, with the namespace-wide settings
	// it depends on. It changes when what the sidecars enforce for this
	// policy changes, not when other policies of the namespace change (the
	// ConfigMap's ratelimit.slidegate.dev/revision annotation is the hash of
	// the whole document). Empty while the policy is not accepted.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Revision string `json:"revision,omitempty"`
}

// RateLimitPolicy limits how many requests each client may make to the
// selected pods in any sliding window, exactly and across all replicas (the
// count is kept in one shared Redis).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rlp,categories=slidegate
// +kubebuilder:printcolumn:name="Window",type=string,JSONPath=`.spec.window`
// +kubebuilder:printcolumn:name="Limit",type=integer,JSONPath=`.spec.limit`
// +kubebuilder:printcolumn:name="Key",type=string,JSONPath=`.spec.key.source`
// +kubebuilder:printcolumn:name="Fail mode",type=string,JSONPath=`.spec.failMode`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Enforced",type=string,JSONPath=`.status.conditions[?(@.type=="Enforced")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Key name",type=string,JSONPath=`.spec.key.name`,priority=1
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`,priority=1
// +kubebuilder:printcolumn:name="Matched pods",type=integer,JSONPath=`.status.matchedPods`,priority=1
// +kubebuilder:printcolumn:name="Enforced pods",type=integer,JSONPath=`.status.enforcedPods`,priority=1
type RateLimitPolicy struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired behaviour of the rate limit.
	// +required
	Spec RateLimitPolicySpec `json:"spec"`

	// status is the observed state, written by the controller.
	// +optional
	// +kubebuilder:default={}
	Status RateLimitPolicyStatus `json:"status,omitempty"`
}

// RateLimitPolicyList is a list of RateLimitPolicy.
//
// +kubebuilder:object:root=true
type RateLimitPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RateLimitPolicy `json:"items"`
}

// ---------------------------------------------------------------------------
// Verified tokens (issue 23): the key.jwt settings of a JWTClaim policy.
// Kept together here; other fields of ClientKey live above.
// ---------------------------------------------------------------------------

// JWTVerification says how the sidecar verifies a JWTClaim policy's bearer
// tokens (see ClientKey.JWT): either issuer, audiences and jwks (all
// three), or insecureSkipVerification alone.
// +kubebuilder:validation:XValidation:rule="has(self.insecureSkipVerification) ? !(has(self.issuer) || has(self.audiences) || has(self.jwks)) : (has(self.issuer) && has(self.audiences) && has(self.jwks))",message="set issuer, audiences and jwks to verify tokens, or only insecureSkipVerification: VerifiedUpstream when a gateway in front of the pods verifies every token"
type JWTVerification struct {
	// issuer is the value the token's iss claim must have, exactly, e.g.
	// "https://auth.example.com/".
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Issuer string `json:"issuer,omitempty"`

	// audiences are the values the token's aud claim may name; it must
	// name at least one of them, e.g. ["https://api.example.com"].
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=1024
	Audiences []string `json:"audiences,omitempty"`

	// jwks says where the issuer's public signing keys, a JSON Web Key Set
	// (RFC 7517), come from.
	// +optional
	JWKS *JWKSSource `json:"jwks,omitempty"`

	// insecureSkipVerification: VerifiedUpstream says that every request
	// reaches the pods through a gateway that has verified its token and
	// refuses invalid ones, so the sidecar reads the claim without
	// verifying the token. Anyone who can reach the pods another way (a
	// pod in the cluster, a Service port around the gateway) chooses their
	// own claim, and so their own budget, with every request. It is what
	// a JWTClaim policy did before jwt existed; a policy stored then,
	// without jwt, is enforced so until its key is next changed (its
	// Accepted condition says so, reason UnverifiedJWT).
	// +optional
	InsecureSkipVerification InsecureSkipVerification `json:"insecureSkipVerification,omitempty"`
}

// InsecureSkipVerification names why a JWTClaim policy need not verify its
// tokens.
// +kubebuilder:validation:Enum=VerifiedUpstream
type InsecureSkipVerification string

const (
	// InsecureSkipVerificationVerifiedUpstream says that a gateway in front
	// of the pods verifies every token.
	InsecureSkipVerificationVerifiedUpstream InsecureSkipVerification = "VerifiedUpstream"
)

// JWKSConfigMapName is the ConfigMap of a namespace that holds the key
// sets its policies name by key (JWKSSource.ConfigMapKey). One fixed name,
// so that the manager may read that ConfigMap and no other (RBAC restricts
// by name, not by label): a policy cannot make the manager read, and
// publish, some other ConfigMap of its namespace.
const JWKSConfigMapName = "slidegate-jwks"

// JWKSSource says where a JSON Web Key Set comes from: exactly one of
// configMapKey and url.
// +kubebuilder:validation:XValidation:rule="has(self.configMapKey) != has(self.url)",message="set exactly one of configMapKey (a key of ConfigMap slidegate-jwks in the policy's namespace) and url (the issuer's https JWKS endpoint)"
type JWKSSource struct {
	// configMapKey is a data key of the ConfigMap slidegate-jwks in the
	// policy's namespace whose value is the key set, e.g. "auth.json". A
	// key set is public data, so it is not read from a Secret: the manager
	// reads no Secret a policy names. Edit the ConfigMap to rotate keys.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	ConfigMapKey string `json:"configMapKey,omitempty"`

	// url is the issuer's JWKS endpoint (the jwks_uri of its OpenID
	// configuration), https only, e.g.
	// "https://auth.example.com/.well-known/jwks.json". The manager fetches
	// it (the sidecars make no network call) every few minutes (its
	// --jwks-refresh-interval) and keeps the last good keys when a fetch
	// fails; the policy's Ready condition says when it has none. The
	// response is bounded (256 KiB, 32 usable keys). Only public addresses
	// are dialed (not loopback, link-local such as a cloud metadata
	// service, or private ranges, where the cluster's own endpoints live)
	// unless the manager's --jwks-allowed-cidrs allows a range; what a host
	// there answers stays in the manager's log. A namespace's policies name
	// at most --jwks-urls-per-namespace URLs (10 by default).
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() == 'https' && url(self).getHostname() != ''",message="url must be an https URL with a host, e.g. https://auth.example.com/.well-known/jwks.json"
	// +kubebuilder:validation:XValidation:rule="!self.contains('@') && !self.contains('#')",message="url must not carry credentials ('@') or a fragment ('#')"
	URL string `json:"url,omitempty"`
}

// Durable admits (issue 24): spec.durability's type.

// Durability says when a request's admit counts (spec.durability).
// +kubebuilder:validation:Enum=Primary;Replicated
type Durability string

const (
	// DurabilityPrimary counts an admit once the Redis master has it.
	DurabilityPrimary Durability = "Primary"
	// DurabilityReplicated counts an admit once a replica of the Redis
	// master has it too.
	DurabilityReplicated Durability = "Replicated"
)
