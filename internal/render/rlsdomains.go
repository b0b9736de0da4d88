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

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/internal/rlsconfig"
)

// Which namespaces may put policies on which domain of the rate limit
// service is the platform team's to say, in one document in the manager's
// namespace (RLSDomainsConfigMapName): a tenant administers its
// own namespaces only, so it can neither edit that ConfigMap nor, as it
// could a label on its own Namespace in some setups, claim a domain for
// itself. A domain is one string of the gateway's filter config: a gateway
// whose filter sends "edge" is limited by every policy on "edge", so a
// policy on another team's domain limits (or, with a huge limit, protects
// nothing of) that team's traffic.

const (
	// RLSDomainsConfigMapName is the ConfigMap, in the manager's namespace,
	// in which the platform team lists which namespaces may address which
	// rate limit service domains, under the key RLSDomainsKey (format:
	// DomainOwners, and docs/rls.md, "Who may use a domain"). Without it
	// every domain is open to every namespace, as before it existed.
	RLSDomainsConfigMapName = "slidegate-rls-domains"
	// RLSDomainsKey is the key of RLSDomainsConfigMapName holding the list.
	RLSDomainsKey = "domains.yaml"
)

// UnclaimedDomains says what happens to a domain the document does not
// list.
type UnclaimedDomains string

const (
	// UnclaimedAllow lets any namespace use it, as before domains could be
	// claimed (the default, and what an install without the ConfigMap
	// gets); such policies are counted (slidegate_rls_unclaimed_domain_policies)
	// and their Accepted message says the domain is open.
	UnclaimedAllow UnclaimedDomains = "Allow"
	// UnclaimedDeny lets no namespace use it: every domain in use must be
	// listed.
	UnclaimedDeny UnclaimedDomains = "Deny"
)

// DomainOwners is the platform team's document (key RLSDomainsKey):
//
//	domains:
//	  - domain: edge
//	    namespaces: [shop, payments]
//	unclaimedDomains: Allow   # or Deny
type DomainOwners struct {
	Domains []DomainOwner `json:"domains"`
	// UnclaimedDomains: "" is UnclaimedAllow.
	UnclaimedDomains UnclaimedDomains `json:"unclaimedDomains,omitempty"`
}

// DomainOwner lists the namespaces that may use one domain (none: the
// domain is closed to all).
type DomainOwner struct {
	Domain     string   `json:"domain"`
	Namespaces []string `json:"namespaces"`
}

// ParseDomainOwners reads and checks the document; unknown fields are
// errors (a typo must not open a domain).
func ParseDomainOwners(data []byte) (*DomainOwners, error) {
	var o DomainOwners
	if err := yaml.UnmarshalStrict(data, &o); err != nil {
		return nil, fmt.Errorf("%s: %w", RLSDomainsKey, err)
	}
	var errs []error
	switch o.UnclaimedDomains {
	case "", UnclaimedAllow, UnclaimedDeny:
	default:
		errs = append(errs, fmt.Errorf("unclaimedDomains %q is not %s or %s", o.UnclaimedDomains, UnclaimedAllow, UnclaimedDeny))
	}
	seen := map[string]bool{}
	for i, d := range o.Domains {
		if d.Domain == "" || len(d.Domain) > rlsconfig.MaxStringBytes {
			errs = append(errs, fmt.Errorf("domains[%d].domain must have 1 to %d bytes", i, rlsconfig.MaxStringBytes))
		}
		if seen[d.Domain] {
			errs = append(errs, fmt.Errorf("domains[%d]: domain %q is listed twice", i, d.Domain))
		}
		seen[d.Domain] = true
		for _, ns := range d.Namespaces {
			if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
				errs = append(errs, fmt.Errorf("domains[%d] (%q): namespace %q: %s", i, d.Domain, ns, msgs[0]))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%s: %w", RLSDomainsKey, err)
	}
	return &o, nil
}

// Check says whether a policy of namespace ns may use domain: nil, or a
// *DomainNotAllowedError. unclaimed reports a domain the document does not
// list (any namespace may use it while UnclaimedDomains is Allow). A nil
// *DomainOwners (no document) claims nothing and allows everything.
func (o *DomainOwners) Check(ns, name, domain string) (unclaimed bool, err error) {
	if o == nil {
		return true, nil
	}
	i := slices.IndexFunc(o.Domains, func(d DomainOwner) bool { return d.Domain == domain })
	switch {
	case i >= 0 && slices.Contains(o.Domains[i].Namespaces, ns):
		return false, nil
	case i >= 0:
		return false, &DomainNotAllowedError{Namespace: ns, Name: name, Domain: domain}
	case o.UnclaimedDomains == UnclaimedDeny:
		return true, &DomainNotAllowedError{Namespace: ns, Name: name, Domain: domain, Unclaimed: true}
	}
	return true, nil
}

// DomainNotAllowedError says why a valid policy for the rate limit service
// is left out: its namespace may not use its domain.
type DomainNotAllowedError struct {
	Namespace, Name, Domain string
	// Unclaimed: the domain is listed for no namespace, and unlisted
	// domains are closed (UnclaimedDeny).
	Unclaimed bool
}

func (e *DomainNotAllowedError) Error() string {
	// It names no other namespace: the tenant learns that the domain is
	// taken, not by whom.
	why := "the domain is reserved for other namespaces"
	if e.Unclaimed {
		why = "the domain is not listed, and unlisted domains are closed (unclaimedDomains: Deny)"
	}
	return fmt.Sprintf("policy %s/%s: namespace %s may not use rate limit service domain %q: %s; the platform team lists which namespaces may use which domain in ConfigMap %s, key %s",
		e.Namespace, e.Name, e.Namespace, e.Domain, why, RLSDomainsConfigMapName, RLSDomainsKey)
}
