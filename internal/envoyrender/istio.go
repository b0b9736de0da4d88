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
	"cmp"
	"fmt"
	"slices"
	"strconv"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// Istio (1.27 or later: the first release whose EnvoyFilter targetRefs
// select only the targeted Gateway's proxies) programs a Gateway API
// Gateway's Envoy from an EnvoyFilter in the Gateway's namespace. Names
// Istio gives, read in istio/istio's pilot (conversion of Gateway API
// routes, route naming, EnvoyFilter matching):
//   - the Envoy routes of an HTTPRoute rule are named after the rule's
//     name when it has one, else "<namespace>.<route>.<rule index>";
//   - an EnvoyFilter's HTTP_ROUTE match compares that name exactly;
//   - a Kubernetes Service's cluster is "outbound|<port>||<host>".

// IstioCluster is the cluster name Istio gives a Service's port, e.g. the
// rate limit service's.
func IstioCluster(namespace, service string, port int32) string {
	return fmt.Sprintf("outbound|%d||%s.%s.svc.cluster.local", port, service, namespace)
}

// IstioRouteName is the name Istio gives the Envoy routes of rule, or ok
// false for a named rule. Istio names the Envoy routes of a named rule by
// the rule's name alone, which a rule of any other HTTPRoute on the same
// Gateway may share: a patch by that name would put the policy on the
// other route's requests too (a tenant limiting another's traffic), and
// leaving shared names out would let another tenant switch a policy off
// by naming a rule alike. So named rules are not patched at all, whatever
// other routes hold (the answer depends on the route alone).
func IstioRouteName(rule Rule) (name string, ok bool) {
	if rule.Name != "" {
		return "", false
	}
	return rule.Namespace + "." + rule.Route + "." + strconv.Itoa(rule.Index), true
}

// IstioEnvoyFilter is the one EnvoyFilter of a Gateway: the rate limit
// filter before the router (once, so that no request is counted twice),
// each route's rate limit actions (MERGE appends to what the route has,
// and the route keeps the virtual host's rate limits too: vh_rate_limits
// INCLUDE), and the virtual hosts' actions of Gateway targets. Policies
// and routes are sorted, so the same input renders the same object.
func IstioEnvoyFilter(gwNamespace, gwName, cluster string, policies []GatewayPolicy) (*unstructured.Unstructured, error) {
	filter, err := Filter(FilterName, cluster, 0)
	if err != nil {
		return nil, err
	}
	patches := []any{map[string]any{
		"applyTo": "HTTP_FILTER",
		"match": map[string]any{"context": "GATEWAY", "listener": map[string]any{"filterChain": map[string]any{"filter": map[string]any{
			"name": "envoy.filters.network.http_connection_manager", "subFilter": map[string]any{"name": "envoy.filters.http.router"},
		}}}},
		"patch": map[string]any{"operation": "INSERT_BEFORE", "value": filter},
	}}

	sorted := slices.Clone(policies)
	slices.SortFunc(sorted, func(a, b GatewayPolicy) int {
		return cmp.Or(cmp.Compare(a.Policy.Namespace, b.Policy.Namespace), cmp.Compare(a.Policy.Name, b.Policy.Name))
	})
	byRoute := map[string][]*routev3.RateLimit{}
	byPort := map[int32][]*routev3.RateLimit{} // 0: every port
	for _, gp := range sorted {
		rl, err := RateLimit(gp.Policy)
		if err != nil {
			return nil, err
		}
		for _, rule := range gp.Rules {
			if n, ok := IstioRouteName(rule); ok {
				byRoute[n] = append(byRoute[n], rl)
			}
		}
		if gp.AllPorts {
			byPort[0] = append(byPort[0], rl)
		}
		for _, port := range gp.Ports {
			byPort[port] = append(byPort[port], rl)
		}
	}
	include := &ratelimitv3.RateLimitPerRoute{VhRateLimits: ratelimitv3.RateLimitPerRoute_INCLUDE}
	if err := include.ValidateAll(); err != nil {
		return nil, err
	}
	perRoute, err := anypb.New(include)
	if err != nil {
		return nil, err
	}
	for _, name := range sortedKeys(byRoute) {
		route := &routev3.Route{
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{RateLimits: byRoute[name]}},
			// Keep the virtual host's rate limits (a Gateway target's)
			// on a route with its own.
			TypedPerFilterConfig: map[string]*anypb.Any{FilterName: perRoute},
		}
		value, err := jsonValue(route)
		if err != nil {
			return nil, err
		}
		patches = append(patches, map[string]any{
			"applyTo": "HTTP_ROUTE",
			"match":   map[string]any{"context": "GATEWAY", "routeConfiguration": map[string]any{"vhost": map[string]any{"route": map[string]any{"name": name}}}},
			"patch":   map[string]any{"operation": "MERGE", "value": value},
		})
	}
	for _, port := range sortedKeys(byPort) {
		value, err := jsonValue(&routev3.VirtualHost{RateLimits: byPort[port]})
		if err != nil {
			return nil, err
		}
		match := map[string]any{"context": "GATEWAY"}
		if port != 0 {
			match["routeConfiguration"] = map[string]any{"portNumber": int64(port)}
		}
		patches = append(patches, map[string]any{"applyTo": "VIRTUAL_HOST", "match": match, "patch": map[string]any{"operation": "MERGE", "value": value}})
	}

	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1alpha3",
		"kind":       "EnvoyFilter",
		"metadata": map[string]any{
			"name": gatewayObjectName(gwName), "namespace": gwNamespace,
			"labels": map[string]any{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue},
		},
		"spec": map[string]any{
			"targetRefs":    []any{map[string]any{"group": v1alpha1.GatewayAPIGroup, "kind": "Gateway", "name": gwName}},
			"configPatches": patches,
		},
	}}
	return roundTripJSON(u, "configPatches", "patch")
}
