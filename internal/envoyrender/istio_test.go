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

package envoyrender

import (
	"encoding/json"
	"slices"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

func TestIstioRouteNames(t *testing.T) {
	r := RouteRules{Namespace: "shop", Name: "checkout", Rules: []string{"login", "", "signup", ""}}
	for _, tc := range []struct {
		name         string
		section      string
		names, named []string
	}{
		{name: "the whole route", names: []string{"shop.checkout.1", "shop.checkout.3"}, named: []string{"login", "signup"}},
		// Istio gives the rule's Envoy routes its name alone, which
		// another HTTPRoute's rule may share: never patched.
		{name: "a named rule", section: "signup", named: []string{"signup"}},
		{name: "a rule the route does not have", section: "gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var names, named []string
			for _, rule := range RulesOf(r, tc.section, nil) {
				if n, ok := IstioRouteName(rule); ok {
					names = append(names, n)
				} else {
					named = append(named, rule.Name)
				}
			}
			if !slices.Equal(names, tc.names) || !slices.Equal(named, tc.named) {
				t.Errorf("names %q named %q, want %q %q", names, named, tc.names, tc.named)
			}
		})
	}
}

// TestIstioEnvoyFilterGolden: one Gateway serving a policy on a route's
// rules and a policy on a listener's port; every Envoy value in it reads
// back as Envoy's own types.
func TestIstioEnvoyFilterGolden(t *testing.T) {
	byHeader := attached("login", v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User", OnMissing: v1alpha1.MissingKeyAllow})
	byAddress := attached("edge", v1alpha1.ClientKey{Source: v1alpha1.KeySourceRemoteAddress})
	u, err := IstioEnvoyFilter("infra", "edge", IstioCluster("slidegate-system", "slidegate-rls", 8081), []GatewayPolicy{
		{Policy: byAddress, Ports: []int32{443}},
		{Policy: byHeader, Rules: RulesOf(RouteRules{Namespace: "shop", Name: "checkout", Rules: []string{"", "login", ""}}, "", nil)},
	})
	if err != nil {
		t.Fatal(err)
	}
	data, err := yaml.Marshal(u.Object)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "istio-envoyfilter.yaml", data)

	patches, _, _ := unstructured.NestedSlice(u.Object, "spec", "configPatches")
	if len(patches) != 4 {
		t.Fatalf("%d patches, want the filter, two routes and one port's virtual hosts", len(patches))
	}
	kinds := map[string]int{}
	for _, p := range patches {
		m := p.(map[string]any)
		kinds[m["applyTo"].(string)]++
		value, err := json.Marshal(m["patch"].(map[string]any)["value"])
		if err != nil {
			t.Fatal(err)
		}
		switch m["applyTo"] {
		case "HTTP_FILTER":
			mustRead(t, value, &hcmv3.HttpFilter{})
		case "HTTP_ROUTE":
			mustRead(t, value, &routev3.Route{})
		case "VIRTUAL_HOST":
			mustRead(t, value, &routev3.VirtualHost{})
		}
	}
	if kinds["HTTP_FILTER"] != 1 {
		t.Errorf("%d rate limit filters, want exactly 1: a second one would count each request twice", kinds["HTTP_FILTER"])
	}
	// The same input in another order renders the same object.
	again, err := IstioEnvoyFilter("infra", "edge", IstioCluster("slidegate-system", "slidegate-rls", 8081), []GatewayPolicy{
		{Policy: byHeader, Rules: reversed(RulesOf(RouteRules{Namespace: "shop", Name: "checkout", Rules: []string{"", "login", ""}}, "", nil))},
		{Policy: byAddress, Ports: []int32{443}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if d2, _ := yaml.Marshal(again.Object); string(d2) != string(data) {
		t.Errorf("another order renders another object:\n%s", d2)
	}
}

// mustRead reads value as Envoy reads it: unknown fields refused.
func mustRead(t *testing.T, value []byte, into proto.Message) {
	t.Helper()
	if err := protojson.Unmarshal(value, into); err != nil {
		t.Errorf("Envoy would refuse %s: %v", value, err)
	}
}

func reversed[T any](s []T) []T {
	s = slices.Clone(s)
	slices.Reverse(s)
	return s
}
