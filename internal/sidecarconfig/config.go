// Package sidecarconfig is the versioned schema of the document that the
// controller renders (one per namespace, in a ConfigMap) and the enforcement
// sidecar loads. It is shared by both sides and imports neither.
//
// The document is JSON. Marshal is deterministic (fixed field order, policies
// sorted by name, no timestamps), so identical input gives identical bytes and
// GitOps tools see no churn.
package sidecarconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	// The IANA time zones of quotas, in the binary: a sidecar's image has
	// no /usr/share/zoneinfo.
	_ "time/tzdata"

	"github.com/slidegate/slidegate/internal/jwtverify"
)

// ConfigMapName is the name of the rendered ConfigMap in each namespace that
// has policies, and FileName its data key (the file the sidecar loads).
const (
	ConfigMapName = "slidegate-sidecar-config"
	FileName      = "config.json"
)

// Config is everything a sidecar needs to enforce its namespace's policies.
type Config struct {
	// Version is the document's schema version, VersionOf(minor): the
	// newest (Version) unless the namespace runs older sidecars (see the
	// compatibility rule in version.go).
	Version string `json:"version"`
	// Namespace the policies belong to.
	Namespace string `json:"namespace"`
	// TrustedProxies are the CIDRs whose X-Forwarded-For/Forwarded headers
	// are believed when the client key is the remote address. Configured on
	// the operator, not in policies.
	TrustedProxies []string `json:"trustedProxies,omitempty"`
	// Policies, sorted by Name. A request must pass every policy that
	// matches it.
	Policies []Policy `json:"policies"`

	// Skipped are the policies of a newer minor version that Parse left
	// out because they have fields this version does not know. Not part of
	// the document.
	Skipped []Skipped `json:"-"`
}

// Policy is one rendered RateLimitPolicy.
type Policy struct {
	// Name of the RateLimitPolicy.
	Name string `json:"name"`
	// ID is the rule id used in Redis keys: "<namespace>/<name>". It stays
	// the same when the limit or window changes, so counts survive a reload.
	ID string `json:"id"`
	// Selector picks the pods (by their labels) that enforce the policy.
	Selector Selector `json:"selector"`
	// WindowMillis is the sliding window in milliseconds.
	WindowMillis int64 `json:"windowMillis"`
	// Limit is the number of admits allowed in any window.
	Limit int64 `json:"limit"`
	// Algorithm is "SlidingLog" or "SlidingWindowCounter".
	Algorithm string `json:"algorithm"`
	// FailMode is "Open" or "Closed".
	FailMode string `json:"failMode"`
	// Mode is "Enforce" or "DryRun".
	Mode string `json:"mode"`
	// Key says how a request's client is identified.
	Key Key `json:"key"`
	// Match restricts the policy to some requests; empty matches all.
	Match Match `json:"match"`
	// Replicas is a fixed fail-open share divisor. The controller no longer
	// renders it (sidecars count each other through Redis, so pod churn
	// rewrites no ConfigMap); it is still read, so that a document written by
	// an older controller keeps working during an upgrade. The sidecars'
	// own count, once known, takes precedence over it.
	Replicas int32 `json:"replicas,omitempty"`
	// Durability is DurabilityReplicated when an admit counts only once a
	// replica of the Redis master has it; absent (or "Primary"), once the
	// master has it. The controller writes it only when Replicated.
	Durability string `json:"durability,omitempty" minor:"1"`
	// Cost, when set, makes the policy weighted: Limit is the cost allowed
	// in any window (cost.go). Absent: every request costs 1.
	Cost *Cost `json:"cost,omitempty" minor:"2"`
	// AdditionalLimits are more windows for the same clients, each with
	// its limit: a request is admitted only when every window, the
	// policy's own and these, has room, and then counts in all of them.
	// Sorted by window, none equal to WindowMillis; not with Cost.
	AdditionalLimits []Limit `json:"additionalLimits,omitempty" minor:"3"`
	// Quotas are limits per calendar period for the same clients: a
	// request is admitted only when they too have room, and then counts in
	// each. Sorted by period (Day before Month), one per period; not with
	// Cost.
	Quotas []Quota `json:"quotas,omitempty" minor:"4"`
}

// Quota is a limit per calendar period (Policy.Quotas).
type Quota struct {
	// Period is QuotaDay or QuotaMonth.
	Period string `json:"period" minor:"4"`
	Limit  int64  `json:"limit" minor:"4"`
	// TimeZone is the IANA name of the zone whose midnight starts a
	// period; "" is UTC.
	TimeZone string `json:"timeZone,omitempty" minor:"4"`
}

// The quota periods (the API's).
const (
	QuotaDay   = "Day"
	QuotaMonth = "Month"
)

// MaxQuota bounds a quota's limit: a count, not a log, so far above
// MaxLimit (limiter.MaxQuota).
const MaxQuota = 1_000_000_000_000

// Location is the time zone of q's periods. The zones come from the
// binary's own database (time/tzdata, imported here), so a sidecar on an
// image without /usr/share/zoneinfo reads them as the manager does.
func (q Quota) Location() (*time.Location, error) {
	if q.TimeZone == "" {
		return time.UTC, nil
	}
	loc, err := time.LoadLocation(q.TimeZone)
	if err != nil {
		return nil, fmt.Errorf("time zone %q: %w", q.TimeZone, err)
	}
	return loc, nil
}

// ItemName is the name of quota q of policy in the RateLimit header
// fields: the policy's name, "/" and the period in lower case ("api/day").
func (q Quota) ItemName(policy string) string { return policy + "/" + q.Variant() }

// Variant is the limiter's Rule.Variant of quota q: its keys'.
func (q Quota) Variant() string { return strings.ToLower(q.Period) }

// Limit is one more window of a policy (Policy.AdditionalLimits).
type Limit struct {
	WindowMillis int64 `json:"windowMillis" minor:"3"`
	Limit        int64 `json:"limit" minor:"3"`
}

// MaxAdditionalLimits bounds Policy.AdditionalLimits (the API's too): each
// window is one more key per client in Redis and one more decision per
// request.
const MaxAdditionalLimits = 4

// DurabilityReplicated is Policy.Durability (and rlsconfig's) for an admit
// that counts once a replica has it (the API's spec.durability).
const DurabilityReplicated = "Replicated"

// ValidDurability says whether d is a Durability a document may hold.
func ValidDurability(d string) bool {
	return d == "" || d == "Primary" || d == DurabilityReplicated
}

// Selector is a Kubernetes label selector in plain data.
type Selector struct {
	MatchLabels      map[string]string `json:"matchLabels,omitempty"`
	MatchExpressions []Requirement     `json:"matchExpressions,omitempty"`
}

// Requirement is one label selector expression.
type Requirement struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"` // In, NotIn, Exists, DoesNotExist
	Values   []string `json:"values,omitempty"`
}

// Key sources and missing-key behaviours.
const (
	SourceRemoteAddress  = "RemoteAddress"
	SourceHeader         = "Header"
	SourceQueryParameter = "QueryParameter"
	SourceJWTClaim       = "JWTClaim"
	SourceGlobal         = "Global"

	MissingDeny          = "Deny"
	MissingAllow         = "Allow"
	MissingRemoteAddress = "RemoteAddress"
)

// Forwarding headers a trusted proxy writes the client address in, the
// values of Key.ForwardedHeader.
const (
	ForwardedXFF     = "X-Forwarded-For"
	ForwardedRFC7239 = "Forwarded"
)

// Path cases, the values of Match.PathCase.
const (
	PathCaseSensitive   = "Sensitive"
	PathCaseInsensitive = "Insensitive"
)

// Key identifies the client of a request.
type Key struct {
	// Source is one of the Source* constants.
	Source string `json:"source"`
	// Name is the header, query parameter or claim name (for those sources).
	Name string `json:"name,omitempty"`
	// OnMissing is what happens when the request has no such value:
	// Deny, Allow (the policy does not apply) or RemoteAddress.
	OnMissing string `json:"onMissing"`
	// ForwardedHeader is the one header whose forwarding chain is read
	// when the TCP peer is a trusted proxy: ForwardedXFF or
	// ForwardedRFC7239. Absent: X-Forwarded-For, which is how the renderer
	// writes it (only Forwarded is rendered), so that a policy that reads
	// X-Forwarded-For stays readable by first-release sidecars (which also
	// read Forwarded when there was no X-Forwarded-For).
	ForwardedHeader string `json:"forwardedHeader,omitempty" minor:"1"`
	// IPv6PrefixLength is the length of the network an IPv6 client is
	// counted by, 1 to 128. Absent (0): DefaultIPv6PrefixLength, and only
	// another length is rendered, for the same reason (first-release
	// sidecars count each IPv6 address on its own).
	IPv6PrefixLength int `json:"ipv6PrefixLength,omitempty" minor:"1"`
	// JWT, for the source JWTClaim, is how the bearer token is verified:
	// its claims count only when its signature, issuer, audience and
	// validity check out. Absent: the token is read without verification,
	// as the first release did (a policy whose gateway verifies tokens
	// says so with insecureSkipVerification, and renders no JWT).
	JWT *JWT `json:"jwt,omitempty" minor:"1"`
}

// JWT says which bearer tokens a JWTClaim policy believes.
type JWT struct {
	// Issuer is the value the token's iss claim must have.
	Issuer string `json:"issuer" minor:"1"`
	// Audiences: the token's aud claim must name one of them.
	Audiences []string `json:"audiences" minor:"1"`
	// JWKS is the JSON Web Key Set of the issuer's public signing keys,
	// in jwtverify's canonical form. With no keys (the policy's keys are
	// unavailable), no token verifies and onMissing decides every request.
	JWKS json.RawMessage `json:"jwks" minor:"1"`
}

// MaxAudiences and MaxIssuerBytes bound a JWT's settings, as the CRD does.
const (
	MaxAudiences   = 16
	MaxIssuerBytes = 1024
)

// DefaultIPv6PrefixLength is the network an IPv6 client is counted by when
// a policy does not say: a /64 is what one subscriber or host holds, and
// counting each address of it on its own gave its holder 2^64 budgets.
const DefaultIPv6PrefixLength = 64

// IPv6Prefix is the prefix length IPv6 clients are counted by.
func (k *Key) IPv6Prefix() int {
	if k.IPv6PrefixLength == 0 {
		return DefaultIPv6PrefixLength
	}
	return k.IPv6PrefixLength
}

// UsesRemoteAddress reports whether a policy with key k may count a request
// against its client address: its source is RemoteAddress, or a request
// without the key falls back to it.
func (k *Key) UsesRemoteAddress() bool {
	switch k.Source {
	case SourceRemoteAddress:
		return true
	case SourceHeader, SourceQueryParameter, SourceJWTClaim:
		return k.OnMissing == MissingRemoteAddress
	}
	return false
}

// Match restricts a policy to HTTP methods and path prefixes. An empty list
// matches everything.
type Match struct {
	Methods      []string `json:"methods,omitempty"`
	PathPrefixes []string `json:"pathPrefixes,omitempty"`
	// PathCase is PathCaseInsensitive when path prefixes match regardless
	// of letter case; absent or PathCaseSensitive, they match as written.
	// Rendered only when Insensitive.
	PathCase string `json:"pathCase,omitempty" minor:"1"`
}

// validate checks what a verifier needs: an issuer, audiences, and a key
// set the sidecar can use in full (jwtverify.Parse).
func (j *JWT) validate() error {
	var errs []error
	if j.Issuer == "" || len(j.Issuer) > MaxIssuerBytes {
		errs = append(errs, fmt.Errorf("issuer is required (at most %d bytes)", MaxIssuerBytes))
	}
	if len(j.Audiences) == 0 || len(j.Audiences) > MaxAudiences {
		errs = append(errs, fmt.Errorf("audiences: from 1 to %d are required", MaxAudiences))
	}
	for _, a := range j.Audiences {
		if a == "" || len(a) > MaxIssuerBytes {
			errs = append(errs, fmt.Errorf("audiences: an audience is empty or longer than %d bytes", MaxIssuerBytes))
			break
		}
	}
	if _, err := jwtverify.Parse(j.JWKS); err != nil {
		errs = append(errs, fmt.Errorf("jwks: %w", err))
	}
	return errors.Join(errs...)
}

// Parse reads and validates a document. Unknown fields are errors: a typo in
// a hand-edited ConfigMap must not silently drop a limit. The exception is a
// document of a newer minor version (a newer controller): its policies with
// fields this version does not know are left out and listed in Skipped, and
// the others are enforced (version.go).
func Parse(data []byte) (*Config, error) {
	var c Config
	if err := decode(data, &c); err != nil {
		return nil, fmt.Errorf("sidecar config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Marshal writes the document in its canonical form.
func Marshal(c *Config) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return MarshalCanonical(c)
}

// DecodeStrict decodes one JSON document into v; unknown fields and data
// after the document are errors. Shared with rlsconfig, whose document is
// read the same way.
func DecodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the document")
	}
	return nil
}

// MarshalCanonical is the canonical form of a rendered document: indented
// JSON with a final newline, the same bytes for the same value.
func MarshalCanonical(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Bounds shared with the CRD's validation.
const (
	MaxLimit        = 1_000_000
	MaxWindowMillis = 24 * 60 * 60 * 1000
)

var (
	headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")
	httpMethod = regexp.MustCompile(`^[A-Z]{1,16}$`)
)

// Validate checks every rule the sidecar relies on. It is the last line of
// defence behind the CRD schema, for a ConfigMap edited by hand.
func (c *Config) Validate() error {
	var errs []error
	if err := c.checkVersion(); err != nil {
		errs = append(errs, err)
	}
	for _, p := range c.TrustedProxies {
		if _, err := ParseTrustedProxy(p); err != nil {
			errs = append(errs, fmt.Errorf("trustedProxies: %q is not a CIDR", p))
		}
	}
	if !slices.IsSortedFunc(c.Policies, func(a, b Policy) int { return strings.Compare(a.Name, b.Name) }) {
		errs = append(errs, errors.New("policies are not sorted by name"))
	}
	seen := map[string]bool{}
	for i := range c.Policies {
		p := &c.Policies[i]
		if seen[p.Name] {
			errs = append(errs, fmt.Errorf("policy %q appears twice", p.Name))
		}
		seen[p.Name] = true
		if err := p.validate(); err != nil {
			errs = append(errs, fmt.Errorf("policy %q: %w", p.Name, err))
		}
	}
	return errors.Join(errs...)
}

func (p *Policy) validate() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if p.Name == "" || p.ID == "" {
		add("name and id are required")
	}
	if strings.ContainsAny(p.ID, "{}") {
		add("id must not contain braces")
	}
	if p.Replicas < 0 {
		add("replicas %d is negative", p.Replicas)
	}
	errs = append(errs, ValidateRule(RuleFields{
		WindowMillis: p.WindowMillis, Limit: p.Limit,
		Algorithm: p.Algorithm, FailMode: p.FailMode, Mode: p.Mode, Durability: p.Durability,
	})...)
	if p.Cost != nil {
		errs = append(errs, p.Cost.validate()...)
	}
	errs = append(errs, ValidateAdditionalLimits(p.WindowMillis, p.AdditionalLimits, p.Cost != nil)...)
	errs = append(errs, p.validateQuotas()...)
	errs = append(errs, p.Key.validate()...)
	errs = append(errs, p.Match.validate()...)
	errs = append(errs, p.Selector.validate()...)
	return errors.Join(errs...)
}

// ValidateAdditionalLimits checks a policy's additional windows (of both
// documents): bounded, sorted, each distinct from the others and from the
// policy's own window (two windows of one length would share a key), not
// on a weighted policy.
func ValidateAdditionalLimits(windowMillis int64, ls []Limit, weighted bool) []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(ls) > MaxAdditionalLimits {
		add("additionalLimits has %d windows, more than %d", len(ls), MaxAdditionalLimits)
	}
	if len(ls) > 0 && weighted {
		add("additionalLimits and cost cannot be used together")
	}
	for i, l := range ls {
		if l.WindowMillis < 1 || l.WindowMillis > MaxWindowMillis {
			add("additionalLimits[%d]: windowMillis %d is outside 1..%d", i, l.WindowMillis, MaxWindowMillis)
		}
		if l.Limit < 1 || l.Limit > MaxLimit {
			add("additionalLimits[%d]: limit %d is outside 1..%d", i, l.Limit, MaxLimit)
		}
		if l.WindowMillis == windowMillis {
			add("additionalLimits[%d]: windowMillis %d is the policy's own window", i, l.WindowMillis)
		}
		if i > 0 && l.WindowMillis <= ls[i-1].WindowMillis {
			add("additionalLimits[%d]: windows are not sorted and distinct (%d after %d)", i, l.WindowMillis, ls[i-1].WindowMillis)
		}
	}
	return errs
}

// ItemName is the name of window l of policy in the RateLimit header
// fields and the rate limit service's current_limit: the policy's name,
// "/" and the window as a policy spells it ("api/1h", "api/1m30s").
func (l Limit) ItemName(policy string) string {
	var b []byte
	d := time.Duration(l.WindowMillis) * time.Millisecond
	for _, u := range []struct {
		d    time.Duration
		unit string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}} {
		if n := d / u.d; n > 0 {
			b = strconv.AppendInt(b, int64(n), 10)
			b = append(b, u.unit...)
			d -= n * u.d
		}
	}
	return policy + "/" + string(b)
}

// Variant is the limiter's Rule.Variant of window l: its keys'.
func (l Limit) Variant() string { return strconv.FormatInt(l.WindowMillis, 10) }

// validateQuotas checks a policy's quotas (ValidateQuotas).
func (p *Policy) validateQuotas() []error { return ValidateQuotas(p.Quotas, p.Cost != nil) }

// ValidateQuotas checks a policy's quotas, for the sidecars' document and
// the rate limit service's (one home): one per period, sorted, each limit
// bounded and its zone known, not with a cost (weighted).
func ValidateQuotas(quotas []Quota, weighted bool) []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(quotas) > 0 && weighted {
		add("quotas and cost cannot be used together")
	}
	order := map[string]int{QuotaDay: 1, QuotaMonth: 2}
	for i, q := range quotas {
		if order[q.Period] == 0 {
			add("quotas[%d]: period %q is not %s or %s", i, q.Period, QuotaDay, QuotaMonth)
		}
		if q.Limit < 1 || q.Limit > MaxQuota {
			add("quotas[%d]: limit %d is outside 1..%d", i, q.Limit, int64(MaxQuota))
		}
		if _, err := q.Location(); err != nil {
			add("quotas[%d]: %w", i, err)
		}
		if i > 0 && order[q.Period] <= order[quotas[i-1].Period] {
			add("quotas[%d]: periods are not sorted and distinct (%s after %s)", i, q.Period, quotas[i-1].Period)
		}
	}
	return errs
}

// validate checks a policy's key.
func (k *Key) validate() []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	switch k.Source {
	case SourceHeader:
		if !headerName.MatchString(k.Name) {
			add("key.name %q is not a valid header name", k.Name)
		}
	case SourceQueryParameter, SourceJWTClaim:
		if k.Name == "" || len(k.Name) > 256 {
			add("key.name is required for %s (at most 256 bytes)", k.Source)
		}
	case SourceRemoteAddress, SourceGlobal:
	default:
		add("key.source %q is unknown", k.Source)
	}
	switch k.OnMissing {
	case MissingDeny, MissingAllow, MissingRemoteAddress:
	default:
		add("key.onMissing %q is not Deny, Allow or RemoteAddress", k.OnMissing)
	}
	switch k.ForwardedHeader {
	case "", ForwardedXFF, ForwardedRFC7239:
	default:
		add("key.forwardedHeader %q is not %s or %s", k.ForwardedHeader, ForwardedXFF, ForwardedRFC7239)
	}
	if k.IPv6PrefixLength < 0 || k.IPv6PrefixLength > 128 {
		add("key.ipv6PrefixLength %d is outside 1..128", k.IPv6PrefixLength)
	}
	if j := k.JWT; j != nil {
		if k.Source != SourceJWTClaim {
			add("key.jwt applies to the source %s only", SourceJWTClaim)
		}
		if err := j.validate(); err != nil {
			add("key.jwt: %w", err)
		}
	}
	return errs
}

// validate checks a policy's request match.
func (m *Match) validate() []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	switch m.PathCase {
	case "", PathCaseSensitive, PathCaseInsensitive:
	default:
		add("match.pathCase %q is not %s or %s", m.PathCase, PathCaseSensitive, PathCaseInsensitive)
	}
	for _, m := range m.Methods {
		if !httpMethod.MatchString(m) {
			add("match.methods: %q is not an upper-case HTTP method", m)
		}
	}
	for _, pp := range m.PathPrefixes {
		if !strings.HasPrefix(pp, "/") {
			add("match.pathPrefixes: %q does not start with /", pp)
		}
	}
	return errs
}

// validate checks a policy's pod selector.
func (sel *Selector) validate() []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	for _, r := range sel.MatchExpressions {
		switch r.Operator {
		case "In", "NotIn":
			if len(r.Values) == 0 {
				add("selector: %s needs values", r.Operator)
			}
		case "Exists", "DoesNotExist":
			if len(r.Values) != 0 {
				add("selector: %s takes no values", r.Operator)
			}
		default:
			add("selector: operator %q is unknown", r.Operator)
		}
	}
	return errs
}
