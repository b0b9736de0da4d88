package inject

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// around lists the ways traffic reaches the app of an injected pod without
// passing its sidecar, judged as the cluster would, from the spec alone: the
// EndpointSlice controller resolves a Service's named target port in the
// regular containers first and then in the native sidecars (FindPort in
// k8s.io/endpointslice); a hostPort on any container's entry of the app's
// port number publishes that port on the node; and the sidecar must be the
// one Inject builds (our image, forwarding to the app), not a look-alike.
// It is the test's own oracle: it shares no code with what it checks.
func around(pod *corev1.Pod, target, image string) []string {
	var out []string
	var sidecars []*corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == ContainerName {
			out = append(out, "a regular container is named "+ContainerName)
		}
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == ContainerName {
			sidecars = append(sidecars, &pod.Spec.InitContainers[i])
		}
	}
	if len(sidecars) != 1 {
		return append(out, fmt.Sprintf("%d init containers named %s", len(sidecars), ContainerName))
	}
	sc := sidecars[0]
	if sc.RestartPolicy == nil || *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		out = append(out, "the sidecar is not a native sidecar (restartPolicy Always)")
	}
	if sc.Image != image {
		out = append(out, fmt.Sprintf("the sidecar runs image %s, not %s", sc.Image, image))
	}
	var upstream int32
	for _, a := range sc.Args {
		if v, ok := strings.CutPrefix(a, "--upstream=http://127.0.0.1:"); ok {
			n, _ := strconv.Atoi(v)
			upstream = int32(n)
		}
	}
	if upstream == 0 {
		out = append(out, "the sidecar forwards nowhere")
	}
	// FindPort: regular containers, then restartable init containers.
	holder := ""
	find := func(cs []corev1.Container, native bool) {
		for _, c := range cs {
			if holder != "" || native && (c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways) {
				continue
			}
			for _, p := range c.Ports {
				if p.Name == target && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP) {
					holder = c.Name
					break
				}
			}
		}
	}
	find(pod.Spec.Containers, false)
	find(pod.Spec.InitContainers, true)
	if holder != ContainerName {
		out = append(out, fmt.Sprintf("a Service's targetPort %q reaches container %q", target, holder))
	}
	for _, cs := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for _, c := range cs {
			if c.Name == ContainerName {
				continue
			}
			for _, p := range c.Ports {
				if p.ContainerPort == upstream && p.HostPort != 0 {
					out = append(out, fmt.Sprintf("container %s publishes the app's port %d on the node as hostPort %d", c.Name, upstream, p.HostPort))
				}
			}
		}
	}
	return out
}

// publishedOn is the pod port that the kubelet maps hostPort to: the
// kubelet builds the pod's port mappings from its regular containers only
// (kuberuntime's generatePodSandboxConfig), not from init containers.
func publishedOn(pod *corev1.Pod, hostPort int32) int32 {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort == hostPort {
				return p.ContainerPort
			}
		}
	}
	return 0
}

// forgedStatus is an injection status a pod author writes by hand.
const forgedStatus = `{"version":"v1","container":"slidegate-sidecar","targetPort":"http","appContainer":"app","appPort":8080}`

func withForgedStatus(p *corev1.Pod, status string) {
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[v1alpha1.InjectedAnnotation] = status
}

// dummySidecar is a container named like the sidecar that limits nothing.
func dummySidecar(native bool, ports ...corev1.ContainerPort) corev1.Container {
	c := corev1.Container{Name: ContainerName, Image: "example.com/busybox:1", Command: []string{"sleep", "infinity"}, Ports: ports}
	if native {
		c.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	}
	return c
}

// TestInjectLeavesNoWayAround: whatever the pod author wrote into the pod
// before the webhook saw it, the injected pod's traffic to the target port
// passes the sidecar (issue 23). Each row failed before the injector stopped
// trusting the pod's own injection status, took over every container's port
// of the target name and moved hostPorts to the sidecar.
func TestInjectLeavesNoWayAround(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mutate  func(*corev1.Pod)
		wantErr error
		// published are hostPorts that must still reach the pod, through
		// the sidecar: a regular container publishes them on its listen
		// port (the kubelet publishes the hostPorts of regular containers
		// only).
		published []int32
	}{
		{name: "clean pod (the paired case: passes before and after)", mutate: func(*corev1.Pod) {}},
		{name: "forged injected annotation and a dummy init container", mutate: func(p *corev1.Pod) {
			withForgedStatus(p, forgedStatus)
			p.Spec.InitContainers = []corev1.Container{dummySidecar(false)}
		}},
		{name: "forged annotation and a look-alike native sidecar holding the port name", mutate: func(p *corev1.Pod) {
			withForgedStatus(p, forgedStatus)
			p.Spec.InitContainers = []corev1.Container{dummySidecar(true, corev1.ContainerPort{Name: "http", ContainerPort: 15280})}
			p.Spec.Containers[0].Ports[0].Name = ""
		}},
		{name: "forged annotation pointing at another port", mutate: func(p *corev1.Pod) {
			withForgedStatus(p, `{"version":"v1","container":"slidegate-sidecar","targetPort":"http","appContainer":"app","appPort":9090}`)
			p.Spec.InitContainers = []corev1.Container{dummySidecar(true)}
		}},
		{name: "forged annotation alone", mutate: func(p *corev1.Pod) { withForgedStatus(p, forgedStatus) }},
		{name: "unreadable annotation", mutate: func(p *corev1.Pod) { withForgedStatus(p, "not json") }},
		{name: "two containers name a port http", mutate: func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "admin", Image: "example.com/admin:1",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8081}}})
		}},
		{name: "a native sidecar of the pod's own names a port http", mutate: func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "envoy", Image: "example.com/envoy:1", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8082}}}}
		}},
		{name: "hostPort on the app's port", mutate: func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].HostPort = 30080 }, published: []int32{30080}},
		{name: "hostPort on another entry of the app's port number", mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{ContainerPort: 8080, HostPort: 30081, HostIP: "10.0.0.1"})
		}, published: []int32{30081}},
		{name: "hostPort of a second container on the app's port number", mutate: func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "admin", Image: "example.com/admin:1",
				Ports: []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 30082}}})
		}, published: []int32{30082}},
		{name: "a regular container named like the sidecar is refused", mutate: func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, dummySidecar(false))
		}, wantErr: ErrReservedName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := readPod(t, "testdata/basic.yaml")
			tc.mutate(pod)
			err := Inject(pod, testOptions)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Inject error = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Inject: %v", err)
			}
			if ways := around(pod, "http", testOptions.Image); len(ways) > 0 {
				t.Errorf("traffic reaches the app around the sidecar:\n  %s", strings.Join(ways, "\n  "))
			}
			for _, hp := range tc.published {
				if got := publishedOn(pod, hp); got != DefaultListenPort {
					t.Errorf("hostPort %d reaches pod port %d, want the sidecar's %d, published by a regular container", hp, got, DefaultListenPort)
				}
			}
			twice := pod.DeepCopy()
			if err := Inject(twice, testOptions); err != nil {
				t.Fatal(err)
			}
			if ways := around(twice, "http", testOptions.Image); len(ways) > 0 {
				t.Errorf("after re-injection: %s", strings.Join(ways, "; "))
			}
		})
	}
}

// TestRemove: Remove takes the sidecar and its marks off and gives the app
// back what the sidecar took (so that injecting the result again is
// injecting the original), but only what the removed sidecar holds: a
// forged status cannot add a port name or a hostPort.
func TestRemove(t *testing.T) {
	inspect := func(t *testing.T, pod *corev1.Pod) {
		t.Helper()
		if _, ok := pod.Annotations[v1alpha1.InjectedAnnotation]; ok {
			t.Error("the injection status is still there")
		}
		if sidecarIndex(pod.Spec.InitContainers) >= 0 {
			t.Error("the sidecar is still there")
		}
		for _, v := range pod.Spec.Volumes {
			if strings.HasPrefix(v.Name, "slidegate-") {
				t.Errorf("volume %s is still there", v.Name)
			}
		}
	}
	for _, in := range []string{"basic", "two-containers", "hostport", "existing-init", "annotated-port", "basic-tls"} {
		t.Run("round trip "+in, func(t *testing.T) {
			orig := readPod(t, "testdata/"+in+".yaml")
			opts := testOptions
			opts.Redis.TLS = strings.HasSuffix(in, "-tls")
			pod := orig.DeepCopy()
			if err := Inject(pod, opts); err != nil {
				t.Fatal(err)
			}
			if err := Remove(pod); err != nil {
				t.Fatal(err)
			}
			inspect(t, pod)
			// The ports are the original's again (probes keep their numbers).
			for i := range orig.Spec.Containers {
				if d := cmp.Diff(orig.Spec.Containers[i].Ports, pod.Spec.Containers[i].Ports); d != "" {
					t.Errorf("container %s ports (-orig +removed):\n%s", orig.Spec.Containers[i].Name, d)
				}
			}
			if d := cmp.Diff(orig.Spec.Volumes, pod.Spec.Volumes, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("volumes (-orig +removed):\n%s", d)
			}
			again, want := pod.DeepCopy(), orig.DeepCopy()
			if err := Inject(again, opts); err != nil {
				t.Fatal(err)
			}
			if err := Inject(want, opts); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(want, again); d != "" {
				t.Errorf("Inject(Remove(Inject(p))) != Inject(p):\n%s", d)
			}
		})
	}

	t.Run("a forged status adds no hostPort and no second name", func(t *testing.T) {
		pod := readPod(t, "testdata/basic.yaml")
		withForgedStatus(pod, `{"version":"v1","container":"slidegate-sidecar","targetPort":"http","appContainer":"app","appPort":8080,`+
			`"takenOver":[{"container":"app","port":8080,"named":true,"hostPort":22},{"container":"app","port":9090,"named":true}]}`)
		pod.Spec.InitContainers = []corev1.Container{dummySidecar(true)}
		want := readPod(t, "testdata/basic.yaml")
		if err := Remove(pod); err != nil {
			t.Fatal(err)
		}
		inspect(t, pod)
		if d := cmp.Diff(want.Spec.Containers, pod.Spec.Containers); d != "" {
			t.Errorf("the app's container changed (-want +got):\n%s", d)
		}
	})
	t.Run("a pod without marks is left alone", func(t *testing.T) {
		pod := readPod(t, "testdata/existing-init.yaml")
		want := pod.DeepCopy()
		if err := Remove(pod); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, pod); d != "" {
			t.Errorf("changed:\n%s", d)
		}
	})
	t.Run("a regular container named like the sidecar", func(t *testing.T) {
		pod := readPod(t, "testdata/basic.yaml")
		pod.Spec.Containers = append(pod.Spec.Containers, dummySidecar(false))
		if err := Remove(pod); !errors.Is(err, ErrReservedName) {
			t.Fatalf("Remove: %v, want %v", err, ErrReservedName)
		}
	})
}

// TestReadGuard: what the controller counts as enforced comes from the
// spec, and each way around the sidecar a spec can show is told apart.
func TestReadGuard(t *testing.T) {
	injected := func(mutate ...func(*corev1.Pod)) func(*testing.T) *corev1.Pod {
		return func(t *testing.T) *corev1.Pod {
			pod := readPod(t, "testdata/basic.yaml")
			if err := Inject(pod, testOptions); err != nil {
				t.Fatal(err)
			}
			for _, m := range mutate {
				m(pod)
			}
			return pod
		}
	}
	plain := func(mutate ...func(*corev1.Pod)) func(*testing.T) *corev1.Pod {
		return func(t *testing.T) *corev1.Pod {
			pod := readPod(t, "testdata/basic.yaml")
			for _, m := range mutate {
				m(pod)
			}
			return pod
		}
	}
	for _, tc := range []struct {
		name    string
		pod     func(*testing.T) *corev1.Pod
		want    Guard
		wantErr error
	}{
		{"injected", injected(), Guard{Port: "http", AppPort: 8080, Image: testOptions.Image}, nil},
		{"no sidecar", plain(), Guard{}, ErrNoSidecar},
		{"the issue's forged pod: status and a dummy init container", plain(func(p *corev1.Pod) {
			withForgedStatus(p, forgedStatus)
			p.Spec.InitContainers = []corev1.Container{dummySidecar(false)}
		}), Guard{}, ErrNotSidecar},
		{"a native look-alike holding no port", plain(func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{dummySidecar(true)}
		}), Guard{}, ErrNotSidecar},
		{"a native look-alike holding the name, forwarding nowhere", plain(func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{dummySidecar(true, corev1.ContainerPort{Name: "http", ContainerPort: 15280})}
		}), Guard{}, ErrNotSidecar},
		{"a regular container named like the sidecar", plain(func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, dummySidecar(false))
		}), Guard{}, ErrNotSidecar},
		{"a container still holds the port name", injected(func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "admin", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8081}}})
		}), Guard{Port: "http", AppPort: 8080, Image: testOptions.Image}, ErrAround},
		{"a UDP port of the name is not resolved for TCP", injected(func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{Name: "http", ContainerPort: 8081, Protocol: corev1.ProtocolUDP})
		}), Guard{Port: "http", AppPort: 8080, Image: testOptions.Image}, nil},
		{"the app's port on the node", injected(func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].HostPort = 30080 }),
			Guard{Port: "http", AppPort: 8080, Image: testOptions.Image}, ErrAround},
		{"another port on the node is none of ours", injected(func(p *corev1.Pod) { p.Spec.Containers[0].Ports[1].HostPort = 30090 }),
			Guard{Port: "http", AppPort: 8080, Image: testOptions.Image}, nil},
		{"the sidecar's own port on the node is limited", injected(func(p *corev1.Pod) { p.Spec.InitContainers[0].Ports[0].HostPort = 30080 }),
			Guard{Port: "http", AppPort: 8080, Image: testOptions.Image}, nil},
		{"host network", injected(func(p *corev1.Pod) { p.Spec.HostNetwork = true }), Guard{Port: "http", AppPort: 8080, Image: testOptions.Image}, ErrAround},
		{"the annotation is not read", injected(func(p *corev1.Pod) { delete(p.Annotations, v1alpha1.InjectedAnnotation) }),
			Guard{Port: "http", AppPort: 8080, Image: testOptions.Image}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := tc.pod(t)
			g, err := ReadGuard(&pod.Spec)
			t.Logf("ReadGuard: %+v, %v", g, err)
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if g != tc.want {
				t.Errorf("guard %+v, want %+v", g, tc.want)
			}
		})
	}
}

// TestGuardCovers: a sidecar in front of one port name covers another name
// only if no container keeps that one (a pod's target-port annotation that
// leaves the app holding the policy's port).
func TestGuardCovers(t *testing.T) {
	pod := readPod(t, "testdata/basic.yaml") // ports http and grpc
	pod.Annotations = map[string]string{TargetPortAnnotation: "grpc"}
	if err := Inject(pod, testOptions); err != nil {
		t.Fatal(err)
	}
	g, err := ReadGuard(&pod.Spec)
	if err != nil || g != (Guard{Port: "grpc", AppPort: 9090, Image: testOptions.Image}) {
		t.Fatalf("ReadGuard: %+v, %v", g, err)
	}
	for name, want := range map[string]bool{"grpc": true, "http": false, "api": true} {
		if got := g.Covers(&pod.Spec, name); got != want {
			t.Errorf("Covers(%q) = %v, want %v", name, got, want)
		}
	}
}
