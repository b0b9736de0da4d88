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

// Package manifests_test checks the install as kustomize renders it
// (kubectl kustomize, as `kubectl apply -k` does): what the rate limit
// service's NetworkPolicy admits, read with NetworkPolicy's own rules, and
// that a real API server (envtest) accepts the objects. Whether a cluster
// enforces a NetworkPolicy is its CNI's business; the real-node test's
// bridge CNI does not, so no test here or there shows a packet dropped.
package manifests_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// admin is envtest's client.
var admin client.Client

func TestMain(m *testing.M) {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	env, c, err := testsupport.StartControlPlane(scheme)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	admin = c
	code := m.Run()
	_ = env.Stop()
	os.Exit(code)
}

// rendered is one overlay as kubectl kustomize renders it.
type rendered struct {
	docs [][]byte
}

func render(t *testing.T, overlay string) rendered {
	t.Helper()
	root, err := testsupport.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("kubectl", "kustomize", filepath.Join(root, "config", overlay)).Output()
	if err != nil {
		testsupport.Missing(t, "kubectl (kustomize)", err)
	}
	var r rendered
	for _, doc := range bytes.Split(out, []byte("\n---\n")) {
		if len(bytes.TrimSpace(doc)) > 0 {
			r.docs = append(r.docs, doc)
		}
	}
	return r
}

// get decodes, strictly, the one object of the kind and name into obj.
func (r rendered) get(t *testing.T, kind, name string, obj any) {
	t.Helper()
	found := 0
	for _, doc := range r.docs {
		var meta struct {
			Kind     string            `json:"kind"`
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		if meta.Kind != kind || meta.Metadata.Name != name {
			continue
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("%s %s: %v", kind, name, err)
		}
		found++
	}
	if found != 1 {
		t.Fatalf("%d objects %s %s rendered, want 1", found, kind, name)
	}
}

// pod is a connection's end: its namespace (with its labels) and labels.
type pod struct {
	namespace string
	nsLabels  map[string]string
	labels    map[string]string
}

func (p pod) namespaceLabels() labels.Set {
	s := labels.Set{corev1.LabelMetadataName: p.namespace} // set by the API server
	for k, v := range p.nsLabels {
		s[k] = v
	}
	return s
}

// selects reports whether np applies to the ingress of dst.
func selects(t *testing.T, np *networkingv1.NetworkPolicy, dst pod) bool {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	return dst.namespace == np.Namespace && sel.Matches(labels.Set(dst.labels)) && slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
}

// admits reports whether np lets src reach dst (which it selects) on the
// container port port, by NetworkPolicy's rules: a rule admits when one of
// its ports matches (none: all) and one of its peers does (none: all); a
// peer with only a podSelector means pods of the policy's namespace, with a
// namespaceSelector pods of the namespaces it selects, narrowed by a
// podSelector beside it. ipBlock and endPort are not used by the install,
// and fail the test if they appear.
func admits(t *testing.T, np *networkingv1.NetworkPolicy, src pod, port corev1.ContainerPort) bool {
	t.Helper()
	matches := func(s *metav1.LabelSelector, set labels.Set) bool {
		sel, err := metav1.LabelSelectorAsSelector(s)
		if err != nil {
			t.Fatal(err)
		}
		return sel.Matches(set)
	}
	for _, rule := range np.Spec.Ingress {
		portOK := len(rule.Ports) == 0
		for _, p := range rule.Ports {
			if p.EndPort != nil {
				t.Fatalf("endPort in %s: not modelled", np.Name)
			}
			proto := corev1.ProtocolTCP
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			if proto != port.Protocol {
				continue
			}
			switch {
			case p.Port == nil:
				portOK = true
			case p.Port.StrVal != "":
				portOK = portOK || p.Port.StrVal == port.Name
			default:
				portOK = portOK || p.Port.IntVal == port.ContainerPort
			}
		}
		peerOK := len(rule.From) == 0
		for _, peer := range rule.From {
			if peer.IPBlock != nil {
				t.Fatalf("ipBlock in %s: not modelled", np.Name)
			}
			nsOK := src.namespace == np.Namespace
			if peer.NamespaceSelector != nil {
				nsOK = matches(peer.NamespaceSelector, src.namespaceLabels())
			}
			podOK := peer.PodSelector == nil || matches(peer.PodSelector, labels.Set(src.labels))
			peerOK = peerOK || nsOK && podOK
		}
		if portOK && peerOK {
			return true
		}
	}
	return false
}

// TestRLSNetworkPolicy (issue 22): as rendered by config/rls, the rate
// limit service's NetworkPolicy selects its pods and no other pod of the
// namespace (the manager's webhook must stay reachable), admits the gRPC
// port from the namespaces labelled rls-client only, and the admin port
// from the manager and the namespaces labelled rls-metrics only. Before,
// the install shipped none: every pod reached both ports.
func TestRLSNetworkPolicy(t *testing.T) {
	r := render(t, "rls")
	var np networkingv1.NetworkPolicy
	r.get(t, "NetworkPolicy", "slidegate-rls", &np)
	var server, manager appsv1.Deployment
	r.get(t, "Deployment", "slidegate-rls", &server)
	r.get(t, "Deployment", "slidegate-controller-manager", &manager)
	const system = "slidegate-system"
	rlsPod := pod{namespace: server.Namespace, labels: server.Spec.Template.Labels}
	managerPod := pod{namespace: manager.Namespace, labels: manager.Spec.Template.Labels}
	if !selects(t, &np, rlsPod) {
		t.Fatalf("the policy does not select the rate limit service's pods %v", rlsPod.labels)
	}
	if selects(t, &np, managerPod) {
		t.Fatalf("the policy selects the manager's pods %v: the API server would no longer reach the webhook", managerPod.labels)
	}
	ports := map[string]corev1.ContainerPort{}
	for _, p := range server.Spec.Template.Spec.Containers[0].Ports {
		ports[p.Name] = p
	}
	if len(ports) != 2 || ports["grpc"].Name == "" || ports["admin"].Name == "" {
		t.Fatalf("container ports %v: the table below covers grpc and admin", ports)
	}

	gateways := map[string]string{v1alpha1.RLSClientNamespaceLabel: "true"}
	metrics := map[string]string{v1alpha1.RLSMetricsNamespaceLabel: "true"}
	for _, tc := range []struct {
		name        string
		src         pod
		grpc, admin bool
	}{
		{"a gateway in a labelled namespace", pod{"istio-system", gateways, map[string]string{"istio": "ingressgateway"}}, true, false},
		{"any pod of a labelled namespace", pod{"istio-system", gateways, nil}, true, false},
		{"a tenant's pod", pod{"shop", nil, map[string]string{"app": "web"}}, false, false},
		{"a tenant's pod labelled like the manager", pod{"shop", nil, managerPod.labels}, false, false},
		{"a namespace labelled rls-client=false", pod{"shop", map[string]string{v1alpha1.RLSClientNamespaceLabel: "false"}, nil}, false, false},
		{"the manager", managerPod, false, true},
		{"Prometheus in a labelled namespace", pod{"monitoring", metrics, map[string]string{"app": "prometheus"}}, false, true},
		{"another pod of slidegate-system", pod{system, nil, map[string]string{"app": "redis"}}, false, false},
		{"another server", rlsPod, false, false},
	} {
		if got := admits(t, &np, tc.src, ports["grpc"]); got != tc.grpc {
			t.Errorf("%s → grpc: admitted %v, want %v", tc.name, got, tc.grpc)
		}
		if got := admits(t, &np, tc.src, ports["admin"]); got != tc.admin {
			t.Errorf("%s → admin: admitted %v, want %v", tc.name, got, tc.admin)
		}
	}

	// The API server takes it as rendered.
	ctx := context.Background()
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: system}}); err != nil {
		t.Fatal(err)
	}
	np.ResourceVersion = ""
	if err := admin.Create(ctx, &np); err != nil {
		t.Fatalf("the API server refuses the rendered NetworkPolicy: %v", err)
	}
}

// TestRLSClientAuthOverlay: config/rls-mtls runs the server with the
// mounted Secret's key pair and client CA (options its own validation
// accepts), and the Service no longer calls the port h2c (cleartext).
func TestRLSClientAuthOverlay(t *testing.T) {
	r := render(t, "rls-mtls")
	var server appsv1.Deployment
	r.get(t, "Deployment", "slidegate-rls", &server)
	var svc corev1.Service
	r.get(t, "Service", "slidegate-rls", &svc)
	spec := server.Spec.Template.Spec
	c := spec.Containers[0]
	flags := map[string]string{}
	for _, a := range c.Args {
		k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		flags[k] = v
	}
	o := rls.TLSOptions{CertFile: flags["tls-cert-file"], KeyFile: flags["tls-key-file"], ClientCAFile: flags["tls-client-ca-file"]}
	if err := o.Validate(); err != nil || !o.ClientAuth() {
		t.Fatalf("flags %v: %v", flags, err)
	}
	var mount string
	for _, m := range c.VolumeMounts {
		if m.Name == "tls" {
			mount = m.MountPath
		}
	}
	for _, f := range []string{o.CertFile, o.KeyFile, o.ClientCAFile} {
		if mount == "" || filepath.Dir(f) != mount {
			t.Errorf("%s is not in the mounted Secret (%q)", f, mount)
		}
	}
	var secret string
	for _, v := range spec.Volumes {
		if v.Name == "tls" && v.Secret != nil {
			secret = v.Secret.SecretName
		}
	}
	if secret != "slidegate-rls-tls" {
		t.Errorf("the tls volume is Secret %q", secret)
	}
	if p := svc.Spec.Ports[0]; p.Name != "grpc" || p.AppProtocol == nil || *p.AppProtocol != "grpc" {
		t.Errorf("Service port %+v", p)
	}
}
