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
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// attached is a policy of namespace shop attached to an HTTPRoute, with key.
func attached(name string, key v1alpha1.ClientKey) *v1alpha1.RateLimitPolicy {
	p := &v1alpha1.RateLimitPolicy{Spec: v1alpha1.RateLimitPolicySpec{
		TargetRefs: []v1alpha1.PolicyTargetReference{{Group: v1alpha1.GatewayAPIGroup, Kind: "HTTPRoute", Name: "checkout"}},
		Window:     "1m", Limit: 5, Key: key,
	}}
	p.Namespace, p.Name = "shop", name
	return p
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/envoyrender -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what is rendered (go test ./internal/envoyrender -update):\n%s", path, got)
	}
}

// roundTrip reads data back as Envoy would (protojson, unknown fields
// refused), validates it and compares it with m.
func roundTrip(t *testing.T, data []byte, m, into proto.Message) {
	t.Helper()
	if err := protojson.Unmarshal(data, into); err != nil {
		t.Fatalf("Envoy would refuse the JSON: %v", err)
	}
	if v, ok := into.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			t.Fatalf("Envoy would refuse the JSON: %v", err)
		}
	}
	if !proto.Equal(m, into) {
		t.Fatalf("read back %v, want %v", into, m)
	}
}

func TestRateLimitGolden(t *testing.T) {
	for _, tc := range []struct {
		file string
		key  v1alpha1.ClientKey
	}{
		{"ratelimit-header.json", v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User", OnMissing: v1alpha1.MissingKeyAllow}},
		{"ratelimit-query.json", v1alpha1.ClientKey{Source: v1alpha1.KeySourceQueryParameter, Name: "api_key", OnMissing: v1alpha1.MissingKeyAllow}},
		{"ratelimit-address.json", v1alpha1.ClientKey{Source: v1alpha1.KeySourceRemoteAddress}},
		{"ratelimit-global.json", v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			rl, err := RateLimit(attached("login", tc.key))
			if err != nil {
				t.Fatal(err)
			}
			data, err := JSON(rl)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, tc.file, data)
			roundTrip(t, data, rl, &routev3.RateLimit{})
		})
	}
}

func TestFilterGolden(t *testing.T) {
	f, err := Filter(FilterName, "outbound|8081||slidegate-rls.slidegate-system.svc.cluster.local", 0)
	if err != nil {
		t.Fatal(err)
	}
	data, err := JSON(f)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "filter.json", data)
	roundTrip(t, data, f, &hcmv3.HttpFilter{})
}

// TestRateLimitRefusesWhatTheGatewayCannotSend: the API's rules, checked
// again where the actions are rendered (an object stored before them).
func TestRateLimitRefusesWhatTheGatewayCannotSend(t *testing.T) {
	for _, tc := range []struct {
		key  v1alpha1.ClientKey
		want string
	}{
		{v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User"}, "key.onMissing must be Allow"},
		{v1alpha1.ClientKey{Source: v1alpha1.KeySourceJWTClaim, Name: "sub"}, "does not apply with targetRefs"},
	} {
		if _, err := RateLimit(attached("p", tc.key)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.key, err, tc.want)
		}
	}
}
