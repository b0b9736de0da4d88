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

// Package attachment resolves a policy's targetRefs (Gateway API policy
// attachment, GEP-713) against the Gateway API objects found for them,
// into the Gateways they reach and the policy's ancestor status. It reads
// the objects as unstructured content, so that slidegate does not depend
// on one release of the Gateway API's Go types, and does no I/O: the
// controller fetches, this package decides.
package attachment

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// MaxAncestors is the most entries status.ancestors holds (the CRD's
// bound, as GEP-713's PolicyStatus).
const MaxAncestors = 16

// Found is one targetRef and the object found for it: nil when the API
// server has none of that name.
type Found struct {
	Ref    v1alpha1.PolicyTargetReference
	Object *unstructured.Unstructured
}

// Result is what the policy's targets come to.
type Result struct {
	// Ancestors are the Gateways its targets reach, each with an Accepted
	// condition, sorted by namespace, name and section.
	Ancestors []v1alpha1.PolicyAncestorStatus
	// Missing describes each target that does not exist, or names a rule
	// or listener its object does not have.
	Missing []string
	// Attached is the number of targets found (with the section they name).
	Attached int
}

// Problem is why no target of the policy exists, or "" when one does.
func (r Result) Problem() string {
	if r.Attached > 0 {
		return ""
	}
	return "no target exists: " + strings.Join(r.Missing, "; ")
}

// gatewayKey identifies an ancestor.
type gatewayKey struct{ namespace, name, section string }

// ancestor gathers what the targets say about one Gateway.
type ancestor struct {
	attached, missing []string
}

// Resolve computes the policy's Result from found, one entry per targetRef
// of the policy in its order. noAPI, when not "", says why nothing could be
// looked up (the Gateway API is not installed): every target is missing.
func Resolve(p *v1alpha1.RateLimitPolicy, found []Found, noAPI string, generation int64) Result {
	var out Result
	gateways := map[gatewayKey]*ancestor{}
	at := func(k gatewayKey) *ancestor {
		if gateways[k] == nil {
			gateways[k] = &ancestor{}
		}
		return gateways[k]
	}
	for _, f := range found {
		what := describe(f.Ref)
		switch {
		case noAPI != "":
			out.Missing = append(out.Missing, what+": "+noAPI)
		case f.Object == nil:
			out.Missing = append(out.Missing, fmt.Sprintf("%s: not found in namespace %s", what, p.Namespace))
		case f.Ref.Kind == "Gateway":
			k := gatewayKey{p.Namespace, f.Ref.Name, f.Ref.SectionName}
			if f.Ref.SectionName != "" && !hasNamed(f.Object, "listeners", f.Ref.SectionName) {
				miss := fmt.Sprintf("%s: the Gateway has no listener named %q", what, f.Ref.SectionName)
				out.Missing = append(out.Missing, miss)
				at(k).missing = append(at(k).missing, miss)
				continue
			}
			out.Attached++
			at(k).attached = append(at(k).attached, what)
		default: // HTTPRoute
			parents := parentGateways(f.Object, p.Namespace)
			if f.Ref.SectionName != "" && !hasNamed(f.Object, "rules", f.Ref.SectionName) {
				miss := fmt.Sprintf("%s: the HTTPRoute has no rule named %q", what, f.Ref.SectionName)
				out.Missing = append(out.Missing, miss)
				for _, k := range parents {
					at(k).missing = append(at(k).missing, miss)
				}
				continue
			}
			out.Attached++
			if len(parents) == 0 {
				out.Missing = append(out.Missing, what+": the HTTPRoute has no Gateway among its parentRefs")
			}
			for _, k := range parents {
				at(k).attached = append(at(k).attached, what)
			}
		}
	}
	keys := make([]gatewayKey, 0, len(gateways))
	for k := range gateways {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b gatewayKey) int {
		return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name), cmp.Compare(a.section, b.section))
	})
	for _, k := range keys[:min(len(keys), MaxAncestors)] {
		a := gateways[k]
		cond := metav1.Condition{Type: string(v1alpha1.ConditionAccepted), ObservedGeneration: generation}
		if len(a.attached) > 0 {
			cond.Status, cond.Reason = metav1.ConditionTrue, string(v1alpha1.ReasonAccepted)
			cond.Message = fmt.Sprintf("the rate limit service limits the requests this Gateway routes through %s (domain %s)",
				strings.Join(a.attached, ", "), v1alpha1.TargetRefsDomain)
		} else {
			cond.Status, cond.Reason = metav1.ConditionFalse, string(v1alpha1.ReasonTargetNotFound)
			cond.Message = strings.Join(a.missing, "; ")
		}
		var conds []metav1.Condition
		meta.SetStatusCondition(&conds, cond)
		out.Ancestors = append(out.Ancestors, v1alpha1.PolicyAncestorStatus{
			AncestorRef:    v1alpha1.GatewayReference{Group: v1alpha1.GatewayAPIGroup, Kind: "Gateway", Namespace: k.namespace, Name: k.name, SectionName: k.section},
			ControllerName: v1alpha1.AncestorControllerName,
			Conditions:     conds,
		})
	}
	return out
}

// describe names a target for messages, e.g. "HTTPRoute checkout (rule
// login)".
func describe(r v1alpha1.PolicyTargetReference) string {
	s := r.Kind + " " + r.Name
	switch {
	case r.SectionName == "":
	case r.Kind == "Gateway":
		s += fmt.Sprintf(" (listener %s)", r.SectionName)
	default:
		s += fmt.Sprintf(" (rule %s)", r.SectionName)
	}
	return s
}

// hasNamed reports whether spec.<list> has an item whose name is name.
func hasNamed(obj *unstructured.Unstructured, list, name string) bool {
	items, _, _ := unstructured.NestedSlice(obj.Object, "spec", list)
	for _, it := range items {
		if m, ok := it.(map[string]any); ok && m["name"] == name {
			return true
		}
	}
	return false
}

// Gateway names a Gateway (sectionName: a listener of it, or "").
type Gateway struct{ Namespace, Name, SectionName string }

// ParentGateways are the Gateways among an HTTPRoute's parentRefs, each
// once, in order.
func ParentGateways(route *unstructured.Unstructured) []Gateway {
	var out []Gateway
	for _, k := range parentGateways(route, route.GetNamespace()) {
		out = append(out, Gateway{Namespace: k.namespace, Name: k.name, SectionName: k.section})
	}
	return out
}

// RuleNames are the names of an HTTPRoute's rules, in order ("" for a rule
// without one).
func RuleNames(route *unstructured.Unstructured) []string {
	rules, _, _ := unstructured.NestedSlice(route.Object, "spec", "rules")
	out := make([]string, len(rules))
	for i, r := range rules {
		if m, ok := r.(map[string]any); ok {
			out[i], _ = m["name"].(string)
		}
	}
	return out
}

// ListenerPort is the port of a Gateway's listener called name, or 0.
func ListenerPort(gw *unstructured.Unstructured, name string) int32 {
	ls, _, _ := unstructured.NestedSlice(gw.Object, "spec", "listeners")
	for _, l := range ls {
		if m, ok := l.(map[string]any); ok && m["name"] == name {
			switch p := m["port"].(type) {
			case int64:
				return int32(p)
			case float64:
				return int32(p)
			}
		}
	}
	return 0
}

// parentGateways are the Gateways among an HTTPRoute's parentRefs (group
// and kind default to the Gateway API's Gateway, namespace to the route's),
// each once.
func parentGateways(route *unstructured.Unstructured, namespace string) []gatewayKey {
	refs, _, _ := unstructured.NestedSlice(route.Object, "spec", "parentRefs")
	var out []gatewayKey
	for _, r := range refs {
		m, ok := r.(map[string]any)
		if !ok {
			continue
		}
		group, kind := str(m, "group", v1alpha1.GatewayAPIGroup), str(m, "kind", "Gateway")
		if group != v1alpha1.GatewayAPIGroup || kind != "Gateway" {
			continue
		}
		k := gatewayKey{str(m, "namespace", namespace), str(m, "name", ""), str(m, "sectionName", "")}
		if k.name != "" && !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// str is m[key] as a string, or def when unset or empty. (The Gateway
// API writes group "" for the core group; "" here means the default.)
func str(m map[string]any, key, def string) string {
	if s, ok := m[key].(string); ok && s != "" {
		return s
	}
	return def
}

// Refuse sets the Accepted condition of the ancestors that are Gateway gw
// (any listener) False, for reason, told by msg: the Gateway cannot serve
// the policy as attached.
func (r *Result) Refuse(gw Gateway, reason v1alpha1.ConditionReason, msg string) {
	r.amend(gw, func(c *metav1.Condition) {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, string(reason), msg
	})
}

// Remark adds msg to the message of the ancestors that are Gateway gw.
func (r *Result) Remark(gw Gateway, msg string) {
	r.amend(gw, func(c *metav1.Condition) { c.Message += "; " + msg })
}

func (r *Result) amend(gw Gateway, f func(*metav1.Condition)) {
	for i := range r.Ancestors {
		a := &r.Ancestors[i]
		if a.AncestorRef.Namespace != gw.Namespace || a.AncestorRef.Name != gw.Name {
			continue
		}
		if c := meta.FindStatusCondition(a.Conditions, string(v1alpha1.ConditionAccepted)); c != nil {
			f(c)
		}
	}
}
