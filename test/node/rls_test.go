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

package node

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// The install with the rate limit service (config/rls: config/default and
// config/components/rls), the image and Redis as in installKustomization.
func rlsKustomization() string { return overlayKustomization("../rls") }

const rlsPolicyManifest = `apiVersion: ratelimit.slidegate.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: gateway-login
  namespace: slidegate-demo
spec:
  rateLimitService:
    domain: node-test
    descriptor:
      - key: generic_key
        value: login
      - key: remote_address
  window: 1m
  limit: 3
`

// testRateLimitService installs the rate limit service the way docs/rls.md
// says, applies a policy for it, and checks what only a real cluster shows:
// the controller finds both servers through the Service's EndpointSlice and
// reports the policy Enforced 2/2 once the kubelet has delivered the
// ConfigMap to both; and the limit is one across the two servers, asked
// alternately by their pod IPs, as a gateway's connections would spread.
func testRateLimitService(ctx context.Context, t *testing.T, n *node) {
	mustKubectl(ctx, t, "apply", "--server-side", "-k", n.overlay(t, rlsKustomization()))
	mustKubectl(ctx, t, "-n", system, "rollout", "status", "deployment/slidegate-rls", "--timeout=3m")
	if _, err := kubectl(ctx, rlsPolicyManifest, "apply", "--server-side", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// The servers see the ConfigMap at their next pod sync (syncFrequency)
	// and the controller asks them every 10 s; twice each and a margin for
	// a busy machine bound it.
	var p v1alpha1.RateLimitPolicy
	took := eventually(t, 2*n.sync+45*time.Second, time.Second, "the policy Enforced by both RLS servers", func() error {
		getJSON(ctx, t, &p, "-n", demo, "get", "rlp", "gateway-login")
		c := meta.FindStatusCondition(p.Status.Conditions, string(v1alpha1.ConditionEnforced))
		if c == nil || c.Status != "True" || p.Status.MatchedPods != 2 || p.Status.EnforcedPods != 2 {
			return fmt.Errorf("matched %d, enforced %d, Enforced %+v", p.Status.MatchedPods, p.Status.EnforcedPods, c)
		}
		return nil
	})
	t.Logf("Enforced 2/2 %.1fs after the apply (%s)", took.Seconds(), time.Since(start).Round(time.Second))

	var pods corev1.PodList
	getJSON(ctx, t, &pods, "-n", system, "get", "pods", "-l", "app.kubernetes.io/component=rls")
	var clients []rlsv3.RateLimitServiceClient
	for _, pod := range pods.Items {
		if !podReady(&pod) {
			continue
		}
		conn, err := grpc.NewClient(net.JoinHostPort(pod.Status.PodIP, "8081"), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
	}
	if len(clients) != 2 {
		t.Fatalf("%d ready RLS servers, want 2", len(clients))
	}
	ask := func(i int, addr string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		resp, err := clients[i%2].ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{
			Domain: "node-test",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
				{Key: "generic_key", Value: "login"}, {Key: "remote_address", Value: addr},
			}}},
		})
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		return resp.GetOverallCode()
	}
	// Three admits for one address, whichever server answers; the fourth
	// is over the limit; another address has a window of its own.
	var codes []string
	for i := range 4 {
		codes = append(codes, ask(i, "203.0.113.7").String())
	}
	codes = append(codes, ask(4, "203.0.113.8").String())
	if got, want := strings.Join(codes, " "), "OK OK OK OVER_LIMIT OK"; got != want {
		t.Errorf("answers %s, want %s (alternating between the two servers)", got, want)
	}

	mustKubectl(ctx, t, "-n", demo, "delete", "rlp", "gateway-login", "--wait=true")
	eventually(t, time.Minute, time.Second, "ConfigMap "+strconv.Quote("slidegate-rls-config")+" deleted with the last policy", func() error {
		out, err := kubectl(ctx, "", "-n", system, "get", "configmap", "slidegate-rls-config", "--ignore-not-found", "-o", "name")
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) != "" {
			return fmt.Errorf("still there: %s", out)
		}
		return nil
	})
}
