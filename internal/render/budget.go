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
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// DefaultMaxBytes is the size budget of a rendered document when
// Options.MaxBytes is 0. The API server refuses a ConfigMap whose data add
// up to more than 1 MiB (1,048,576 bytes). 1,000,000 is a round number below
// that, which a condition message can state and a user can add up against,
// and it leaves the ConfigMap's metadata (an owner reference per policy,
// managed fields) room within etcd's 1.5 MiB request limit.
const DefaultMaxBytes = 1_000_000

// The canonical encoding (sidecarconfig.Marshal, two-space indent) puts
// each policy at depth 2: opened by "\n    " and, but for the last, followed
// by ",". A non-empty list closes with "\n  ]" where an empty one is "[]".
// So a policy whose own indented encoding is n bytes adds n+perPolicyBytes,
// and the first one also adds listBytes. TestFitSizesAreExact holds this to
// the bytes of Encode.
const (
	policyIndent   = "    "
	perPolicyBytes = len("\n"+policyIndent) + len(",")
	listBytes      = len("[\n  ]") - len("[]") - len(",")
)

// ConfigTooLargeError says why a valid policy is left out of its namespace's
// sidecar configuration: with it, the document would exceed the budget.
type ConfigTooLargeError struct {
	Namespace, Name string
	// PolicyBytes is what the policy adds to the document.
	PolicyBytes int
	// TotalBytes is the size of the document with the policy and every
	// policy that fits before it.
	TotalBytes int
	// MaxBytes is the budget.
	MaxBytes int
	// Ahead is the number of policies that fit before it.
	Ahead int
	// RateLimitService: the document is the rate limit service's (one for
	// the cluster), not a namespace's sidecar configuration.
	RateLimitService bool
}

func (e *ConfigTooLargeError) Error() string {
	doc, cm := "the sidecar configuration", sidecarconfig.ConfigMapName
	if e.RateLimitService {
		doc, cm = "the rate limit service's configuration (all such policies of the cluster)", rlsconfig.ConfigMapName
	}
	return fmt.Sprintf("policy %s/%s (%s bytes) does not fit: with it %s would be %s bytes, "+
		"over the %s-byte budget of ConfigMap %s (the API server refuses more than 1 MiB); the %d policies that come before it "+
		"(created earlier, or at the same second and earlier by name) fill %s bytes",
		e.Namespace, e.Name, thousands(e.PolicyBytes), doc, thousands(e.TotalBytes), thousands(e.MaxBytes),
		cm, e.Ahead, thousands(e.TotalBytes-e.PolicyBytes))
}

// Fit chooses the policies of one namespace that its sidecar configuration
// holds, so that the encoded document stays within opts.MaxBytes. Every
// policy must be valid (see Render). Policies are taken in order of
// precedence, the oldest first and then by name (as Gateway API resolves
// conflicts between policies), so a new policy never pushes out one that is
// already enforced; one that would take the document over the budget is
// left out, and later, smaller ones may still fit. fit keeps the order of
// policies. What a policy costs depends on the policy alone, so the same
// policies always give the same choice.
func Fit(policies []v1alpha1.RateLimitPolicy, opts Options) (fit []v1alpha1.RateLimitPolicy, tooLarge []*ConfigTooLargeError, err error) {
	if opts.Namespace == "" {
		return nil, nil, errors.New("render: no namespace given")
	}
	empty, err := sidecarconfig.Marshal(&sidecarconfig.Config{
		Version:        opts.version(),
		Namespace:      opts.Namespace,
		TrustedProxies: trustedProxies(opts.TrustedProxies),
		Policies:       []sidecarconfig.Policy{},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("render: %w", err)
	}
	return fitWithin(policies, len(empty), opts.MaxBytes, false, func(p *v1alpha1.RateLimitPolicy) (int, error) {
		if p.Namespace != opts.Namespace {
			return 0, fmt.Errorf("policy %s/%s is not in namespace %q", p.Namespace, p.Name, opts.Namespace)
		}
		rp, err := Policy(p)
		if err != nil {
			return 0, err
		}
		return encodedBytes(rp)
	})
}

// fitWithin keeps, in order of precedence, the policies whose encodings
// (cost) fit in a document of emptyBytes with no policy and a budget of
// maxBytes (0: DefaultMaxBytes). Both documents, the sidecars' and the rate
// limit service's, are encoded alike (a list of policies at depth 2).
func fitWithin(policies []v1alpha1.RateLimitPolicy, emptyBytes, maxBytes int, rls bool,
	cost func(*v1alpha1.RateLimitPolicy) (int, error)) (fit []v1alpha1.RateLimitPolicy, tooLarge []*ConfigTooLargeError, err error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	order := make([]int, len(policies))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return precedence(&policies[a], &policies[b]) })
	var errs []error
	keep := make([]bool, len(policies))
	total, ahead := emptyBytes, 0
	for _, i := range order {
		p := &policies[i]
		c, err := cost(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ahead == 0 {
			c += listBytes
		}
		if total+c > maxBytes {
			tooLarge = append(tooLarge, &ConfigTooLargeError{
				Namespace: p.Namespace, Name: p.Name,
				PolicyBytes: c, TotalBytes: total + c, MaxBytes: maxBytes, Ahead: ahead, RateLimitService: rls,
			})
			continue
		}
		total += c
		ahead++
		keep[i] = true
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, fmt.Errorf("render: %w", err)
	}
	for i := range policies {
		if keep[i] {
			fit = append(fit, policies[i])
		}
	}
	return fit, tooLarge, nil
}

// precedence orders policies: the oldest first, then by namespace and
// name.
func precedence(a, b *v1alpha1.RateLimitPolicy) int {
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c
	}
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// encodedBytes is what a rendered policy adds to a document.
func encodedBytes(rendered any) (int, error) {
	b, err := json.MarshalIndent(rendered, policyIndent, "  ")
	if err != nil {
		return 0, err
	}
	return len(b) + perPolicyBytes, nil
}

// thousands writes n (not negative) with comma separators, e.g. 1,000,000.
func thousands(n int) string {
	s := strconv.Itoa(n)
	var b strings.Builder
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
