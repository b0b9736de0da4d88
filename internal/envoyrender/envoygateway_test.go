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
	"maps"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// TestEnvoyPatchPolicyGolden: an Envoy Gateway Gateway with two HTTP
// listeners on one port and one on another, serving a policy on a route's
// rule attached to one listener and a policy on every listener; each value
// reads back as Envoy's own types.
func TestEnvoyPatchPolicyGolden(t *testing.T) {
	byHeader := attached("login", v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User", OnMissing: v1alpha1.MissingKeyAllow})
	byAddress := attached("edge", v1alpha1.ClientKey{Source: v1alpha1.KeySourceRemoteAddress})
	listeners := []Listener{{Name: "http", Port: 80}, {Name: "http-alt", Port: 80}, {Name: "https", Port: 443}}
	rules := RulesOf(RouteRules{Namespace: "shop", Name: "checkout.v2", Rules: []string{"login", ""}}, "login", []int32{443})
	u, err := EnvoyPatchPolicy("infra", "edge", listeners, "slidegate-rls.slidegate-system.svc.cluster.local", 8081, []GatewayPolicy{
		{Policy: byHeader, Rules: rules},
		{Policy: byAddress, AllPorts: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	data, err := yaml.Marshal(u.Object)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "envoypatchpolicy.yaml", data)
	patches, _, _ := unstructured.NestedSlice(u.Object, "spec", "jsonPatches")
	counts := map[string]int{}
	for _, p := range patches {
		m := p.(map[string]any)
		op := m["operation"].(map[string]any)
		value, err := json.Marshal(op["value"])
		if err != nil {
			t.Fatal(err)
		}
		typ := m["type"].(string)
		path, _ := op["jsonPath"].(string)
		switch {
		case strings.HasSuffix(typ, "Cluster"):
			mustRead(t, value, &clusterv3.Cluster{})
		case strings.HasSuffix(typ, "Listener"):
			mustRead(t, value, &hcmv3.HttpFilter{})
		case strings.HasPrefix(path, "..routes"):
			mustRead(t, value, &anypb.Any{})
		default:
			mustRead(t, value, &anypb.Any{})
		}
		counts[typ+" "+m["name"].(string)]++
	}
	want := map[string]int{
		"type.googleapis.com/envoy.config.cluster.v3.Cluster slidegate-rls":             1,
		"type.googleapis.com/envoy.config.listener.v3.Listener infra/edge/http":         1, // port 80's, once
		"type.googleapis.com/envoy.config.listener.v3.Listener infra/edge/https":        1,
		"type.googleapis.com/envoy.config.route.v3.RouteConfiguration infra/edge/http":  1, // the virtual hosts
		"type.googleapis.com/envoy.config.route.v3.RouteConfiguration infra/edge/https": 2, // and the rule on 443
	}
	if !maps.Equal(counts, want) {
		t.Errorf("patches %v, want %v", counts, want)
	}
}
