package sidecar

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/jwtverify"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/ratelimitheader"
	"github.com/slidegate/slidegate/internal/respcost"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// state is one loaded configuration compiled for this pod: immutable, shared
// by all requests through an atomic pointer, replaced whole on reload. A
// request keeps the state it started with, so a reload never disturbs one
// in flight.
type state struct {
	// revision identifies the config and labels this state was built from.
	revision  string
	namespace string
	trusted   trustedProxies
	// policies are those whose selector matches the pod's labels, in the
	// config's order (by name).
	policies []*policy
	// total is the number of policies in the config, matching or not.
	total int
	// skipped are the config's policies this sidecar cannot read (a newer
	// controller's, see sidecarconfig.Parse), matching or not.
	skipped []sidecarconfig.Skipped

	configSum, labelsSum [sha256.Size]byte
}

// policy is one policy with everything a request needs precomputed.
type policy struct {
	name    string
	rule    limiter.Rule
	dryRun  bool
	methods []string // upper case, HEAD wherever GET is (compileMethods)
	// prefixes are the path prefixes, case-folded (foldCase) when foldCase
	// is set.
	prefixes []string
	foldCase bool

	source    string
	keyName   string // canonical header name, query parameter or claim
	onMissing string
	// forwarded is the header the client address is read from behind a
	// trusted proxy; ipv6Bits the prefix length IPv6 clients are counted
	// by (0: the whole address).
	forwarded forwardedMode
	ipv6Bits  int
	// jwt verifies the bearer tokens of a JWTClaim policy; nil: they are
	// read unverified (the policy says a gateway verified them). Policies
	// with the same settings share one, built once per loaded config.
	jwt *jwtverify.Verifier
	// tokens are its slidegate_sidecar_jwt_tokens_total series, by
	// failure ("" for verified); nil without jwt.
	tokens map[jwtverify.Failure]prometheus.Counter

	// nameItem is the policy name as an RFC 9651 String, the item of the
	// RateLimit and RateLimit-Policy fields; policyItem is its complete
	// RateLimit-Policy item.
	nameItem   string
	policyItem string

	// reqCost and respCost are a cost policy's (spec.cost; rule.Weighted):
	// its cost when the request arrives, and the rule that measures the
	// response's (nil: none).
	reqCost  *requestCost
	respCost *respcost.Rule

	// counters are this policy's slidegate_sidecar_requests_total series,
	// one per outcome, bound when the state is put in force.
	counters enforce.Counters

	// windows are the policy's additional windows (additionalLimits), in
	// the config's order: each a copy of the policy with its own rule
	// (Variant set, so its own keys in the policy's slot) and header
	// items, and of set to the policy. A request asks the limiter about
	// the policy and each of its windows together, all or nothing.
	windows []*policy
	// of is the policy an additional window belongs to, nil for a policy:
	// its outcome counts as the policy's, not apart. windowName is an
	// additional window's name, as its RateLimit item spells it ("api/1h").
	of         *policy
	windowName string
	// quota is the quota a copy counts (spec.quotas), nil for a window.
	quota *sidecarconfig.Quota
}

// compile builds the state of a validated config for a pod with labels.
func compile(cfg *sidecarconfig.Config, labels map[string]string, configSum, labelsSum [sha256.Size]byte) (*state, error) {
	trusted, err := parseTrustedProxies(cfg.TrustedProxies)
	if err != nil {
		return nil, err
	}
	st := &state{
		revision:  revisionOf(configSum, labelsSum),
		namespace: cfg.Namespace,
		trusted:   trusted,
		total:     len(cfg.Policies),
		skipped:   cfg.Skipped,
		configSum: configSum,
		labelsSum: labelsSum,
	}
	verifiers := map[string]*jwtverify.Verifier{}
	for i := range cfg.Policies {
		p := &cfg.Policies[i]
		if !selectorMatches(p.Selector, labels) {
			continue
		}
		cp, err := compilePolicy(p, verifiers)
		if err != nil {
			return nil, err
		}
		st.policies = append(st.policies, cp)
	}
	return st, nil
}

// compilePolicy builds the state of one policy; verifiers holds the JWT
// verifiers already built, shared by the policies of the same settings.
func compilePolicy(p *sidecarconfig.Policy, verifiers map[string]*jwtverify.Verifier) (*policy, error) {
	var err error
	cp := &policy{
		name: p.Name,
		rule: limiter.Rule{
			ID:        p.ID,
			Limit:     p.Limit,
			Window:    time.Duration(p.WindowMillis) * time.Millisecond,
			Algorithm: limiter.Algorithm(p.Algorithm),
			FailMode:  limiter.FailMode(p.FailMode),
			Replicas:  int(p.Replicas),
			Durable:   p.Durability == sidecarconfig.DurabilityReplicated,
		},
		dryRun:    p.Mode == sidecarconfig.ModeDryRun,
		methods:   compileMethods(p.Match.Methods),
		prefixes:  slices.Clone(p.Match.PathPrefixes),
		foldCase:  p.Match.PathCase == sidecarconfig.PathCaseInsensitive,
		source:    p.Key.Source,
		keyName:   p.Key.Name,
		onMissing: p.Key.OnMissing,
		forwarded: forwardedModeOf(p.Key.ForwardedHeader),
		ipv6Bits:  p.Key.IPv6Prefix(),
		nameItem:  ratelimitheader.String(p.Name),
	}
	if cp.foldCase {
		for i, pre := range cp.prefixes {
			cp.prefixes[i] = foldCase(pre)
		}
	}
	if cp.source == sidecarconfig.SourceHeader {
		cp.keyName = http.CanonicalHeaderKey(cp.keyName)
	}
	if cp.jwt, err = verifierOf(p.Key.JWT, verifiers); err != nil {
		return nil, fmt.Errorf("policy %s: key.jwt: %w", p.Name, err)
	}
	if c := p.Cost; c != nil {
		cp.rule.Weighted = true
		if c.Request != nil {
			cp.reqCost = compileRequestCost(c.Request)
		}
		if rc := c.Response; rc != nil {
			spec := respcost.Spec{Header: rc.Header, JSONFields: rc.JSONFields, Default: rc.Default}
			if cp.respCost, err = respcost.Compile(spec); err != nil {
				return nil, fmt.Errorf("policy %s: cost.response: %w", p.Name, err)
			}
		}
	}
	cp.policyItem = ratelimitheader.PolicyItem(cp.nameItem, p.Limit, cp.rule.Window)
	for _, l := range p.AdditionalLimits {
		w := *cp
		w.of = cp
		w.rule.Limit = l.Limit
		w.rule.Window = time.Duration(l.WindowMillis) * time.Millisecond
		w.rule.Variant = l.Variant()
		// Each window is an item of its own in the RateLimit fields
		// (the draft's several-policies form): "api/1h".
		w.windowName = l.ItemName(p.Name)
		w.nameItem = ratelimitheader.String(w.windowName)
		w.policyItem = ratelimitheader.PolicyItem(w.nameItem, l.Limit, w.rule.Window)
		cp.windows = append(cp.windows, &w)
	}
	for _, q := range p.Quotas {
		loc, err := q.Location()
		if err != nil {
			return nil, fmt.Errorf("policy %s: quota %s: %w", p.Name, q.Period, err)
		}
		cal, err := limiter.NewCalendar(limiter.CalendarUnit(q.Period), loc)
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", p.Name, err)
		}
		// A quota is asked with the policy as its windows are: a copy with
		// a calendar rule (the limiter sets its window to the period's
		// length), an item of its own ("api/day"), no w in its policy item.
		w := *cp
		w.of = cp
		w.rule.Limit = q.Limit
		w.rule.Window = 0
		w.rule.Algorithm = limiter.SlidingLog
		w.rule.Calendar = cal
		w.rule.Variant = q.Variant()
		w.windowName = q.ItemName(p.Name)
		w.nameItem = ratelimitheader.String(w.windowName)
		w.policyItem = ratelimitheader.PolicyItem(w.nameItem, q.Limit, 0)
		w.quota = &q
		cp.windows = append(cp.windows, &w)
	}
	return cp, nil
}

// verifierOf is the verifier of j (nil for nil), shared through built
// with every policy of the same settings: its keys are parsed once per
// loaded config, not per request nor per policy.
func verifierOf(j *sidecarconfig.JWT, built map[string]*jwtverify.Verifier) (*jwtverify.Verifier, error) {
	if j == nil {
		return nil, nil
	}
	id := j.Issuer + "\x00" + strings.Join(j.Audiences, "\x00") + "\x00" + string(j.JWKS)
	if v, ok := built[id]; ok {
		return v, nil
	}
	set, err := jwtverify.Parse(j.JWKS)
	if err != nil {
		return nil, err
	}
	v, err := jwtverify.NewVerifier(j.Issuer, j.Audiences, set)
	if err != nil {
		return nil, err
	}
	built[id] = v
	return v, nil
}

// revisionOf is a short digest of the config and labels files: the
// config_revision_info metric label and the log field.
func revisionOf(configSum, labelsSum [sha256.Size]byte) string {
	h := sha256.New()
	h.Write(configSum[:])
	h.Write(labelsSum[:])
	return hex.EncodeToString(h.Sum(nil)[:6])
}

// String describes st for the log: its revision and how many policies of
// the config apply to the pod.
func (st *state) String() string {
	return fmt.Sprintf("revision %s: %d of %d policies apply", st.revision, len(st.policies), st.total)
}

// policyNamed is the policy of st called name (names are unique in a
// valid config), nil when none applies to the pod.
func (st *state) policyNamed(name string) *policy {
	for _, p := range st.policies {
		if p.name == name {
			return p
		}
	}
	return nil
}

// policyNames lists the names of st's policies for a message.
func (st *state) policyNames() string {
	names := make([]string, 0, len(st.policies))
	for _, p := range st.policies {
		names = append(names, p.name)
	}
	return strings.Join(names, ", ")
}
