package inject

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/redisconn"
	sidecarpkg "github.com/slidegate/slidegate/internal/sidecar"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var testOptions = Options{
	Image: "ghcr.io/slidegate/slidegate:v0.1.0",
	Redis: redisconn.Config{Mode: redisconn.Standalone, Addrs: []string{"redis.slidegate-system.svc:6379"}},
}

func readPod(t *testing.T, path string) *corev1.Pod {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict(b, &pod); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return &pod
}

// TestInjectGolden compares Inject's output for every testdata/*.yaml with
// its .golden file (go test ./internal/inject -update rewrites them), checks
// that re-injection changes nothing and that the result passes the Pod
// Security "restricted" profile (an input that fails it on its own, with a
// hostPort, must fail nothing more once injected).
func TestInjectGolden(t *testing.T) {
	inputs, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no inputs: %v", err)
	}
	for _, in := range inputs {
		t.Run(filepath.Base(in), func(t *testing.T) {
			pod := readPod(t, in)
			allowed := map[string]bool{}
			for _, f := range restricted(t, pod) {
				if !strings.HasPrefix(f, "hostPort") {
					t.Fatalf("input %s must itself pass the restricted profile (but for hostPorts), so the check below tests the sidecar: %v", in, f)
				}
				reason, _, _ := strings.Cut(f, ":")
				allowed[reason] = true
			}
			opts := testOptions
			if strings.HasSuffix(in, "-tls.yaml") {
				opts.Redis.TLS, opts.Redis.TLSServerName = true, "redis.data.svc"
			}
			if strings.HasSuffix(in, "-namespace-identity.yaml") {
				opts.RedisIdentity = v1alpha1.RedisIdentityNamespace
			}
			if err := Inject(pod, opts); err != nil {
				t.Fatalf("Inject: %v", err)
			}
			got, err := yaml.Marshal(pod)
			if err != nil {
				t.Fatal(err)
			}
			golden := strings.TrimSuffix(in, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if d := cmp.Diff(string(want), string(got)); d != "" {
				t.Errorf("Inject(%s) differs from %s (-want +got):\n%s", in, golden, d)
			}

			twice := pod.DeepCopy()
			if err := Inject(twice, opts); err != nil {
				t.Fatalf("re-Inject: %v", err)
			}
			if d := cmp.Diff(pod, twice); d != "" {
				t.Errorf("Inject(Inject(p)) != Inject(p) (-once +twice):\n%s", d)
			}
			for _, f := range restricted(t, pod) {
				if reason, _, _ := strings.Cut(f, ":"); !allowed[reason] {
					t.Errorf("the injected pod fails the restricted Pod Security profile: %v", f)
				}
			}
		})
	}
}

// TestReinjectCopiedPod: a pod made from a copy of an injected pod (older
// sidecar image, a status of before takenOver) comes out as the same pod
// injected fresh would.
func TestReinjectCopiedPod(t *testing.T) {
	pod := readPod(t, "testdata/copied-injected.yaml")
	if err := Inject(pod, testOptions); err != nil {
		t.Fatal(err)
	}
	want := readPod(t, "testdata/basic.yaml")
	if err := Inject(want, testOptions); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, pod); d != "" {
		t.Errorf("the copied pod re-injected differs from the pod injected fresh (-fresh +copied):\n%s", d)
	}
}

// restricted returns the checks of the Pod Security Admission "restricted"
// profile (latest version) that the pod fails.
func restricted(t *testing.T, pod *corev1.Pod) []string {
	t.Helper()
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var failed []string
	for _, r := range eval.EvaluatePod(api.LevelVersion{Level: api.LevelRestricted, Version: api.LatestVersion()}, &pod.ObjectMeta, &pod.Spec) {
		if !r.Allowed {
			failed = append(failed, r.ForbiddenReason+": "+r.ForbiddenDetail)
		}
	}
	return failed
}

// TestRestrictedCheckCanFail shows the restricted check above is not
// vacuous: a sidecar that may escalate privileges is caught.
func TestRestrictedCheckCanFail(t *testing.T) {
	pod := readPod(t, "testdata/basic.yaml")
	if err := Inject(pod, testOptions); err != nil {
		t.Fatal(err)
	}
	pod.Spec.InitContainers[0].SecurityContext.AllowPrivilegeEscalation = nil
	pod.Spec.InitContainers[0].SecurityContext.Capabilities = nil
	if len(restricted(t, pod)) == 0 {
		t.Fatal("a sidecar without allowPrivilegeEscalation=false and dropped capabilities passed the restricted check")
	}
}

func TestInjectTakesOverNamedPort(t *testing.T) {
	pod := readPod(t, "testdata/basic.yaml")
	if err := Inject(pod, testOptions); err != nil {
		t.Fatal(err)
	}
	sc := pod.Spec.InitContainers[0]
	if sc.Name != ContainerName || sc.RestartPolicy == nil || *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Fatalf("sidecar is not a native sidecar first among init containers: %+v", sc.Name)
	}
	if sc.Ports[0].Name != "http" || sc.Ports[0].ContainerPort != 15280 {
		t.Errorf("sidecar port = %+v, want name http on 15280", sc.Ports[0])
	}
	if sc.Ports[1].Name != AdminPortName || sc.Ports[1].ContainerPort != 15290 {
		t.Errorf("sidecar admin port = %+v, want name %s on 15290", sc.Ports[1], AdminPortName)
	}
	app := pod.Spec.Containers[0]
	if app.Ports[0].Name != "" || app.Ports[0].ContainerPort != 8080 {
		t.Errorf("app port = %+v, want unnamed 8080", app.Ports[0])
	}
	if app.ReadinessProbe.HTTPGet.Port.IntVal != 8080 || app.LivenessProbe.TCPSocket.Port.IntVal != 8080 {
		t.Errorf("app probes still address the moved port name: %+v %+v", app.ReadinessProbe.HTTPGet.Port, app.LivenessProbe.TCPSocket.Port)
	}
	if !containsArg(sc.Args, "--upstream=http://127.0.0.1:8080") {
		t.Errorf("sidecar args %v lack the upstream", sc.Args)
	}
	// Credentials come from files of the namespace's Secret, read for every
	// new connection, not from the environment (resolved once).
	if len(sc.Env) != 0 {
		t.Errorf("sidecar env %+v: credentials belong in the mounted Secret", sc.Env)
	}
	if !containsArg(sc.Args, "--redis-credentials-dir="+RedisCredentialsDir) {
		t.Errorf("sidecar args %v lack the credentials directory", sc.Args)
	}
}

func containsArg(args []string, want string) bool {
	for _, a := range args {
		if a == want {
			return true
		}
	}
	return false
}

// istioProxy is the container Istio's injector adds (its webhook runs
// before ours): istio-proxy declares 15090 (Envoy's Prometheus endpoint);
// the other ports Istio reserves are declared here too, as a stricter case.
func istioProxy() corev1.Container {
	c := corev1.Container{Name: "istio-proxy", Image: "docker.io/istio/proxyv2:1.24.0"}
	for _, p := range []struct {
		name string
		port int32
	}{{"http-envoy-prom", 15090}, {"envoy-admin", 15000}, {"outbound", 15001}, {"inbound", 15006}, {"status-port", 15020}, {"health", 15021}} {
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: p.name, ContainerPort: p.port, Protocol: corev1.ProtocolTCP})
	}
	return c
}

// oldPorts are the sidecar's former defaults, inside Istio's range.
func oldPorts(o *Options) { o.ListenPort, o.AdminPort = 15080, 15090 }

func TestInjectErrorsAndSkips(t *testing.T) {
	withIstio := func(p *corev1.Pod) { p.Spec.Containers = append(p.Spec.Containers, istioProxy()) }
	withNativeIstio := func(p *corev1.Pod) {
		// Istio's native sidecar mode (ENABLE_NATIVE_SIDECARS).
		c := istioProxy()
		c.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
		p.Spec.InitContainers = append(p.Spec.InitContainers, c)
	}
	for _, tc := range []struct {
		name     string
		mutate   func(*corev1.Pod)
		opts     func(*Options) // changes testOptions
		wantErr  error          // nil: injected
		wantSkip string
	}{
		{name: "no such port", mutate: func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].Name = "web" }, wantErr: ErrNoTargetPort},
		{name: "udp port is not taken", mutate: func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].Protocol = corev1.ProtocolUDP }, wantErr: ErrNoTargetPort},
		{name: "app uses the sidecar's port", mutate: func(p *corev1.Pod) { p.Spec.Containers[0].Ports[1].ContainerPort = DefaultListenPort }, wantErr: ErrPortInUse},
		{name: "app uses the sidecar's admin port", mutate: func(p *corev1.Pod) { p.Spec.Containers[0].Ports[1].ContainerPort = DefaultAdminPort }, wantErr: ErrPortInUse},
		{name: "app uses the sidecar's debug port", mutate: func(p *corev1.Pod) { p.Spec.Containers[0].Ports[1].ContainerPort = DefaultDebugPort }, wantErr: ErrPortInUse},
		{name: "app uses a configured sidecar port", mutate: func(p *corev1.Pod) { p.Spec.Containers[0].Ports[1].ContainerPort = 18090 },
			opts: func(o *Options) { o.ListenPort, o.AdminPort = 18080, 18090 }, wantErr: ErrPortInUse},
		{name: "istio-proxy container", mutate: withIstio},
		{name: "istio-proxy native sidecar", mutate: withNativeIstio},
		// The bug the defaults moved for: Istio's 15090 was the admin port.
		{name: "istio-proxy container, old default ports", mutate: withIstio, opts: oldPorts, wantErr: ErrPortInUse},
		{name: "istio-proxy native sidecar, old default ports", mutate: withNativeIstio, opts: oldPorts, wantErr: ErrPortInUse},
		{name: "one port for both", mutate: func(*corev1.Pod) {}, opts: func(o *Options) { o.AdminPort = DefaultListenPort }, wantErr: ErrInvalidPorts},
		{name: "debug on the admin port", mutate: func(*corev1.Pod) {}, opts: func(o *Options) { o.DebugPort = DefaultAdminPort }, wantErr: ErrInvalidPorts},
		{name: "port out of range", mutate: func(*corev1.Pod) {}, opts: func(o *Options) { o.ListenPort = -1 }, wantErr: ErrInvalidPorts},
		{name: "host network", mutate: func(p *corev1.Pod) { p.Spec.HostNetwork = true }, wantSkip: "hostNetwork"},
		{name: "opt out", mutate: func(p *corev1.Pod) { p.Annotations = map[string]string{OptOutAnnotation: "false"} }, wantSkip: "opted out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := readPod(t, "testdata/basic.yaml")
			tc.mutate(pod)
			if tc.wantSkip != "" {
				if got := SkipReason(pod); !strings.Contains(got, tc.wantSkip) {
					t.Fatalf("SkipReason = %q, want it to mention %q", got, tc.wantSkip)
				}
				return
			}
			if got := SkipReason(pod); got != "" {
				t.Fatalf("SkipReason = %q, want none", got)
			}
			opts := testOptions
			if tc.opts != nil {
				tc.opts(&opts)
			}
			before := pod.DeepCopy()
			err := Inject(pod, opts)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Inject: %v", err)
				}
				if i := sidecarIndex(pod.Spec.InitContainers); i < 0 {
					t.Errorf("no %s among the init containers", ContainerName)
				}
				return
			}
			t.Logf("Inject: %v", err)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Inject error = %v, want %v", err, tc.wantErr)
			}
			if d := cmp.Diff(before, pod); d != "" {
				t.Errorf("a failed Inject changed the pod:\n%s", d)
			}
		})
	}
}

// TestTLSFileNames: the injector mounts the Secret's TLS keys as files
// named after the keys; the sidecar's Redis client reads those names.
func TestTLSFileNames(t *testing.T) {
	got := []string{redisconn.SecretTLSCAKey, redisconn.SecretTLSCertKey, redisconn.SecretTLSKeyKey}
	want := []string{redisconn.TLSDirCA, redisconn.TLSDirCert, redisconn.TLSDirKey}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Secret keys and the files the Redis client reads differ (-client +keys):\n%s", d)
	}
}

// TestReinjectWithoutTLS: a pod injected with TLS on and injected again
// with it off keeps no TLS volume, mount or flag.
func TestReinjectWithoutTLS(t *testing.T) {
	pod := readPod(t, "testdata/basic.yaml")
	withTLS := testOptions
	withTLS.Redis.TLS = true
	if err := Inject(pod, withTLS); err != nil {
		t.Fatal(err)
	}
	if err := Inject(pod, testOptions); err != nil {
		t.Fatal(err)
	}
	want := readPod(t, "testdata/basic.yaml")
	if err := Inject(want, testOptions); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, pod); d != "" {
		t.Errorf("re-injected without TLS differs from injected without TLS (-want +got):\n%s", d)
	}
}

// mountTokenLikeServiceAccountAdmission does what the ServiceAccount
// admission plugin does to a pod (k8s.io/kubernetes
// plugin/pkg/admission/serviceaccount): it mounts the token volume at
// APITokenDir into every init container and container that has nothing
// mounted there. It runs before the mutating webhooks, and again after them
// when a webhook is reinvoked.
func mountTokenLikeServiceAccountAdmission(pod *corev1.Pod) {
	const tokenVolume = "kube-api-access-x7k2p"
	mount := corev1.VolumeMount{Name: tokenVolume, MountPath: APITokenDir, ReadOnly: true}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if !slices.ContainsFunc(cs[i].VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == APITokenDir }) {
				cs[i].VolumeMounts = append(cs[i].VolumeMounts, mount)
			}
		}
	}
	if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == tokenVolume }) {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: tokenVolume,
			VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}})
	}
}

// TestSidecarGetsNoAPIToken: the app keeps the ServiceAccount token it was
// given, the sidecar never gets it, whether the admission plugin runs
// before the webhook only or again after it (reinvocation).
func TestSidecarGetsNoAPIToken(t *testing.T) {
	pod := readPod(t, filepath.Join("testdata", "basic.yaml"))
	mountTokenLikeServiceAccountAdmission(pod) // before the webhooks
	if err := Inject(pod, testOptions); err != nil {
		t.Fatal(err)
	}
	mountTokenLikeServiceAccountAdmission(pod) // reinvoked after them
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		var at []string
		for _, m := range c.VolumeMounts {
			if m.MountPath == APITokenDir {
				at = append(at, m.Name)
			}
		}
		want := "kube-api-access-x7k2p"
		if c.Name == ContainerName {
			want = NoAPITokenVolume
		}
		if len(at) != 1 || at[0] != want {
			t.Errorf("container %s mounts %v at %s, want only %s", c.Name, at, APITokenDir, want)
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == NoAPITokenVolume && (v.EmptyDir == nil || v.Projected != nil || v.Secret != nil) {
			t.Errorf("volume %s is not an empty directory: %+v", v.Name, v.VolumeSource)
		}
	}
}

// TestDefaultTargetPortIsTheSchemas: DefaultTargetPort stands for the CRD's
// default targetPort (a +kubebuilder:default marker cannot name the
// constant), so the two must not drift.
func TestDefaultTargetPortIsTheSchemas(t *testing.T) {
	raw, err := os.ReadFile("../../config/crd/bases/ratelimit.slidegate.dev_ratelimitpolicies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		t.Fatal(err)
	}
	def := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["targetPort"].Default
	if def == nil || string(def.Raw) != `"`+DefaultTargetPort+`"` {
		t.Errorf("the schema's default targetPort is %v, DefaultTargetPort %q", def, DefaultTargetPort)
	}
}

// TestDefaultPortsAreTheSidecars: the sidecar's own flag defaults are the
// ports the injector declares (it passes them as flags, but a sidecar run
// by hand should listen where the docs and the PodMonitor say).
func TestDefaultPortsAreTheSidecars(t *testing.T) {
	o := sidecarpkg.DefaultOptions()
	want := []string{":" + strconv.Itoa(DefaultListenPort), ":" + strconv.Itoa(DefaultAdminPort), "127.0.0.1:" + strconv.Itoa(DefaultDebugPort)}
	if d := cmp.Diff(want, []string{o.ListenAddress, o.AdminAddress, o.DebugAddress}); d != "" {
		t.Errorf("sidecar default addresses differ from the injector's ports (-injector +sidecar):\n%s", d)
	}
}

// TestDefaultPortsAvoidOtherSidecars: the default ports are none that
// another common sidecar or node agent uses in the pod's network namespace.
func TestDefaultPortsAvoidOtherSidecars(t *testing.T) {
	taken := map[string][]int32{
		"istio (15000-15099)": nil, // checked as a range below
		"linkerd":             {4140, 4143, 4191, 4567, 4568},
		"consul/envoy":        {19000, 20000},
		"dapr":                {3500, 3501, 50001},
		"datadog":             {8125, 8126},
		"node exporter":       {9100},
	}
	for _, p := range []int32{DefaultListenPort, DefaultAdminPort, DefaultDebugPort} {
		if p >= 15000 && p <= 15099 {
			t.Errorf("default port %d is in Istio's reserved range 15000-15099", p)
		}
		for who, ports := range taken {
			if slices.Contains(ports, p) {
				t.Errorf("default port %d is used by %s", p, who)
			}
		}
	}
	if err := (Options{}).Validate(); err != nil {
		t.Errorf("the defaults do not validate: %v", err)
	}
}

// TestCheckImage: the sidecar image names one release for good (a fixed
// tag, or a digest); a moving or implied tag is refused with the reason.
func TestCheckImage(t *testing.T) {
	digest := "sha256:" + strings.Repeat("0f", 32)
	for _, tc := range []struct {
		image   string
		wantErr string
	}{
		{image: ReleaseImage("v0.2.0")},
		{image: "ghcr.io/slidegate/slidegate:v0.2.0@" + digest},
		{image: "ghcr.io/slidegate/slidegate@" + digest},
		{image: "registry.internal:5000/sg/slidegate:v1"},
		{image: "registry.internal:5000/sg/slidegate", wantErr: "no tag"},
		{image: "ghcr.io/slidegate/slidegate", wantErr: "no tag"},
		{image: "ghcr.io/slidegate/slidegate:", wantErr: "no tag"},
		{image: "ghcr.io/slidegate/slidegate:latest", wantErr: "latest moves"},
		{image: "slidegate:latest", wantErr: "latest moves"},
		{image: "ghcr.io/slidegate/slidegate:v1@sha256:abc", wantErr: "not sha256:<64 hex digits>"},
		{image: "ghcr.io/slidegate/slidegate:v1@sha256:" + strings.Repeat("g", 64), wantErr: "not sha256:<64 hex digits>"},
		{image: "", wantErr: "empty"},
	} {
		t.Run(tc.image, func(t *testing.T) {
			err := CheckImage(tc.image)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestImageRepositoryOf(t *testing.T) {
	for ref, want := range map[string]string{
		"ghcr.io/slidegate/slidegate:v0.2.0":                                   "ghcr.io/slidegate/slidegate",
		"ghcr.io/slidegate/slidegate:v0.2.0@sha256:" + strings.Repeat("a", 64): "ghcr.io/slidegate/slidegate",
		"ghcr.io/slidegate/slidegate@sha256:" + strings.Repeat("a", 64):        "ghcr.io/slidegate/slidegate",
		"localhost:5000/slidegate:v1":                                          "localhost:5000/slidegate",
		"localhost:5000/slidegate":                                             "localhost:5000/slidegate",
		"slidegate":                                                            "slidegate",
		"":                                                                     "",
	} {
		if got := ImageRepositoryOf(ref); got != want {
			t.Errorf("ImageRepositoryOf(%q) = %q, want %q", ref, got, want)
		}
	}
}
