// Package node tests slidegate on a real Kubernetes node (hack/node.sh): the
// install from config/default as a user makes it, the webhook called by the
// API server, the sidecar injected by a real kubelet as a native sidecar,
// traffic through a real ClusterIP Service, the ConfigMap projection, the
// fail modes, rolling updates and the uninstall.
//
// Run with `make test-node`. The steps depend on each other (one install, one
// demo), so they are subtests of one test, in order.
package node

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/testsupport"
)

const (
	demoImage    = "slidegate.test/demo-app:node"
	system       = "slidegate-system"
	demo         = "slidegate-demo"
	manager      = "deployment/slidegate-controller-manager"
	userPolicy   = "per-user"     // config/samples: 5 per 10 s by X-User-ID, fail-open
	loginPolicy  = "per-ip-login" // config/samples: POST /login, fail-closed
	appPort      = 8080
	demoReplicas = 2
)

var theNode *node

// image is make image's release image, which hack/node-images.sh builds and
// hack/node.sh imports as kind load image-archive does, pinned by the tag
// the manifests name and the digest make image printed, as make dist pins
// it. The manager and every sidecar it injects run it: a digest the import
// did not keep would be pulled, and fail here, where no registry is.
var image string

// redisServiceName is the Service of this test's Redis, set as the install's
// Redis address in installKustomization; not the default's, so the install
// works only if that setting reaches the manager, the RLS and the sidecars.
const redisServiceName = "redis-node"

func TestMain(m *testing.M) {
	n, err := nodeFromEnv()
	if err != nil {
		testsupport.MissingInMain("a real node", err)
	}
	theNode = n
	release, err := os.ReadFile(filepath.Join(n.root, "VERSION"))
	if err != nil {
		testsupport.MissingInMain("the release in VERSION", err)
	}
	if image, err = pinnedImage(strings.TrimSpace(string(release))); err != nil {
		testsupport.MissingInMain("make image's reference", err)
	}
	os.Exit(m.Run())
}

func TestNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	n := theNode
	// For all steps (a subtest's cleanup would stop it): Redis with AUTH,
	// as the quickstart sets it up.
	n.redis, n.redisAdminUser, n.redisAdminPassword = quickstartRedis(t, n)
	steps := []struct {
		name string
		run  func(context.Context, *testing.T, *node)
	}{
		{"Install", testInstall},
		{"DemoInjected", testDemoInjected},
		{"ExactAcrossReplicas", testExactAcrossReplicas},
		{"DebugForAuthorizedUsersOnly", testDebugAccess},
		{"NumericTargetPortBypasses", testBypass},
		{"NoWayAround", testNoWayAround},
		{"LimitChangeReachesSidecars", testLimitChange},
		{"FailModes", testFailModes},
		{"WebhookSurvivesAManagerPod", testWebhookAvailability},
		{"RollingUpdatesLoseNothing", testRollingUpdates},
		{"BarePodWarned", testBarePod},
		{"ManagerNeverForbidden", testManagerNeverForbidden},
		{"CredentialsOnlyWhereOptedIn", testCredentialsOnlyWhereOptedIn},
		{"RateLimitService", testRateLimitService},
		{"RateLimitServiceClientCertificates", testRateLimitServiceMTLS},
		{"LastPolicyDeletedMeansNoLimit", testLastPolicyDeleted},
		{"Uninstall", testUninstall},
		{"HelmChart", testHelmChart},
		{"Quickstart", testQuickstart},
	}
	for _, s := range steps {
		if !t.Run(s.name, func(t *testing.T) { s.run(ctx, t, n) }) {
			t.Fatalf("step %s failed; the later steps build on it", s.name)
		}
	}
}

// testInstall installs slidegate as a user does (config/default through
// kustomize with the image make image built, the Redis address set in the
// install's one place), and waits for the manager with its self-issued
// webhook certificate.
func testInstall(ctx context.Context, t *testing.T, n *node) {
	dir := n.overlay(t, installKustomization())
	mustKubectl(ctx, t, "apply", "--server-side", "-k", dir)
	// Redis as a selector-less Service with a hand-written EndpointSlice:
	// what a user does for a Redis outside the cluster.
	if _, err := kubectl(ctx, redisService(n.ip, redisServiceName), "apply", "--server-side", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	// The administrative identity, created after the install (the
	// quickstart creates it first; after is the case that waits): the
	// manager reads it from its mounted volume once the kubelet has filled
	// it, and then administers Redis.
	mustKubectl(ctx, t, "-n", system, "create", "secret", "generic", "slidegate-redis-admin",
		"--from-literal=username="+n.redisAdminUser, "--from-literal=password="+n.redisAdminPassword)
	mustKubectl(ctx, t, "-n", system, "rollout", "status", manager, "--timeout=3m")
	rdb := n.redis.testClient()
	defer func() { _ = rdb.Close() }()
	took := eventually(t, 2*time.Minute, time.Second, "the manager loads the slidegate library into Redis with the quickstart's identity", func() error {
		libs, err := rdb.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "slidegate"}).Result()
		if err == nil && len(libs) == 0 {
			err = fmt.Errorf("no library yet")
		}
		return err
	})
	t.Logf("the manager administered Redis %.1fs after the manager rolled out", took.Seconds())

	var cfg struct {
		Webhooks []struct {
			ClientConfig struct {
				CABundle []byte `json:"caBundle"`
				Service  *struct{ Name, Namespace string }
			} `json:"clientConfig"`
		} `json:"webhooks"`
	}
	eventually(t, time.Minute, time.Second, "webhook caBundle set by the manager", func() error {
		getJSON(ctx, t, &cfg, "get", "mutatingwebhookconfiguration", "slidegate-mutating-webhook-configuration")
		for _, w := range cfg.Webhooks {
			if len(w.ClientConfig.CABundle) == 0 {
				return fmt.Errorf("empty caBundle")
			}
			if w.ClientConfig.Service == nil || w.ClientConfig.Service.Namespace != system {
				return fmt.Errorf("webhook not called through a Service of %s: %+v", system, w.ClientConfig.Service)
			}
		}
		return nil
	})
	var secret corev1.Secret
	getJSON(ctx, t, &secret, "-n", system, "get", "secret", "slidegate-webhook-server-cert")
	if len(secret.Data["tls.crt"]) == 0 || len(secret.Data["tls.key"]) == 0 {
		t.Fatalf("the webhook's serving certificate was not issued: keys %v", keys(secret.Data))
	}
	var pods corev1.PodList
	getJSON(ctx, t, &pods, "-n", system, "get", "pods", "-l", "control-plane=controller-manager")
	for _, p := range pods.Items {
		if !podReady(&p) {
			t.Errorf("manager pod %s is not Ready", p.Name)
		}
		if img := p.Spec.Containers[0].Image; img != image {
			t.Errorf("manager pod %s runs %s, want %s", p.Name, img, image)
		}
		// The kubelet first mounts the install's empty certificate Secret;
		// a manager that starts its webhook server on it exits once.
		for _, c := range p.Status.ContainerStatuses {
			if c.RestartCount != 0 {
				t.Errorf("manager pod %s restarted %d times (last: %+v)", p.Name, c.RestartCount, c.LastTerminationState.Terminated)
			}
		}
	}
}

// installKustomization is the default install as a user's overlay (or a
// GitOps repository) sets it up: the image pinned by its digest as make
// dist pins it (kustomize's images, copied to the sidecar's as
// hack/render-install.sh does), and the Redis address in the one place the
// install has for it, the generator of the ConfigMap
// slidegate-redis-connection merged (docs/install.md).
func installKustomization() string {
	return overlayKustomization("../default")
}

// overlayKustomization is installKustomization on the install in base.
func overlayKustomization(base string) string {
	name, digest, _ := strings.Cut(image, "@")
	name, tag := name[:strings.LastIndex(name, ":")], name[strings.LastIndex(name, ":")+1:]
	return `resources:
  - ` + base + `
images:
  - name: ` + name + `
    newTag: ` + tag + `
    digest: ` + digest + `
replacements:
  - source:
      kind: Deployment
      name: slidegate-controller-manager
      fieldPath: spec.template.spec.containers.[name=manager].image
    targets:
      - select:
          kind: Deployment
          name: slidegate-controller-manager
        fieldPaths:
          - spec.template.spec.containers.[name=manager].env.[name=SLIDEGATE_SIDECAR_IMAGE].value
configMapGenerator:
  - name: slidegate-redis-connection
    namespace: slidegate-system
    behavior: merge
    literals:
      - SLIDEGATE_REDIS_ADDRS=` + redisServiceName + `.slidegate-system.svc.cluster.local:6379
`
}

// pinnedImage is the reference make image wrote for the release
// (hack/image.sh: IMAGE:TAG@sha256:...), in the images directory that
// hack/node.sh imported.
func pinnedImage(release string) (string, error) {
	dir := os.Getenv("SLIDEGATE_NODE_IMAGES")
	if dir == "" {
		return "", errors.New("SLIDEGATE_NODE_IMAGES is not set (hack/node.sh sets it)")
	}
	b, err := os.ReadFile(filepath.Join(dir, "release", "slidegate-"+release+".ref"))
	if err != nil {
		return "", err
	}
	ref := strings.TrimSpace(string(b))
	if !strings.HasPrefix(ref, inject.ReleaseImage(release)+"@sha256:") {
		return "", fmt.Errorf("make image's reference %q is not %s@sha256:...", ref, inject.ReleaseImage(release))
	}
	return ref, nil
}

// config/samples, with the demo app's image replaced by this repository's
// stand-in (test/node/demoapp takes agnhost's arguments).
const demoKustomization = `resources:
  - ../samples
images:
  - name: registry.k8s.io/e2e-test-images/agnhost
    newName: slidegate.test/demo-app
    newTag: node
`

// redisService is a selector-less Service of each name with a hand-written
// EndpointSlice to the redis-server at ip: what a user does for a Redis
// outside the cluster.
func redisService(ip string, names ...string) string {
	return redisServiceIn(system, ip, names...)
}

// redisServiceIn is redisService in namespace ns.
func redisServiceIn(ns, ip string, names ...string) string {
	var b strings.Builder
	for _, name := range names {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Service
metadata: {name: %[3]s, namespace: %[1]s}
spec:
  ports: [{name: redis, port: 6379, targetPort: 6379, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[3]s
  namespace: %[1]s
  labels: {kubernetes.io/service-name: %[3]s}
addressType: IPv4
ports: [{name: redis, port: 6379, protocol: TCP}]
endpoints: [{addresses: [%[2]q]}]
`, ns, ip, name)
	}
	return b.String()
}

// testDemoInjected applies config/samples and checks what the kubelet runs:
// every replica Ready with the sidecar as a native sidecar, admitted under
// the namespace's enforced Pod Security "restricted" level.
func testDemoInjected(ctx context.Context, t *testing.T, n *node) {
	dir := n.overlay(t, demoKustomization)
	mustKubectl(ctx, t, "apply", "--server-side", "-k", dir)
	mustKubectl(ctx, t, "-n", demo, "rollout", "status", "deployment/demo-app", "--timeout=3m")
	pods := demoPods(ctx, t)
	if len(pods) != demoReplicas {
		t.Fatalf("%d demo pods, want %d", len(pods), demoReplicas)
	}
	for _, p := range pods {
		if len(p.Spec.InitContainers) == 0 || p.Spec.InitContainers[0].Name != inject.ContainerName {
			t.Fatalf("pod %s: no injected sidecar (init containers %v)", p.Name, p.Spec.InitContainers)
		}
		sc := p.Spec.InitContainers[0]
		if sc.RestartPolicy == nil || *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			t.Errorf("pod %s: the sidecar is not a native sidecar (restartPolicy %v)", p.Name, sc.RestartPolicy)
		}
		if sc.Image != image {
			t.Errorf("pod %s: sidecar image %s, want %s", p.Name, sc.Image, image)
		}
		if !podReady(&p) {
			t.Errorf("pod %s is not Ready", p.Name)
		}
		for _, s := range p.Status.InitContainerStatuses {
			if s.Name == inject.ContainerName && (s.Started == nil || !*s.Started || !s.Ready) {
				t.Errorf("pod %s: sidecar not started and ready: %+v", p.Name, s)
			}
		}
	}
	// The namespace label enforces "restricted" for real: the same app
	// without its security context is refused by the API server.
	bad := `apiVersion: v1
kind: Pod
metadata: {name: not-restricted, namespace: ` + demo + `, labels: {ratelimit.slidegate.dev/inject: "false"}}
spec:
  containers: [{name: app, image: ` + demoImage + `}]
`
	_, err := kubectl(ctx, bad, "apply", "-f", "-")
	if err == nil || !strings.Contains(err.Error(), "violates PodSecurity") {
		t.Errorf("a pod violating the restricted level was not refused: %v", err)
	}
	waitEnforced(ctx, t, userPolicy, demoReplicas)
	waitServiceReachesAll(ctx, t)
}

// waitServiceReachesAll waits until requests through the demo Service reach
// every replica: Ready pods are in the EndpointSlice a moment before
// kube-proxy's rules send traffic to them.
func waitServiceReachesAll(ctx context.Context, t *testing.T) {
	t.Helper()
	url := "http://" + serviceIP(ctx, t, "demo-app") + "/hostname"
	seen := map[string]bool{}
	var i int
	eventually(t, time.Minute, 20*time.Millisecond, "the Service reaches every replica", func() error {
		i++
		a, err := request(ctx, "GET", url, map[string]string{"X-User-ID": fmt.Sprintf("warmup-%d", i)})
		if err != nil {
			return err
		}
		if a.code == 200 {
			seen[strings.TrimSpace(a.body)] = true
		}
		if len(seen) < demoReplicas {
			return fmt.Errorf("reached %v", seen)
		}
		return nil
	})
}

// testExactAcrossReplicas sends each user's requests through the ClusterIP
// Service (targetPort by name), one connection each, so kube-proxy spreads
// them over both replicas: exactly the limit passes per user, and the app
// saw exactly what was admitted.
func testExactAcrossReplicas(ctx context.Context, t *testing.T, _ *node) {
	const limit, perUser = 5, 8
	url := "http://" + serviceIP(ctx, t, "demo-app") + "/"
	before := appStats(ctx, t)
	users := []string{"alice", "bob", "carol"}
	for _, u := range users {
		admitted := 0
		for range perUser {
			a, err := request(ctx, "GET", url, map[string]string{"X-User-ID": u})
			if err != nil {
				t.Fatal(err)
			}
			switch a.code {
			case 200:
				admitted++
			case 429:
				for _, h := range []string{"Retry-After", "RateLimit-Policy", "RateLimit"} {
					if a.header.Get(h) == "" {
						t.Errorf("429 without %s: %v", h, a.header)
					}
				}
				if !strings.Contains(a.header.Get("RateLimit-Policy"), `"`+userPolicy+`";q=5;w=10`) {
					t.Errorf("RateLimit-Policy %q does not name %s's limit", a.header.Get("RateLimit-Policy"), userPolicy)
				}
			default:
				t.Fatalf("user %s: status %d: %s", u, a.code, a.body)
			}
		}
		if admitted != limit {
			t.Errorf("user %s: %d of %d admitted, want exactly %d", u, admitted, perUser, limit)
		}
	}
	after := appStats(ctx, t)
	podsHit := 0
	for pod, s := range after {
		if s.Total > before[pod].Total {
			podsHit++
		}
	}
	for _, u := range users {
		got := 0
		for pod, s := range after {
			got += s.ByUser[u] - before[pod].ByUser[u]
		}
		if got != limit {
			t.Errorf("the app saw %d requests of %s, want exactly the %d admitted", got, u, limit)
		}
	}
	if podsHit != demoReplicas {
		t.Errorf("admitted requests reached %d of %d replicas: the test did not exercise the shared limit", podsHit, demoReplicas)
	}
}

// testBypass adds a Service with a numeric targetPort: it reaches the app
// past the sidecar, and the policy says so.
func testBypass(ctx context.Context, t *testing.T, _ *node) {
	svc := `apiVersion: v1
kind: Service
metadata: {name: demo-app-direct, namespace: ` + demo + `}
spec:
  selector: {app: demo-app}
  ports: [{name: http, port: 80, targetPort: ` + strconv.Itoa(appPort) + `}]
`
	if _, err := kubectl(ctx, svc, "apply", "--server-side", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, time.Second, "Enforced=False ServiceBypassesSidecar", func() error {
		c := condition(ctx, t, userPolicy, v1alpha1.ConditionEnforced)
		if c == nil || c.Status != "False" || c.Reason != string(v1alpha1.ReasonServiceBypassesSidecar) {
			return fmt.Errorf("Enforced is %+v", c)
		}
		if !strings.Contains(c.Message, "demo-app-direct") {
			return fmt.Errorf("message does not name the Service: %q", c.Message)
		}
		return nil
	})
	url := "http://" + serviceIP(ctx, t, "demo-app-direct") + "/"
	// A new Service answers once kube-proxy has written its rules.
	eventually(t, 30*time.Second, 100*time.Millisecond, "the new Service answers", func() error {
		_, err := request(ctx, "GET", url+"hostname", nil)
		return err
	})
	for i := range 8 {
		a, err := request(ctx, "GET", url, map[string]string{"X-User-ID": "bypass"})
		if err != nil {
			t.Fatal(err)
		}
		if a.code != 200 {
			t.Fatalf("request %d past the sidecar: status %d (the numeric targetPort should not be limited)", i, a.code)
		}
	}
	mustKubectl(ctx, t, "-n", demo, "delete", "service", "demo-app-direct")
	waitEnforced(ctx, t, userPolicy, demoReplicas)
}

// testLimitChange patches the limit and measures how long the kubelet's
// ConfigMap projection takes to bring it to every running sidecar, which must
// not restart.
func testLimitChange(ctx context.Context, t *testing.T, n *node) {
	pods := demoPods(ctx, t)
	restarts := sidecarRestarts(pods)
	mustKubectl(ctx, t, "-n", demo, "patch", "rlp", userPolicy, "--type=merge", "-p", `{"spec":{"limit":8}}`)
	start := time.Now()
	// The kubelet refreshes a projected ConfigMap on a pod sync: at most
	// one syncFrequency apart, plus its ConfigMap watch and the sidecar's
	// reload. Twice the period and a fixed margin for a busy machine bound it.
	timeout := 2*n.sync + 45*time.Second
	var probe atomic.Int64
	for _, p := range pods {
		url := fmt.Sprintf("http://%s:%d/", p.Status.PodIP, v1alpha1.SidecarPort)
		eventually(t, timeout, 250*time.Millisecond, "new limit at pod "+p.Name, func() error {
			a, err := request(ctx, "GET", url, map[string]string{"X-User-ID": fmt.Sprintf("probe-%d", probe.Add(1))})
			if err != nil {
				return err
			}
			if !strings.Contains(a.header.Get("RateLimit-Policy"), `"`+userPolicy+`";q=8;w=10`) {
				return fmt.Errorf("RateLimit-Policy %q", a.header.Get("RateLimit-Policy"))
			}
			return nil
		})
		t.Logf("limit 5 → 8 reached %s %.1fs after the patch (kubelet syncFrequency %s)", p.Name, time.Since(start).Seconds(), n.sync)
	}
	after := demoPods(ctx, t)
	if got := sidecarRestarts(after); got != restarts {
		t.Errorf("sidecar restarts went from %v to %v", restarts, got)
	}
	if names(after) != names(pods) {
		t.Errorf("pods changed: %s → %s", names(pods), names(after))
	}
}

// testFailModes stops Redis: the fail-open policy serves within each
// replica's share, the fail-closed one answers 503 with Retry-After; when
// Redis is back, decisions come from it again.
func testFailModes(ctx context.Context, t *testing.T, n *node) {
	const limit = 8 // since testLimitChange
	share := (limit + demoReplicas - 1) / demoReplicas
	pods := demoPods(ctx, t)
	// The share is ceil(limit / the replicas each sidecar last counted
	// through Redis). A sidecar that started before the other counted
	// itself alone until its next announcement, one PeerInterval later; the
	// steps before this one can take less than that.
	for _, p := range pods {
		want := fmt.Sprintf("slidegate_sidecar_policy_replicas{policy=%q} %d", userPolicy, demoReplicas)
		metrics := fmt.Sprintf("http://%s:%d/metrics", p.Status.PodIP, sidecarAdminPort(t, &p))
		eventually(t, time.Minute, 100*time.Millisecond, "pod "+p.Name+" counting "+strconv.Itoa(demoReplicas)+" sidecars", func() error {
			a, err := request(ctx, "GET", metrics, nil)
			if err != nil {
				return err
			}
			if !strings.Contains(a.body, want+"\n") {
				return fmt.Errorf("no %q in its metrics", want)
			}
			return nil
		})
	}
	n.redis.stop()
	for _, p := range pods {
		url := fmt.Sprintf("http://%s:%d/", p.Status.PodIP, v1alpha1.SidecarPort)
		user := "down-" + p.Name
		admitted := 0
		for range limit {
			a, err := request(ctx, "GET", url, map[string]string{"X-User-ID": user})
			if err != nil {
				t.Fatal(err)
			}
			switch a.code {
			case 200:
				admitted++
			case 429:
			default:
				t.Fatalf("fail-open with Redis down: status %d: %s", a.code, a.body)
			}
		}
		if admitted != share {
			t.Errorf("pod %s with Redis down admitted %d of %d, want its share ceil(%d/%d) = %d", p.Name, admitted, limit, limit, demoReplicas, share)
		}
		a, err := request(ctx, "POST", url+"login", nil)
		if err != nil {
			t.Fatal(err)
		}
		if a.code != 503 || a.header.Get("Retry-After") == "" {
			t.Errorf("fail-closed %s with Redis down: status %d, Retry-After %q; want 503 with Retry-After", loginPolicy, a.code, a.header.Get("Retry-After"))
		}
	}
	n.redis.start(t)
	restarted := time.Now()
	for _, p := range pods {
		url := fmt.Sprintf("http://%s:%d/login", p.Status.PodIP, v1alpha1.SidecarPort)
		eventually(t, 30*time.Second, 100*time.Millisecond, "decisions from Redis again at "+p.Name, func() error {
			a, err := request(ctx, "POST", url, nil)
			if err != nil {
				return err
			}
			if a.code == 503 {
				return fmt.Errorf("still 503")
			}
			return nil
		})
		t.Logf("pod %s decides through Redis again %.2fs after redis-server restarted", p.Name, time.Since(restarted).Seconds())
	}
	// One replica alone now admits the whole limit: Redis decides, not the
	// per-replica share.
	url := fmt.Sprintf("http://%s:%d/", pods[0].Status.PodIP, v1alpha1.SidecarPort)
	admitted := 0
	for range limit + 2 {
		a, err := request(ctx, "GET", url, map[string]string{"X-User-ID": "back-up"})
		if err != nil {
			t.Fatal(err)
		}
		if a.code == 200 {
			admitted++
		}
	}
	if admitted != limit {
		t.Errorf("with Redis back, one replica admitted %d, want the whole limit %d", admitted, limit)
	}
}

// testWebhookAvailability deletes one manager pod while pods are being
// created in the opted-in namespace (server-side dry runs: the API server
// calls the webhook for them as for real ones): with failurePolicy Fail,
// every create must still pass, served by the other replica.
func testWebhookAvailability(ctx context.Context, t *testing.T, _ *node) {
	if _, err := kubectl(ctx, "", "-n", system, "get", "pdb", "slidegate-controller-manager"); err != nil {
		t.Errorf("no PodDisruptionBudget for the manager: %v", err)
	}
	var pods corev1.PodList
	getJSON(ctx, t, &pods, "-n", system, "get", "pods", "-l", "control-plane=controller-manager")
	if len(pods.Items) < 2 {
		t.Fatalf("%d manager pods; the webhook needs two to survive one", len(pods.Items))
	}
	victim, victimIP := pods.Items[0].Name, pods.Items[0].Status.PodIP
	pod := func(i int) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: webhook-probe-%d, namespace: %s, labels: {app: webhook-probe}}
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: app
    image: %s
    ports: [{name: http, containerPort: 8080}]
    securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
`, i, demo, demoImage)
	}
	drained := watchDrain(ctx, t, victimIP)
	mustKubectl(ctx, t, "-n", system, "delete", "pod", victim, "--wait=false")
	var failures []string
	deadline := time.Now().Add(20 * time.Second) // past the pod's preStop sleep and most of its grace period
	i := 0
	for ; time.Now().Before(deadline); i++ {
		if _, err := kubectl(ctx, pod(i), "create", "--dry-run=server", "-f", "-"); err != nil {
			failures = append(failures, err.Error())
		}
	}
	t.Logf("%d pod creates while manager pod %s terminated: %d failed", i, victim, len(failures))
	if len(failures) > 0 {
		t.Errorf("pod creation failed while one manager pod was going: %v", failures[:min(3, len(failures))])
	}
	// The creates above pass or fail by the luck of timing; this is the
	// deterministic half: the going pod must still accept TLS on the webhook
	// port after kube-proxy has taken it out of the Service's rules, so no
	// connection the API server makes can reach a pod that no longer serves.
	d := <-drained
	t.Logf("manager pod %s: out of kube-proxy's rules %.2fs after its deletion, served until %.2fs",
		victim, d.unrouted.Sub(d.deleted).Seconds(), d.lastServed.Sub(d.deleted).Seconds())
	if d.unrouted.IsZero() || !d.lastServed.After(d.unrouted) {
		t.Errorf("manager pod %s stopped serving the webhook (%.2fs after its deletion) before kube-proxy stopped routing to it (%.2fs): API server calls in between fail",
			victim, d.lastServed.Sub(d.deleted).Seconds(), d.unrouted.Sub(d.deleted).Seconds())
	}
	mustKubectl(ctx, t, "-n", system, "rollout", "status", manager, "--timeout=3m")

	// The paired case, and the blast radius docs/operations.md describes:
	// with no manager at all, the same create is refused, so the creates
	// above did go through the webhook.
	mustKubectl(ctx, t, "-n", system, "scale", manager, "--replicas=0")
	eventually(t, time.Minute, 500*time.Millisecond, "no manager pod", func() error {
		var left corev1.PodList
		getJSON(ctx, t, &left, "-n", system, "get", "pods", "-l", "control-plane=controller-manager")
		if len(left.Items) > 0 {
			return fmt.Errorf("%d left", len(left.Items))
		}
		return nil
	})
	_, err := kubectl(ctx, pod(i), "create", "--dry-run=server", "-f", "-")
	if err == nil || !strings.Contains(err.Error(), "inject.ratelimit.slidegate.dev") {
		t.Errorf("with no manager, a pod create in %s was not refused by the webhook: %v", demo, err)
	}
	mustKubectl(ctx, t, "-n", system, "scale", manager, "--replicas=2")
	mustKubectl(ctx, t, "-n", system, "rollout", "status", manager, "--timeout=3m")
}

// drain is what watchDrain saw of a going manager pod.
type drain struct {
	deleted    time.Time // the watch started; the delete follows at once
	unrouted   time.Time // kube-proxy's rules no longer hold the pod's IP
	lastServed time.Time // the last TLS handshake on the webhook port
}

// watchDrain follows a manager pod that is about to be deleted: it dials its
// webhook port every 50 ms until the dial fails, and reads the node's
// kube-proxy nftables table until the pod's IP is gone from it.
func watchDrain(ctx context.Context, t *testing.T, ip string) <-chan drain {
	t.Helper()
	out := make(chan drain, 1)
	d := drain{deleted: time.Now()}
	var wg sync.WaitGroup
	wg.Go(func() {
		for time.Since(d.deleted) < 30*time.Second {
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp",
				net.JoinHostPort(ip, "9443"), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only whether it serves
			if err != nil {
				return
			}
			d.lastServed = time.Now()
			_ = conn.Close()
			time.Sleep(50 * time.Millisecond)
		}
	})
	wg.Go(func() {
		for time.Since(d.deleted) < 30*time.Second {
			rules, err := exec.CommandContext(ctx, "nft", "list", "table", "ip", "kube-proxy").Output()
			if err != nil {
				t.Errorf("nft list table ip kube-proxy: %v", err)
				return
			}
			if !strings.Contains(string(rules), ip) {
				d.unrouted = time.Now()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	go func() {
		wg.Wait()
		out <- d
	}()
	return out
}

// testRollingUpdates drives traffic through the Service while the app rolls
// and the manager restarts: no request may fail other than by a 429.
func testRollingUpdates(ctx context.Context, t *testing.T, _ *node) {
	url := "http://" + serviceIP(ctx, t, "demo-app") + "/"
	var (
		ok, limited atomic.Int64
		mu          sync.Mutex
		failures    []string
		stop        = make(chan struct{})
		wg          sync.WaitGroup
	)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				a, err := request(ctx, "GET", url, map[string]string{"X-User-ID": fmt.Sprintf("roll-%d-%d", w, i)})
				switch {
				case err == nil && a.code == 200:
					ok.Add(1)
				case err == nil && a.code == 429:
					limited.Add(1)
				default:
					mu.Lock()
					if err != nil {
						failures = append(failures, err.Error())
					} else {
						failures = append(failures, fmt.Sprintf("status %d: %s", a.code, strings.TrimSpace(a.body)))
					}
					mu.Unlock()
				}
			}
		})
	}
	time.Sleep(2 * time.Second)
	mustKubectl(ctx, t, "-n", demo, "rollout", "restart", "deployment/demo-app")
	mustKubectl(ctx, t, "-n", demo, "rollout", "status", "deployment/demo-app", "--timeout=3m")
	mustKubectl(ctx, t, "-n", system, "rollout", "restart", manager)
	mustKubectl(ctx, t, "-n", system, "rollout", "status", manager, "--timeout=3m")
	// Old pods may still be terminating behind the Service; keep going
	// until they are gone.
	eventually(t, 2*time.Minute, time.Second, "old demo pods gone", func() error {
		var pods corev1.PodList
		getJSON(ctx, t, &pods, "-n", demo, "get", "pods", "-l", "app=demo-app")
		if len(pods.Items) != demoReplicas {
			return fmt.Errorf("%d pods", len(pods.Items))
		}
		return nil
	})
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("during the app's rolling update and the manager's restart: %d admitted, %d limited, %d failed", ok.Load(), limited.Load(), len(failures))
	if len(failures) > 0 {
		t.Errorf("%d requests failed, first: %v", len(failures), failures[:min(5, len(failures))])
	}
	if ok.Load() == 0 {
		t.Error("no request was admitted during the updates")
	}
	waitEnforced(ctx, t, userPolicy, demoReplicas)
	for _, p := range demoPods(ctx, t) {
		if len(p.Spec.InitContainers) == 0 || p.Spec.InitContainers[0].Name != inject.ContainerName {
			t.Errorf("pod %s of the rolled Deployment has no sidecar", p.Name)
		}
	}
}

// testBarePod applies a bare pod twice, as a GitOps tool would: the first
// apply warns that the second will be refused, and it is.
func testBarePod(ctx context.Context, t *testing.T, n *node) {
	manifest := `apiVersion: v1
kind: Pod
metadata: {name: bare, namespace: ` + demo + `, labels: {app: demo-app, bare: "true"}}
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: app
    image: ` + demoImage + `
    ports: [{name: http, containerPort: 8080}]
    securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
`
	file := n.overlay(t, "") + "/bare.yaml"
	if err := os.WriteFile(file, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = kubectl(context.Background(), "", "-n", demo, "delete", "pod", "bare", "--ignore-not-found", "--wait=true")
	})
	cmd := exec.CommandContext(ctx, "kubectl", "apply", "-f", file)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("first apply: %v: %s", err, out)
	}
	if !strings.Contains(string(out), "applying this manifest again") {
		t.Errorf("the first apply printed no warning about applying again: %s", out)
	}
	out, err = exec.CommandContext(ctx, "kubectl", "apply", "-f", file).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "may not change fields") {
		t.Errorf("the second apply of the injected bare pod: %v: %s; want it refused as the warning said", err, out)
	}
}

// testManagerNeverForbidden reads the manager pods' logs: with the install's
// least-privilege RBAC, nothing the manager did so far was refused.
// Pod by pod: a manager pod the restart before replaced may still be
// listed while it terminates and be gone a moment later (its logs with
// it); `kubectl logs -l` then fails as a whole (seen once in CI). A pod
// gone is skipped; the pods that remain must be read.
func testManagerNeverForbidden(ctx context.Context, t *testing.T, _ *node) {
	var logs strings.Builder
	for _, pod := range strings.Fields(mustKubectl(ctx, t, "-n", system, "get", "pods", "-l", "control-plane=controller-manager", "-o", "name")) {
		out, err := kubectl(ctx, "", "-n", system, "logs", pod, "--tail=-1", "--prefix")
		if err != nil && strings.Contains(err.Error(), "NotFound") {
			t.Logf("%s is gone (it terminated after the restart before): its logs are not read", pod)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		logs.WriteString(out)
	}
	if !strings.Contains(logs.String(), "Starting") {
		t.Fatalf("no manager logs read: %q", logs.String())
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(strings.ToLower(line), "forbidden") {
			t.Errorf("the manager was refused: %s", line)
		}
	}
}

// testLastPolicyDeleted deletes every policy of the namespace: the
// controller deletes the ConfigMap, the kubelet renders the optional volume
// as an empty snapshot, and the running sidecars stop limiting (no restart).
func testLastPolicyDeleted(ctx context.Context, t *testing.T, n *node) {
	pods := demoPods(ctx, t)
	restarts := sidecarRestarts(pods)
	mustKubectl(ctx, t, "-n", demo, "delete", "rlp", "--all")
	eventually(t, time.Minute, time.Second, "the ConfigMap deleted with the last policy", func() error {
		out, err := kubectl(ctx, "", "-n", demo, "get", "configmap", "slidegate-sidecar-config", "--ignore-not-found", "-o", "name")
		if err == nil && strings.TrimSpace(out) != "" {
			err = fmt.Errorf("still there: %s", out)
		}
		return err
	})
	var round atomic.Int64
	for _, p := range pods {
		url := fmt.Sprintf("http://%s:%d/", p.Status.PodIP, v1alpha1.SidecarPort)
		eventually(t, 2*n.sync+45*time.Second, 500*time.Millisecond, "no limit at "+p.Name, func() error {
			user := fmt.Sprintf("after-delete-%d", round.Add(1))
			for i := range 10 { // over the limit of 8 it had
				a, err := request(ctx, "GET", url, map[string]string{"X-User-ID": user})
				if err != nil {
					return err
				}
				if a.code != 200 {
					return fmt.Errorf("request %d: status %d", i, a.code)
				}
			}
			return nil
		})
	}
	if got := sidecarRestarts(demoPods(ctx, t)); got != restarts {
		t.Errorf("sidecar restarts went from %v to %v", restarts, got)
	}
}

// testUninstall removes the demo and then the install, and checks that
// nothing slidegate created is left.
func testUninstall(ctx context.Context, t *testing.T, n *node) {
	mustKubectl(ctx, t, "delete", "--ignore-not-found", "--wait=true", "--timeout=3m", "-k", n.overlay(t, demoKustomization))
	mustKubectl(ctx, t, "delete", "--wait=true", "--timeout=3m", "-k", n.overlay(t, installKustomization()))
	nothingLeft(ctx, t, n)
}

// nothingLeft checks that an uninstall left nothing behind: nothing in the
// cluster (nothingLeftInCluster), and in Redis only the users and the
// library docs/install.md says stay.
func nothingLeft(ctx context.Context, t *testing.T, n *node) {
	t.Helper()
	nothingLeftInCluster(ctx, t)
	// Redis: no namespace's identity is left (the manager deletes a
	// namespace's user when the namespace goes, before the install does).
	// What docs/install.md says stays: the administrative user the operator
	// created, the rate limit service's user and the Functions library,
	// which the operator deletes. (Keys expire with their windows.)
	rdb := n.redis.testClient()
	defer func() { _ = rdb.Close() }()
	eventually(t, 2*time.Minute, time.Second, "only the users docs/install.md names left in Redis", func() error {
		users, err := rdb.Do(ctx, "ACL", "USERS").StringSlice()
		if err != nil {
			return err
		}
		for _, u := range users {
			if u != "default" && u != testRedisUser && u != n.redisAdminUser && u != "slidegate-rls" {
				return fmt.Errorf("user %s left (users %v)", u, users)
			}
		}
		return nil
	})
	libs, err := rdb.FunctionList(ctx, redis.FunctionListQuery{}).Result()
	if err != nil || len(libs) != 1 || libs[0].Name != "slidegate" {
		t.Errorf("libraries left: %+v (%v); want the slidegate library alone, as docs/install.md says", libs, err)
	}
}

// nothingLeftInCluster checks that no CRD, namespace, webhook, admission
// policy, role or object of slidegate's is left in the cluster.
func nothingLeftInCluster(ctx context.Context, t *testing.T) {
	t.Helper()
	for _, q := range [][]string{
		{"get", "crd", "ratelimitpolicies.ratelimit.slidegate.dev", "--ignore-not-found", "-o", "name"},
		{"get", "namespace", system, demo, "--ignore-not-found", "-o", "name"},
		{"get", "mutatingwebhookconfigurations,validatingwebhookconfigurations,validatingadmissionpolicies,validatingadmissionpolicybindings,clusterroles,clusterrolebindings", "-l", "app.kubernetes.io/part-of=slidegate", "-o", "name"},
		{"get", "configmaps,secrets,services,deployments,roles,rolebindings,serviceaccounts,leases", "-A", "-l", "app.kubernetes.io/part-of=slidegate", "-o", "name"},
		{"get", "configmaps,secrets", "-A", "-l", "app.kubernetes.io/managed-by=slidegate", "-o", "name"},
	} {
		eventually(t, 2*time.Minute, time.Second, "nothing left: kubectl "+strings.Join(q, " "), func() error {
			out, err := kubectl(ctx, "", q...)
			if err != nil {
				return err
			}
			if s := strings.TrimSpace(out); s != "" {
				return fmt.Errorf("left: %s", s)
			}
			return nil
		})
	}
}

// --- reading the cluster ----------------------------------------------------

func demoPods(ctx context.Context, t *testing.T) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	getJSON(ctx, t, &pods, "-n", demo, "get", "pods", "-l", "app=demo-app", "--field-selector=status.phase=Running")
	var live []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	return live
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func serviceIP(ctx context.Context, t *testing.T, name string) string {
	t.Helper()
	var svc corev1.Service
	getJSON(ctx, t, &svc, "-n", demo, "get", "service", name)
	if svc.Spec.ClusterIP == "" {
		t.Fatalf("service %s has no ClusterIP", name)
	}
	return svc.Spec.ClusterIP
}

func condition(ctx context.Context, t *testing.T, policy string, typ v1alpha1.ConditionType) *metav1.Condition {
	t.Helper()
	var p v1alpha1.RateLimitPolicy
	getJSON(ctx, t, &p, "-n", demo, "get", "rlp", policy)
	return meta.FindStatusCondition(p.Status.Conditions, string(typ))
}

// waitEnforced waits for Enforced=True on the policy with want pods.
func waitEnforced(ctx context.Context, t *testing.T, policy string, want int32) {
	t.Helper()
	eventually(t, 2*time.Minute, time.Second, policy+" enforced on every pod", func() error {
		var p v1alpha1.RateLimitPolicy
		getJSON(ctx, t, &p, "-n", demo, "get", "rlp", policy)
		c := meta.FindStatusCondition(p.Status.Conditions, string(v1alpha1.ConditionEnforced))
		if c == nil || c.Status != "True" || p.Status.EnforcedPods != want || p.Status.MatchedPods != want {
			return fmt.Errorf("enforced %d/%d matched, condition %+v", p.Status.EnforcedPods, p.Status.MatchedPods, c)
		}
		return nil
	})
}

type stats struct {
	Total  int            `json:"total"`
	ByUser map[string]int `json:"byUser"`
}

// appStats reads each demo pod's own counters on the app's port, past the
// sidecar (the pod IP is reachable from the node).
func appStats(ctx context.Context, t *testing.T) map[string]stats {
	t.Helper()
	out := map[string]stats{}
	for _, p := range demoPods(ctx, t) {
		a, err := request(ctx, "GET", fmt.Sprintf("http://%s:%d/stats", p.Status.PodIP, appPort), nil)
		if err != nil {
			t.Fatal(err)
		}
		var s stats
		if err := json.Unmarshal([]byte(a.body), &s); err != nil {
			t.Fatalf("stats of %s: %v: %q", p.Name, err, a.body)
		}
		out[p.Name] = s
	}
	return out
}

func sidecarRestarts(pods []corev1.Pod) string {
	var s []string
	for _, p := range pods {
		for _, c := range p.Status.InitContainerStatuses {
			if c.Name == inject.ContainerName {
				s = append(s, fmt.Sprintf("%s=%d", p.Name, c.RestartCount))
			}
		}
	}
	return strings.Join(s, ",")
}

func names(pods []corev1.Pod) string {
	var s []string
	for _, p := range pods {
		s = append(s, p.Name)
	}
	return strings.Join(s, ",")
}

func keys(m map[string][]byte) []string {
	var k []string
	for key := range m {
		k = append(k, key)
	}
	return k
}

// sidecarAdminPort is the port of the injected sidecar's admin endpoint
// (/metrics) in pod p.
func sidecarAdminPort(t *testing.T, p *corev1.Pod) int32 {
	t.Helper()
	port, ok := adminPort(p)
	if !ok {
		t.Fatalf("pod %s has no %s port on its %s container", p.Name, inject.AdminPortName, inject.ContainerName)
	}
	return port
}

// adminPort is sidecarAdminPort for callers that cannot fail the test.
func adminPort(p *corev1.Pod) (int32, bool) {
	for _, c := range p.Spec.InitContainers {
		for _, port := range c.Ports {
			if c.Name == inject.ContainerName && port.Name == inject.AdminPortName {
				return port.ContainerPort, true
			}
		}
	}
	return 0, false
}
