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

package attachment

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

func object(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatal(err)
	}
	return u
}

const route = `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: checkout, namespace: shop}
spec:
  parentRefs:
  - {name: edge, namespace: infra, sectionName: https}
  - {name: internal}
  - {name: internal}
  - {group: networking.example.com, kind: Mesh, name: m}
  rules:
  - name: login
  - {}
`

const gateway = `
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: shopgw, namespace: shop}
spec:
  listeners:
  - {name: http, port: 80, protocol: HTTP}
`

func ref(kind, name, section string) v1alpha1.PolicyTargetReference {
	return v1alpha1.PolicyTargetReference{Group: v1alpha1.GatewayAPIGroup, Kind: kind, Name: name, SectionName: section}
}

// ancestorLine is one ancestor as "ns/name/section=Status Reason".
func ancestorLines(r Result) []string {
	var out []string
	for _, a := range r.Ancestors {
		c := a.Conditions[0]
		out = append(out, a.AncestorRef.Namespace+"/"+a.AncestorRef.Name+"/"+a.AncestorRef.SectionName+"="+string(c.Status)+" "+c.Reason)
	}
	return out
}

func TestResolve(t *testing.T) {
	p := &v1alpha1.RateLimitPolicy{}
	p.Namespace, p.Name = "shop", "limit"
	tests := []struct {
		name        string
		found       func(t *testing.T) []Found
		noAPI       string
		ancestors   []string
		attached    int
		problem     string // substring of Problem(); "" for none
		missingText string // substring of a Missing entry
	}{
		{name: "a route's Gateways, each once, not its other parents", found: func(t *testing.T) []Found {
			return []Found{{Ref: ref("HTTPRoute", "checkout", ""), Object: object(t, route)}}
		}, ancestors: []string{"infra/edge/https=True Accepted", "shop/internal/=True Accepted"}, attached: 1},
		{name: "a rule of the route", found: func(t *testing.T) []Found {
			return []Found{{Ref: ref("HTTPRoute", "checkout", "login"), Object: object(t, route)}}
		}, ancestors: []string{"infra/edge/https=True Accepted", "shop/internal/=True Accepted"}, attached: 1},
		{name: "a rule the route does not have", found: func(t *testing.T) []Found {
			return []Found{{Ref: ref("HTTPRoute", "checkout", "signup"), Object: object(t, route)}}
		}, ancestors: []string{"infra/edge/https=False TargetNotFound", "shop/internal/=False TargetNotFound"},
			problem: `HTTPRoute checkout (rule signup): the HTTPRoute has no rule named "signup"`},
		{name: "a missing route beside a found gateway", found: func(t *testing.T) []Found {
			return []Found{{Ref: ref("HTTPRoute", "gone", "")}, {Ref: ref("Gateway", "shopgw", "http"), Object: object(t, gateway)}}
		}, ancestors: []string{"shop/shopgw/http=True Accepted"}, attached: 1, missingText: "HTTPRoute gone: not found in namespace shop"},
		{name: "a listener the gateway does not have", found: func(t *testing.T) []Found {
			return []Found{{Ref: ref("Gateway", "shopgw", "https"), Object: object(t, gateway)}}
		}, ancestors: []string{"shop/shopgw/https=False TargetNotFound"}, problem: `no listener named "https"`},
		{name: "no Gateway API", found: func(t *testing.T) []Found {
			return []Found{{Ref: ref("HTTPRoute", "checkout", "")}}
		}, noAPI: "the Gateway API is not installed", problem: "HTTPRoute checkout: the Gateway API is not installed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := Resolve(p, tc.found(t), tc.noAPI, 3)
			if got := ancestorLines(r); strings.Join(got, ",") != strings.Join(tc.ancestors, ",") {
				t.Errorf("ancestors = %q, want %q", got, tc.ancestors)
			}
			if r.Attached != tc.attached {
				t.Errorf("attached = %d, want %d", r.Attached, tc.attached)
			}
			if got := r.Problem(); (tc.problem == "") != (got == "") || !strings.Contains(got, tc.problem) {
				t.Errorf("problem = %q, want one with %q", got, tc.problem)
			}
			if tc.missingText != "" && !strings.Contains(strings.Join(r.Missing, "\n"), tc.missingText) {
				t.Errorf("missing = %q, want %q", r.Missing, tc.missingText)
			}
			for _, a := range r.Ancestors {
				if a.ControllerName != v1alpha1.AncestorControllerName || a.Conditions[0].ObservedGeneration != 3 || a.Conditions[0].Message == "" {
					t.Errorf("ancestor %+v: want controllerName, generation 3 and a message", a)
				}
			}
		})
	}
}

// TestResolveBoundsAncestors: a route with more Gateways than the status
// holds keeps the first MaxAncestors in order.
func TestResolveBoundsAncestors(t *testing.T) {
	doc := "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: shop}\nspec:\n  parentRefs:\n"
	for i := range MaxAncestors + 4 {
		doc += "  - {name: gw" + string(rune('a'+i)) + "}\n"
	}
	p := &v1alpha1.RateLimitPolicy{}
	p.Namespace, p.Name = "shop", "limit"
	r := Resolve(p, []Found{{Ref: ref("HTTPRoute", "r", ""), Object: object(t, doc)}}, "", 1)
	if len(r.Ancestors) != MaxAncestors || r.Ancestors[0].AncestorRef.Name != "gwa" {
		t.Fatalf("got %d ancestors starting at %q, want %d from gwa", len(r.Ancestors), r.Ancestors[0].AncestorRef.Name, MaxAncestors)
	}
}

// TestRefuseAndRemark: what a Gateway cannot serve amends its ancestor
// only (any listener of it), not the others.
func TestRefuseAndRemark(t *testing.T) {
	p := &v1alpha1.RateLimitPolicy{}
	p.Namespace, p.Name = "shop", "limit"
	r := Resolve(p, []Found{{Ref: ref("HTTPRoute", "checkout", ""), Object: object(t, route)}}, "", 1)
	r.Refuse(Gateway{Namespace: "infra", Name: "edge"}, v1alpha1.ReasonInvalid, "not here")
	r.Remark(Gateway{Namespace: "shop", Name: "internal"}, "by hand")
	if got := ancestorLines(r); strings.Join(got, ",") != "infra/edge/https=False Invalid,shop/internal/=True Accepted" {
		t.Fatalf("ancestors %q", got)
	}
	if m := r.Ancestors[0].Conditions[0].Message; m != "not here" {
		t.Errorf("refused message %q", m)
	}
	if m := r.Ancestors[1].Conditions[0].Message; !strings.HasSuffix(m, "; by hand") {
		t.Errorf("remarked message %q", m)
	}
}
