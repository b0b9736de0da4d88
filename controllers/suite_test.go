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
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/clienthash"
	"github.com/slidegate/slidegate/internal/jwksfetch"
	"github.com/slidegate/slidegate/internal/kubecache"
	"github.com/slidegate/slidegate/internal/redisadmin"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisidentity"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// The package's one control plane and manager, shared by every test; each
// test works in namespaces of its own.
var (
	scheme = runtime.NewScheme()
	// k talks to the API server directly (no cache); its writes are not
	// counted.
	k client.Client
	// cached reads the manager's cache, as the reconciler does.
	cached client.Client
	// writes counts every write the reconciler's client attempts.
	writes *countingClient
	// recorder records the reconciler's events.
	recorder = &eventLog{}
	// reconciler is the instance the manager runs; tests may also call its
	// Reconcile directly.
	reconciler *RateLimitPolicyReconciler
	// redisSecret is the manager's credentials Secret.
	redisSecret = types.NamespacedName{Namespace: "slidegate-system", Name: "redis-auth"}
	// redisServer is the Redis the reconciler administers (identities.go);
	// its default user needs no password, as a test Redis's does.
	redisServer *testsupport.Redis
	// identities is the reconciler's administration of it: the shared mode
	// with an administrative identity, which prepares the namespaces' own.
	identities *redisidentity.Identities
)

// managerPod names the manager's own Pod, which events about Redis are
// about.
var managerPod = types.NamespacedName{Namespace: "slidegate-system", Name: "manager-0"}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	flag.Parse()
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true), zap.Level(zapLevel())))
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))

	// The Gateway API's CRDs, so that the rate limit service controller
	// watches the routes and gateways policies attach to, and Istio's.
	gatewayCRDs, err := testsupport.GatewayAPICRDs()
	if err != nil {
		testsupport.MissingInMain("the Gateway API's CRDs", err)
	}
	// Istio's and Envoy Gateway's, so that the objects rendered for
	// gateways are checked by their own schemas.
	istioCRDs, err := testsupport.IstioCRDs()
	if err != nil {
		testsupport.MissingInMain("Istio's CRDs", err)
	}
	egCRD, err := testsupport.EnvoyGatewayCRDs()
	if err != nil {
		testsupport.MissingInMain("Envoy Gateway's EnvoyPatchPolicy CRD", err)
	}
	gatewayCRDs = append(gatewayCRDs, istioCRDs, egCRD)
	env, c, err := testsupport.StartControlPlane(scheme, gatewayCRDs...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
		}
	}()
	k = c
	cfg := env.Config

	testsupport.RedisInMain()
	redisServer, err = testsupport.NewRedis()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer redisServer.Close()
	admin, err := redisadmin.New(redisadmin.Options{Redis: redisconn.Config{Addrs: []string{redisServer.Addr}}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer admin.Close()
	identities = &redisidentity.Identities{Mode: redisidentity.Shared, Admin: admin, Interval: 300 * time.Millisecond,
		RLSSecret: types.NamespacedName{Namespace: redisSecret.Namespace, Name: redisidentity.RLSCredentialsSecretName}, Pod: managerPod,
		SharedSecret: redisSecret}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := setupRedisSecret(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	stopped, err := startManager(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	cancel()
	<-stopped
	return code
}

func zapLevel() zapcore.Level {
	if testing.Verbose() {
		return -1 // V(1) and up
	}
	return 0
}

func setupRedisSecret(ctx context.Context) error {
	if err := k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: redisSecret.Namespace}}); err != nil {
		return err
	}
	return k.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: redisSecret.Name, Namespace: redisSecret.Namespace},
		Type:       corev1.SecretTypeBasicAuth,
		Data: map[string][]byte{"username": []byte("sidecar"), "password": []byte("s3cret"),
			"sentinel-password": []byte("sentinel-s3cret"), "ca.crt": []byte(testCA), "unrelated": []byte("not copied")},
	})
}

// testCA stands for the CA of a Redis served over TLS; the mirror copies
// it like the credentials (no tls.crt/tls.key: a CA alone is valid).
const testCA = "-----BEGIN CERTIFICATE-----\nnot parsed by the controller\n-----END CERTIFICATE-----\n"

func startManager(ctx context.Context, cfg *rest.Config) (<-chan struct{}, error) {
	skip := true
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  CacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: &skip},
		NewClient: func(cfg *rest.Config, opts client.Options) (client.Client, error) {
			c, err := client.New(cfg, opts)
			if err != nil {
				return nil, err
			}
			writes = &countingClient{Client: c}
			return writes, nil
		},
	})
	if err != nil {
		return nil, err
	}
	cached = mgr.GetClient()
	reconciler = &RateLimitPolicyReconciler{
		Client:         mgr.GetClient(),
		Recorder:       recorder,
		TrustedProxies: nil,
		Identities:     identities,
		// Short, so that the credentials test sees Stalled come and go.
		CredentialsGrace: 2 * time.Second,
	}
	// The key set URLs of the tests are httptest TLS servers on loopback
	// (one certificate for all), refreshed quickly; those on 127.0.0.2
	// (internalIssuer) stand for internal hosts.
	fetch := jwksfetch.Options{Refresh: 300 * time.Millisecond, Retry: 100 * time.Millisecond, Timeout: 5 * time.Second,
		RootCAs: httptestRoots(), AllowAddr: func(a netip.Addr) bool { return a.IsLoopback() },
		Internal: func(a netip.Addr) bool { return a == internalIssuerAddr }}
	if err := policyDependencies(ctx, mgr, reconciler, fetch); err != nil {
		return nil, err
	}
	if err := reconciler.SetupWithManager(ctx, mgr); err != nil {
		return nil, err
	}
	rlsReconciler = &RateLimitServiceReconciler{
		Client:     mgr.GetClient(),
		Recorder:   recorder,
		Namespace:  redisSecret.Namespace,
		HTTPClient: &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: rlsTestDial}},
		Recheck:    300 * time.Millisecond,
		// The objects of Istio's and Envoy Gateway's gateways
		// (TestIstioGateways, TestEnvoyGateways).
		IstioGateways: true,
		EnvoyGateways: true,
		// Small, so that TestRLSFloodKeepsOthers fills it with a hundred
		// policies rather than thousands.
		maxBytes: rlsTestMaxBytes,
	}
	local, domains := rlsReconciler.CacheObjects()
	if rlsReconciler.Local, err = kubecache.Scoped(ctx, mgr, local); err != nil {
		return nil, err
	}
	if rlsReconciler.Domains, err = kubecache.Scoped(ctx, mgr, domains); err != nil {
		return nil, err
	}
	if err := rlsReconciler.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		return nil, fmt.Errorf("the manager's cache did not sync")
	}
	return stopped, nil
}

// policyDependencies builds what the reconciler reads through besides the
// manager's cache as internal/manager.PolicyDependencies does (which this
// package's tests cannot import: it imports this package), with the
// install key in redisSecret's namespace.
func policyDependencies(ctx context.Context, mgr ctrl.Manager, r *RateLimitPolicyReconciler, fetch jwksfetch.Options) error {
	ri := r.Identities
	ri.Client, ri.Recorder = mgr.GetClient(), r.Recorder
	ri.Key = &redisidentity.InstallKey{Secret: types.NamespacedName{Namespace: redisSecret.Namespace, Name: clienthash.InstallSecretName},
		Reader: mgr.GetAPIReader(), Writer: mgr.GetClient()}
	wake := make(chan event.TypedGenericEvent[client.Object], 1024)
	r.Wake, ri.Wake = wake, wake
	ri.RecordMode()
	c, err := kubecache.Scoped(ctx, mgr, map[client.Object]cache.ByObject{&corev1.Secret{}: kubecache.NamedIn(ri.SharedSecret)})
	if err != nil {
		return err
	}
	ri.SharedReader, r.SharedSecretCache = c, c
	if err := mgr.Add(ri); err != nil {
		return err
	}
	if r.KeySets, err = kubecache.Scoped(ctx, mgr, KeySetObjects()); err != nil {
		return err
	}
	fetch.Log = mgr.GetLogger().WithName("jwks")
	r.Fetcher = NewKeySetFetcher(fetch, mgr.GetClient(), wake)
	return mgr.Add(r.Fetcher)
}

// httptestRoots trusts the certificate of httptest's TLS servers (one for
// all of them).
func httptestRoots() *x509.CertPool {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	pool := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	pool.AddCert(internalIssuerCert.Leaf)
	return pool
}

// internalIssuerAddr is where internalIssuer listens: an address the
// suite's fetcher counts internal (jwksfetch.Options.Internal).
var internalIssuerAddr = netip.MustParseAddr("127.0.0.2")

// internalIssuerCert is a self-signed certificate for internalIssuerAddr
// (httptest's covers 127.0.0.1 only), trusted by the suite's fetcher.
var internalIssuerCert = func() tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "internal issuer"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{internalIssuerAddr.AsSlice()}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		panic(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}()

// internalIssuer is an httptest TLS server on internalIssuerAddr.
func internalIssuer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	l, err := net.Listen("tcp", netip.AddrPortFrom(internalIssuerAddr, 0).String())
	if err != nil {
		t.Fatalf("listening on %s (Linux routes all of 127.0.0.0/8 to loopback): %v", internalIssuerAddr, err)
	}
	srv := &httptest.Server{Listener: l, Config: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second},
		TLS: &tls.Config{Certificates: []tls.Certificate{internalIssuerCert}, MinVersion: tls.VersionTLS12}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// countingClient counts (and names) every write attempted through it.
type countingClient struct {
	client.Client
	mu  sync.Mutex
	log []string
}

func (c *countingClient) record(op string, obj any) {
	desc := fmt.Sprintf("%T", obj)
	switch o := obj.(type) {
	case client.Object:
		desc = fmt.Sprintf("%T %s/%s", o, o.GetNamespace(), o.GetName())
	case interface {
		GetNamespace() *string
		GetName() *string
	}:
		if o.GetNamespace() != nil && o.GetName() != nil {
			desc = fmt.Sprintf("%T %s/%s", o, *o.GetNamespace(), *o.GetName())
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.log = append(c.log, op+" "+desc)
}

// since returns the writes after the first n.
func (c *countingClient) since(n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.log[n:]...)
}

func (c *countingClient) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.log)
}

func (c *countingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.record("create", obj)
	return c.Client.Create(ctx, obj, opts...)
}

func (c *countingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.record("update", obj)
	return c.Client.Update(ctx, obj, opts...)
}

func (c *countingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	c.record("patch", obj)
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c *countingClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	c.record("apply", obj)
	return c.Client.Apply(ctx, obj, opts...)
}

func (c *countingClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	c.record("delete", obj)
	return c.Client.Delete(ctx, obj, opts...)
}

func (c *countingClient) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	c.record("deleteallof", obj)
	return c.Client.DeleteAllOf(ctx, obj, opts...)
}

func (c *countingClient) Status() client.SubResourceWriter {
	return &countingStatus{SubResourceWriter: c.Client.Status(), c: c}
}

func (c *countingClient) SubResource(name string) client.SubResourceClient {
	panic("the reconciler uses no subresource client but status: count " + name + " writes before using it")
}

type countingStatus struct {
	client.SubResourceWriter
	c *countingClient
}

func (s *countingStatus) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	s.c.record("status create", obj)
	return s.SubResourceWriter.Create(ctx, obj, sub, opts...)
}

func (s *countingStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	s.c.record("status update", obj)
	return s.SubResourceWriter.Update(ctx, obj, opts...)
}

func (s *countingStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	s.c.record("status patch", obj)
	return s.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

func (s *countingStatus) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	s.c.record("status apply", obj)
	return s.SubResourceWriter.Apply(ctx, obj, opts...)
}

// eventLog is an events.EventRecorder that remembers events.
type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (e *eventLog) Eventf(regarding, _ runtime.Object, eventtype, reason, action, note string, args ...any) {
	name := "?"
	if o, ok := regarding.(client.Object); ok {
		name = o.GetNamespace() + "/" + o.GetName()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, fmt.Sprintf("%s %s %s %s: %s", name, eventtype, reason, action, fmt.Sprintf(note, args...)))
}

func (e *eventLog) since(n int) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.events[n:]...)
}

func (e *eventLog) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.events)
}

// about returns the events about one object.
func (e *eventLog) about(ns, name string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.events {
		if strings.HasPrefix(ev, ns+"/"+name+" ") {
			out = append(out, ev)
		}
	}
	return out
}

// eventually polls cond until it returns nil, or fails the test with its
// last error after timeout.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	testsupport.Eventually(t, 20*time.Second, 25*time.Millisecond, what, cond)
}

// controllerIdle reports whether the controller has nothing queued and no
// reconcile running, from controller-runtime's own metrics.
func controllerIdle() error {
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		return err
	}
	value := func(name, label string) (float64, bool) {
		for _, f := range families {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.GetMetric() {
				if hasLabel(m, label, ControllerName) {
					return m.GetGauge().GetValue(), true
				}
			}
		}
		return 0, false
	}
	if v, ok := value("workqueue_depth", "name"); !ok || v != 0 {
		return fmt.Errorf("workqueue depth %v (found %v)", v, ok)
	}
	if v, ok := value("controller_runtime_active_workers", "controller"); !ok || v != 0 {
		return fmt.Errorf("active workers %v (found %v)", v, ok)
	}
	return nil
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}
