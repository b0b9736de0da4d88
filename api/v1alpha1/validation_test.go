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

package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// k is a client of the package's one envtest API server, with the CRD of
// config/crd/bases installed.
var k client.Client

func TestMain(m *testing.M) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	env, c, err := testsupport.StartControlPlane(scheme)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	k = c
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
	}
	os.Exit(code)
}

// validationCase is one policy for the API server: mutate turns validSpec
// into it, and wantErr are substrings of the API server's error (none:
// accepted).
type validationCase struct {
	name    string
	mutate  func(*v1alpha1.RateLimitPolicySpec)
	wantErr []string
}

func validSpec() v1alpha1.RateLimitPolicySpec {
	return v1alpha1.RateLimitPolicySpec{
		TargetSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "checkout"}},
		Window:         "10s",
		Limit:          5,
		Key:            v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User-ID"},
	}
}

// rls turns a sidecar policy into one for the rate limit service.
func rls(s *v1alpha1.RateLimitPolicySpec) {
	s.TargetSelector, s.Key = nil, v1alpha1.ClientKey{}
	s.RateLimitService = &v1alpha1.RateLimitServiceTarget{
		Domain:     "edge",
		Descriptor: []v1alpha1.DescriptorEntry{{Key: "generic_key", Value: "checkout"}, {Key: "remote_address"}},
	}
}

// attach turns a sidecar policy into one attached to an HTTPRoute's rule
// and a Gateway's listener.
func attach(s *v1alpha1.RateLimitPolicySpec) {
	s.TargetSelector = nil
	s.Key.OnMissing = v1alpha1.MissingKeyAllow
	s.TargetRefs = []v1alpha1.PolicyTargetReference{
		{Group: v1alpha1.GatewayAPIGroup, Kind: "HTTPRoute", Name: "checkout", SectionName: "login"},
		{Group: v1alpha1.GatewayAPIGroup, Kind: "Gateway", Name: "edge", SectionName: "https"},
	}
}

// TestValidation creates policies through the real API server: valid specs
// are stored, invalid ones are rejected with a message a user understands.
func TestValidation(t *testing.T) {
	tests := []validationCase{
		{name: "valid header key", mutate: func(*v1alpha1.RateLimitPolicySpec) {}},
		// Policies for the rate limit service (issue 14).
		{name: "valid rate limit service", mutate: rls},
		{name: "valid rate limit service, fixed values only", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			rls(s)
			s.RateLimitService.Descriptor = []v1alpha1.DescriptorEntry{{Key: "generic_key", Value: "checkout"}, {Key: "path", Value: "/login"}}
		}},
		{name: "neither targetSelector nor rateLimitService", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.TargetSelector = nil },
			wantErr: []string{"set exactly one of targetSelector (pods that carry the sidecar), rateLimitService (requests of Envoy gateways, by descriptor) and targetRefs"}},
		{name: "both targetSelector and rateLimitService", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			sel := s.TargetSelector
			rls(s)
			s.TargetSelector = sel
		}, wantErr: []string{"set exactly one of targetSelector"}},
		{name: "targetSelector without key", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Key = v1alpha1.ClientKey{} },
			wantErr: []string{"key is required with targetSelector and targetRefs"}},
		// Policies attached to Gateway API objects.
		{name: "valid targetRefs, route and gateway listener", mutate: attach},
		{name: "valid targetRefs, remote address", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s)
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceRemoteAddress}
		}},
		{name: "targetRefs and targetSelector", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			sel := s.TargetSelector
			attach(s)
			s.TargetSelector = sel
		}, wantErr: []string{"set exactly one of targetSelector"}},
		{name: "targetRefs and rateLimitService", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s)
			refs, key := s.TargetRefs, s.Key
			rls(s)
			s.TargetRefs, s.Key = refs, key
		}, wantErr: []string{"set exactly one of targetSelector"}},
		{name: "targetRefs without key", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s)
			s.Key = v1alpha1.ClientKey{}
		}, wantErr: []string{"key is required with targetSelector and targetRefs"}},
		{name: "targetRefs, JWT claim", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s)
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceJWTClaim, Name: "sub", JWT: &v1alpha1.JWTVerification{InsecureSkipVerification: "VerifiedUpstream"}}
		}, wantErr: []string{"with targetRefs the key source is RemoteAddress, Header, QueryParameter or Global"}},
		{name: "targetRefs, header key counted by address when missing", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s)
			s.Key.OnMissing = ""
		}, wantErr: []string{"with targetRefs write key.onMissing: Allow"}},
		{name: "targetRefs with match", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s)
			s.Match = &v1alpha1.RequestMatch{Methods: []v1alpha1.HTTPMethod{"GET"}}
		}, wantErr: []string{"match does not apply with targetRefs"}},
		{name: "targetRefs with remoteAddress", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s)
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceRemoteAddress, RemoteAddress: &v1alpha1.ClientAddress{}}
		}, wantErr: []string{"key.remoteAddress does not apply with targetRefs"}},
		{name: "targetRefs, a kind other than Gateway or HTTPRoute", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s)
			s.TargetRefs[0].Kind = "GRPCRoute"
		}, wantErr: []string{"spec.targetRefs[0].kind", "supported values"}},
		{name: "targetRefs, another group", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s)
			s.TargetRefs[0].Group = "networking.istio.io"
		}, wantErr: []string{"spec.targetRefs[0].group"}},
		{name: "targetRefs, one target twice", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s)
			s.TargetRefs = append(s.TargetRefs, s.TargetRefs[0])
		}, wantErr: []string{"each target may be listed once"}},
		{name: "targetRefs, a rule and its route both listed", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			attach(s)
			whole := s.TargetRefs[0]
			whole.SectionName = ""
			s.TargetRefs = append(s.TargetRefs, whole)
		}},
		{name: "rateLimitService on the reserved domain", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			rls(s)
			s.RateLimitService.Domain = v1alpha1.TargetRefsDomain
		}, wantErr: []string{"the domain ratelimit.slidegate.dev is reserved for policies with targetRefs"}},
		{name: "rateLimitService with key", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			rls(s)
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal}
		}, wantErr: []string{"key and match do not apply with rateLimitService"}},
		{name: "rateLimitService with match", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			rls(s)
			s.Match = &v1alpha1.RequestMatch{Methods: []v1alpha1.HTTPMethod{"GET"}}
		}, wantErr: []string{"key and match do not apply with rateLimitService"}},
		{name: "rateLimitService without descriptor", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			rls(s)
			s.RateLimitService.Descriptor = nil
		}, wantErr: []string{"spec.rateLimitService.descriptor: Required value"}},
		{name: "rateLimitService, 9 entries", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			rls(s)
			for i := range 8 {
				s.RateLimitService.Descriptor = append(s.RateLimitService.Descriptor, v1alpha1.DescriptorEntry{Key: fmt.Sprintf("k%d", i)})
			}
		}, wantErr: []string{"spec.rateLimitService.descriptor", "must have at most 8 items"}},
		{name: "rateLimitService, empty domain", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			rls(s)
			s.RateLimitService.Domain = ""
		}, wantErr: []string{"spec.rateLimitService.domain"}},
		{name: "rateLimitService, empty entry key", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			rls(s)
			s.RateLimitService.Descriptor[0].Key = ""
		}, wantErr: []string{"spec.rateLimitService.descriptor[0].key"}},
		{name: "valid 1ms", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Window = "1ms" }},
		{name: "valid 24h", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Window = "24h" }},
		{name: "valid compound window", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Window = "1h30m15s250ms" }},
		{name: "valid 86400000ms", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Window = "86400000ms" }},
		{name: "valid limit 1", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Limit = 1 }},
		{name: "valid limit 1000000", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Limit = 1_000_000 }},
		{name: "valid remote address", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceRemoteAddress}
		}},
		{name: "valid global", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal}
		}},
		{name: "valid query parameter, onMissing Deny", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceQueryParameter, Name: "api_key", OnMissing: v1alpha1.MissingKeyDeny}
		}},
		{name: "valid JWT claim", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceJWTClaim, Name: "sub", OnMissing: v1alpha1.MissingKeyAllow, JWT: verified()}
		}},
		{name: "valid everything set", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetPort = "web-8080"
			s.FailMode = v1alpha1.FailClosed
			s.Algorithm = v1alpha1.AlgorithmSlidingWindowCounter
			s.Mode = v1alpha1.ModeDryRun
			s.Match = &v1alpha1.RequestMatch{Methods: []v1alpha1.HTTPMethod{"GET", "POST"}, PathPrefixes: []v1alpha1.PathPrefix{"/api/", "/"}}
		}},

		{name: "valid durability Replicated", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Durability = v1alpha1.DurabilityReplicated }},
		{name: "valid durability Primary", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Durability = v1alpha1.DurabilityPrimary }},
		{name: "unknown durability", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Durability = "Quorum" },
			wantErr: []string{"spec.durability", `Unsupported value: "Quorum"`}},

		{name: "limit 0", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Limit = 0 },
			wantErr: []string{"spec.limit", "greater than or equal to 1"}},
		{name: "limit -1", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Limit = -1 },
			wantErr: []string{"spec.limit", "greater than or equal to 1"}},
		{name: "limit 2000000", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Limit = 2_000_000 },
			wantErr: []string{"spec.limit", "less than or equal to 1000000"}},
		{name: "window 0", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Window = "0" },
			wantErr: []string{"spec.window", "window must be a duration like '500ms'"}},
		{name: "window 0s", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Window = "0s" },
			wantErr: []string{"spec.window", "window must be from 1ms to 24h"}},
		{name: "window 500us", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Window = "500us" },
			wantErr: []string{"spec.window", "window must be a duration like '500ms'"}},
		{name: "window 1.5s", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Window = "1.5s" },
			wantErr: []string{"spec.window", "window must be a duration like '500ms'"}},
		{name: "window 25h", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Window = "25h" },
			wantErr: []string{"spec.window", "window must be from 1ms to 24h"}},
		{name: "window 24h1ms", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Window = "24h1ms" },
			wantErr: []string{"spec.window", "window must be from 1ms to 24h"}},
		{name: "window abc", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Window = "abc" },
			wantErr: []string{"spec.window", "window must be a duration like '500ms'"}},
		{name: "window empty", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Window = "" },
			wantErr: []string{"spec.window"}},
		{name: "window huge does not overflow", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Window = "99h9999m99999s99999999ms" },
			wantErr: []string{"spec.window", "window must be from 1ms to 24h"}},
		{name: "unknown key source", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Key.Source = "Cookie" },
			wantErr: []string{"spec.key.source", `Unsupported value: "Cookie"`}},
		{name: "unknown onMissing", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Key.OnMissing = "Ignore" },
			wantErr: []string{"spec.key.onMissing", `Unsupported value: "Ignore"`}},
		{name: "unknown failMode", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.FailMode = "Half" },
			wantErr: []string{"spec.failMode", `Unsupported value: "Half"`}},
		{name: "unknown algorithm", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Algorithm = "TokenBucket" },
			wantErr: []string{"spec.algorithm", `Unsupported value: "TokenBucket"`}},
		{name: "unknown mode", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Mode = "Shadow" },
			wantErr: []string{"spec.mode", `Unsupported value: "Shadow"`}},
		{name: "unknown method", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Match = &v1alpha1.RequestMatch{Methods: []v1alpha1.HTTPMethod{"get"}}
		}, wantErr: []string{"spec.match.methods[0]", `Unsupported value: "get"`}},
		{name: "Header without a name", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Key.Name = "" },
			wantErr: []string{"spec.key", "name is required when source is Header, QueryParameter or JWTClaim"}},
		{name: "QueryParameter without a name", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceQueryParameter}
		}, wantErr: []string{"spec.key", "name is required when source is Header, QueryParameter or JWTClaim"}},
		{name: "JWTClaim without a name", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceJWTClaim}
		}, wantErr: []string{"spec.key", "name is required when source is Header, QueryParameter or JWTClaim"}},
		{name: "Global with a name", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal, Name: "x"}
		}, wantErr: []string{"spec.key", "name must not be set when source is RemoteAddress or Global"}},
		{name: "RemoteAddress with onMissing", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceRemoteAddress, OnMissing: v1alpha1.MissingKeyDeny}
		}, wantErr: []string{"spec.key", "onMissing applies only when source is Header, QueryParameter or JWTClaim"}},
		{name: "bad header name", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Key.Name = "X User" },
			wantErr: []string{"spec.key", "a header name may contain only letters, digits"}},
		{name: "path prefix without slash", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Match = &v1alpha1.RequestMatch{PathPrefixes: []v1alpha1.PathPrefix{"api"}}
		}, wantErr: []string{"spec.match.pathPrefixes[0]", "a path prefix must start with '/'"}},
		{name: "path prefix with query", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Match = &v1alpha1.RequestMatch{PathPrefixes: []v1alpha1.PathPrefix{"/api?x=1"}}
		}, wantErr: []string{"spec.match.pathPrefixes[0]", "must not contain '?' or '#'"}},
		{name: "duplicate method", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Match = &v1alpha1.RequestMatch{Methods: []v1alpha1.HTTPMethod{"GET", "GET"}}
		}, wantErr: []string{"spec.match.methods[1]", "Duplicate value"}},
		{name: "selector operator unknown", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchExpressions = []v1alpha1.LabelSelectorRequirement{{Key: "app", Operator: "Matches", Values: []string{"x"}}}
		}, wantErr: []string{"spec.targetSelector.matchExpressions[0].operator", `Unsupported value: "Matches"`}},
		{name: "selector In without values", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchExpressions = []v1alpha1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn}}
		}, wantErr: []string{"spec.targetSelector", "matchExpressions with the operator In or NotIn need values"}},
		{name: "selector Exists with values", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchExpressions = []v1alpha1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpExists, Values: []string{"x"}}}
		}, wantErr: []string{"spec.targetSelector", "matchExpressions with the operator Exists or DoesNotExist take no values"}},
		{name: "valid selector expressions", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchExpressions = []v1alpha1.LabelSelectorRequirement{
				{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"web"}},
				{Key: "canary", Operator: metav1.LabelSelectorOpDoesNotExist},
			}
		}},
		// Selector bounds (issue 13): every policy of a namespace shares one
		// ConfigMap of at most 1 MiB, so a selector cannot be unbounded.
		{name: "largest selector", mutate: func(s *v1alpha1.RateLimitPolicySpec) { sel := largestSelector(); s.TargetSelector = &sel }},
		{name: "33 matchLabels", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchLabels = matchLabels(33)
		}, wantErr: []string{"spec.targetSelector.matchLabels", "must have at most 32 items"}},
		{name: "17 matchExpressions", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchExpressions = matchExpressions(17, 1)
		}, wantErr: []string{"spec.targetSelector.matchExpressions", "must have at most 16 items"}},
		{name: "65 values", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchExpressions = matchExpressions(1, 65)
		}, wantErr: []string{"spec.targetSelector.matchExpressions[0].values", "must have at most 64 items"}},
		{name: "matchLabels value of 64 characters", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchLabels = map[string]v1alpha1.LabelValue{"app": v1alpha1.LabelValue(strings.Repeat("v", 64))}
		}, wantErr: []string{"spec.targetSelector.matchLabels.app", "may not be more than 63"}},
		{name: "matchLabels key of 318 characters", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchLabels = map[string]v1alpha1.LabelValue{labelKey(0) + "x": "v"}
		}, wantErr: []string{"spec.targetSelector.matchLabels", "a matchLabels key must be a label key"}},
		{name: "matchExpressions key of 318 characters", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchExpressions = []v1alpha1.LabelSelectorRequirement{{Key: labelKey(0) + "x", Operator: metav1.LabelSelectorOpExists}}
		}, wantErr: []string{"spec.targetSelector.matchExpressions[0].key", "may not be more than 317"}},
		{name: "matchExpressions value of 64 characters", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchExpressions = []v1alpha1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{strings.Repeat("v", 64)}}}
		}, wantErr: []string{"spec.targetSelector.matchExpressions[0].values[0]", "may not be more than 63"}},
		{name: "the issue's 839 KB selector", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchExpressions = matchExpressions(1, 13_000)
		}, wantErr: []string{"spec.targetSelector.matchExpressions[0].values", "must have at most 64 items"}},
		// Label formats (issue 13): what the renderer used to find only at
		// reconcile time is refused by the API server.
		{name: "matchLabels value not a label value", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchLabels = map[string]v1alpha1.LabelValue{"app": "not a label value!"}
		}, wantErr: []string{"spec.targetSelector.matchLabels[app]", "a label value has at most 63 letters"}},
		{name: "matchLabels key not a label key", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchLabels = map[string]v1alpha1.LabelValue{"app name": "web"}
		}, wantErr: []string{"spec.targetSelector.matchLabels", "a matchLabels key must be a label key"}},
		{name: "matchLabels key with a bad prefix", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchLabels = map[string]v1alpha1.LabelValue{"Example.COM/app": "web"}
		}, wantErr: []string{"spec.targetSelector.matchLabels", "a matchLabels key must be a label key"}},
		{name: "matchLabels key with a prefix", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchLabels = map[string]v1alpha1.LabelValue{"app.kubernetes.io/name": "web", "empty": ""}
		}},
		{name: "matchExpressions key not a label key", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchExpressions = []v1alpha1.LabelSelectorRequirement{{Key: "-app", Operator: metav1.LabelSelectorOpExists}}
		}, wantErr: []string{"spec.targetSelector.matchExpressions[0].key", "key must be a label key"}},
		{name: "matchExpressions value not a label value", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.TargetSelector.MatchExpressions = []v1alpha1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"a/b"}}}
		}, wantErr: []string{"spec.targetSelector.matchExpressions[0].values", "values must be label values"}},
		{name: "targetPort upper case", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.TargetPort = "HTTP" },
			wantErr: []string{"spec.targetPort", "targetPort must be a container port name"}},
		{name: "targetPort number", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.TargetPort = "8080" },
			wantErr: []string{"spec.targetPort", "targetPort must be a container port name"}},
		{name: "targetPort too long", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.TargetPort = "a-very-long-port-name" },
			wantErr: []string{"spec.targetPort", "may not be more than 15"}},
		// Issue 23: the client address settings and the case-insensitive
		// path prefix.
		{name: "valid remoteAddress for RemoteAddress", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceRemoteAddress,
				RemoteAddress: &v1alpha1.ClientAddress{ForwardedHeader: v1alpha1.ForwardedHeaderForwarded, IPv6PrefixLength: 56}}
		}},
		{name: "valid remoteAddress for a header, onMissing defaulted", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key.RemoteAddress = &v1alpha1.ClientAddress{IPv6PrefixLength: 128}
		}},
		{name: "valid remoteAddress for a query parameter, onMissing RemoteAddress", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceQueryParameter, Name: "k", OnMissing: v1alpha1.MissingKeyRemoteAddress,
				RemoteAddress: &v1alpha1.ClientAddress{IPv6PrefixLength: 32}}
		}},
		{name: "remoteAddress with onMissing Deny", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key.OnMissing = v1alpha1.MissingKeyDeny
			s.Key.RemoteAddress = &v1alpha1.ClientAddress{}
		}, wantErr: []string{"remoteAddress applies only when the client address is used"}},
		{name: "remoteAddress with Global", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal, RemoteAddress: &v1alpha1.ClientAddress{}}
		}, wantErr: []string{"remoteAddress applies only when the client address is used"}},
		{name: "ipv6PrefixLength 31", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key.RemoteAddress = &v1alpha1.ClientAddress{IPv6PrefixLength: 31}
		}, wantErr: []string{"spec.key.remoteAddress.ipv6PrefixLength", "should be greater than or equal to 32"}},
		{name: "ipv6PrefixLength 129", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key.RemoteAddress = &v1alpha1.ClientAddress{IPv6PrefixLength: 129}
		}, wantErr: []string{"spec.key.remoteAddress.ipv6PrefixLength", "should be less than or equal to 128"}},
		{name: "forwardedHeader X-Real-IP", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Key.RemoteAddress = &v1alpha1.ClientAddress{ForwardedHeader: "X-Real-IP"}
		}, wantErr: []string{"spec.key.remoteAddress.forwardedHeader", `supported values: "X-Forwarded-For", "Forwarded"`}},
		{name: "valid pathCase Insensitive", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Match = &v1alpha1.RequestMatch{PathPrefixes: []v1alpha1.PathPrefix{"/api/"}, PathCase: v1alpha1.PathCaseInsensitive}
		}},
		{name: "pathCase Insensitive without prefixes", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Match = &v1alpha1.RequestMatch{Methods: []v1alpha1.HTTPMethod{"GET"}, PathCase: v1alpha1.PathCaseInsensitive}
		}, wantErr: []string{"pathCase Insensitive applies to pathPrefixes: list at least one"}},
		{name: "pathCase Lower", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Match = &v1alpha1.RequestMatch{PathPrefixes: []v1alpha1.PathPrefix{"/api/"}, PathCase: "Lower"}
		}, wantErr: []string{"spec.match.pathCase", `supported values: "Sensitive", "Insensitive"`}},

		// Several windows (issue 37).
		{name: "valid additionalLimits", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Window, s.Limit = "1s", 10
			s.AdditionalLimits = []v1alpha1.AdditionalLimit{{Window: "1h", Limit: 1000}, {Window: "24h", Limit: 10000}}
		}},
		{name: "additionalLimits, window equal to the policy's", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Window = "60s"
			s.AdditionalLimits = []v1alpha1.AdditionalLimit{{Window: "1m", Limit: 5}}
		}, wantErr: []string{"each window of additionalLimits must differ from window"}},
		{name: "additionalLimits, the same window twice", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.AdditionalLimits = []v1alpha1.AdditionalLimit{{Window: "1h", Limit: 5}, {Window: "60m", Limit: 6}}
		}, wantErr: []string{"spec.additionalLimits", "the windows of additionalLimits must differ from each other"}},
		{name: "additionalLimits, one window spelled twice", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.AdditionalLimits = []v1alpha1.AdditionalLimit{{Window: "1h", Limit: 5}, {Window: "1h", Limit: 6}}
		}, wantErr: []string{"spec.additionalLimits[1]", "Duplicate value"}},
		{name: "additionalLimits, five windows", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			for _, w := range []v1alpha1.Duration{"1h", "2h", "3h", "4h", "5h"} {
				s.AdditionalLimits = append(s.AdditionalLimits, v1alpha1.AdditionalLimit{Window: w, Limit: 5})
			}
		}, wantErr: []string{"spec.additionalLimits", "must have at most 4 items"}},
		{name: "additionalLimits, window 25h", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.AdditionalLimits = []v1alpha1.AdditionalLimit{{Window: "25h", Limit: 5}}
		}, wantErr: []string{"spec.additionalLimits[0].window", "window must be from 1ms to 24h"}},
		{name: "additionalLimits, window 1.5s", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.AdditionalLimits = []v1alpha1.AdditionalLimit{{Window: "1.5s", Limit: 5}}
		}, wantErr: []string{"spec.additionalLimits[0].window", "window must be a duration like '500ms'"}},
		{name: "additionalLimits, limit 0", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.AdditionalLimits = []v1alpha1.AdditionalLimit{{Window: "1h", Limit: 0}}
		}, wantErr: []string{"spec.additionalLimits[0].limit", "greater than or equal to 1"}},
		{name: "additionalLimits with cost", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.AdditionalLimits = []v1alpha1.AdditionalLimit{{Window: "1h", Limit: 5}}
			c := int64(1)
			s.Cost = &v1alpha1.Cost{Request: &v1alpha1.RequestCost{Constant: &c}}
		}, wantErr: []string{"additionalLimits cannot be used with cost"}},
		{name: "valid additionalLimits with rateLimitService", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			rls(s)
			s.AdditionalLimits = []v1alpha1.AdditionalLimit{{Window: "1h", Limit: 5}}
		}},
		{name: "valid quotas", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Quotas = []v1alpha1.Quota{{Period: "Month", Limit: 1_000_000_000_000, TimeZone: "America/Argentina/Buenos_Aires"}, {Period: "Day", Limit: 1}}
		}},
		{name: "quotas, a period twice", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Quotas = []v1alpha1.Quota{{Period: "Day", Limit: 5}, {Period: "Day", Limit: 6}}
		}, wantErr: []string{"spec.quotas[1]", "Duplicate value"}},
		{name: "quotas, a week", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Quotas = []v1alpha1.Quota{{Period: "Week", Limit: 5}}
		}, wantErr: []string{"spec.quotas[0].period", `supported values: "Day", "Month"`}},
		{name: "quotas, over 10^12", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Quotas = []v1alpha1.Quota{{Period: "Month", Limit: 1_000_000_000_001}}
		}, wantErr: []string{"spec.quotas[0].limit", "less than or equal to 1000000000000"}},
		{name: "quotas, a time zone that is a path", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Quotas = []v1alpha1.Quota{{Period: "Day", Limit: 5, TimeZone: "../etc/passwd"}}
		}, wantErr: []string{"spec.quotas[0].timeZone", "should match"}},
		{name: "quotas with cost", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			s.Quotas = []v1alpha1.Quota{{Period: "Day", Limit: 5}}
			c := int64(1)
			s.Cost = &v1alpha1.Cost{Request: &v1alpha1.RequestCost{Constant: &c}}
		}, wantErr: []string{"quotas cannot be used with cost"}},
		{name: "quotas with rateLimitService and cost", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
			rls(s)
			s.Quotas = []v1alpha1.Quota{{Period: "Day", Limit: 5}}
			s.Cost = &v1alpha1.Cost{Request: &v1alpha1.RequestCost{}}
		}, wantErr: []string{"quotas cannot be used with cost"}},
	}
	tests = append(tests, jwtCases...)
	ctx := context.Background()
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &v1alpha1.RateLimitPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("case-%d", i), Namespace: "default"},
				Spec:       validSpec(),
			}
			tt.mutate(&p.Spec)
			err := k.Create(ctx, p)
			if testing.Verbose() && err != nil {
				t.Log(err)
			}
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("valid policy rejected: %v", err)
				}
				// envtest outlives one run (-count=2).
				t.Cleanup(func() { _ = k.Delete(context.Background(), p) })
				return
			}
			if err == nil {
				t.Fatalf("invalid policy accepted: %+v", p.Spec)
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not contain %q:\n%v", want, err)
				}
			}
		})
	}
}

// labelKey is a distinct label key of the greatest length Kubernetes
// allows: a 253-character DNS prefix, "/", a 63-character name.
func labelKey(i int) string {
	label := strings.Repeat("p", 63)
	prefix := label + "." + label + "." + label + "." + strings.Repeat("p", 61)
	name := fmt.Sprintf("n%03d", i)
	return prefix + "/" + name + strings.Repeat("n", 63-len(name))
}

// matchLabels are n labels of the greatest length.
func matchLabels(n int) map[string]v1alpha1.LabelValue {
	out := map[string]v1alpha1.LabelValue{}
	for i := range n {
		out[labelKey(i)] = v1alpha1.LabelValue(strings.Repeat("v", 63))
	}
	return out
}

// matchExpressions are n In expressions with the given number of values,
// keys and values of the greatest length.
func matchExpressions(n, values int) []v1alpha1.LabelSelectorRequirement {
	var out []v1alpha1.LabelSelectorRequirement
	for i := range n {
		e := v1alpha1.LabelSelectorRequirement{Key: labelKey(i), Operator: metav1.LabelSelectorOpIn}
		for j := range values {
			v := fmt.Sprintf("v%05d", j)
			e.Values = append(e.Values, v+strings.Repeat("v", 63-len(v)))
		}
		out = append(out, e)
	}
	return out
}

// largestSelector is the largest selector the schema admits.
func largestSelector() v1alpha1.LabelSelector {
	return v1alpha1.LabelSelector{MatchLabels: matchLabels(32), MatchExpressions: matchExpressions(16, 64)}
}

// TestDefaults: the schema fills in the documented defaults, and a new
// policy's status says observedGeneration 0, so that kstatus sees it in
// progress until the controller has written its status.
func TestDefaults(t *testing.T) {
	ctx := context.Background()
	p := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "defaults", Namespace: "default"},
		Spec:       validSpec(),
	}
	if err := k.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Delete(context.Background(), p) })
	var got v1alpha1.RateLimitPolicy
	if err := k.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
		t.Fatal(err)
	}
	s := got.Spec
	if s.TargetPort != "http" || s.FailMode != v1alpha1.FailOpen || s.Algorithm != v1alpha1.AlgorithmSlidingLog || s.Mode != v1alpha1.ModeEnforce {
		t.Errorf("defaults not applied: targetPort=%q failMode=%q algorithm=%q mode=%q", s.TargetPort, s.FailMode, s.Algorithm, s.Mode)
	}
	if s.Key.OnMissing != "" || s.Key.RemoteAddress != nil {
		t.Errorf("onMissing or remoteAddress defaulted in the schema (%q, %+v); they are defaulted by the renderer only for the key sources they apply to", s.Key.OnMissing, s.Key.RemoteAddress)
	}

	// Within remoteAddress and match, their fields' defaults.
	p2 := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "defaults-2", Namespace: "default"}, Spec: validSpec()}
	p2.Spec.Key.RemoteAddress = &v1alpha1.ClientAddress{}
	p2.Spec.Match = &v1alpha1.RequestMatch{PathPrefixes: []v1alpha1.PathPrefix{"/api/"}}
	if err := k.Create(ctx, p2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Delete(context.Background(), p2) })
	if err := k.Get(ctx, client.ObjectKeyFromObject(p2), &got); err != nil {
		t.Fatal(err)
	}
	if ca := got.Spec.Key.RemoteAddress; ca == nil || ca.ForwardedHeader != v1alpha1.ForwardedHeaderXForwardedFor || ca.IPv6PrefixLength != 64 {
		t.Errorf("remoteAddress defaults: %+v, want X-Forwarded-For and 64", ca)
	}
	if got.Spec.Match == nil || got.Spec.Match.PathCase != v1alpha1.PathCaseSensitive {
		t.Errorf("match.pathCase default: %+v, want Sensitive", got.Spec.Match)
	}

	u := &unstructuredPolicy{}
	if err := k.Get(ctx, client.ObjectKeyFromObject(p), u.obj()); err != nil {
		t.Fatal(err)
	}
	og, found, err := u.nestedInt64("status", "observedGeneration")
	if err != nil || !found || og != 0 {
		t.Errorf("status.observedGeneration of a new policy: %d found=%v err=%v; want 0, present", og, found, err)
	}
}

// TestSamples: every RateLimitPolicy in config/samples is accepted by the
// API server.
func TestSamples(t *testing.T) {
	root, err := testsupport.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "config", "samples", "ratelimit_v1alpha1_*.yaml"))
	if err != nil || len(files) < 4 {
		t.Fatalf("want at least 4 sample policies, found %v (%v)", files, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var p v1alpha1.RateLimitPolicy
		if err := yaml.UnmarshalStrict(data, &p); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		p.Namespace = "default"
		if err := k.Create(context.Background(), &p, client.DryRunAll); err != nil {
			t.Errorf("%s rejected: %v", filepath.Base(f), err)
		}
	}
}

// TestWindowPatternInCRD: the CRD's window rule and the renderer share
// v1alpha1.WindowPattern (the marker cannot refer to the constant).
func TestWindowPatternInCRD(t *testing.T) {
	root, err := testsupport.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	crd, err := os.ReadFile(filepath.Join(root, "config", "crd", "bases", "ratelimit.slidegate.dev_ratelimitpolicies.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// Every rule that reads a window (its format, its bounds, and the
	// rules of additionalLimits that compare durations) uses it verbatim.
	n := strings.Count(string(crd), "matches('"+v1alpha1.WindowPattern+"')")
	if all := strings.Count(string(crd), "matches('^([0-9]"); n != all || n < 2 {
		t.Errorf("the CRD uses WindowPattern in %d of its %d duration patterns, want all (at least format and bounds)", n, all)
	}
}
