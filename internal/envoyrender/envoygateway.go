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
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// Envoy Gateway (1.2 or later: the first release whose EnvoyPatchPolicy
// selects nodes by jsonPath) programs a Gateway API Gateway's Envoy from
// its own xDS, which an EnvoyPatchPolicy in the Gateway's namespace patches
// (JSON Patch on named xDS resources; the controller must have
// extensionApis.enableEnvoyPatchPolicy on). Names Envoy Gateway gives, read
// in envoyproxy/gateway (internal/gatewayapi, internal/xds/translator):
//   - a listener, and its route configuration, is "<gateway namespace>/
//     <gateway>/<listener>", the first listener of its port's (HTTP
//     listeners on one port share it);
//   - an HTTPRoute rule's Envoy routes are named
//     "httproute/<namespace>/<route>/rule/<index>/match/<m>/<host>", so a
//     rule is found by that name's prefix, which no other route shares.

// EnvoyGatewayFilterName is the name of the rate limit filter slidegate
// adds to Envoy Gateway's listeners: a name of its own, so that its
// per-route configuration (the policies' actions) is slidegate's alone and
// leaves Envoy Gateway's own rate limiting untouched.
const EnvoyGatewayFilterName = "slidegate.ratelimit"

// EnvoyGatewayCluster is the cluster slidegate adds for the rate limit
// service.
const EnvoyGatewayCluster = "slidegate-rls"

// Listener is a listener of a Gateway: its name and port.
type Listener struct {
	Name string
	Port int32
}

// EnvoyPatchPolicy is the one EnvoyPatchPolicy of an Envoy Gateway
// Gateway: the cluster of the rate limit service (host:port, spoken to in
// HTTP/2), the rate limit filter first in each listener's HTTP filters,
// and the policies' actions as that filter's per-route configuration: on
// the routes of each targeted rule (with the Gateway targets' actions of
// that port, since the most specific per-filter configuration wins), and
// on the virtual hosts of the ports of Gateway targets. listeners are the
// Gateway's, in its order.
func EnvoyPatchPolicy(gwNamespace, gwName string, listeners []Listener, host string, port int32, policies []GatewayPolicy) (*unstructured.Unstructured, error) {
	const (
		listenerType = "type.googleapis.com/envoy.config.listener.v3.Listener"
		routesType   = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
		clusterType  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	)
	// The route configuration of each port: its first listener's.
	byPort := map[int32]string{}
	var ports []int32
	for _, l := range listeners {
		if _, ok := byPort[l.Port]; !ok {
			byPort[l.Port] = gwNamespace + "/" + gwName + "/" + l.Name
			ports = append(ports, l.Port)
		}
	}
	slices.Sort(ports)

	cluster, err := rlsCluster(host, port)
	if err != nil {
		return nil, err
	}
	filter, err := Filter(EnvoyGatewayFilterName, EnvoyGatewayCluster, 0)
	if err != nil {
		return nil, err
	}
	patches := []any{patch(clusterType, EnvoyGatewayCluster, "", "", cluster)}
	for _, p := range ports {
		patches = append(patches, patch(listenerType, byPort[p],
			"..filters[?(@.name=='envoy.filters.network.http_connection_manager')].typed_config.http_filters[0]", "", filter))
	}

	sorted := slices.Clone(policies)
	slices.SortFunc(sorted, func(a, b GatewayPolicy) int {
		return cmp.Or(cmp.Compare(a.Policy.Namespace, b.Policy.Namespace), cmp.Compare(a.Policy.Name, b.Policy.Name))
	})
	onPort := map[int32][]*routev3.RateLimit{} // Gateway targets, by port
	type ruleKey struct {
		port   int32
		prefix string
	}
	onRule := map[ruleKey][]*routev3.RateLimit{}
	for _, gp := range sorted {
		rl, err := RateLimit(gp.Policy)
		if err != nil {
			return nil, err
		}
		for _, p := range ports {
			if gp.AllPorts || slices.Contains(gp.Ports, p) {
				onPort[p] = append(onPort[p], rl)
			}
		}
		for _, rule := range gp.Rules {
			for _, p := range ports {
				if len(rule.Ports) == 0 || slices.Contains(rule.Ports, p) {
					k := ruleKey{p, "httproute/" + rule.Namespace + "/" + rule.Route + "/rule/" + strconv.Itoa(rule.Index) + "/"}
					onRule[k] = append(onRule[k], rl)
				}
			}
		}
	}
	perFilter := "typed_per_filter_config/" + EnvoyGatewayFilterName
	for _, p := range ports {
		if len(onPort[p]) > 0 {
			v, err := perRoute(onPort[p])
			if err != nil {
				return nil, err
			}
			patches = append(patches, patch(routesType, byPort[p], "virtual_hosts[*]", perFilter, v))
		}
	}
	keys := make([]ruleKey, 0, len(onRule))
	for k := range onRule {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b ruleKey) int { return cmp.Or(cmp.Compare(a.port, b.port), cmp.Compare(a.prefix, b.prefix)) })
	for _, k := range keys {
		v, err := perRoute(append(slices.Clone(onRule[k]), onPort[k.port]...))
		if err != nil {
			return nil, err
		}
		// [.] for a dot: names are DNS names, and the pattern needs no
		// escapes inside the JSONPath string.
		pattern := "^" + strings.ReplaceAll(k.prefix, ".", "[.]")
		patches = append(patches, patch(routesType, byPort[k.port], "..routes[?(@.name=~'"+pattern+"')]", perFilter, v))
	}

	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.envoyproxy.io/v1alpha1",
		"kind":       "EnvoyPatchPolicy",
		"metadata": map[string]any{
			"name": gatewayObjectName(gwName), "namespace": gwNamespace,
			"labels": map[string]any{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue},
		},
		"spec": map[string]any{
			"targetRef":   map[string]any{"group": v1alpha1.GatewayAPIGroup, "kind": "Gateway", "name": gwName},
			"type":        "JSONPatch",
			"jsonPatches": patches,
		},
	}}
	return roundTripJSON(u, "jsonPatches", "operation")
}

// patch is one JSON patch of an EnvoyPatchPolicy: an add (slidegate only
// adds).
func patch(typ, name, jsonPath, path string, value any) map[string]any {
	operation := map[string]any{"op": "add", "value": value}
	if jsonPath != "" {
		operation["jsonPath"] = jsonPath
	}
	if path != "" || jsonPath == "" {
		operation["path"] = path
	}
	return map[string]any{"type": typ, "name": name, "operation": operation}
}

// perRoute is the rate limit filter's per-route configuration with
// actions.
func perRoute(actions []*routev3.RateLimit) (*anypb.Any, error) {
	cfg := &ratelimitv3.RateLimitPerRoute{RateLimits: actions}
	if err := cfg.ValidateAll(); err != nil {
		return nil, err
	}
	return anypb.New(cfg)
}

// rlsCluster is the cluster of the rate limit service at host:port, over
// HTTP/2 (gRPC).
func rlsCluster(host string, port int32) (*clusterv3.Cluster, error) {
	h2, err := anypb.New(&httpv3.HttpProtocolOptions{UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
		ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
			Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
		}},
	}})
	if err != nil {
		return nil, err
	}
	c := &clusterv3.Cluster{
		Name:                 EnvoyGatewayCluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS},
		ConnectTimeout:       durationpb.New(time.Second),
		TypedExtensionProtocolOptions: map[string]*anypb.Any{
			"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": h2,
		},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: EnvoyGatewayCluster,
			Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
						Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)},
					}}},
				}},
			}}}},
		},
	}
	if err := c.ValidateAll(); err != nil {
		return nil, fmt.Errorf("the rendered cluster: %w", err)
	}
	return c, nil
}
