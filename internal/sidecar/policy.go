package sidecar

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/ratelimitheader"
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

	configSum, labelsSum [sha256.Size]byte
}

// policy is one policy with everything a request needs precomputed.
type policy struct {
	name     string
	rule     limiter.Rule
	dryRun   bool
	methods  []string
	prefixes []string

	source    string
	keyName   string // canonical header name, query parameter or claim
	onMissing string

	// nameItem is the policy name as an RFC 9651 String, the item of the
	// RateLimit and RateLimit-Policy fields; policyItem is its complete
	// RateLimit-Policy item.
	nameItem   string
	policyItem string

	// counters are this policy's slidegate_sidecar_requests_total series,
	// one per decision, bound when the state is put in force.
	counters [numDecisions]prometheus.Counter
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
		configSum: configSum,
		labelsSum: labelsSum,
	}
	for i := range cfg.Policies {
		p := &cfg.Policies[i]
		if !selectorMatches(p.Selector, labels) {
			continue
		}
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
			dryRun:    p.Mode == "DryRun",
			methods:   slices.Clone(p.Match.Methods),
			prefixes:  slices.Clone(p.Match.PathPrefixes),
			source:    p.Key.Source,
			keyName:   p.Key.Name,
			onMissing: p.Key.OnMissing,
			nameItem:  ratelimitheader.String(p.Name),
		}
		if cp.source == sidecarconfig.SourceHeader {
			cp.keyName = http.CanonicalHeaderKey(cp.keyName)
		}
		cp.policyItem = ratelimitheader.PolicyItem(cp.nameItem, p.Limit, cp.rule.Window)
		st.policies = append(st.policies, cp)
	}
	return st, nil
}

// revisionOf is a short digest of the config and labels files: the
// config_revision_info metric label and the log field.
func revisionOf(configSum, labelsSum [sha256.Size]byte) string {
	h := sha256.New()
	h.Write(configSum[:])
	h.Write(labelsSum[:])
	return hex.EncodeToString(h.Sum(nil)[:6])
}

// matches reports whether the policy applies to a request's method and
// path. Empty lists match everything. A prefix matches the path as received
// (the documented rule) or the path normalised (see cleanRequestPath), so
// that "/public/../admin" or "//admin" cannot slip past a prefix "/admin"
// that the application would route them to: for a limit, matching too much
// is safe, matching too little is a bypass.
func (p *policy) matches(ri *reqInfo) bool {
	if len(p.methods) > 0 && !slices.Contains(p.methods, ri.r.Method) {
		return false
	}
	if len(p.prefixes) == 0 {
		return true
	}
	u := ri.r.URL
	for _, pre := range p.prefixes {
		if strings.HasPrefix(u.Path, pre) || strings.HasPrefix(ri.cleanPath(), pre) ||
			(u.RawPath != "" && strings.HasPrefix(u.RawPath, pre)) {
			return true
		}
	}
	return false
}

// cleanRequestPath is the decoded path with dot segments and repeated
// slashes removed; a trailing slash is kept. It is used for matching only:
// the request is forwarded unchanged.
func cleanRequestPath(p string) string {
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	c := path.Clean(p)
	if c != "/" && strings.HasSuffix(p, "/") {
		c += "/"
	}
	return c
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
