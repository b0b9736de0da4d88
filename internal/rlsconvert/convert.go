// Package rlsconvert turns the configuration of envoyproxy/ratelimit (its
// config.yaml: a domain and a tree of descriptors with rate limits) into
// RateLimitPolicies for slidegate's rate limit service, and says what does
// not map and why. Gateways keep their rate limit actions: the descriptors
// they send are the same.
//
// Where the two differ, the converter reports it instead of guessing:
//   - envoyproxy/ratelimit counts fixed windows of one unit; a policy counts
//     a sliding window of that length, exact at every instant, so the
//     double burst at a window's edge is gone;
//   - envoyproxy/ratelimit applies only the most specific match of a key
//     (key=value before key alone) and lets one limit replace another;
//     slidegate applies every matching policy, all or nothing;
//   - windows go up to 24h and limits from 1 to 1,000,000; values match
//     exactly (no wildcards); a descriptor has at most 8 entries.
package rlsconvert

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// The configuration file, with every key envoyproxy/ratelimit knows (it
// refuses others, and so does Convert).
type (
	config struct {
		Domain      string       `json:"domain"`
		Descriptors []descriptor `json:"descriptors"`
	}
	descriptor struct {
		Key            string       `json:"key"`
		Value          string       `json:"value"`
		RateLimit      *rateLimit   `json:"rate_limit"`
		Descriptors    []descriptor `json:"descriptors"`
		ShadowMode     bool         `json:"shadow_mode"`
		DetailedMetric bool         `json:"detailed_metric"`
	}
	rateLimit struct {
		RequestsPerUnit int64  `json:"requests_per_unit"`
		Unit            string `json:"unit"`
		Unlimited       bool   `json:"unlimited"`
		Name            string `json:"name"`
		Replaces        []struct {
			Name string `json:"name"`
		} `json:"replaces"`
	}
)

// windows are the units that map, as policy windows.
var windows = map[string]string{"second": "1s", "minute": "1m", "hour": "1h", "day": "24h"}

// maxEntries and maxLimit are the RateLimitPolicy schema's bounds.
const (
	maxEntries = 8
	maxLimit   = 1000000
)

// Note is what a converted rate limit changes, or why one did not map.
type Note struct {
	// Descriptor is the rate limit's place in the file: domain.key_value.key...
	Descriptor string `json:"descriptor"`
	// Policy is the policy written for it; empty when none was.
	Policy string `json:"policy,omitempty"`
	// Message says what differs or why nothing was written.
	Message string `json:"message"`
}

// Result is what Convert made of one file.
type Result struct {
	Policies []v1alpha1.RateLimitPolicy
	Notes    []Note
}

// Convert reads one envoyproxy/ratelimit configuration file and returns the
// policies, in namespace, that limit what its rate limits limit, in the
// file's order, with the notes.
func Convert(file []byte, namespace string) (Result, error) {
	var c config
	if err := yaml.UnmarshalStrict(file, &c); err != nil {
		return Result{}, fmt.Errorf("not an envoyproxy/ratelimit configuration: %w", err)
	}
	if c.Domain == "" {
		return Result{}, fmt.Errorf("the configuration has no domain")
	}
	var r Result
	names := map[string]bool{}
	r.walk(c.Domain, namespace, nil, c.Domain, c.Descriptors, names)
	return r, nil
}

// walk converts the descriptors below path (the entries above them).
func (r *Result) walk(domain, namespace string, path []v1alpha1.DescriptorEntry, where string, ds []descriptor, names map[string]bool) {
	for _, d := range ds {
		here := where + "." + d.Key
		if d.Value != "" {
			here += "_" + d.Value
		}
		if d.Key == "" {
			r.Notes = append(r.Notes, Note{Descriptor: here, Message: "an entry without a key (envoyproxy/ratelimit refuses it too): nothing below it converted"})
			continue
		}
		if strings.HasSuffix(d.Value, "*") {
			r.Notes = append(r.Notes, Note{Descriptor: here, Message: "a wildcard value: a policy matches values exactly; nothing below it converted"})
			continue
		}
		entries := append(append([]v1alpha1.DescriptorEntry(nil), path...), v1alpha1.DescriptorEntry{Key: d.Key, Value: d.Value})
		if len(entries) > maxEntries {
			r.Notes = append(r.Notes, Note{Descriptor: here, Message: fmt.Sprintf("more than %d entries: a policy's descriptor has at most %d; nothing below it converted", maxEntries, maxEntries)})
			continue
		}
		if d.RateLimit != nil {
			r.limit(domain, namespace, entries, here, d, shadowed(ds, d), names)
		}
		r.walk(domain, namespace, entries, here, d.Descriptors, names)
	}
}

// shadowed says whether d, a key with a value, has a sibling of the same
// key without one: envoyproxy/ratelimit then applies d's subtree alone,
// slidegate both.
func shadowed(siblings []descriptor, d descriptor) bool {
	if d.Value == "" {
		return false
	}
	for _, s := range siblings {
		if s.Key == d.Key && s.Value == "" {
			return true
		}
	}
	return false
}

// limit converts the rate limit of d, at entries.
func (r *Result) limit(domain, namespace string, entries []v1alpha1.DescriptorEntry, here string, d descriptor, hasDefault bool, names map[string]bool) {
	rl := d.RateLimit
	note := func(policy, msg string) {
		r.Notes = append(r.Notes, Note{Descriptor: here, Policy: policy, Message: msg})
	}
	if rl.Unlimited {
		msg := "unlimited: no policy written"
		if hasDefault {
			msg += fmt.Sprintf("; a policy has no exemption: the limit for %q without a value applies to this value too", d.Key)
		}
		note("", msg)
		return
	}
	window, ok := windows[strings.ToLower(rl.Unit)]
	if !ok {
		note("", fmt.Sprintf("unit %q: a policy's window is at most 24h (second, minute, hour, day)", rl.Unit))
		return
	}
	if rl.RequestsPerUnit < 1 || rl.RequestsPerUnit > maxLimit {
		note("", fmt.Sprintf("%d requests per %s: a policy's limit is from 1 to %d", rl.RequestsPerUnit, strings.ToLower(rl.Unit), maxLimit))
		return
	}
	name := policyName(domain, entries, rl.Name, names)
	p := v1alpha1.RateLimitPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "RateLimitPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: v1alpha1.RateLimitPolicySpec{
			RateLimitService: &v1alpha1.RateLimitServiceTarget{Domain: domain, Descriptor: entries},
			Window:           v1alpha1.Duration(window),
			Limit:            int32(rl.RequestsPerUnit),
		},
	}
	if d.ShadowMode {
		p.Spec.Mode = v1alpha1.ModeDryRun
	}
	r.Policies = append(r.Policies, p)
	if hasDefault {
		note(name, fmt.Sprintf("the policy for %q without a value applies to this value too: slidegate applies every matching policy, envoyproxy/ratelimit only the most specific", d.Key))
	}
	if len(rl.Replaces) > 0 {
		note(name, "replaces: a policy replaces no other; every matching policy applies, all or nothing")
	}
	if d.DetailedMetric {
		note(name, "detailed_metric: no per-value series (a client's value is a key, not a label)")
	}
}

var notName = regexp.MustCompile(`[^a-z0-9]+`)

// policyName is the rate limit's name when it is one a policy can have,
// else one made of the domain and the entries; a name taken, or cut to fit,
// gets a hash of the whole descriptor.
func policyName(domain string, entries []v1alpha1.DescriptorEntry, name string, taken map[string]bool) string {
	full := domain
	for _, e := range entries {
		full += "." + e.Key + "_" + e.Value
	}
	n := strings.Trim(notName.ReplaceAllString(strings.ToLower(name), "-"), "-")
	if n == "" || n != strings.ToLower(name) {
		parts := []string{domain}
		for _, e := range entries {
			parts = append(parts, e.Key, e.Value)
		}
		n = strings.Trim(notName.ReplaceAllString(strings.ToLower(strings.Join(parts, "-")), "-"), "-")
	}
	if len(n) > 63 || taken[n] || n == "" {
		sum := sha256.Sum256([]byte(full))
		n = strings.Trim(n[:min(len(n), 54)], "-") + "-" + hex.EncodeToString(sum[:])[:8]
	}
	taken[n] = true
	return n
}

// Header is said once above the policies: the difference every converted
// limit has.
const Header = `Converted from envoyproxy/ratelimit. Each policy counts a sliding window
as long as the rate limit's unit, exact at every instant: a fixed window let
up to twice the limit through across its edge, a policy never does. Every
policy that matches a request applies (all or nothing).`

// YAML is the policies as one YAML stream, the header and the notes above
// them as comments.
func (r Result) YAML() ([]byte, error) {
	var b strings.Builder
	for _, line := range strings.Split(Header, "\n") {
		b.WriteString("# " + line + "\n")
	}
	for _, n := range r.Notes {
		what := "not converted"
		if n.Policy != "" {
			what = "policy " + n.Policy
		}
		b.WriteString("# " + n.Descriptor + " (" + what + "): " + n.Message + "\n")
	}
	for _, p := range r.Policies {
		out, err := yaml.Marshal(policyDoc{p.TypeMeta, policyMeta{p.Name, p.Namespace}, p.Spec})
		if err != nil {
			return nil, err
		}
		b.WriteString("---\n")
		b.Write(out)
	}
	return []byte(b.String()), nil
}

// policyDoc is a policy as a user writes it: no status, no empty metadata.
type (
	policyDoc struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        policyMeta                   `json:"metadata"`
		Spec            v1alpha1.RateLimitPolicySpec `json:"spec"`
	}
	policyMeta struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	}
)
