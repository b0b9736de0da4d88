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
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// The controller's two entry points: Namespace for a namespace's sidecars,
// Service for the rate limit service. Each runs the whole pipeline (check
// each policy, hold back, fit, render, encode, per-policy revisions) and
// says what became of every policy, so that a policy left out does not
// block the others and its status can say why.

// NamespaceResult is a namespace's sidecar configuration and what became of
// each of its policies.
type NamespaceResult struct {
	// Data is the ConfigMap's document and Revision its hash.
	Data     []byte
	Revision string
	// Revisions holds each accepted policy's own revision, by policy name:
	// a policy's status names its own, so that a policy coming or going
	// rewrites no other policy's status.
	Revisions map[string]string
	// NotAccepted holds, by policy name, why each policy left out of Data
	// is: an *InvalidPolicyError, a *FootprintTooLargeError or a
	// *ConfigTooLargeError.
	NotAccepted map[string]error
	// TooLarge counts the policies left out for want of room.
	TooLarge int
	// HeldBack holds, by name, the minor version of the document that each
	// valid policy left out for the namespace's legacy sidecars needs
	// (Options.LegacySidecars).
	HeldBack map[string]int
	// Minors holds, by name, the minor version of the document that each
	// accepted policy needs (sidecarconfig.MinMinor).
	Minors map[string]int
}

// Namespace renders the policies of opts.Namespace. No replica counts in
// the document: the sidecars count themselves through Redis, so pod churn
// rewrites nothing. The error is for a failure no policy change causes.
func Namespace(policies []v1alpha1.RateLimitPolicy, opts Options) (NamespaceResult, error) {
	out := NamespaceResult{NotAccepted: map[string]error{}}
	var valid []v1alpha1.RateLimitPolicy
	for i := range policies {
		if _, err := Policy(&policies[i]); err != nil {
			out.NotAccepted[policies[i].Name] = err
			continue
		}
		if err := CheckFootprint(&policies[i], opts.MaxClientBytes); err != nil {
			out.NotAccepted[policies[i].Name] = err
			continue
		}
		valid = append(valid, policies[i])
	}
	if opts.LegacySidecars {
		// A sidecar of the first release refuses the whole document if one
		// policy has a field it does not know: hold those policies back
		// until it is gone (sidecarconfig's compatibility rule).
		valid, out.HeldBack = HoldBack(valid, 0)
	}
	accepted, tooLarge, err := Fit(valid, opts)
	if err != nil {
		return out, fmt.Errorf("fitting the policies of namespace %s: %w", opts.Namespace, err)
	}
	for _, e := range tooLarge {
		out.NotAccepted[e.Name] = e
	}
	out.TooLarge = len(tooLarge)
	cfg, err := Render(accepted, opts)
	if err != nil {
		return out, fmt.Errorf("rendering namespace %s: %w", opts.Namespace, err)
	}
	out.Minors = make(map[string]int, len(cfg.Policies))
	for i := range cfg.Policies {
		out.Minors[cfg.Policies[i].Name] = sidecarconfig.MinMinor(&cfg.Policies[i])
	}
	if out.Data, out.Revision, err = Encode(cfg); err != nil {
		return out, fmt.Errorf("encoding the configuration of namespace %s: %w", opts.Namespace, err)
	}
	if out.Revisions, err = PolicyRevisions(cfg); err != nil {
		return out, fmt.Errorf("encoding the configuration of namespace %s: %w", opts.Namespace, err)
	}
	return out, nil
}

// ServiceOptions are the settings of the rate limit service's rendering that
// do not come from policies.
type ServiceOptions struct {
	// Owners says which namespaces may use which domain; nil: every domain
	// is open to all.
	Owners *DomainOwners
	// MaxBytes is the size budget of the encoded document (FitRLS); 0:
	// DefaultMaxBytes.
	MaxBytes int
	// MaxClientBytes bounds what one client of a policy can make the shared
	// Redis hold (CheckFootprint); 0: no bound.
	MaxClientBytes int64
}

// ServiceResult is the rate limit service's document and what became of
// each policy.
type ServiceResult struct {
	// Data is the ConfigMap's document and Revision its hash.
	Data     []byte
	Revision string
	// Revisions holds each accepted policy's own revision, by
	// rlsconfig.PolicyID.
	Revisions map[string]string
	// NotAccepted holds why each policy left out of Data is: an
	// *InvalidPolicyError, a *FootprintTooLargeError, a
	// *DomainNotAllowedError or a *ConfigTooLargeError.
	NotAccepted map[types.NamespacedName]error
	// Unclaimed holds the accepted policies on a domain that no namespace
	// claimed (open to all).
	Unclaimed map[types.NamespacedName]bool
}

// Service renders the cluster's policies for the rate limit service: the
// valid ones on domains their namespace may use that fit within the budget.
func Service(policies []v1alpha1.RateLimitPolicy, opts ServiceOptions) (ServiceResult, error) {
	out := ServiceResult{NotAccepted: map[types.NamespacedName]error{}, Unclaimed: map[types.NamespacedName]bool{}}
	var valid []v1alpha1.RateLimitPolicy
	for i := range policies {
		p := &policies[i]
		k := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
		if _, err := RLSPolicy(p); err != nil {
			out.NotAccepted[k] = err
			continue
		}
		if err := CheckFootprint(p, opts.MaxClientBytes); err != nil {
			out.NotAccepted[k] = err
			continue
		}
		if p.Spec.RateLimitService != nil {
			// A policy with targetRefs has its own descriptor on a reserved
			// domain: nobody else's to claim.
			unclaimed, err := opts.Owners.Check(p.Namespace, p.Name, p.Spec.RateLimitService.Domain)
			if err != nil {
				out.NotAccepted[k] = err
				continue
			}
			if unclaimed {
				out.Unclaimed[k] = true
			}
		}
		valid = append(valid, *p)
	}
	fit, tooLarge, err := FitRLS(valid, opts.MaxBytes)
	if err != nil {
		return out, err
	}
	for _, e := range tooLarge {
		k := types.NamespacedName{Namespace: e.Namespace, Name: e.Name}
		out.NotAccepted[k] = e
		delete(out.Unclaimed, k)
	}
	cfg, err := RLS(fit)
	if err != nil {
		return out, err
	}
	if out.Data, out.Revision, err = EncodeRLS(cfg); err != nil {
		return out, err
	}
	out.Revisions = rlsconfig.PolicyRevisions(cfg)
	return out, nil
}
