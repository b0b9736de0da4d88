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

// Package envoyrender renders the Envoy configuration that makes a
// gateway ask slidegate's rate limit service about the requests of a
// policy attached to its routes (spec.targetRefs): the rate limit HTTP
// filter, once per gateway, and the rate limit actions of each route,
// which build the descriptor the service's document expects
// (render.AttachedDescriptor). The messages are go-control-plane's own
// types, checked by their generated validation, so what is rendered is
// configuration Envoy accepts; no Envoy runs in the tests.
package envoyrender

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitconfv3 "github.com/envoyproxy/go-control-plane/envoy/config/ratelimit/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
)

// FilterName is the name of Envoy's rate limit HTTP filter.
const FilterName = "envoy.filters.http.ratelimit"

// DefaultTimeout bounds the filter's call to the rate limit service. The
// service answers within its own Redis deadline (failMode decides past
// it); this is the gateway's bound for a service that does not answer at
// all, after which the request passes (FailureModeDeny false).
const DefaultTimeout = 200 * time.Millisecond

// RateLimit is the element of a route's rate_limits that sends the
// policy's descriptor: a generic_key entry naming the policy, then the
// client's entry (remote_address; request_headers or query_parameters
// under the key slidegate_client; none for Global). A request without the
// header or query parameter makes Envoy send no descriptor for it, so it
// passes uncounted (key.onMissing Allow, which the API requires here).
func RateLimit(p *v1alpha1.RateLimitPolicy) (*routev3.RateLimit, error) {
	d, err := render.AttachedDescriptor(p)
	if err != nil {
		return nil, fmt.Errorf("policy %s/%s: %w", p.Namespace, p.Name, err)
	}
	actions := []*routev3.RateLimit_Action{{ActionSpecifier: &routev3.RateLimit_Action_GenericKey_{
		GenericKey: &routev3.RateLimit_Action_GenericKey{DescriptorKey: v1alpha1.TargetRefsPolicyKey, DescriptorValue: d.Descriptor[0].Value},
	}}}
	k := p.Spec.Key
	switch k.Source {
	case v1alpha1.KeySourceRemoteAddress:
		actions = append(actions, &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_RemoteAddress_{
			RemoteAddress: &routev3.RateLimit_Action_RemoteAddress{},
		}})
	case v1alpha1.KeySourceHeader:
		actions = append(actions, &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_RequestHeaders_{
			RequestHeaders: &routev3.RateLimit_Action_RequestHeaders{HeaderName: k.Name, DescriptorKey: v1alpha1.TargetRefsClientKey},
		}})
	case v1alpha1.KeySourceQueryParameter:
		actions = append(actions, &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_QueryParameters_{
			QueryParameters: &routev3.RateLimit_Action_QueryParameters{QueryParameterName: k.Name, DescriptorKey: v1alpha1.TargetRefsClientKey},
		}})
	}
	rl := &routev3.RateLimit{Actions: actions}
	if err := rl.ValidateAll(); err != nil {
		return nil, fmt.Errorf("policy %s/%s: the rendered rate limit actions: %w", p.Namespace, p.Name, err)
	}
	return rl, nil
}

// Filter is the rate limit HTTP filter, named name, that asks the rate
// limit service,
// reached through the Envoy cluster named cluster (the gateway's own name
// for slidegate's RLS Service), on the reserved domain. It goes before
// the router, once per gateway: two such filters would count each
// request twice.
func Filter(name, cluster string, timeout time.Duration) (*hcmv3.HttpFilter, error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	cfg := &ratelimitv3.RateLimit{
		Domain:          v1alpha1.TargetRefsDomain,
		Timeout:         durationpb.New(timeout),
		FailureModeDeny: false,
		// The service's own RateLimit and Retry-After headers reach the
		// client through response_headers_to_add; Envoy adds no others.
		RateLimitService: &ratelimitconfv3.RateLimitServiceConfig{
			GrpcService: &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
				EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: cluster},
			}},
			TransportApiVersion: corev3.ApiVersion_V3,
		},
	}
	if err := cfg.ValidateAll(); err != nil {
		return nil, fmt.Errorf("the rendered rate limit filter: %w", err)
	}
	anyCfg, err := anypb.New(cfg)
	if err != nil {
		return nil, err
	}
	f := &hcmv3.HttpFilter{Name: name, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: anyCfg}}
	if err := f.ValidateAll(); err != nil {
		return nil, fmt.Errorf("the rendered rate limit filter: %w", err)
	}
	return f, nil
}

// JSON is m as Envoy's JSON and YAML configuration spell it (proto field
// names, e.g. rate_limits), indented, for EnvoyFilter and EnvoyPatchPolicy
// values and the docs. protojson varies its whitespace on purpose; the
// bytes are compacted and indented again, so the same message always
// gives the same bytes (golden files).
func JSON(m proto.Message) ([]byte, error) {
	raw, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	var compact, out bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, err
	}
	if err := json.Indent(&out, compact.Bytes(), "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}
