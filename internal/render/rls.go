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
	if s.RateLimitService == nil {
		add("the policy has no rateLimitService")
		return rlsconfig.Policy{}, &InvalidPolicyError{Namespace: p.Namespace, Name: p.Name, Err: errors.Join(errs...)}
	}
	if s.TargetSelector != nil || s.Key != (v1alpha1.ClientKey{}) || s.Match != nil {
		add("targetSelector, key and match do not apply with rateLimitService")
	}
	window, err := ParseWindow(s.Window)
	if err != nil {
		errs = append(errs, err)
	}
	out := rlsconfig.Policy{
		Namespace:    p.Namespace,
		Name:         p.Name,
		ID:           rlsconfig.PolicyID(p.Namespace, p.Name),
		Domain:       s.RateLimitService.Domain,
		WindowMillis: window.Milliseconds(),
		Limit:        int64(s.Limit),
		Algorithm:    string(orDefault(s.Algorithm, v1alpha1.AlgorithmSlidingLog)),
		FailMode:     string(orDefault(s.FailMode, v1alpha1.FailOpen)),
		Mode:         string(orDefault(s.Mode, v1alpha1.ModeEnforce)),
		Durability:   durability(s.Durability),
	}
	for _, e := range s.RateLimitService.Descriptor {
		out.Descriptor = append(out.Descriptor, rlsconfig.Entry{Key: e.Key, Value: e.Value})
	}
	if len(errs) == 0 {
		// The schema's last line of defence: bounds, enums, the id.
		if err := (&rlsconfig.Config{Version: rlsconfig.Version, Policies: []rlsconfig.Policy{out}}).Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return rlsconfig.Policy{}, &InvalidPolicyError{Namespace: p.Namespace, Name: p.Name, Err: err}
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
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	return cfg, nil
}

// FitRLS chooses the policies the rate limit service's document holds
// within maxBytes (0: DefaultMaxBytes), in the same order of precedence as
// Fit: the oldest first, so a new policy never pushes out an enforced one.
func FitRLS(policies []v1alpha1.RateLimitPolicy, maxBytes int) (fit []v1alpha1.RateLimitPolicy, tooLarge []*ConfigTooLargeError, err error) {
	empty, err := rlsconfig.Marshal(&rlsconfig.Config{Version: rlsconfig.Version, Policies: []rlsconfig.Policy{}})
	if err != nil {
		return nil, nil, fmt.Errorf("render: %w", err)
	}
	return fitWithin(policies, len(empty), maxBytes, true, func(p *v1alpha1.RateLimitPolicy) (int, error) {
		rp, err := RLSPolicy(p)
		if err != nil {
			return 0, err
		}
		return encodedBytes(rp)
	})
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
