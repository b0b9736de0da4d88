package webhook

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
)

// labelNamespace creates (or relabels) namespace name with the injection
// label set to value.
func labelNamespace(t *testing.T, name, value string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.InjectionLabel: value}}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		if err := k8s.Patch(context.Background(), ns, client.MergeFrom(&corev1.Namespace{})); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10e9, "the cache sees the namespace's label", func() bool {
		var got corev1.Namespace
		return cached.Get(context.Background(), client.ObjectKey{Name: name}, &got) == nil && got.Labels[v1alpha1.InjectionLabel] == value
	})
}

// forge writes what issue 23's pod author wrote: an injection status and a
// dummy init container named like the sidecar, the app keeping its port.
func forge(p *corev1.Pod) {
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[v1alpha1.InjectedAnnotation] = `{"version":"v1","container":"slidegate-sidecar","targetPort":"http","appContainer":"app","appPort":8080}`
	p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: inject.ContainerName, Image: "example.com/busybox:1",
		Command: []string{"sleep", "infinity"}, RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)})
}

// portHolder is the container a Service's targetPort name reaches, as the
// EndpointSlice controller resolves it: regular containers first, then
// native sidecars. The test's own copy, so that it checks the injector's.
func portHolder(p *corev1.Pod, name string) string {
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == name {
				return c.Name
			}
		}
	}
	for _, c := range p.Spec.InitContainers {
		if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			continue
		}
		for _, port := range c.Ports {
			if port.Name == name {
				return c.Name
			}
		}
	}
	return ""
}

// protected checks that the stored pod carries the webhook's own sidecar,
// which a Service's targetPort http reaches, and that the app's port 8080 is
// not on the node.
func protected(t *testing.T, p *corev1.Pod) {
	t.Helper()
	n := 0
	for _, c := range p.Spec.InitContainers {
		if c.Name == inject.ContainerName {
			n++
			if c.Image != injector.Options.Image {
				t.Errorf("the sidecar runs %s, not the webhook's image %s", c.Image, injector.Options.Image)
			}
		}
	}
	if n != 1 {
		t.Fatalf("%d init containers named %s", n, inject.ContainerName)
	}
	if h := portHolder(p, "http"); h != inject.ContainerName {
		t.Errorf("targetPort http reaches container %q, not the sidecar", h)
	}
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.ContainerPort == 8080 && port.HostPort != 0 {
				t.Errorf("container %s publishes the app's port on the node (hostPort %d)", c.Name, port.HostPort)
			}
		}
	}
}

// clean checks that the stored pod carries no sidecar and no injection
// status, and that the app kept its port name.
func clean(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if _, ok := p.Annotations[v1alpha1.InjectedAnnotation]; ok {
		t.Errorf("the pod keeps an injection status: %s", p.Annotations[v1alpha1.InjectedAnnotation])
	}
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for _, c := range cs {
			if c.Name == inject.ContainerName {
				t.Errorf("the pod keeps a container named %s (image %s)", c.Name, c.Image)
			}
		}
	}
	if h := portHolder(p, "http"); h != "app" {
		t.Errorf("targetPort http reaches %q, want the app", h)
	}
}

// podName makes a pod name of a test case's.
func podName(s string) string {
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(s))
	name = strings.Join(strings.FieldsFunc(name, func(r rune) bool { return r == '-' }), "-")
	return strings.Trim(name[:min(len(name), 60)], "-")
}

// TestNoWayAroundThroughAPIServer creates, through the API server and the
// shipped webhook configuration, the pods of issue 23 that kept their
// traffic away from the sidecar, and the opt-outs a namespace labelled
// required refuses. Each pod is either protected by the webhook's own
// sidecar, admitted without any sidecar or status, or refused.
func TestNoWayAroundThroughAPIServer(t *testing.T) {
	namespace(t, "shop", true)
	policy(t, "shop")
	labelNamespace(t, "strict", v1alpha1.InjectionRequired)
	policy(t, "strict")
	optOutLabel := func(p *corev1.Pod) { p.Labels[inject.OptOutAnnotation] = "false" }
	optOutAnnotation := func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[inject.OptOutAnnotation] = "false"
	}
	for _, tc := range []struct {
		name, ns string
		mutate   []func(*corev1.Pod)
		check    func(*testing.T, *corev1.Pod)
		refused  string // part of the refusal's message; "" admitted
	}{
		{name: "forged status and dummy init container", ns: "shop", mutate: []func(*corev1.Pod){forge}, check: protected},
		{name: "opted out by label, with a forged sidecar", ns: "shop", mutate: []func(*corev1.Pod){forge, optOutLabel}, check: clean},
		{name: "opted out by annotation, with a forged sidecar", ns: "shop", mutate: []func(*corev1.Pod){forge, optOutAnnotation}, check: clean},
		{name: "selected by no policy, with a forged sidecar", ns: "shop", mutate: []func(*corev1.Pod){forge, func(p *corev1.Pod) { p.Labels["app"] = "other" }}, check: clean},
		{name: "two containers name a port http", ns: "shop", mutate: []func(*corev1.Pod){func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "admin", Image: "example.com/admin:1",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8081}}})
		}}, check: protected},
		{name: "hostPort on the app's port", ns: "shop", mutate: []func(*corev1.Pod){func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].HostPort = 30080 }},
			check: func(t *testing.T, p *corev1.Pod) {
				protected(t, p)
				// The kubelet publishes regular containers' hostPorts only:
				// the app's container publishes the sidecar's port.
				if !slices.ContainsFunc(p.Spec.Containers[0].Ports, func(cp corev1.ContainerPort) bool {
					return cp.HostPort == 30080 && cp.ContainerPort == inject.DefaultListenPort
				}) {
					t.Errorf("hostPort 30080 does not publish the sidecar's port %d: %+v", inject.DefaultListenPort, p.Spec.Containers[0].Ports)
				}
			}},
		{name: "a regular container named like the sidecar", ns: "shop", mutate: []func(*corev1.Pod){func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: inject.ContainerName, Image: "example.com/busybox:1"})
		}}, refused: "reserved for slidegate's sidecar"},
		{name: "enabled: opting out is allowed (the paired case)", ns: "shop", mutate: []func(*corev1.Pod){optOutLabel}, check: clean},
		{name: "required: a selected pod is injected", ns: "strict", check: protected},
		{name: "required: opted out by label", ns: "strict", mutate: []func(*corev1.Pod){optOutLabel},
			refused: "namespace strict requires the rate limit sidecar (ratelimit.slidegate.dev/injection=required): pods may not opt out"},
		{name: "required: opted out by annotation", ns: "strict", mutate: []func(*corev1.Pod){optOutAnnotation}, refused: "pods may not opt out"},
		{name: "required: opted out though no policy selects it", ns: "strict", mutate: []func(*corev1.Pod){optOutLabel, func(p *corev1.Pod) { p.Labels["app"] = "other" }},
			refused: "pods may not opt out"},
		{name: "required: a selected pod that cannot be injected", ns: "strict", mutate: []func(*corev1.Pod){func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].Name = "web" }},
			refused: `no container port with that name "http"`},
		{name: "required: a selected pod on the host network", ns: "strict", mutate: []func(*corev1.Pod){func(p *corev1.Pod) { p.Spec.HostNetwork = true }},
			refused: "RateLimitPolicy per-user selects this pod, but it cannot carry the sidecar: pod uses hostNetwork"},
		{name: "required: a pod no policy selects is admitted", ns: "strict", mutate: []func(*corev1.Pod){func(p *corev1.Pod) { p.Labels["app"] = "other" }}, check: clean},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := webPod(podName(tc.name))
			pod.Namespace = tc.ns
			for _, m := range tc.mutate {
				m(pod)
			}
			err := k8s.Create(context.Background(), pod)
			if err == nil {
				t.Cleanup(func() { _ = k8s.Delete(context.Background(), pod) })
			}
			if tc.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("create: %v; want it refused with %q", err, tc.refused)
				}
				t.Logf("refused: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("creating the pod: %v", err)
			}
			tc.check(t, pod)
		})
	}
}
