package node

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
)

// The namespaces of testNoWayAround: one opted in (no Pod Security level:
// a hostPort is not "restricted"), one that requires the sidecar.
const (
	nwa      = "slidegate-nwa"
	required = "slidegate-required"
	nwaLimit = 5
	hostPort = 30080
)

// netpolEnforced is set when hack/node.sh runs a NetworkPolicy
// implementation on the node (SLIDEGATE_NODE_NETWORK_POLICY=enforced); the
// bridge CNI alone does not enforce NetworkPolicy.
var netpolEnforced = os.Getenv("SLIDEGATE_NODE_NETWORK_POLICY") == "enforced"

// nwaPod is a bare pod of the demo app in namespace nwa, labelled app=nwa
// (the policy's) and case=name (its own Service's), whose app serves port
// http (8080); extra is more YAML under its spec, metadata more under its
// metadata.
func nwaPod(name, metadata, extraContainers, initContainers string, appPortExtra string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: %[2]s
  labels: {app: nwa, case: %[1]s}
%[3]sspec:
  terminationGracePeriodSeconds: 1
%[4]s  containers:
  - name: app
    image: %[5]s
    args: [netexec, --http-port=8080, --drain=0s]
    ports:
    - {name: http, containerPort: 8080%[6]s}
    readinessProbe: {httpGet: {path: /healthz, port: http}, periodSeconds: 1}
%[7]s---
apiVersion: v1
kind: Service
metadata: {name: nwa-%[1]s, namespace: %[2]s}
spec:
  selector: {case: %[1]s}
  ports: [{name: http, port: 80, targetPort: http}]
`, name, nwa, metadata, initContainers, demoImage, appPortExtra, extraContainers)
}

// testNoWayAround creates issue 23's pods that kept their traffic away from
// the sidecar before — a forged injection status with a dummy sidecar, two
// containers naming port http, the app's port on a hostPort — and checks
// that the webhook fixed each (the real sidecar holds port http, the
// hostPort moved to it), that the policy counts them enforced, and that
// traffic through each one's Service, and to the node's port, is limited.
// A namespace labelled required refuses a pod that opts out (admitted in
// the opted-in one). The policy's NetworkPolicy is created; whether a pod
// dialing the app's port directly is refused depends on the node's network
// (the bridge CNI does not enforce NetworkPolicy; SLIDEGATE_NODE_NETWORK_POLICY).
func testNoWayAround(ctx context.Context, t *testing.T, n *node) {
	setup := fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %[1]s, labels: {ratelimit.slidegate.dev/injection: enabled}}
---
apiVersion: v1
kind: Namespace
metadata: {name: %[2]s, labels: {ratelimit.slidegate.dev/injection: required}}
---
apiVersion: ratelimit.slidegate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: per-user, namespace: %[1]s}
spec:
  targetSelector: {matchLabels: {app: nwa}}
  window: 1m
  limit: %[3]d
  key: {source: Header, name: X-User-ID}
  networkPolicy: {}
---
apiVersion: ratelimit.slidegate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: per-user, namespace: %[2]s}
spec:
  targetSelector: {matchLabels: {app: nwa}}
  window: 1m
  limit: %[3]d
  key: {source: Header, name: X-User-ID}
`, nwa, required, nwaLimit)
	if _, err := kubectl(ctx, setup, "apply", "--server-side", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = kubectl(context.Background(), "", "delete", "namespace", nwa, required, "--ignore-not-found", "--wait=true", "--timeout=2m")
	})
	// The webhook reads the namespace and the policy from its cache: a
	// server-side dry run is injected once it has both.
	probe := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: probe, namespace: %s, labels: {app: nwa}}
spec:
  containers: [{name: app, image: %s, ports: [{name: http, containerPort: 8080}]}]
`, nwa, demoImage)
	eventually(t, 30*time.Second, 200*time.Millisecond, "the webhook sees the policy", func() error {
		out, err := kubectl(ctx, probe, "apply", "--dry-run=server", "-o", "json", "-f", "-")
		if err != nil {
			return err
		}
		if !strings.Contains(out, `"name": "`+inject.ContainerName+`"`) {
			return fmt.Errorf("the dry run was not injected")
		}
		return nil
	})

	forged := nwaPod("forged",
		"  annotations: {ratelimit.slidegate.dev/injected: '{\"version\":\"v1\",\"container\":\"slidegate-sidecar\",\"targetPort\":\"http\",\"appContainer\":\"app\",\"appPort\":8080}'}\n",
		"", fmt.Sprintf("  initContainers:\n  - {name: %s, image: %s, args: [netexec, --http-port=9999], restartPolicy: Always}\n", inject.ContainerName, demoImage), "")
	two := nwaPod("two", "", fmt.Sprintf("  - name: admin\n    image: %s\n    args: [netexec, --http-port=8081, --drain=0s]\n    ports: [{name: http, containerPort: 8081}]\n", demoImage), "", "")
	hp := nwaPod("hostport", "", "", "", ", hostPort: "+strconv.Itoa(hostPort))
	client := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: client, namespace: %s, labels: {app: client}}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{name: app, image: %s, args: [netexec, --http-port=8080, --drain=0s], readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}}]
`, nwa, demoImage)
	for _, manifest := range []string{forged, two, hp, client} {
		if _, err := kubectl(ctx, manifest, "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
	}
	mustKubectl(ctx, t, "-n", nwa, "wait", "--for=condition=Ready", "pod/forged", "pod/two", "pod/hostport", "pod/client", "--timeout=3m")

	for _, name := range []string{"forged", "two", "hostport"} {
		var p corev1.Pod
		getJSON(ctx, t, &p, "-n", nwa, "get", "pod", name)
		checkFixed(t, &p)
	}
	waitPolicyEnforced(ctx, t, nwa, 3)

	// Through each pod's own Service (targetPort http), and for the
	// hostPort pod also through the node's port: the limit holds.
	targets := map[string]string{}
	for _, name := range []string{"forged", "two", "hostport"} {
		var svc corev1.Service
		getJSON(ctx, t, &svc, "-n", nwa, "get", "service", "nwa-"+name)
		targets["Service nwa-"+name] = "http://" + svc.Spec.ClusterIP + "/"
	}
	targets["node port "+strconv.Itoa(hostPort)] = fmt.Sprintf("http://%s:%d/", n.ip, hostPort)
	for what, u := range targets {
		eventually(t, 30*time.Second, 100*time.Millisecond, what+" answers", func() error {
			_, err := request(ctx, "GET", u+"hostname", nil)
			return err
		})
		user := "nwa-" + strings.ReplaceAll(what, " ", "-")
		admitted := 0
		for range nwaLimit + 3 {
			a, err := request(ctx, "GET", u, map[string]string{"X-User-ID": user})
			if err != nil {
				t.Fatal(err)
			}
			switch a.code {
			case 200:
				admitted++
			case 429:
			default:
				t.Fatalf("%s: status %d: %s", what, a.code, a.body)
			}
		}
		if admitted != nwaLimit {
			t.Errorf("through %s: %d of %d admitted, want exactly %d", what, admitted, nwaLimit+3, nwaLimit)
		} else {
			t.Logf("through %s: %d of %d admitted, the limit", what, admitted, nwaLimit+3)
		}
	}

	testRequiredRefusesOptOut(ctx, t)
	testPodIP(ctx, t)
}

// checkFixed checks that pod p carries the webhook's sidecar, which holds
// port name http (no other container does), and that the app's port 8080
// is on no hostPort (a hostPort moved to the sidecar's port).
func checkFixed(t *testing.T, p *corev1.Pod) {
	t.Helper()
	var sidecars []corev1.Container
	for _, c := range p.Spec.InitContainers {
		if c.Name == inject.ContainerName {
			sidecars = append(sidecars, c)
		}
	}
	if len(sidecars) != 1 || sidecars[0].Image != image {
		t.Fatalf("pod %s: init containers %v; want one %s running %s", p.Name, p.Spec.InitContainers, inject.ContainerName, image)
	}
	if sidecars[0].Ports[0].Name != "http" {
		t.Errorf("pod %s: the sidecar's port %+v is not named http", p.Name, sidecars[0].Ports[0])
	}
	published := int32(0)
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == "http" {
				t.Errorf("pod %s: container %s keeps port name http (%d)", p.Name, c.Name, port.ContainerPort)
			}
			switch {
			case port.HostPort == 0:
			case port.ContainerPort == sidecars[0].Ports[0].ContainerPort:
				published = port.HostPort
			default:
				t.Errorf("pod %s: container %s publishes port %d on hostPort %d", p.Name, c.Name, port.ContainerPort, port.HostPort)
			}
		}
	}
	// The kubelet publishes regular containers' hostPorts only: the app's
	// container publishes the sidecar's port.
	if p.Name == "hostport" && published != hostPort {
		t.Errorf("pod hostport: hostPort %d does not publish the sidecar's port %d (%+v)", hostPort, sidecars[0].Ports[0].ContainerPort, p.Spec.Containers[0].Ports)
	}
	if _, err := inject.ReadGuard(&p.Spec); err != nil {
		t.Errorf("pod %s: %v", p.Name, err)
	}
}

// waitPolicyEnforced waits for Enforced=True on policy per-user of
// namespace ns with want pods.
func waitPolicyEnforced(ctx context.Context, t *testing.T, ns string, want int32) {
	t.Helper()
	eventually(t, 2*time.Minute, time.Second, "per-user enforced in "+ns, func() error {
		var p v1alpha1.RateLimitPolicy
		getJSON(ctx, t, &p, "-n", ns, "get", "rlp", "per-user")
		for _, c := range p.Status.Conditions {
			if c.Type == string(v1alpha1.ConditionEnforced) && c.Status == "True" && p.Status.EnforcedPods == want && p.Status.MatchedPods == want {
				return nil
			}
		}
		return fmt.Errorf("enforced %d/%d matched, conditions %+v", p.Status.EnforcedPods, p.Status.MatchedPods, p.Status.Conditions)
	})
}

// testRequiredRefusesOptOut: a pod that opts out is refused in a namespace
// labelled required, with the reason, and admitted (without the sidecar)
// where injection is only enabled.
func testRequiredRefusesOptOut(ctx context.Context, t *testing.T) {
	optedOut := func(ns string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: opted-out, namespace: %s, labels: {app: nwa, ratelimit.slidegate.dev/inject: "false"}}
spec:
  containers: [{name: app, image: %s, args: [netexec, --http-port=8080], ports: [{name: http, containerPort: 8080}]}]
`, ns, demoImage)
	}
	_, err := kubectl(ctx, optedOut(required), "apply", "-f", "-")
	if err == nil || !strings.Contains(err.Error(), "namespace "+required+" requires the rate limit sidecar") {
		t.Errorf("an opted-out pod in a namespace labelled required: %v; want it refused, saying why", err)
	} else {
		t.Logf("refused: %v", err)
	}
	if _, err := kubectl(ctx, optedOut(nwa), "apply", "--dry-run=server", "-f", "-"); err != nil {
		t.Errorf("the same pod where injection is only enabled: %v; want it admitted", err)
	}
}

// testPodIP: the policy's NetworkPolicy exists as rendered, admitting only
// the sidecar's ports. A pod of the cluster dials the forged pod's app port
// directly and through its Service: where the node enforces NetworkPolicy,
// the first is refused and the second answers; the bridge CNI enforces
// nothing, which the test records.
func testPodIP(ctx context.Context, t *testing.T) {
	var np networkingv1.NetworkPolicy
	eventually(t, time.Minute, time.Second, "the NetworkPolicy rendered", func() error {
		_, err := kubectl(ctx, "", "-n", nwa, "get", "networkpolicy", "slidegate-per-user")
		return err
	})
	getJSON(ctx, t, &np, "-n", nwa, "get", "networkpolicy", "slidegate-per-user")
	var ports []string
	for _, r := range np.Spec.Ingress {
		for _, p := range r.Ports {
			ports = append(ports, p.Port.String())
		}
	}
	if got := strings.Join(ports, ","); got != fmt.Sprintf("%d,%d", v1alpha1.SidecarPort, v1alpha1.SidecarAdminPort) {
		t.Errorf("the NetworkPolicy admits ports %s, want the sidecar's %d,%d", got, v1alpha1.SidecarPort, v1alpha1.SidecarAdminPort)
	}

	var target, clientPod corev1.Pod
	var svc corev1.Service
	getJSON(ctx, t, &target, "-n", nwa, "get", "pod", "forged")
	getJSON(ctx, t, &clientPod, "-n", nwa, "get", "pod", "client")
	getJSON(ctx, t, &svc, "-n", nwa, "get", "service", "nwa-forged")
	dial := func(host string, port int) (ok bool, detail string) {
		u := fmt.Sprintf("http://%s:8080/dial?request=hostname&protocol=http&tries=1&host=%s&port=%d", clientPod.Status.PodIP, url.QueryEscape(host), port)
		a, err := request(ctx, "GET", u, nil)
		if err != nil {
			t.Fatalf("asking the client pod to dial: %v", err)
		}
		var out struct{ Responses, Errors []string }
		if err := json.Unmarshal([]byte(a.body), &out); err != nil {
			t.Fatalf("the client pod's answer %q: %v", a.body, err)
		}
		return len(out.Responses) > 0, fmt.Sprint(out.Responses, out.Errors)
	}
	// NetworkPolicy implementations apply a new policy asynchronously.
	eventually(t, time.Minute, time.Second, "the Service answers the client pod", func() error {
		if ok, detail := dial(svc.Spec.ClusterIP, 80); !ok {
			return fmt.Errorf("through the Service: %s", detail)
		}
		return nil
	})
	direct := fmt.Sprintf("%s:%d", target.Status.PodIP, appPort)
	if !netpolEnforced {
		ok, detail := dial(target.Status.PodIP, appPort)
		t.Logf("this node's network does not enforce NetworkPolicy (the bridge CNI): a pod dialing %s, the app's port, directly: answered %v %s", direct, ok, detail)
		return
	}
	eventually(t, time.Minute, time.Second, "the app's port refused to the client pod", func() error {
		if ok, detail := dial(target.Status.PodIP, appPort); ok {
			return fmt.Errorf("%s answered: %s", direct, detail)
		}
		return nil
	})
	ok, detail := dial(target.Status.PodIP, appPort)
	t.Logf("a pod dialing %s directly: answered %v %s; through the Service: answers", direct, ok, detail)
	if ok, detail := dial(svc.Spec.ClusterIP, 80); !ok {
		t.Errorf("through the Service after the app's port was closed: %s", detail)
	}
}
