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

// Package render turns the RateLimitPolicies of one namespace into the
// sidecar configuration document (package sidecarconfig) that the
// enforcement sidecars of that namespace load.
//
// Rendering is a pure, deterministic function: no clock, no randomness, no
// API calls; policies are sorted by name and set-like lists are sorted, so
// equal input gives equal bytes and GitOps tools see no churn. The controller,
// the demo and the tests call the same functions.
package render

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/jwtverify"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// Options are the settings of a rendering that do not come from policies.
type Options struct {
	// Namespace whose policies are rendered. Every policy must be in it.
	Namespace string
	// TrustedProxies are the proxy ranges whose X-Forwarded-For header the
	// sidecars believe (the manager's --trusted-proxies flag, parsed by
	// sidecarconfig.ParseTrustedProxies). Rendered as
	// sidecarconfig.TrustedProxies returns them: masked, IPv4-mapped
	// prefixes as IPv4, sorted and without duplicates.
	TrustedProxies []netip.Prefix
	// MaxBytes is the size budget of the encoded document that Fit keeps
	// to; 0 means DefaultMaxBytes.
	MaxBytes int
	// LegacySidecars says that a sidecar of the namespace reads only
	// minor version 0 of the document (the first release's, which refuses
	// every field it does not know): the document is then rendered as
	// minor 0, and the caller leaves out the policies that need more
	// (HoldBack).
	LegacySidecars bool
	// KeySets are the key sets of the namespace's policies that verify
	// tokens, in jwtverify's canonical form, by KeySetRef of where each
	// policy says its keys are; the caller resolves them (a ConfigMap, the
	// issuer's URL). A policy whose set is absent renders with no key: no
	// token verifies, and onMissing decides each request, which keeps the
	// limit (by client address, by default) rather than dropping it.
	KeySets map[string][]byte
	// MaxClientBytes bounds what one client of a policy can make the shared
	// Redis hold (CheckFootprint); 0: no bound.
	MaxClientBytes int64
}

// KeySetRef names where a policy's key set comes from, the key of
// Options.KeySets: "configMap:<key>" or "url:<url>".
func KeySetRef(src *v1alpha1.JWKSSource) string {
	if src.URL != "" {
		return "url:" + src.URL
	}
	return "configMap:" + src.ConfigMapKey
}

// render renders one valid policy with its keys (Options.KeySets).
func (o Options) render(p *v1alpha1.RateLimitPolicy) (sidecarconfig.Policy, error) {
	rp, err := Policy(p)
	if err != nil || rp.Key.JWT == nil {
		return rp, err
	}
	if keys, ok := o.KeySets[KeySetRef(p.Spec.Key.JWT.JWKS)]; ok {
		rp.Key.JWT.JWKS = keys
		// The one check Policy could not make: a set that the sidecar
		// would refuse is the caller's bug, not the policy's.
		if err := (&sidecarconfig.Config{Version: sidecarconfig.Version, Policies: []sidecarconfig.Policy{rp}}).Validate(); err != nil {
			return sidecarconfig.Policy{}, fmt.Errorf("policy %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return rp, nil
}

// version is the document version the options render.
func (o Options) version() string {
	if o.LegacySidecars {
		return sidecarconfig.VersionOf(0)
	}
	return sidecarconfig.Version
}

// HoldBack splits valid policies into those a document of the given minor
// version can carry and those it cannot, with the minor version each of
// the latter needs (sidecarconfig.MinMinor), by name. Every policy must be
// valid (see Policy).
func HoldBack(policies []v1alpha1.RateLimitPolicy, minor int) (kept []v1alpha1.RateLimitPolicy, held map[string]int) {
	held = map[string]int{}
	for i := range policies {
		rp, err := Policy(&policies[i])
		if m := sidecarconfig.MinMinor(&rp); err == nil && m > minor {
			held[policies[i].Name] = m
			continue
		}
		kept = append(kept, policies[i])
	}
	return kept, held
}

// Render renders the policies of one namespace into one sidecar
// configuration. Every policy must be valid (see Policy): the caller leaves
// out the ones Policy rejects, so that one bad policy does not block the
// others of its namespace, and then the ones Fit leaves out, so that the
// document fits in its ConfigMap. The order of policies does not matter; their
// names must be unique. An empty list renders a document with no policies.
func Render(policies []v1alpha1.RateLimitPolicy, opts Options) (*sidecarconfig.Config, error) {
	if opts.Namespace == "" {
		return nil, errors.New("render: no namespace given")
	}
	cfg := &sidecarconfig.Config{
		Version:        opts.version(),
		Namespace:      opts.Namespace,
		TrustedProxies: trustedProxies(opts.TrustedProxies),
		Policies:       make([]sidecarconfig.Policy, 0, len(policies)),
	}
	// Work in name order, so that errors too come out the same for any
	// order of input.
	order := make([]*v1alpha1.RateLimitPolicy, 0, len(policies))
	for i := range policies {
		order = append(order, &policies[i])
	}
	slices.SortStableFunc(order, func(a, b *v1alpha1.RateLimitPolicy) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	var errs []error
	for _, p := range order {
		if p.Namespace != opts.Namespace {
			errs = append(errs, fmt.Errorf("policy %s/%s is not in namespace %q", p.Namespace, p.Name, opts.Namespace))
			continue
		}
		rp, err := opts.render(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cfg.Policies = append(cfg.Policies, rp)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	return cfg, nil
}

// Policy renders one policy, applying the same defaults as the CRD schema
// (so that policies built in Go render like stored ones). Its error says
// what is wrong in words a policy author understands; the controller puts
// it in the Accepted condition. A policy that verifies tokens renders
// with no key here; Render and Fit add its keys (Options.KeySets).
func Policy(p *v1alpha1.RateLimitPolicy) (sidecarconfig.Policy, error) {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	s := &p.Spec

	if p.Name == "" || p.Namespace == "" {
		add("the policy needs a name and a namespace")
	}
	r, err := ruleOf(s)
	if err != nil {
		errs = append(errs, err)
	}
	if s.Limit < 1 || s.Limit > sidecarconfig.MaxLimit {
		add("limit %d is not from 1 to %d", s.Limit, sidecarconfig.MaxLimit)
	}
	var sel sidecarconfig.Selector
	if s.TargetSelector == nil {
		add("the policy has no targetSelector: it is not for the sidecars")
	} else if sel, err = selector(s.TargetSelector.AsMeta()); err != nil {
		add("targetSelector: %w", err)
	}
	key, err := clientKey(&s.Key)
	if err != nil {
		errs = append(errs, err)
	}
	more, err := additionalLimits(s.AdditionalLimits)
	if err != nil {
		errs = append(errs, err)
	}
	out := sidecarconfig.Policy{
		Name:             p.Name,
		ID:               p.Namespace + "/" + p.Name,
		Selector:         sel,
		WindowMillis:     r.windowMillis,
		Limit:            r.limit,
		Algorithm:        r.algorithm,
		FailMode:         r.failMode,
		Mode:             r.mode,
		Key:              key,
		Match:            match(s.Match),
		Durability:       r.durability,
		Cost:             cost(s.Cost),
		AdditionalLimits: more,
		Quotas:           quotas(s.Quotas),
	}
	// The document's Validate checks enum values, header names, methods,
	// path prefixes, the cost, that the additional windows differ from
	// each other and from the policy's own, and the quotas' time zones.
	if err := invalidPolicy(p, errs, (&sidecarconfig.Config{Version: sidecarconfig.Version, Policies: []sidecarconfig.Policy{out}}).Validate); err != nil {
		return sidecarconfig.Policy{}, err
	}
	return out, nil
}

// quotas renders a policy's quotas, Day before Month whatever their order
// in the list (a map keyed by period).
func quotas(in []v1alpha1.Quota) []sidecarconfig.Quota {
	var out []sidecarconfig.Quota
	for _, q := range in {
		out = append(out, sidecarconfig.Quota{Period: string(q.Period), Limit: q.Limit, TimeZone: q.TimeZone})
	}
	// "Day" < "Month": the alphabet is the order.
	slices.SortFunc(out, func(a, b sidecarconfig.Quota) int { return cmp.Compare(a.Period, b.Period) })
	return out
}

// additionalLimits renders a policy's additional windows, sorted by
// window (the API's list is a map keyed by the window's spelling, which
// orders nothing), so that the document does not change with the order
// they are listed in.
func additionalLimits(in []v1alpha1.AdditionalLimit) ([]sidecarconfig.Limit, error) {
	var out []sidecarconfig.Limit
	var errs []error
	for i, l := range in {
		w, err := ParseWindow(string(l.Window))
		if err != nil {
			errs = append(errs, fmt.Errorf("additionalLimits[%d]: %w", i, err))
			continue
		}
		out = append(out, sidecarconfig.Limit{WindowMillis: w.Milliseconds(), Limit: int64(l.Limit)})
	}
	slices.SortFunc(out, func(a, b sidecarconfig.Limit) int { return cmp.Compare(a.WindowMillis, b.WindowMillis) })
	return out, errors.Join(errs...)
}

// rule is what a policy says that both enforcers (the sidecars and the
// rate limit service) read alike: its window and count, with the defaults
// of the CRD schema applied, so that policies built in Go render like
// stored ones.
type rule struct {
	windowMillis, limit                   int64
	algorithm, failMode, mode, durability string
}

// ruleOf reads the rule of a spec; the error is the window's.
func ruleOf(s *v1alpha1.RateLimitPolicySpec) (rule, error) {
	window, err := ParseWindow(string(s.Window))
	return rule{
		windowMillis: window.Milliseconds(),
		limit:        int64(s.Limit),
		algorithm:    string(orDefault(s.Algorithm, v1alpha1.AlgorithmSlidingLog)),
		failMode:     string(orDefault(s.FailMode, v1alpha1.FailOpen)),
		mode:         string(orDefault(s.Mode, v1alpha1.ModeEnforce)),
		durability:   durability(s.Durability),
	}, err
}

// invalidPolicy is the end of rendering one policy for either enforcer: nil
// if errs is empty and the policy passes validate (its document's own
// Validate, the schema's last line of defence), else an
// *InvalidPolicyError with every problem, in the order found.
func invalidPolicy(p *v1alpha1.RateLimitPolicy, errs []error, validate func() error) error {
	if len(errs) == 0 && validate != nil {
		if err := validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return &InvalidPolicyError{Namespace: p.Namespace, Name: p.Name, Err: err}
	}
	return nil
}

// InvalidPolicyError says why a policy cannot be rendered.
type InvalidPolicyError struct {
	Namespace, Name string
	Err             error
}

func (e *InvalidPolicyError) Error() string {
	return fmt.Sprintf("policy %s/%s: %s", e.Namespace, e.Name, strings.ReplaceAll(e.Err.Error(), "\n", "; "))
}

func (e *InvalidPolicyError) Unwrap() error { return e.Err }

// windowPattern is v1alpha1.WindowPattern: the CRD and the renderer accept
// exactly the same windows.
var windowPattern = regexp.MustCompile(v1alpha1.WindowPattern)

// ParseWindow parses a policy's window: whole hours, minutes, seconds and
// milliseconds, largest unit first (v1alpha1.WindowPattern), from 1ms to
// 24h. Nothing is rounded: "500us" and "1.5s" are errors, not 0 or 1s.
func ParseWindow(s string) (time.Duration, error) {
	if s == "" || !windowPattern.MatchString(s) {
		return 0, fmt.Errorf("window %q is not a duration like \"500ms\", \"10s\", \"1m30s\" or \"1h\" (whole numbers with the units h, m, s and ms, largest unit first)", s)
	}
	d, err := time.ParseDuration(s)
	if err != nil { // unreachable for strings the pattern accepts
		return 0, fmt.Errorf("window %q: %w", s, err)
	}
	if d < time.Millisecond || d.Milliseconds() > sidecarconfig.MaxWindowMillis || d%time.Millisecond != 0 {
		return 0, fmt.Errorf("window %q is not from 1ms to 24h", s)
	}
	return d, nil
}

// trustedProxies is the canonical list of a document's trustedProxies,
// the form the sidecar reads back unchanged.
func trustedProxies(in []netip.Prefix) []string {
	var out []string
	for _, p := range sidecarconfig.TrustedProxies(in) {
		out = append(out, p.String())
	}
	return out
}

// Encode returns the canonical bytes of a configuration and their revision.
func Encode(cfg *sidecarconfig.Config) (data []byte, revision string, err error) {
	data, err = sidecarconfig.Marshal(cfg)
	if err != nil {
		return nil, "", err
	}
	return data, Revision(data), nil
}

// Revision is the content hash of a rendered document: the first 16 hex
// digits of its SHA-256. A sidecar can compute it from the file it loaded.
func Revision(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

// PolicyRevisions returns the revision of each policy of a rendered document,
// by name: the content hash of its entry together with the document-wide
// settings that change what the sidecars do with it (version, namespace,
// trusted proxies). It changes when what the sidecars enforce for that policy
// changes, and not when another policy of the namespace comes, goes or
// changes, so that a policy's status is not rewritten for its neighbours
// (the namespace-wide Revision would make adding policies one at a time cost
// a number of status writes quadratic in their count).
func PolicyRevisions(cfg *sidecarconfig.Config) (map[string]string, error) {
	out := make(map[string]string, len(cfg.Policies))
	for i := range cfg.Policies {
		b, err := json.Marshal(struct {
			Version        string               `json:"version"`
			Namespace      string               `json:"namespace"`
			TrustedProxies []string             `json:"trustedProxies,omitempty"`
			Policy         sidecarconfig.Policy `json:"policy"`
		}{cfg.Version, cfg.Namespace, cfg.TrustedProxies, cfg.Policies[i]})
		if err != nil {
			return nil, err
		}
		out[cfg.Policies[i].Name] = Revision(b)
	}
	return out, nil
}

func orDefault[T ~string](v, def T) T {
	if v == "" {
		return def
	}
	return v
}

func selector(ls *metav1.LabelSelector) (sidecarconfig.Selector, error) {
	// LabelSelectorAsSelector checks label keys, values and operators.
	if _, err := metav1.LabelSelectorAsSelector(ls); err != nil {
		return sidecarconfig.Selector{}, err
	}
	var out sidecarconfig.Selector
	if len(ls.MatchLabels) > 0 {
		out.MatchLabels = make(map[string]string, len(ls.MatchLabels))
		for k, v := range ls.MatchLabels {
			out.MatchLabels[k] = v
		}
	}
	for _, r := range ls.MatchExpressions {
		values := slices.Clone(r.Values)
		slices.Sort(values)
		out.MatchExpressions = append(out.MatchExpressions, sidecarconfig.Requirement{
			Key:      r.Key,
			Operator: string(r.Operator),
			Values:   slices.Compact(values),
		})
	}
	return out, nil
}

func clientKey(k *v1alpha1.ClientKey) (sidecarconfig.Key, error) {
	out := sidecarconfig.Key{
		Source:    string(k.Source),
		Name:      k.Name,
		OnMissing: string(orDefault(k.OnMissing, v1alpha1.MissingKeyRemoteAddress)),
	}
	switch k.Source {
	case v1alpha1.KeySourceHeader, v1alpha1.KeySourceQueryParameter, v1alpha1.KeySourceJWTClaim:
		if k.Name == "" {
			return out, fmt.Errorf("key.name is required when key.source is %s", k.Source)
		}
	case v1alpha1.KeySourceRemoteAddress, v1alpha1.KeySourceGlobal:
		if k.Name != "" {
			return out, fmt.Errorf("key.name must not be set when key.source is %s", k.Source)
		}
		if k.OnMissing != "" {
			return out, fmt.Errorf("key.onMissing applies only when key.source is Header, QueryParameter or JWTClaim, not %s", k.Source)
		}
	default:
		return out, fmt.Errorf("key.source %q is not one of RemoteAddress, Header, QueryParameter, JWTClaim, Global", k.Source)
	}
	if err := jwtSettings(k, &out); err != nil {
		return out, err
	}
	if !out.UsesRemoteAddress() {
		if k.RemoteAddress != nil {
			return out, errors.New("key.remoteAddress applies only when the client address is used: source RemoteAddress, or onMissing RemoteAddress (the default for Header, QueryParameter and JWTClaim)")
		}
		return out, nil
	}
	// Only what differs from the sidecar's defaults (X-Forwarded-For, a
	// /64) is rendered: a policy with the defaults then needs no field a
	// first-release sidecar cannot read, and is enforced by it during an
	// upgrade (the old way) rather than held back (sidecarconfig's
	// compatibility rule).
	ca := k.RemoteAddress
	if ca == nil {
		return out, nil
	}
	if ca.ForwardedHeader == v1alpha1.ForwardedHeaderForwarded {
		out.ForwardedHeader = sidecarconfig.ForwardedRFC7239
	}
	if n := int(ca.IPv6PrefixLength); n != 0 && n != sidecarconfig.DefaultIPv6PrefixLength {
		if n < MinIPv6PrefixLength || n > 128 {
			return out, fmt.Errorf("key.remoteAddress.ipv6PrefixLength %d is not from %d to 128", n, MinIPv6PrefixLength)
		}
		out.IPv6PrefixLength = n
	}
	return out, nil
}

// jwtSettings renders key.jwt into out: the verification settings of a
// JWTClaim policy, with no key yet (Options.render adds them). A policy
// that opts out (insecureSkipVerification), or one stored before jwt
// existed, renders no JWT: the sidecar reads its tokens unverified, as
// the first release did.
func jwtSettings(k *v1alpha1.ClientKey, out *sidecarconfig.Key) error {
	j := k.JWT
	if j == nil {
		return nil
	}
	if k.Source != v1alpha1.KeySourceJWTClaim {
		return fmt.Errorf("key.jwt applies only when key.source is JWTClaim, not %s", k.Source)
	}
	if j.InsecureSkipVerification != "" {
		if j.Issuer != "" || len(j.Audiences) > 0 || j.JWKS != nil {
			return errors.New("key.jwt: set issuer, audiences and jwks to verify tokens, or only insecureSkipVerification")
		}
		return nil
	}
	if j.Issuer == "" || len(j.Audiences) == 0 || j.JWKS == nil {
		return errors.New("key.jwt: issuer, audiences and jwks are required to verify tokens")
	}
	if (j.JWKS.ConfigMapKey == "") == (j.JWKS.URL == "") {
		return errors.New("key.jwt.jwks: set exactly one of configMapKey and url")
	}
	audiences := slices.Clone(j.Audiences)
	slices.Sort(audiences)
	out.JWT = &sidecarconfig.JWT{Issuer: j.Issuer, Audiences: slices.Compact(audiences), JWKS: slices.Clone(jwtverify.EmptySet)}
	return nil
}

// LegacyUnverified reports whether p keys on a token claim without saying
// how tokens are verified: a JWTClaim policy stored before key.jwt existed
// (the API server refuses new ones). It renders as it did then, the token
// read unverified, and its status says so loudly.
func LegacyUnverified(p *v1alpha1.RateLimitPolicy) bool {
	return p.Spec.TargetSelector != nil && p.Spec.Key.Source == v1alpha1.KeySourceJWTClaim && p.Spec.Key.JWT == nil
}

// MinIPv6PrefixLength is the shortest IPv6 prefix a policy may count a
// client by (as the CRD's bound).
const MinIPv6PrefixLength = 32

func match(m *v1alpha1.RequestMatch) sidecarconfig.Match {
	var out sidecarconfig.Match
	if m == nil {
		return out
	}
	for _, v := range m.Methods {
		out.Methods = append(out.Methods, string(v))
	}
	for _, v := range m.PathPrefixes {
		out.PathPrefixes = append(out.PathPrefixes, string(v))
	}
	// Only when set: absent means case-sensitive, as before the field.
	if m.PathCase == v1alpha1.PathCaseInsensitive {
		out.PathCase = sidecarconfig.PathCaseInsensitive
	}
	slices.Sort(out.Methods)
	slices.Sort(out.PathPrefixes)
	out.Methods = slices.Compact(out.Methods)
	out.PathPrefixes = slices.Compact(out.PathPrefixes)
	return out
}

// durability is spec.durability as the documents hold it: written only
// when Replicated, so that every other policy renders byte for byte as
// before the field existed.
func durability(d v1alpha1.Durability) string {
	if d == v1alpha1.DurabilityReplicated {
		return sidecarconfig.DurabilityReplicated
	}
	return ""
}
