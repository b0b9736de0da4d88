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
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

var rlsReconciler *RateLimitServiceReconciler

// rlsTestAddr is the address the test's EndpointSlices give the RLS
// servers: the API server refuses loopback addresses there, and the test
// servers listen on loopback only, so the controller's HTTP client in the
// suite dials loopback for it (rlsTestDial). It is in TEST-NET-1 (RFC 5737):
// nothing is ever sent to it.
const rlsTestAddr = "192.0.2.10"

// rlsTestDial dials loopback for rlsTestAddr, and refuses anything else.
func rlsTestDial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if host != rlsTestAddr {
		return nil, fmt.Errorf("the test dials only %s, not %s", rlsTestAddr, host)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
}

// newRLSPolicy is testsupport.NewRLSPolicy: 100 per minute on domain edge.
var newRLSPolicy = testsupport.NewRLSPolicy

// rlsServer is a real RLS server (internal/rls, on a real redis-server)
// whose admin port answers the controller; its config file is written by
// load, as the kubelet refreshes a mounted ConfigMap.
type rlsServer struct {
	srv   *rls.Server
	file  string
	admin net.Listener
}

func startRLSServer(t *testing.T) *rlsServer {
	t.Helper()
	redis := testsupport.StartRedis(t)
	rdb, err := redisconn.NewClient(redisconn.Config{Addrs: []string{redis.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := limiter.New(rdb, limiter.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	s := &rlsServer{file: filepath.Join(t.TempDir(), rlsconfig.FileName)}
	// The watch's resync is long: the test loads by hand (load).
	s.srv = rls.New(lim, rls.Options{ConfigFile: s.file, ResyncInterval: time.Hour})
	grpcLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if s.admin, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.srv.Serve(ctx, grpcLn, s.admin, 0, time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RLS server: %v", err)
		}
	})
	return s
}

// load makes the server load the ConfigMap as it is now.
func (s *rlsServer) load(t *testing.T) {
	t.Helper()
	var cm corev1.ConfigMap
	if err := k.Get(context.Background(), types.NamespacedName{Namespace: redisSecret.Namespace, Name: rlsconfig.ConfigMapName}, &cm); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.file, []byte(cm.Data[rlsconfig.FileName]), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.srv.Reload(); err != nil {
		t.Fatalf("the RLS server refused the ConfigMap: %v", err)
	}
}

// publishRLSEndpoints makes the servers the ready endpoints of the RLS
// Service, as the EndpointSlice controller would.
func publishRLSEndpoints(t *testing.T, servers ...*rlsServer) {
	t.Helper()
	ctx := context.Background()
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "slidegate-rls-test", Namespace: redisSecret.Namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: DefaultRLSServiceName}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	if err := k.Get(ctx, client.ObjectKeyFromObject(es), es); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	port := 0
	es.Endpoints = nil
	for _, s := range servers {
		_, p, err := net.SplitHostPort(s.admin.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		host := rlsTestAddr
		// One port per slice, as the servers of a Deployment share theirs;
		// the test publishes one server.
		port, _ = strconv.Atoi(p)
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{host}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	es.Ports = []discoveryv1.EndpointPort{{Name: ptr.To(RLSAdminPortName), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}}
	var err error
	if es.ResourceVersion == "" {
		err = k.Create(ctx, es)
	} else {
		err = k.Update(ctx, es)
	}
	if err != nil {
		t.Fatalf("publishing the RLS endpoints: %v", err)
	}
	t.Cleanup(func() { _ = k.Delete(context.Background(), es) })
}

func enforcedCondition(p *v1alpha1.RateLimitPolicy, status metav1.ConditionStatus, reason v1alpha1.ConditionReason) func() error {
	return func() error {
		var got v1alpha1.RateLimitPolicy
		if err := cached.Get(context.Background(), client.ObjectKeyFromObject(p), &got); err != nil {
			return err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionEnforced))
		if got.Status.ObservedGeneration != got.Generation || c == nil || c.Status != status || c.Reason != string(reason) {
			return fmt.Errorf("%s: Enforced %+v, want %s/%s", p.Name, c, status, reason)
		}
		return nil
	}
}

// TestRateLimitService: a policy for the rate limit service is rendered
// into the one cluster-wide ConfigMap, is Ready, and is Enforced only once
// the ready RLS server reports its revision loaded; the namespace's sidecar
// controller leaves it alone; the ConfigMap goes with the last such policy.
func TestRateLimitService(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	p := newRLSPolicy(ns, "login")
	create(t, p)

	eventually(t, "rendered and Ready, no server", func() error {
		if err := settled(p, readyAccepted); err != nil {
			return err
		}
		return enforcedCondition(p, metav1.ConditionFalse, v1alpha1.ReasonNoRateLimitService)()
	})
	waitGauge(t, notEnforcedGauge.WithLabelValues(ns, string(v1alpha1.ReasonNoRateLimitService), targetRateLimitService), 1)
	var cm corev1.ConfigMap
	if err := k.Get(ctx, types.NamespacedName{Namespace: redisSecret.Namespace, Name: rlsconfig.ConfigMapName}, &cm); err != nil {
		t.Fatal(err)
	}
	cfg, err := rlsconfig.Parse([]byte(cm.Data[rlsconfig.FileName]))
	if err != nil {
		t.Fatalf("the RLS server would refuse the ConfigMap: %v", err)
	}
	id := rlsconfig.PolicyID(ns, "login")
	if got, want := get(t, p).Status.Revision, rlsconfig.PolicyRevisions(cfg)[id]; got == "" || got != want {
		t.Errorf("status.revision %q, want %q (its part of the ConfigMap)", got, want)
	}
	// The namespace's sidecar controller renders nothing for it.
	if err := k.Get(ctx, types.NamespacedName{Namespace: ns, Name: "slidegate-sidecar-config"}, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Errorf("a sidecar ConfigMap for a namespace with only an RLS policy: %v", err)
	}

	// A ready server that has not loaded it yet: partially enforced, and
	// the controller comes back without being told.
	srv := startRLSServer(t)
	publishRLSEndpoints(t, srv)
	eventually(t, "a server behind", enforcedCondition(p, metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced))
	// Nothing the controller watches changes when a server loads; its
	// recheck (Recheck, 300 ms here, 10 s by default) sees it.
	srv.load(t)
	eventually(t, "loaded", enforcedCondition(p, metav1.ConditionTrue, v1alpha1.ReasonEnforced))
	waitGauge(t, notEnforcedGauge.WithLabelValues(ns, string(v1alpha1.ReasonPartiallyEnforced), targetRateLimitService), 0)
	if got := get(t, p).Status; got.MatchedPods != 1 || got.EnforcedPods != 1 {
		t.Errorf("matched/enforced %d/%d, want 1/1 (servers)", got.MatchedPods, got.EnforcedPods)
	}

	// A change of the limit is a new revision: not enforced until loaded.
	got := get(t, p)
	got.Spec.Limit = 7
	if err := k.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	eventually(t, "new revision behind", enforcedCondition(p, metav1.ConditionFalse, v1alpha1.ReasonPartiallyEnforced))
	srv.load(t)
	eventually(t, "new revision loaded", enforcedCondition(p, metav1.ConditionTrue, v1alpha1.ReasonEnforced))

	// The last policy gone, the ConfigMap goes.
	if err := k.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ConfigMap deleted", func() error {
		err := k.Get(ctx, types.NamespacedName{Namespace: redisSecret.Namespace, Name: rlsconfig.ConfigMapName}, &corev1.ConfigMap{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("ConfigMap still there: %w", err)
	})
}
