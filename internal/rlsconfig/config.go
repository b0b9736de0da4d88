// Package rlsconfig is the contract between the controller, which renders
// every RateLimitPolicy addressed to Envoy's rate limit service into one
// ConfigMap, and the RLS server (internal/rls), which loads it. Like
// sidecarconfig, it holds only the document and its validation, so both
// sides import it without importing each other.
package rlsconfig

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

const (
	// ConfigMapName is the ConfigMap, in the manager's namespace, that
	// holds the rendered config under FileName.
	ConfigMapName = "slidegate-rls-config"
	// FileName is the ConfigMap key and the file name in the mounted volume.
	FileName = "config.json"
	// IDPrefix starts every policy ID: "rls/<namespace>/<name>". The sidecar's
	// rule IDs never start with it, so the two never share Redis keys.
	IDPrefix = "rls/"
)

// DurabilityReplicated is Policy.Durability for an admit that counts once
// a replica has it.
const DurabilityReplicated = sidecarconfig.DurabilityReplicated

// Bounds of a config. The limit and window bounds are the sidecar's (the
// CRD's); the others bound what a request is matched against.
const (
	MaxLimit        = sidecarconfig.MaxLimit
	MaxWindowMillis = sidecarconfig.MaxWindowMillis
	// MaxEntries bounds a policy's descriptor (Envoy descriptors are short:
	// one entry per rate limit action).
	MaxEntries = 16
	// MaxStringBytes bounds a domain, an entry key and an entry value.
	MaxStringBytes = 256
)

// Config is the whole document.
type Config struct {
	Version  string   `json:"version"`  // VersionOf(the minor it needs), see version.go
	Policies []Policy `json:"policies"` // sorted by ID

	// Skipped are the policies of a newer minor version that Parse left
	// out because they have fields this version does not know. Not part of
	// the document.
	Skipped []sidecarconfig.Skipped `json:"-"`
}

// Policy is one RateLimitPolicy addressed to the RLS server.
type Policy struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// ID is "rls/<namespace>/<name>": the Redis rule id, stable across
	// limit changes so that a reload keeps the counts.
	ID     string `json:"id"`
	Domain string `json:"domain"`
	// Descriptor is the descriptor a request must carry for the policy to
	// count it: same length, same keys in order, and the same value
	// wherever Value is set.
	Descriptor   []Entry `json:"descriptor"`
	WindowMillis int64   `json:"windowMillis"`
	Limit        int64   `json:"limit"`
	Algorithm    string  `json:"algorithm"` // SlidingLog | SlidingWindowCounter
	FailMode     string  `json:"failMode"`  // Open | Closed
	Mode         string  `json:"mode"`      // Enforce | DryRun
	// Durability is sidecarconfig.DurabilityReplicated, or absent: as
	// sidecarconfig.Policy's.
	Durability string `json:"durability,omitempty" minor:"1"`
	// Cost, when set, makes the policy weighted (issue 27): Limit is the
	// cost allowed in any window, and the gateway sends each cost as a
	// descriptor's hits_addend, so Cost only says which calls carry it:
	// exactly one of Request and Response, both empty (validateCost).
	Cost *Cost `json:"cost,omitempty" minor:"2"`
	// AdditionalLimits are more windows for the same clients, as
	// sidecarconfig.Policy's: a call is admitted only when every window
	// has room.
	AdditionalLimits []Limit `json:"additionalLimits,omitempty" minor:"3"`
	// Quotas are limits per calendar period for the same clients, as
	// sidecarconfig.Policy's: a call is admitted only when the windows and
	// every quota have room.
	Quotas []Quota `json:"quotas,omitempty" minor:"4"`
}

// Quota is the sidecars' type of a quota (one home).
type Quota = sidecarconfig.Quota

// Limit is the sidecars' type of an additional window (one home).
type Limit = sidecarconfig.Limit

// Cost is the sidecars' cost type (one home); in this document its parts
// are empty.
type Cost = sidecarconfig.Cost

// RequestCost is the sidecars' type; empty in this document.
type RequestCost = sidecarconfig.RequestCost

// ResponseCost is the sidecars' type; empty in this document.
type ResponseCost = sidecarconfig.ResponseCost

// validateCost checks a policy's cost for the rate limit service: the
// cost comes from hits_addend, so its parts name no source, and a policy
// has one of them only. With Request, a hits_addend above 0 is a request's
// cost, admitted only if it fits; with Response, it is a response's cost
// that Envoy's apply_on_stream_done call charges, even past the limit.
// Nothing in that call tells it apart from the request's own, so one
// policy cannot have both.
func validateCost(c *Cost) []error {
	var errs []error
	switch {
	case c.Request == nil && c.Response == nil:
		errs = append(errs, errors.New("cost needs request or response"))
	case c.Request != nil && c.Response != nil:
		errs = append(errs, errors.New("cost: set request or response, not both (an after-stream call looks like any other)"))
	}
	if c.Request != nil && *c.Request != (RequestCost{}) {
		errs = append(errs, errors.New("cost.request must be empty: the gateway sends the cost as hits_addend"))
	}
	if r := c.Response; r != nil && (r.Header != "" || len(r.JSONFields) > 0 || r.Default != 0) {
		errs = append(errs, errors.New("cost.response must be empty: the gateway sends the cost as hits_addend"))
	}
	return errs
}

// Entry is one descriptor entry of a policy.
type Entry struct {
	Key string `json:"key"`
	// Value "" matches any value; the values of the entries without Value
	// identify the client (joined unambiguously); a descriptor whose
	// entries all have a Value is one global bucket.
	Value string `json:"value,omitempty"`
}

// PolicyID is the ID of the policy namespace/name.
func PolicyID(namespace, name string) string { return IDPrefix + namespace + "/" + name }

// Parse reads and validates a document. Unknown fields are errors (a typo
// in a hand-edited ConfigMap must not drop a limit), except in the
// policies of a document of a newer minor version (a newer controller):
// those are left out and listed in Skipped, and the others are enforced
// (version.go).
func Parse(data []byte) (*Config, error) {
	var c Config
	if err := decode(data, &c); err != nil {
		return nil, fmt.Errorf("rls config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Marshal writes the document in its canonical form (what the controller
// writes, byte for byte the same for the same policies).
func Marshal(c *Config) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return sidecarconfig.MarshalCanonical(c)
}

// Validate checks everything the server relies on; it is the last line of
// defence behind the CRD schema, for a ConfigMap edited by hand.
func (c *Config) Validate() error {
	var errs []error
	if err := c.checkVersion(); err != nil {
		errs = append(errs, err)
	}
	if !slices.IsSortedFunc(c.Policies, func(a, b Policy) int { return strings.Compare(a.ID, b.ID) }) {
		errs = append(errs, errors.New("policies are not sorted by id"))
	}
	seen := map[string]bool{}
	for i := range c.Policies {
		p := &c.Policies[i]
		if seen[p.ID] {
			errs = append(errs, fmt.Errorf("policy %q appears twice", p.ID))
		}
		seen[p.ID] = true
		if err := p.validate(); err != nil {
			errs = append(errs, fmt.Errorf("policy %q: %w", p.ID, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("rls config: %w", errors.Join(errs...))
	}
	return nil
}

func (p *Policy) validate() error {
	var errs []error
	if p.Namespace == "" || p.Name == "" {
		errs = append(errs, errors.New("namespace and name are required"))
	}
	if want := PolicyID(p.Namespace, p.Name); p.ID != want {
		errs = append(errs, fmt.Errorf("id is not %q", want))
	}
	if err := boundedString("domain", p.Domain); err != nil {
		errs = append(errs, err)
	}
	if n := len(p.Descriptor); n == 0 || n > MaxEntries {
		errs = append(errs, fmt.Errorf("descriptor has %d entries, want 1 to %d", n, MaxEntries))
	}
	for i, e := range p.Descriptor {
		if err := boundedString(fmt.Sprintf("descriptor[%d].key", i), e.Key); err != nil {
			errs = append(errs, err)
		}
		if len(e.Value) > MaxStringBytes {
			errs = append(errs, fmt.Errorf("descriptor[%d].value longer than %d bytes", i, MaxStringBytes))
		}
	}
	errs = append(errs, sidecarconfig.ValidateRule(sidecarconfig.RuleFields{
		WindowMillis: p.WindowMillis, Limit: p.Limit,
		Algorithm: p.Algorithm, FailMode: p.FailMode, Mode: p.Mode, Durability: p.Durability,
	})...)
	if p.Cost != nil {
		errs = append(errs, validateCost(p.Cost)...)
	}
	errs = append(errs, sidecarconfig.ValidateAdditionalLimits(p.WindowMillis, p.AdditionalLimits, p.Cost != nil)...)
	errs = append(errs, sidecarconfig.ValidateQuotas(p.Quotas, p.Cost != nil)...)
	return errors.Join(errs...)
}

func boundedString(field, s string) error {
	if s == "" || len(s) > MaxStringBytes {
		return fmt.Errorf("%s must have 1 to %d bytes", field, MaxStringBytes)
	}
	return nil
}
