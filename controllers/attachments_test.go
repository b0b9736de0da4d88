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

package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/envoyrender"
	"github.com/slidegate/slidegate/internal/rlsconfig"
)

// httpRoute is an HTTPRoute of the Gateway API's CRD (installed by
// TestMain), attached to Gateway edge of namespace infra.
func httpRoute(t *testing.T, ns, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	doc := fmt.Sprintf(`
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: %s, namespace: %s}
spec:
  parentRefs: [{name: edge, namespace: infra}]
  rules:
  - name: login
    matches: [{path: {type: PathPrefix, value: /login}}]
    backendRefs: [{name: checkout, port: 8080}]
  - backendRefs: [{name: checkout, port: 8080}]
`, name, ns)
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatal(err)
	}
	return u
}

// rlsDocumentPolicy is the policy id's entry in the rate limit service's
// ConfigMap, or nil.
func rlsDocumentPolicy(t *testing.T, id string) *rlsconfig.Policy {
	t.Helper()
	var cm corev1.ConfigMap
	if err := k.Get(context.Background(), types.NamespacedName{Namespace: redisSecret.Namespace, Name: rlsconfig.ConfigMapName}, &cm); err != nil {
		return nil
	}
	cfg, err := rlsconfig.Parse([]byte(cm.Data[rlsconfig.FileName]))
	if err != nil {
		t.Fatalf("the RLS server would refuse the ConfigMap: %v", err)
	}
	if i := slices.IndexFunc(cfg.Policies, func(p rlsconfig.Policy) bool { return p.ID == id }); i >= 0 {
		return &cfg.Policies[i]
	}
	return nil
}

// TestTargetRefs attaches a policy to a rule of an HTTPRoute that does not
// exist yet: TargetNotFound (in progress, not Stalled) and nothing in the
// rate limit service's document; once the route exists, Accepted with its
// Gateway as the ancestor and the derived descriptor in the document; the
// route deleted, TargetNotFound again.
func TestTargetRefs(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	p := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "login", Namespace: ns},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetRefs: []v1alpha1.PolicyTargetReference{{Group: v1alpha1.GatewayAPIGroup, Kind: "HTTPRoute", Name: "checkout", SectionName: "login"}},
			Window:     "1m", Limit: 5,
			Key: v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User", OnMissing: v1alpha1.MissingKeyAllow},
		},
	}
	create(t, p)
	// Other tests see the rate limit service's ConfigMap go with their
	// last policy.
	t.Cleanup(func() { _ = k.Delete(ctx, p) })
	id := rlsconfig.PolicyID(ns, "login")

	notFound := func() error {
		got := get(t, p)
		if got.Status.ObservedGeneration != got.Generation {
			return fmt.Errorf("observedGeneration %d", got.Status.ObservedGeneration)
		}
		c := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionAccepted))
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != string(v1alpha1.ReasonTargetNotFound) {
			return fmt.Errorf("accepted = %+v", c)
		}
		if !strings.Contains(c.Message, "HTTPRoute checkout (rule login): not found in namespace "+ns) {
			return fmt.Errorf("message %q does not name the missing target", c.Message)
		}
		if s := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionStalled)); s != nil {
			return fmt.Errorf("stalled %+v: a missing target is in progress, not failed", s)
		}
		if len(got.Status.Ancestors) != 0 {
			return fmt.Errorf("ancestors %+v, want none", got.Status.Ancestors)
		}
		if rlsDocumentPolicy(t, id) != nil {
			return fmt.Errorf("in the rate limit service's document without a target")
		}
		return nil
	}
	eventually(t, "target not found", notFound)

	route := httpRoute(t, ns, "checkout")
	if err := k.Create(ctx, route); err != nil {
		t.Fatal(err)
	}
	eventually(t, "attached", func() error {
		got := get(t, p)
		if err := settled(p, readyAccepted); err != nil {
			return err
		}
		if len(got.Status.Ancestors) != 1 {
			return fmt.Errorf("ancestors %+v, want the one Gateway", got.Status.Ancestors)
		}
		a := got.Status.Ancestors[0]
		want := v1alpha1.GatewayReference{Group: v1alpha1.GatewayAPIGroup, Kind: "Gateway", Namespace: "infra", Name: "edge"}
		if a.AncestorRef != want || a.ControllerName != v1alpha1.AncestorControllerName {
			return fmt.Errorf("ancestor %+v, want %+v by %s", a.AncestorRef, want, v1alpha1.AncestorControllerName)
		}
		if !meta.IsStatusConditionTrue(a.Conditions, string(v1alpha1.ConditionAccepted)) {
			return fmt.Errorf("ancestor conditions %+v", a.Conditions)
		}
		rp := rlsDocumentPolicy(t, id)
		if rp == nil {
			return fmt.Errorf("not in the rate limit service's document")
		}
		wantDesc := []rlsconfig.Entry{{Key: v1alpha1.TargetRefsPolicyKey, Value: ns + "/login"}, {Key: v1alpha1.TargetRefsClientKey}}
		if rp.Domain != v1alpha1.TargetRefsDomain || !slices.Equal(rp.Descriptor, wantDesc) {
			return fmt.Errorf("document has %s %+v, want %s %+v", rp.Domain, rp.Descriptor, v1alpha1.TargetRefsDomain, wantDesc)
		}
		return nil
	})

	if err := k.Delete(ctx, route); err != nil {
		t.Fatal(err)
	}
	eventually(t, "target gone", notFound)
}

// TestIstioEnvoyFilterPassesIstiosSchema: the EnvoyFilter rendered for a
// Gateway (package envoyrender) is stored by an API server that has
// Istio's own CRD (from istio.io/api's module); the same object with a
// patch Istio does not know is refused, so the schema is really checked.
// No Istio or Envoy runs here: what Envoy makes of the values is checked
// in envoyrender against Envoy's own types.
func TestIstioEnvoyFilterPassesIstiosSchema(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	p := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "login", Namespace: "shop"}, Spec: v1alpha1.RateLimitPolicySpec{
		TargetRefs: []v1alpha1.PolicyTargetReference{{Group: v1alpha1.GatewayAPIGroup, Kind: "HTTPRoute", Name: "checkout"}},
		Window:     "1m", Limit: 5, Key: v1alpha1.ClientKey{Source: v1alpha1.KeySourceRemoteAddress},
	}}
	ef, err := envoyrender.IstioEnvoyFilter(ns, "edge", envoyrender.IstioCluster("slidegate-system", "slidegate-rls", 8081),
		[]envoyrender.GatewayPolicy{{Policy: p, Rules: []envoyrender.Rule{{Namespace: "shop", Route: "checkout"}}, AllPorts: true}})
	if err != nil {
		t.Fatal(err)
	}
	bad := ef.DeepCopy()
	if err := k.Create(ctx, ef); err != nil {
		t.Fatalf("Istio's schema refuses the rendered EnvoyFilter: %v", err)
	}
	patches, _, _ := unstructured.NestedSlice(bad.Object, "spec", "configPatches")
	patches[0].(map[string]any)["applyTo"] = "HTTP_FILTERS"
	_ = unstructured.SetNestedSlice(bad.Object, patches, "spec", "configPatches")
	bad.SetName("slidegate-ratelimit-bad")
	if err := k.Create(ctx, bad); err == nil || !strings.Contains(err.Error(), "applyTo") {
		t.Fatalf("an EnvoyFilter with applyTo HTTP_FILTERS: %v, want Istio's schema to refuse it", err)
	}
}

// apply creates a Gateway API object from YAML.
func applyDoc(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatal(err)
	}
	if err := k.Create(context.Background(), u); err != nil {
		t.Fatalf("creating %s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return u
}

// envoyFilter reads the EnvoyFilter of Gateway ns/gw, or nil.
func envoyFilter(t *testing.T, ns, gw string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("networking.istio.io/v1alpha3")
	u.SetKind("EnvoyFilter")
	if err := k.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "slidegate-ratelimit-" + gw}, u); err != nil {
		return nil
	}
	return u
}

// routePatches are the route names an EnvoyFilter patches, and the number
// of rate limit filters it inserts.
func routePatches(ef *unstructured.Unstructured) (names []string, filters int) {
	patches, _, _ := unstructured.NestedSlice(ef.Object, "spec", "configPatches")
	for _, p := range patches {
		m := p.(map[string]any)
		switch m["applyTo"] {
		case "HTTP_FILTER":
			filters++
		case "HTTP_ROUTE":
			n, _, _ := unstructured.NestedString(m, "match", "routeConfiguration", "vhost", "route", "name")
			names = append(names, n)
		}
	}
	return names, filters
}

// TestIstioGateways: a policy attached to an HTTPRoute of an Istio Gateway
// in another namespace gets the Gateway's EnvoyFilter (in the Gateway's
// namespace, accepted by Istio's CRD) with the rate limit filter once and
// the actions on the route's unnamed rule; its named rule is reported, not
// patched. A Gateway of another class gets nothing and the policy's
// ancestor says so. The policy deleted, the EnvoyFilter goes.
func TestIstioGateways(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	infra := newNamespaceWith(t, nil)
	applyDoc(t, `
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio-`+ns+`}
spec: {controllerName: istio.io/gateway-controller}`)
	applyDoc(t, `
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: other-`+ns+`}
spec: {controllerName: example.com/gateway}`)
	for _, gw := range []struct{ name, class string }{{"edge", "istio-" + ns}, {"other", "other-" + ns}} {
		applyDoc(t, fmt.Sprintf(`
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: %s, namespace: %s}
spec:
  gatewayClassName: %s
  listeners: [{name: http, port: 80, protocol: HTTP}]`, gw.name, infra, gw.class))
	}
	applyDoc(t, fmt.Sprintf(`
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: checkout, namespace: %s}
spec:
  parentRefs: [{name: edge, namespace: %s}, {name: other, namespace: %s}]
  rules:
  - name: login
    backendRefs: [{name: checkout, port: 8080}]
  - backendRefs: [{name: checkout, port: 8080}]`, ns, infra, infra))
	p := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "checkout", Namespace: ns},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetRefs: []v1alpha1.PolicyTargetReference{{Group: v1alpha1.GatewayAPIGroup, Kind: "HTTPRoute", Name: "checkout"}},
			Window:     "1m", Limit: 5, Key: v1alpha1.ClientKey{Source: v1alpha1.KeySourceRemoteAddress},
		},
	}
	create(t, p)
	t.Cleanup(func() { _ = k.Delete(ctx, p) })

	eventually(t, "the Istio Gateway's EnvoyFilter", func() error {
		ef := envoyFilter(t, infra, "edge")
		if ef == nil {
			return fmt.Errorf("no EnvoyFilter in %s", infra)
		}
		names, filters := routePatches(ef)
		if want := []string{ns + ".checkout.1"}; !slices.Equal(names, want) || filters != 1 {
			return fmt.Errorf("routes %q and %d filters, want %q and 1", names, filters, want)
		}
		if envoyFilter(t, infra, "other") != nil {
			return fmt.Errorf("an EnvoyFilter for the Gateway of another class")
		}
		got := get(t, p)
		if len(got.Status.Ancestors) != 2 {
			return fmt.Errorf("ancestors %+v", got.Status.Ancestors)
		}
		msgs := map[string]string{}
		for _, a := range got.Status.Ancestors {
			c := meta.FindStatusCondition(a.Conditions, string(v1alpha1.ConditionAccepted))
			if c == nil || c.Status != metav1.ConditionTrue {
				return fmt.Errorf("ancestor %s: %+v", a.AncestorRef.Name, c)
			}
			msgs[a.AncestorRef.Name] = c.Message
		}
		if !strings.Contains(msgs["edge"], "does not configure rules login of HTTPRoute checkout") {
			return fmt.Errorf("edge's message %q does not name the named rule left out", msgs["edge"])
		}
		if !strings.Contains(msgs["other"], `GatewayClass controller "example.com/gateway"`) {
			return fmt.Errorf("other's message %q does not say its gateway is not configured", msgs["other"])
		}
		return nil
	})

	if err := k.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the EnvoyFilter deleted with the last policy on the Gateway", func() error {
		if envoyFilter(t, infra, "edge") != nil {
			return fmt.Errorf("still there")
		}
		return nil
	})
}

// TestEnvoyGateways: a policy attached to a rule of an HTTPRoute on an
// Envoy Gateway Gateway gets the Gateway's EnvoyPatchPolicy (accepted by
// Envoy Gateway's CRD), with the cluster, the filter on each HTTP port's
// listener and the actions on the rule's routes; the policy deleted, it
// goes. What Envoy Gateway does with the patches (its JSONPath and JSON
// Patch libraries on its xDS) is not run here.
func TestEnvoyGateways(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	infra := newNamespaceWith(t, nil)
	applyDoc(t, `
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: eg-`+ns+`}
spec: {controllerName: gateway.envoyproxy.io/gatewayclass-controller}`)
	applyDoc(t, fmt.Sprintf(`
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: %s}
spec:
  gatewayClassName: eg-%s
  listeners:
  - {name: http, port: 80, protocol: HTTP}
  - {name: tcp, port: 9000, protocol: TCP}`, infra, ns))
	applyDoc(t, fmt.Sprintf(`
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: checkout, namespace: %s}
spec:
  parentRefs: [{name: edge, namespace: %s}]
  rules:
  - name: login
    backendRefs: [{name: checkout, port: 8080}]
  - backendRefs: [{name: checkout, port: 8080}]`, ns, infra))
	p := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "login", Namespace: ns},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetRefs: []v1alpha1.PolicyTargetReference{{Group: v1alpha1.GatewayAPIGroup, Kind: "HTTPRoute", Name: "checkout", SectionName: "login"}},
			Window:     "1m", Limit: 5, Key: v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User", OnMissing: v1alpha1.MissingKeyAllow},
		},
	}
	create(t, p)
	t.Cleanup(func() { _ = k.Delete(ctx, p) })

	readPolicy := func() *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("gateway.envoyproxy.io/v1alpha1")
		u.SetKind("EnvoyPatchPolicy")
		if err := k.Get(ctx, types.NamespacedName{Namespace: infra, Name: "slidegate-ratelimit-edge"}, u); err != nil {
			return nil
		}
		return u
	}
	eventually(t, "the Gateway's EnvoyPatchPolicy", func() error {
		epp := readPolicy()
		if epp == nil {
			return fmt.Errorf("no EnvoyPatchPolicy in %s", infra)
		}
		patches, _, _ := unstructured.NestedSlice(epp.Object, "spec", "jsonPatches")
		var got []string
		for _, x := range patches {
			m := x.(map[string]any)
			jp, _, _ := unstructured.NestedString(m, "operation", "jsonPath")
			got = append(got, m["name"].(string)+" "+jp)
		}
		want := []string{
			"slidegate-rls ",
			infra + "/edge/http ..filters[?(@.name=='envoy.filters.network.http_connection_manager')].typed_config.http_filters[0]",
			infra + "/edge/http ..routes[?(@.name=~'^httproute/" + ns + "/checkout/rule/0/')]",
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("patches %q, want %q", got, want)
		}
		return nil
	})
	if err := k.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the EnvoyPatchPolicy deleted", func() error {
		if readPolicy() != nil {
			return fmt.Errorf("still there")
		}
		return nil
	})
}
