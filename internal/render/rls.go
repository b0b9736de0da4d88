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

package render

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/rlsconfig"
)

// The rate limit service's configuration is one document for the whole
// cluster (the RLS server answers every gateway), so it is rendered from the
// policies of every namespace that set spec.rateLimitService, keyed by
// namespace and name.

// RLSPolicy renders one policy for the rate limit service, or says why it
// cannot be (an *InvalidPolicyError).
func RLSPolicy(p *v1alpha1.RateLimitPolicy) (rlsconfig.Policy, error) {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	s := &p.Spec
	if p.Name == "" || p.Namespace == "" {
		add("the policy needs a name and a namespace")
	}
	target := s.RateLimitService
	switch {
	case target != nil && len(s.TargetRefs) > 0:
		add("set rateLimitService or targetRefs, not both")
	case target != nil:
		if s.TargetSelector != nil || s.Key != (v1alpha1.ClientKey{}) || s.Match != nil {
			add("targetSelector, key and match do not apply with rateLimitService")
		}
		if target.Domain == v1alpha1.TargetRefsDomain {
			add("the domain %s is reserved for policies with targetRefs", v1alpha1.TargetRefsDomain)
		}
	case len(s.TargetRefs) > 0:
		if s.TargetSelector != nil {
			add("targetSelector does not apply with targetRefs")
		}
		var err error
		if target, err = AttachedDescriptor(p); err != nil {
			errs = append(errs, err)
		}
	default:
		add("the policy has neither rateLimitService nor targetRefs")
	}
	if target == nil {
		return rlsconfig.Policy{}, invalidPolicy(p, errs, nil)
	}
	r, err := ruleOf(s)
	if err != nil {
		errs = append(errs, err)
	}
	more, err := additionalLimits(s.AdditionalLimits)
	if err != nil {
		errs = append(errs, err)
	}
	out := rlsconfig.Policy{
		Namespace:        p.Namespace,
		Name:             p.Name,
		ID:               rlsconfig.PolicyID(p.Namespace, p.Name),
		Domain:           target.Domain,
		WindowMillis:     r.windowMillis,
		Limit:            r.limit,
		Algorithm:        r.algorithm,
		FailMode:         r.failMode,
		Mode:             r.mode,
		Durability:       r.durability,
		Cost:             cost(s.Cost),
		AdditionalLimits: more,
		Quotas:           quotas(s.Quotas),
	}
	for _, e := range target.Descriptor {
		out.Descriptor = append(out.Descriptor, rlsconfig.Entry{Key: e.Key, Value: e.Value})
	}
	// The document's Validate checks bounds, enums, the id and the cost.
	one := []rlsconfig.Policy{out}
	if err := invalidPolicy(p, errs, (&rlsconfig.Config{Version: rlsconfig.VersionFor(one), Policies: one}).Validate); err != nil {
		return rlsconfig.Policy{}, err
	}
	return out, nil
}

// RLS renders the rate limit service's document from valid policies
// (see RLSPolicy; the caller leaves out the invalid ones and those FitRLS
// leaves out). The order of policies does not matter.
func RLS(policies []v1alpha1.RateLimitPolicy) (*rlsconfig.Config, error) {
	cfg := &rlsconfig.Config{Version: rlsconfig.Version, Policies: make([]rlsconfig.Policy, 0, len(policies))}
	var errs []error
	for i := range policies {
		rp, err := RLSPolicy(&policies[i])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cfg.Policies = append(cfg.Policies, rp)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	slices.SortFunc(cfg.Policies, func(a, b rlsconfig.Policy) int { return strings.Compare(a.ID, b.ID) })
	// The oldest version that carries them: servers of the first release
	// read "v1" only (rlsconfig's compatibility rule).
	cfg.Version = rlsconfig.VersionFor(cfg.Policies)
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	return cfg, nil
}

// FitRLS chooses the policies the rate limit service's document holds
// within maxBytes (0: DefaultMaxBytes). The document is one for the whole
// cluster, so that no namespace can fill it for the others, the budget is
// shared: each of the N namespaces that have such policies is guaranteed
// 1/N of it. First, each namespace takes its own policies in order of
// precedence (the oldest first, then by name, as Fit) while they fit in its
// share; then the room the namespaces left goes to the remaining policies
// in order of precedence across namespaces, as it all did before shares. A
// namespace within its share therefore keeps every policy whatever the
// others add; one above it keeps its share and whatever the others leave
// (a namespace that comes later, or grows within its share, can take that
// back). A policy left out at its turn never fits afterwards, so the
// document holds as much as it can. What a policy costs depends on the
// policy alone, so the same policies always give the same choice.
func FitRLS(policies []v1alpha1.RateLimitPolicy, maxBytes int) (fit []v1alpha1.RateLimitPolicy, tooLarge []*ConfigTooLargeError, err error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	if len(policies) == 0 {
		return nil, nil, nil
	}
	empty, err := rlsconfig.Marshal(&rlsconfig.Config{Version: rlsconfig.Version, Policies: []rlsconfig.Policy{}})
	if err != nil {
		return nil, nil, fmt.Errorf("render: %w", err)
	}
	cost, err := rlsCosts(policies)
	if err != nil {
		return nil, nil, err
	}
	order := byPrecedence(policies)
	// The bytes all policies can take: the budget less the empty document
	// and what a non-empty list adds.
	room := maxBytes - len(empty) - listBytes
	used := map[string]int{} // bytes kept, by namespace: every one with policies
	for i := range policies {
		used[policies[i].Namespace] = 0
	}
	share := max(room, 0) / len(used)

	keep := make([]bool, len(policies))
	for _, i := range order { // each namespace within its share
		ns := policies[i].Namespace
		if used[ns]+cost[i] <= share {
			used[ns] += cost[i]
			keep[i] = true
		}
	}
	total := 0
	for _, b := range used {
		total += b
	}
	for _, i := range order { // what the shares left, by precedence
		if keep[i] {
			continue
		}
		p := &policies[i]
		if total+cost[i] <= room {
			total += cost[i]
			used[p.Namespace] += cost[i]
			keep[i] = true
			continue
		}
		tooLarge = append(tooLarge, &ConfigTooLargeError{
			Namespace: p.Namespace, Name: p.Name,
			PolicyBytes: cost[i], TotalBytes: len(empty) + listBytes + total + cost[i], MaxBytes: maxBytes,
			RateLimitService: true, Namespaces: len(used), ShareBytes: share, NamespaceBytes: used[p.Namespace],
		})
	}
	return kept(policies, keep), tooLarge, nil
}

// kept is the policies whose keep is true, in their order.
func kept(policies []v1alpha1.RateLimitPolicy, keep []bool) (fit []v1alpha1.RateLimitPolicy) {
	for i := range policies {
		if keep[i] {
			fit = append(fit, policies[i])
		}
	}
	return fit
}

// rlsCosts is what each policy adds to the rate limit service's document,
// in bytes.
func rlsCosts(policies []v1alpha1.RateLimitPolicy) ([]int, error) {
	cost := make([]int, len(policies))
	var errs []error
	for i := range policies {
		rp, err := RLSPolicy(&policies[i])
		if err == nil {
			cost[i], err = encodedBytes(rp)
		}
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	return cost, nil
}

// byPrecedence are the indexes of policies, the policy that keeps its place
// first (precedence).
func byPrecedence(policies []v1alpha1.RateLimitPolicy) []int {
	order := make([]int, len(policies))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return precedence(&policies[a], &policies[b]) })
	return order
}

// EncodeRLS returns the canonical bytes of the rate limit service's
// document and their revision.
func EncodeRLS(cfg *rlsconfig.Config) (data []byte, revision string, err error) {
	data, err = rlsconfig.Marshal(cfg)
	if err != nil {
		return nil, "", err
	}
	return data, rlsconfig.Revision(data), nil
}
