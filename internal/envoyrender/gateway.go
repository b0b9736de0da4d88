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
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// What the objects of both gateways share: the targeted rules, a policy as
// one Gateway serves it, and the object's name and JSON.

// RouteRules are an HTTPRoute's rules, by name ("" for a rule without one),
// in order.
type RouteRules struct {
	Namespace, Name string
	Rules           []string
}

// Rule is one rule of an HTTPRoute that a policy targets, as a Gateway
// serves it: Ports are the ports of the Gateway's listeners the route is
// attached to (its parentRef's sectionName), or every listener's when
// empty.
type Rule struct {
	Namespace, Route, Name string
	Index                  int
	Ports                  []int32
}

// RulesOf are the rules of r that section selects (every rule when
// section is ""), on ports.
func RulesOf(r RouteRules, section string, ports []int32) []Rule {
	var out []Rule
	for i, name := range r.Rules {
		if section == "" || name == section {
			out = append(out, Rule{Namespace: r.Namespace, Route: r.Name, Name: name, Index: i, Ports: ports})
		}
	}
	return out
}

// GatewayPolicy is a policy as one Gateway serves it: on the routes of
// Rules (HTTPRoute targets), and, for a Gateway target, on every route of
// the listeners on Ports (AllPorts: of every listener).
type GatewayPolicy struct {
	Policy   *v1alpha1.RateLimitPolicy
	Rules    []Rule
	Ports    []int32
	AllPorts bool
}

// jsonValue is m as a JSON object value of an EnvoyFilter patch.
func jsonValue(m proto.Message) (map[string]any, error) {
	data, err := JSON(m)
	if err != nil {
		return nil, err
	}
	var v map[string]any
	return v, json.Unmarshal(data, &v)
}

// gatewayObjectName names a Gateway's object: slidegate-ratelimit-<name>,
// or a hash of the name where that would exceed an object name's 253
// characters.
func gatewayObjectName(gw string) string {
	if n := "slidegate-ratelimit-" + gw; len(n) <= 253 {
		return n
	}
	sum := sha256.Sum256([]byte(gw))
	return "slidegate-ratelimit-" + hex.EncodeToString(sum[:8])
}

// roundTripJSON turns the proto messages among the values of the object's
// spec.<list>[].<field>.value into their JSON (Envoy's), and the whole
// object into what the API server stores (int64, map[string]any), so that
// it compares equal after a read.
func roundTripJSON(u *unstructured.Unstructured, list, field string) (*unstructured.Unstructured, error) {
	spec := u.Object["spec"].(map[string]any)
	for _, p := range spec[list].([]any) {
		holder := p.(map[string]any)[field].(map[string]any)
		if m, ok := holder["value"].(proto.Message); ok {
			v, err := jsonValue(m)
			if err != nil {
				return nil, err
			}
			holder["value"] = v
		}
	}
	data, err := json.Marshal(u.Object)
	if err != nil {
		return nil, err
	}
	out := &unstructured.Unstructured{}
	return out, out.UnmarshalJSON(data)
}

func sortedKeys[K int32 | string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
