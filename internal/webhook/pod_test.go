package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/testsupport"
)

var (
	testEnvConfig *rest.Config
	k8s           client.Client // talks to the API server directly
	cached        client.Client // the manager's cache, what the webhook reads
	injector      *PodInjector
	scheme        = runtime.NewScheme()
)

// TestMain starts one API server with the webhook configuration that
// config/webhook renders (namespaceSelector included) pointed at a manager
// serving PodInjector, as in a cluster.
func TestMain(m *testing.M) {
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	env, err := testsupport.NewEnvironment()
	if err != nil {
		testsupport.MissingInMain("envtest control plane", testsupport.EnvtestUnavailable(err))
	}
	hooks, err := testsupport.RenderedWebhooks()
	if err != nil {
		testsupport.MissingInMain("kubectl (kustomize)", err)
	}
	env.WebhookInstallOptions = envtest.WebhookInstallOptions{MutatingWebhooks: hooks}
	env.Scheme = scheme
	if _, err := env.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "starting envtest:", err)
		os.Exit(1)
	}
	code := run(m, env)
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping envtest:", err)
	}
	os.Exit(code)
}

func run(m *testing.M, env *envtest.Environment) int {
	wo := &env.WebhookInstallOptions
	mgr, err := manager.New(env.Config, manager.Options{
		Scheme:  scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: wo.LocalServingHost, Port: wo.LocalServingPort, CertDir: wo.LocalServingCertDir,
		}),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	injector = &PodInjector{
		Reader:  mgr.GetClient(),
		Decoder: admission.NewDecoder(scheme),
		Options: inject.Options{Image: "example.com/slidegate:test", Redis: redisconn.Config{Mode: redisconn.Standalone, Addrs: []string{"redis:6379"}}},
	}
	mgr.GetWebhookServer().Register(Path, &webhook.Admission{Handler: injector})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		fmt.Fprintln(os.Stderr, "cache did not sync")
		return 1
	}
	addr := net.JoinHostPort(wo.LocalServingHost, strconv.Itoa(wo.LocalServingPort))
	if err := waitTLS(addr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	testEnvConfig = env.Config
	k8s, err = client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cached = mgr.GetClient()
	return m.Run()
}

func waitTLS(addr string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // test server with a throwaway cert
		if err == nil {
			_ = conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("webhook server at %s not serving: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func namespace(t *testing.T, name string, optIn bool) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if optIn {
		ns.Labels = map[string]string{v1alpha1.InjectionLabel: v1alpha1.InjectionEnabled}
	}
	if err := k8s.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if optIn {
		// kube-system exists already: label it.
		if err := k8s.Patch(context.Background(), ns, client.MergeFrom(&corev1.Namespace{})); err != nil {
			t.Fatal(err)
		}
	}
}

func policy(t *testing.T, ns string) {
	t.Helper()
	p := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "per-user", Namespace: ns},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "web"}},
			Window:         "10s",
			Limit:          5,
			Key:            v1alpha1.ClientKey{Source: "Header", Name: "X-User-ID"},
		},
	}
	if err := k8s.Create(context.Background(), p); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// The webhook reads the manager's cache: wait until it sees the policy.
	deadline := time.Now().Add(10 * time.Second)
	for cached.Get(context.Background(), client.ObjectKeyFromObject(p), &v1alpha1.RateLimitPolicy{}) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the manager's cache never saw the policy")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func webPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "app", Image: "example.com/web:1",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
		}}},
	}
}

func injected(p *corev1.Pod) bool {
	_, ok := p.Annotations[v1alpha1.InjectedAnnotation]
	return ok || len(p.Spec.InitContainers) > 0
}

// TestWebhookThroughAPIServer creates pods through the API server and checks
// what comes back: the webhook is called by the API server itself, with the
// shipped namespaceSelector (opted-out pods reach it too).
func TestWebhookThroughAPIServer(t *testing.T) {
	namespace(t, "shop", true)
	namespace(t, "plain", false)
	namespace(t, "kube-system", true) // opted in, but excluded by the selector
	for _, ns := range []string{"shop", "plain", "kube-system"} {
		policy(t, ns)
	}

	for _, tc := range []struct {
		name, ns     string
		mutate       func(*corev1.Pod)
		wantInjected bool
	}{
		{name: "selected pod in opted-in namespace", ns: "shop", wantInjected: true},
		{name: "namespace did not opt in", ns: "plain"},
		{name: "system namespace is excluded", ns: "kube-system"},
		{name: "no policy selects the pod", ns: "shop", mutate: func(p *corev1.Pod) { p.Labels["app"] = "other" }},
		{name: "opted out by label", ns: "shop", mutate: func(p *corev1.Pod) { p.Labels[inject.OptOutAnnotation] = "false" }},
		{name: "opted out by annotation", ns: "shop", mutate: func(p *corev1.Pod) {
			p.Annotations = map[string]string{inject.OptOutAnnotation: "false"}
		}},
		{name: "no port to take over", ns: "shop", mutate: func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].Name = "web" }},
		// Istio's webhook runs first; its istio-proxy declares 15090.
		{name: "pod in an istio mesh", ns: "shop", wantInjected: true, mutate: func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "istio-proxy", Image: "docker.io/istio/proxyv2:1.24.0",
				Ports: []corev1.ContainerPort{{Name: "http-envoy-prom", ContainerPort: 15090, Protocol: corev1.ProtocolTCP}}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := webPod(strings.ReplaceAll(tc.name, " ", "-"))
			pod.Namespace = tc.ns
			if tc.mutate != nil {
				tc.mutate(pod)
			}
			if err := k8s.Create(context.Background(), pod); err != nil {
				t.Fatalf("creating the pod: %v", err)
			}
			// envtest outlives one run (-count=2); no kubelet: gone at once.
			t.Cleanup(func() { _ = k8s.Delete(context.Background(), pod) })
			if got := injected(pod); got != tc.wantInjected {
				t.Fatalf("injected = %v, want %v (annotations %v, init containers %d)", got, tc.wantInjected, pod.Annotations, len(pod.Spec.InitContainers))
			}
			if tc.wantInjected {
				sc := pod.Spec.InitContainers[0]
				if sc.Name != inject.ContainerName || sc.Ports[0].Name != "http" || pod.Spec.Containers[0].Ports[0].Name != "" {
					t.Errorf("the stored pod does not have the sidecar on the named port: %+v", sc.Ports)
				}
			}
		})
	}
}

// TestHandlerWarnsWhenPortMissing calls the handler directly to see the
// admission warning that kubectl would print.
func TestHandlerWarnsWhenPortMissing(t *testing.T) {
	namespace(t, "shop", true)
	policy(t, "shop")
	pod := webPod("no-port")
	pod.Spec.Containers[0].Ports[0].Name = "web"
	resp := injector.Handle(context.Background(), admissionRequest(t, "shop", pod))
	if !resp.Allowed || len(resp.Patches) != 0 {
		t.Fatalf("response allowed=%v patches=%d, want allowed without patch", resp.Allowed, len(resp.Patches))
	}
	if len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "NOT rate limited") {
		t.Fatalf("warnings = %v, want one saying the pod is not rate limited", resp.Warnings)
	}
}

// TestHandlerWarnsOnBarePod: a pod no controller owns cannot be applied
// again once injected; its creator is told so. A controller's pod is not
// re-applied (the controller makes new ones), so it gets no such warning.
func TestHandlerWarnsOnBarePod(t *testing.T) {
	namespace(t, "bare", true)
	policy(t, "bare")
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		warn bool
	}{
		{"bare", webPod("bare"), true},
		{"owned by a ReplicaSet", owned(webPod("owned")), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := injector.Handle(context.Background(), admissionRequest(t, "bare", tc.pod))
			if !resp.Allowed || len(resp.Patches) == 0 {
				t.Fatalf("allowed=%v patches=%d, want the pod injected", resp.Allowed, len(resp.Patches))
			}
			warned := slices.ContainsFunc(resp.Warnings, func(w string) bool { return strings.Contains(w, "applying this manifest again") })
			if warned != tc.warn {
				t.Fatalf("warnings = %v, want the re-apply warning: %v", resp.Warnings, tc.warn)
			}
		})
	}
}

// owned makes pod a ReplicaSet's, as a Deployment's pods are.
func owned(pod *corev1.Pod) *corev1.Pod {
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-1", UID: "rs-uid", Controller: ptr.To(true)}}
	return pod
}

func admissionRequest(t *testing.T, ns string, pod *corev1.Pod) admission.Request {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "u1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Create,
		Namespace: ns, Object: runtime.RawExtension{Raw: raw},
	}}
}

// FuzzAdmissionReview posts arbitrary bodies to the webhook's HTTP handler:
// it must never panic and must always answer a well-formed AdmissionReview.
func FuzzAdmissionReview(f *testing.F) {
	pod, _ := json.Marshal(webPod("fuzz"))
	good, _ := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "f1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Operation: admissionv1.Create, Namespace: "shop", Object: runtime.RawExtension{Raw: pod}},
	})
	f.Add(good)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","kind":{"kind":"Pod","version":"v1"},"operation":"CREATE","object":{"spec":{"containers":null}}}}`))
	f.Add([]byte(`not json`))
	f.Add(bytes.Repeat([]byte("["), 1000))
	h := &webhook.Admission{Handler: injector}
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		raw, _ := io.ReadAll(rec.Body)
		var review admissionv1.AdmissionReview
		if err := json.Unmarshal(raw, &review); err != nil {
			t.Fatalf("response is not JSON (%v): %q", err, raw)
		}
		if review.Response == nil {
			t.Fatalf("response has no AdmissionResponse: %q", raw)
		}
		if !review.Response.Allowed && review.Response.Result == nil {
			t.Fatalf("a denial without a status: %q", raw)
		}
	})
}

// TestHandlerWarnsOnTargetPortConflict: two policies select the pod with
// different targetPorts; the sidecar can guard only one, and the other
// policy's owner is told when a container keeps that other port, whose
// traffic then passes around the sidecar. Without such a port (the paired
// case) every request reaches the app through the sidecar, which enforces
// every policy selecting the pod: no warning.
func TestHandlerWarnsOnTargetPortConflict(t *testing.T) {
	namespace(t, "mixed", true)
	policy(t, "mixed")
	apiPolicy(t, "mixed")
	for _, tc := range []struct {
		name    string
		apiPort bool
		want    []string
	}{
		{"the app keeps port api", true, []string{"z-api names targetPort \"api\", which container app keeps: its traffic passes around the sidecar"}},
		{"the pod has no port api", false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := owned(webPod("mixed"))
			if tc.apiPort {
				pod.Spec.Containers[0].Ports = append(pod.Spec.Containers[0].Ports, corev1.ContainerPort{Name: "api", ContainerPort: 9090})
			}
			resp := injector.Handle(context.Background(), admissionRequest(t, "mixed", pod))
			if !resp.Allowed || len(resp.Patches) == 0 {
				t.Fatalf("allowed=%v patches=%d, want the pod injected for the first policy", resp.Allowed, len(resp.Patches))
			}
			if len(resp.Warnings) != len(tc.want) {
				t.Fatalf("warnings = %q, want %d", resp.Warnings, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(resp.Warnings[i], w) {
					t.Errorf("warning %q lacks %q", resp.Warnings[i], w)
				}
			}
		})
	}
}

// TestHandlerTargetPortAnnotation: a pod that chooses the port with
// inject.TargetPortAnnotation gets the sidecar in front of that port, whatever
// the policies name. When the app keeps the port a policy names (issue 23:
// the annotation left the app holding http, and silenced the warning), the
// pod's creator is told that this port's traffic passes around the sidecar.
func TestHandlerTargetPortAnnotation(t *testing.T) {
	namespace(t, "chosen", true)
	policy(t, "chosen") // targetPort http (the default)
	apiPolicy(t, "chosen")
	pod := webPod("chosen") // bare: the re-apply warning names the port taken over
	pod.Annotations = map[string]string{inject.TargetPortAnnotation: "grpc"}
	pod.Spec.Containers[0].Ports = append(pod.Spec.Containers[0].Ports, corev1.ContainerPort{Name: "grpc", ContainerPort: 9090})
	resp := injector.Handle(context.Background(), admissionRequest(t, "chosen", pod))
	if !resp.Allowed || len(resp.Patches) == 0 {
		t.Fatalf("allowed=%v patches=%d, want the pod injected", resp.Allowed, len(resp.Patches))
	}
	want := []string{`took over port name "grpc"`,
		`per-user names targetPort "http", which container app keeps: its traffic passes around the sidecar`}
	if len(resp.Warnings) != len(want) {
		t.Fatalf("warnings = %q, want %d: the re-apply warning naming port grpc, and one for port http", resp.Warnings, len(want))
	}
	for i, w := range want {
		if !strings.Contains(resp.Warnings[i], w) {
			t.Errorf("warning %q lacks %q", resp.Warnings[i], w)
		}
	}
}

// apiPolicy creates policy z-api in ns, selecting the web pods with
// targetPort api, and waits until the webhook's cache has it.
func apiPolicy(t *testing.T, ns string) {
	t.Helper()
	other := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "z-api", Namespace: ns},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "web"}},
			TargetPort:     "api", Window: "10s", Limit: 5,
			Key: v1alpha1.ClientKey{Source: "Global"},
		},
	}
	if err := k8s.Create(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), other) })
	eventually(t, 10*time.Second, "the cache sees the second policy", func() bool {
		return cached.Get(context.Background(), client.ObjectKeyFromObject(other), &v1alpha1.RateLimitPolicy{}) == nil
	})
}

// TestInjectsBeforeTheCacheSees: one `kubectl apply` of a labelled
// namespace, a policy and a Deployment creates the pods a moment after the
// policy, before the manager's cache may have seen it (or the namespace's
// label). The webhook asks the API server before admitting a pod without
// the sidecar; with the cache alone, the pod ran unprotected until it was
// restarted (seen on the real node: PartiallyEnforced after a Helm
// install and the demo's apply).
func TestInjectsBeforeTheCacheSees(t *testing.T) {
	namespace(t, "fresh", true)
	policy(t, "fresh")
	stale := fake.NewClientBuilder().WithScheme(scheme).WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "fresh"}}).Build()
	for _, tc := range []struct {
		name   string
		live   client.Reader
		inject bool
	}{
		{"the cache alone", nil, false},
		{"the API server behind it", k8s, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &PodInjector{Reader: stale, Live: tc.live, Decoder: injector.Decoder, Options: injector.Options}
			resp := h.Handle(context.Background(), admissionRequest(t, "fresh", owned(webPod("w"))))
			if !resp.Allowed {
				t.Fatalf("refused: %v", resp.Result)
			}
			if injected := len(resp.Patches) > 0; injected != tc.inject {
				t.Errorf("injected %v (%s), want %v", injected, resp.Result.Message, tc.inject)
			}
		})
	}
}
