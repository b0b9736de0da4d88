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
	"strings"
	"testing"
)

// TestParseDomainOwners: the platform team's list is read strictly (a
// typo must not open a domain); new cases go at the end.
func TestParseDomainOwners(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string // want: "" valid, else part of the error
	}{
		{"empty", "", ""},
		{"one domain", "domains:\n  - domain: edge\n    namespaces: [shop, payments]\n", ""},
		{"closed domain", "domains:\n  - domain: edge\n    namespaces: []\n", ""},
		{"deny unclaimed", "unclaimedDomains: Deny\n", ""},
		{"unknown field", "domains:\n  - domain: edge\n    namespace: [shop]\n", `unknown field "namespace"`},
		{"unknown top field", "unclaimed: Deny\n", `unknown field "unclaimed"`},
		{"bad mode", "unclaimedDomains: Open\n", `unclaimedDomains "Open" is not Allow or Deny`},
		{"twice", "domains:\n  - domain: edge\n    namespaces: [a]\n  - domain: edge\n    namespaces: [b]\n", `domain "edge" is listed twice`},
		{"empty domain", "domains:\n  - domain: \"\"\n    namespaces: [a]\n", "must have 1 to 256 bytes"},
		{"long domain", "domains:\n  - domain: " + strings.Repeat("d", 257) + "\n    namespaces: [a]\n", "must have 1 to 256 bytes"},
		{"bad namespace", "domains:\n  - domain: edge\n    namespaces: [Shop]\n", `namespace "Shop"`},
		{"not YAML", "domains: [", "domains.yaml"},
	} {
		_, err := ParseDomainOwners([]byte(tc.doc))
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestDomainOwnersCheck: a listed domain is its namespaces' alone; an
// unlisted one is open to all unless unclaimed domains are closed; no
// document (an install from before domains could be claimed) opens all.
func TestDomainOwnersCheck(t *testing.T) {
	open, err := ParseDomainOwners([]byte("domains:\n  - domain: edge\n    namespaces: [shop, payments]\n  - domain: closed\n    namespaces: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	deny, err := ParseDomainOwners([]byte("domains:\n  - domain: edge\n    namespaces: [shop]\nunclaimedDomains: Deny\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name               string
		owners             *DomainOwners
		ns, domain         string
		allowed, unclaimed bool
	}{
		{"owner", open, "shop", "edge", true, false},
		{"second owner", open, "payments", "edge", true, false},
		{"another namespace", open, "evil", "edge", false, false},
		{"closed domain", open, "shop", "closed", false, false},
		{"unlisted, open", open, "evil", "internal", true, true},
		{"owner, deny", deny, "shop", "edge", true, false},
		{"another namespace, deny", deny, "evil", "edge", false, false},
		{"unlisted, deny", deny, "shop", "internal", false, true},
		{"no document", nil, "evil", "edge", true, true},
		{"domains are exact", open, "evil", "Edge", true, true},
	} {
		unclaimed, err := tc.owners.Check(tc.ns, "p", tc.domain)
		var notAllowed *DomainNotAllowedError
		if (err == nil) != tc.allowed || unclaimed != tc.unclaimed || err != nil && !errors.As(err, &notAllowed) {
			t.Errorf("%s: unclaimed %v, %v; want allowed %v, unclaimed %v", tc.name, unclaimed, err, tc.allowed, tc.unclaimed)
		}
		if err != nil && strings.Contains(err.Error(), "payments") {
			t.Errorf("%s: the message names the owner: %v", tc.name, err)
		}
	}
}
