package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/redisadmin"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// The release a user upgrades from: the first one users may run, pinned by
// commit. Its images are built from that commit (hack/node-image-from.sh),
// and it is installed from that commit's own config/default.
const (
	previousRelease = "v0.1.0"
	previousCommit  = "91309a3233908aa8f191cef5ba76945a03a347a8"
	// previousImage is in the release repository, as a user's upgrade
	// keeps it: the status counts a sidecar of another repository as not
	// enforced (controllers' guards).
	previousImage = inject.ImageRepository + ":" + previousRelease
)

// The sample per-user policy (config/samples, unchanged since the previous
// release): 5 requests per 10 s per X-User-ID, a sliding log.
const (
	userLimit  = 5
	userWindow = 10 * time.Second
)

// TestUpgrade upgrades a running install of the previous release to this
// checkout and rolls it back, on the real node, as a user does: `kubectl
// apply --server-side -k` of config/default (an overlay that sets the
// image), then a `kubectl rollout restart` of the app to replace the
// sidecars. Traffic goes through the Service the whole time; every response
// must be a 200 or a 429, and the per-user limit exact throughout, judged
// from what came back from the app (testsupport.BusiestWindow).
//
// The sidecars of the previous release read only ".../v1" documents and
// refuse every field they do not know, so while one runs the controller must
// render ".../v1" (legacySidecars); the test watches the ConfigMap against
// the pods the whole time.
func TestUpgrade(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	n := theNode
	if out := mustKubectl(ctx, t, "get", "crd", "ratelimitpolicies.ratelimit.slidegate.dev", "--ignore-not-found", "-o", "name"); strings.TrimSpace(out) != "" {
		t.Fatalf("slidegate is still installed (an earlier test left it): %s", out)
	}
	u := &upgrade{n: n, prev: previousTree(t, n)}
	u.newRelease = readVersion(t, n.root)
	// Redis with AUTH, as an install of the previous release with its one
	// shared identity has it (the user of redisschema.ACLRules, whose
	// credentials the Secret of --redis-secret-name holds), and with the
	// quickstart's administrative user, which the move to the namespace
	// mode adds first (operations.md, "Moving an install to the namespace
	// mode", step 1).
	acl, adminUser, adminPassword := quickstartACL(t, n)
	acl += fmt.Sprintf("\nuser %s on >%s %s\n", sharedRedisUser, sharedRedisPassword, strings.Join(redisschema.ACLRules(""), " "))
	u.redis = startRedisACL(t, n, acl)
	u.adminUser, u.adminPassword = adminUser, adminPassword
	steps := []struct {
		name string
		run  func(context.Context, *testing.T)
	}{
		{"InstallPrevious", u.installPrevious},
		{"Upgrade", u.upgrade},
		{"Rollback", u.rollback},
		{"Uninstall", u.uninstall},
	}
	defer u.stop()
	total := time.Now()
	for _, s := range steps {
		start := time.Now()
		ok := t.Run(s.name, func(t *testing.T) { s.run(ctx, t) })
		t.Logf("%s: %.1fs", s.name, time.Since(start).Seconds())
		if !ok {
			t.Fatalf("step %s failed; the later steps build on it", s.name)
		}
	}
	t.Logf("upgrade test: %.1fs in all", time.Since(total).Seconds())
}

// upgrade is the state the steps share.
type upgrade struct {
	n          *node
	prev       string // the previous release's source tree
	newRelease string // this checkout's VERSION
	redis      *redisProc
	// The administrative Redis identity the upgrade brings (step 1).
	adminUser, adminPassword string
	tr                       *traffic
	mon                      *monitor
	// rolledBack is when the rollback was applied: the traffic before it
	// is the upgrade's, after it the rollback's.
	started, rolledBack time.Time
}

// stop stops the traffic and the monitor, if they run.
func (u *upgrade) stop() {
	if u.tr != nil {
		u.tr.stopAndWait()
	}
	if u.mon != nil {
		u.mon.stopAndWait()
	}
}

// previousTree extracts the previous release's sources (git archive) into a
// temporary directory. A shallow clone lacks the commit: that is a setup
// problem with a known fix, and under CI a failure, never a skip.
func previousTree(t *testing.T, n *node) string {
	t.Helper()
	if out, err := exec.Command("git", "-C", n.root, "cat-file", "-e", previousCommit+"^{commit}").CombinedOutput(); err != nil {
		msg := fmt.Sprintf("slidegate %s (commit %s) is not in this clone (%v: %s): a shallow clone? "+
			"Fetch the history with `git fetch --unshallow` (or `git fetch origin %s`)",
			previousRelease, previousCommit, err, strings.TrimSpace(string(out)), previousCommit)
		if testsupport.InCI() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	archive := exec.Command("git", "-C", n.root, "archive", previousCommit)
	untar := exec.Command("tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	untar.Stdin = pipe
	var stderr strings.Builder
	archive.Stderr, untar.Stderr = &stderr, &stderr
	if err := untar.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s: %v: %s", previousCommit, err, stderr.String())
	}
	if err := untar.Wait(); err != nil {
		t.Fatalf("extracting %s: %v: %s", previousCommit, err, stderr.String())
	}
	return dir
}

func readVersion(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// prevOverlay writes a kustomization into the previous release's config/,
// as n.overlay does into this checkout's.
func (u *upgrade) prevOverlay(t *testing.T, kustomization string) string {
	t.Helper()
	dir, err := os.MkdirTemp(filepath.Join(u.prev, "config"), ".node-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// prevInstall is the previous release's install as its user applied it
// (with prevOverlay): its config/default with the previous image, and its
// default Redis address (the Service "redis"; that release had no other
// place for it than the manager's arguments). Its demo is
// demoKustomization, unchanged.
func prevInstall() string {
	return withSharedIdentity(`resources:
  - ../default
images:
  - name: ghcr.io/slidegate/slidegate
    newTag: ` + previousRelease + `
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
`)
}

// The shared Redis identity of the previous release's install: its user
// and the Secret that holds its credentials (--redis-secret-name).
const (
	sharedRedisUser     = "slidegate"
	sharedRedisPassword = "shared-identity-password"
	sharedRedisSecret   = "slidegate-redis"
)

// withSharedIdentity adds --redis-secret-name to the manager of the install
// kustomization k, as the previous release's user had it and as the move to
// the namespace mode keeps it (step 1) while sidecars that use it run.
func withSharedIdentity(k string) string {
	return k + `patches:
  - target: {kind: Deployment, name: slidegate-controller-manager}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --redis-secret-name=` + sharedRedisSecret + `
`
}

// installPrevious imports the previous release's image (previousImageTarball)
// into the node's containerd, and installs that release with the demo and
// Redis.
func (u *upgrade) installPrevious(ctx context.Context, t *testing.T) {
	start := time.Now()
	ctr(ctx, t, "images", "import", u.previousImageTarball(ctx, t))
	t.Logf("%s imported in %.1fs", previousImage, time.Since(start).Seconds())

	mustKubectl(ctx, t, "apply", "--server-side", "-k", u.prevOverlay(t, prevInstall()))
	// The previous release's default address, and the one this checkout's
	// install is given: one redis-server behind both, as a user who moves
	// the address in the upgrade keeps the old one until it is done.
	if _, err := kubectl(ctx, redisService(u.n.ip, "redis", redisServiceName), "apply", "--server-side", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	mustKubectl(ctx, t, "-n", system, "create", "secret", "generic", sharedRedisSecret,
		"--from-literal=username="+sharedRedisUser, "--from-literal=password="+sharedRedisPassword)
	mustKubectl(ctx, t, "-n", system, "rollout", "status", manager, "--timeout=3m")
	waitCABundle(ctx, t)
	mustKubectl(ctx, t, "apply", "--server-side", "-k", u.prevOverlay(t, demoKustomization))
	mustKubectl(ctx, t, "-n", demo, "rollout", "status", "deployment/demo-app", "--timeout=3m")
	waitEnforced(ctx, t, userPolicy, demoReplicas)
	for _, p := range demoPods(ctx, t) {
		checkSidecar(t, &p, previousImage, v1alpha1.InjectionStatus{})
	}
	if v := u.configVersion(ctx, t); v != sidecarconfig.VersionOf(0) {
		t.Fatalf("the previous release rendered %q, want %q", v, sidecarconfig.VersionOf(0))
	}
	waitServiceReachesAll(ctx, t)
	u.connectedAs(ctx, t, sharedRedisUser)
	t.Logf("%s installed with the demo in %.1fs", previousRelease, time.Since(start).Seconds())
}

// previousImageTarball returns the previous release's image: built from its
// commit by hack/node-image-from.sh the first time, then kept in the cache
// outside the checkout (SLIDEGATE_CACHE, else ~/.cache/slidegate) by commit
// and Go version, so that later runs and fresh clones do not build it again.
// The build is offline (the node's network namespace has no route out).
func (u *upgrade) previousImageTarball(ctx context.Context, t *testing.T) string {
	t.Helper()
	dir := os.Getenv("SLIDEGATE_CACHE")
	if dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			t.Fatalf("no cache directory for the previous release's image: %v", err)
		}
		dir = filepath.Join(cache, "slidegate")
	}
	dir = filepath.Join(dir, "node", "previous")
	// The image's name is in the file's: a tarball holds one name.
	name := strings.NewReplacer("/", "_", ":", "_").Replace(previousImage)
	tarball := filepath.Join(dir, fmt.Sprintf("%s-%s-%s.tar", name, previousCommit[:12], goruntime.Version()))
	if _, err := os.Stat(tarball); err == nil {
		t.Logf("%s from the cache: %s", previousImage, tarball)
		return tarball
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	tmp := tarball + ".tmp"
	build := exec.CommandContext(ctx, filepath.Join(u.n.root, "hack", "node-image-from.sh"), u.prev, previousImage, tmp)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building %s from %s: %v\n%s", previousImage, previousCommit, err, out)
	}
	if err := os.Rename(tmp, tarball); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s built from %s in %.1fs, cached as %s", previousImage, previousCommit[:7], time.Since(start).Seconds(), tarball)
	return tarball
}

// upgrade applies this checkout's install over the running previous one. The
// previous release's sidecars keep running, one of them restarts, and the
// ConfigMap must stay ".../v1" until the app's rollout has replaced them all.
func (u *upgrade) upgrade(ctx context.Context, t *testing.T) {
	u.mon = startMonitor(ctx, t)
	u.tr = startTraffic(ctx, "http://"+serviceIP(ctx, t, "demo-app")+"/")
	u.started = time.Now()
	time.Sleep(2 * time.Second) // traffic on the previous release first

	// Step 1 of the move to the namespace mode: the administrative
	// identity's Secret (its user is in Redis's configuration already).
	mustKubectl(ctx, t, "-n", system, "create", "secret", "generic", "slidegate-redis-admin",
		"--from-literal=username="+u.adminUser, "--from-literal=password="+u.adminPassword)
	applied := time.Now()
	mustKubectl(ctx, t, "apply", "--server-side", "-k", u.n.overlay(t, withSharedIdentity(installKustomization())))
	mustKubectl(ctx, t, "-n", system, "rollout", "status", manager, "--timeout=3m")
	waitLeader(ctx, t, image)
	t.Logf("the manager of %s leads %.1fs after the apply", u.newRelease, time.Since(applied).Seconds())

	// The new controller has the namespace, whose sidecars are all of the
	// previous release: it renders what they read.
	if v := u.configVersion(ctx, t); v != sidecarconfig.VersionOf(0) {
		t.Errorf("with sidecars of %s running, the ConfigMap is %q, want %q", previousRelease, v, sidecarconfig.VersionOf(0))
	}
	u.restartSidecar(ctx, t)
	waitEnforced(ctx, t, userPolicy, demoReplicas)
	if v := u.configVersion(ctx, t); v != sidecarconfig.VersionOf(0) {
		t.Errorf("after a sidecar of %s restarted under the new controller, the ConfigMap is %q, want %q", previousRelease, v, sidecarconfig.VersionOf(0))
	}
	u.tr.checkApp(ctx, t)

	// The app's rollout replaces the sidecars; once none of the previous
	// release is left, the document moves to the newest minor version.
	waitInjectedBy(ctx, t, image)
	restart := time.Now()
	mustKubectl(ctx, t, "-n", demo, "rollout", "restart", "deployment/demo-app")
	mustKubectl(ctx, t, "-n", demo, "rollout", "status", "deployment/demo-app", "--timeout=3m")
	want := v1alpha1.InjectionStatus{SidecarVersion: u.newRelease, ConfigMinor: sidecarconfig.Minor}
	var gone time.Time
	eventually(t, 2*time.Minute, 200*time.Millisecond, "no pod of the previous release left", func() error {
		if legacy := legacyPods(ctx, t); len(legacy) > 0 {
			return fmt.Errorf("still there: %v", legacy)
		}
		gone = time.Now()
		return nil
	})
	eventually(t, time.Minute, 200*time.Millisecond, "the ConfigMap at "+sidecarconfig.Version, func() error {
		if v := u.configVersion(ctx, t); v != sidecarconfig.Version {
			return fmt.Errorf("it is %q", v)
		}
		return nil
	})
	t.Logf("app restarted; the last pod of %s gone %.1fs after the restart, the ConfigMap at %s %.1fs after that",
		previousRelease, gone.Sub(restart).Seconds(), sidecarconfig.Version, time.Since(gone).Seconds())
	pods := demoPods(ctx, t)
	for _, p := range pods {
		checkSidecar(t, &p, image, want)
	}
	// Each new sidecar started on ".../v1" (the previous release's pods were
	// still there) and now loads the newest version: a second successful load.
	loaded := time.Now()
	for _, p := range pods {
		waitLoaded(ctx, t, &p, 2, u.n.sync)
	}
	t.Logf("the new sidecars loaded %s %.1fs later (kubelet syncFrequency %s)", sidecarconfig.Version, time.Since(loaded).Seconds(), u.n.sync)
	waitEnforced(ctx, t, userPolicy, demoReplicas)
	u.tr.checkApp(ctx, t)
	// Step 4: the new sidecars reach Redis as the namespace's own user, and
	// once no sidecar that uses the shared identity is left, the
	// namespace's Secret no longer holds it.
	u.connectedAs(ctx, t, redisadmin.NamespaceUser(demo))
	eventually(t, time.Minute, time.Second, "the shared identity gone from the namespace's Secret", func() error {
		var sec corev1.Secret
		getJSON(ctx, t, &sec, "-n", demo, "get", "secret", credentialsSecret)
		for _, k := range []string{redisconn.SecretUsernameKey, redisconn.SecretPasswordKey} {
			if _, ok := sec.Data[k]; ok {
				return fmt.Errorf("it still has %s (keys %v)", k, keys(sec.Data))
			}
		}
		return nil
	})
	t.Logf("upgrade: %.1fs from the apply", time.Since(applied).Seconds())
}

// addedSincePrevious are the cluster-scoped objects of this checkout's
// install that the previous release's has not. Its apply leaves them (kubectl
// apply removes nothing) and its uninstall does not know them, so the
// Rollback of docs/operations.md deletes them, as rollback does;
// checkAddedSincePrevious holds the list to the two installs.
var addedSincePrevious = []string{
	"clusterrole/slidegate-resetter",
	"validatingadmissionpolicy/slidegate-selected-labels",
	"validatingadmissionpolicy/slidegate-sidecar-image",
	"validatingadmissionpolicybinding/slidegate-selected-labels",
	"validatingadmissionpolicybinding/slidegate-sidecar-image",
}

// checkAddedSincePrevious fails t unless addedSincePrevious is what this
// checkout's config/default renders, of the kinds that outlive a namespace,
// and the previous release's install does not.
func (u *upgrade) checkAddedSincePrevious(ctx context.Context, t *testing.T) {
	t.Helper()
	objects := func(dir string) map[string]bool {
		out, err := exec.CommandContext(ctx, "kubectl", "kustomize", dir).Output()
		if err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		set := map[string]bool{}
		for _, doc := range strings.Split(string(out), "\n---\n") {
			var o metav1.PartialObjectMetadata
			if err := sigsyaml.Unmarshal([]byte(doc), &o); err != nil {
				t.Fatalf("%s: %v", dir, err)
			}
			switch o.Kind {
			case "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "ValidatingAdmissionPolicy",
				"ValidatingAdmissionPolicyBinding", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
				set[strings.ToLower(o.Kind)+"/"+o.Name] = true
			}
		}
		return set
	}
	prev := objects(u.prevOverlay(t, prevInstall()))
	var added []string
	for o := range objects(filepath.Join(u.n.root, "config", "default")) {
		if !prev[o] {
			added = append(added, o)
		}
	}
	slices.Sort(added)
	if !slices.Equal(added, addedSincePrevious) {
		t.Fatalf("the install adds %q to %s's, addedSincePrevious (and docs/operations.md's Rollback) say %q", added, previousRelease, addedSincePrevious)
	}
}

// rollback applies the previous release's install again over the upgraded
// one: its controller renders ".../v1", which the new sidecars read, and the
// app's rollout brings back the previous release's sidecars. Then it
// deletes what this release added (addedSincePrevious), as the docs say.
func (u *upgrade) rollback(ctx context.Context, t *testing.T) {
	u.checkAddedSincePrevious(ctx, t)
	pods := demoPods(ctx, t)
	before := map[string]int{}
	for _, p := range pods {
		before[p.Name] = sidecarMetrics(ctx, t, &p).loads
	}
	u.rolledBack = time.Now()
	mustKubectl(ctx, t, "apply", "--server-side", "-k", u.prevOverlay(t, prevInstall()))
	mustKubectl(ctx, t, "-n", system, "rollout", "status", manager, "--timeout=3m")
	waitLeader(ctx, t, previousImage)
	eventually(t, time.Minute, 200*time.Millisecond, "the previous controller's "+sidecarconfig.VersionOf(0), func() error {
		if v := u.configVersion(ctx, t); v != sidecarconfig.VersionOf(0) {
			return fmt.Errorf("it is %q", v)
		}
		return nil
	})
	t.Logf("the manager of %s leads and renders %s %.1fs after the apply", previousRelease, sidecarconfig.VersionOf(0), time.Since(u.rolledBack).Seconds())
	for _, p := range pods {
		waitLoaded(ctx, t, &p, before[p.Name]+1, u.n.sync)
	}
	waitEnforced(ctx, t, userPolicy, demoReplicas)
	u.tr.checkApp(ctx, t)

	waitInjectedBy(ctx, t, previousImage)
	mustKubectl(ctx, t, "-n", demo, "rollout", "restart", "deployment/demo-app")
	mustKubectl(ctx, t, "-n", demo, "rollout", "status", "deployment/demo-app", "--timeout=3m")
	eventually(t, 2*time.Minute, 200*time.Millisecond, "only pods of the previous release", func() error {
		var pods corev1.PodList
		getJSON(ctx, t, &pods, "-n", demo, "get", "pods", "-l", "app=demo-app")
		for _, p := range pods.Items {
			if st, _ := injectionStatus(&p); st.ConfigMinor != 0 {
				return fmt.Errorf("pod %s still runs a sidecar of %s", p.Name, st.SidecarVersion)
			}
		}
		return nil
	})
	for _, p := range demoPods(ctx, t) {
		checkSidecar(t, &p, previousImage, v1alpha1.InjectionStatus{})
		if m := sidecarMetrics(ctx, t, &p); m.loads < 1 || m.failures != 0 || !m.lastOK {
			t.Errorf("pod %s: the sidecar of %s did not load %s: %+v", p.Name, previousRelease, sidecarconfig.VersionOf(0), m)
		}
	}
	waitEnforced(ctx, t, userPolicy, demoReplicas)
	u.connectedAs(ctx, t, sharedRedisUser)
	time.Sleep(2 * time.Second) // traffic on the rolled-back release
	u.tr.stopAndWait()
	u.tr.checkApp(ctx, t)
	u.mon.stopAndWait()
	t.Logf("rollback: %.1fs from the apply", time.Since(u.rolledBack).Seconds())

	u.mon.report(t)
	u.tr.report(t, []phase{{"upgrade", u.started, u.rolledBack}, {"rollback", u.rolledBack, time.Now()}})
	mustKubectl(ctx, t, append([]string{"delete", "--ignore-not-found"}, addedSincePrevious...)...)
}

// uninstall removes the demo and the install as the previous release's user
// would, leaving the node as the test found it.
func (u *upgrade) uninstall(ctx context.Context, t *testing.T) {
	mustKubectl(ctx, t, "delete", "--ignore-not-found", "--wait=true", "--timeout=3m", "-k", u.prevOverlay(t, demoKustomization))
	mustKubectl(ctx, t, "delete", "--wait=true", "--timeout=3m", "-k", u.prevOverlay(t, prevInstall()))
	for _, q := range [][]string{
		{"get", "crd", "ratelimitpolicies.ratelimit.slidegate.dev", "--ignore-not-found", "-o", "name"},
		{"get", "namespace", system, demo, "--ignore-not-found", "-o", "name"},
		{"get", "mutatingwebhookconfigurations,validatingadmissionpolicies,validatingadmissionpolicybindings,clusterroles,clusterrolebindings", "-l", "app.kubernetes.io/part-of=slidegate", "-o", "name"},
	} {
		eventually(t, 2*time.Minute, time.Second, "nothing left: kubectl "+strings.Join(q, " "), func() error {
			out, err := kubectl(ctx, "", q...)
			if err == nil && strings.TrimSpace(out) != "" {
				err = fmt.Errorf("left: %s", out)
			}
			return err
		})
	}
}

// connectedAs waits until every demo pod's sidecar has a connection to
// Redis, all of them as user want.
func (u *upgrade) connectedAs(ctx context.Context, t *testing.T, want string) {
	t.Helper()
	rdb := u.redis.testClient()
	defer func() { _ = rdb.Close() }()
	eventually(t, 30*time.Second, time.Second, "the demo's sidecars connected as "+want, func() error {
		return connectedAs(ctx, rdb, demoPods(ctx, t), want)
	})
}

// --- the release's parts on the node ----------------------------------------

// ctr runs containerd's client against the node's containerd, in the
// Kubernetes namespace of its images and containers.
func ctr(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	sock := filepath.Join(os.Getenv("SLIDEGATE_NODE_STATE"), "containerd", "containerd.sock")
	out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", sock, "-n", "k8s.io"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// waitCABundle waits until the manager has put its CA into the webhook
// configuration: before that, the API server cannot call the webhook.
func waitCABundle(ctx context.Context, t *testing.T) {
	t.Helper()
	eventually(t, time.Minute, time.Second, "webhook caBundle set by the manager", func() error {
		out, err := kubectl(ctx, "", "get", "mutatingwebhookconfiguration", "slidegate-mutating-webhook-configuration",
			"-o", "jsonpath={.webhooks[*].clientConfig.caBundle}")
		if err == nil && strings.TrimSpace(out) == "" {
			err = errors.New("empty caBundle")
		}
		return err
	})
}

// waitLeader waits until a manager pod running img holds the leader lease:
// then its controller is the one rendering.
func waitLeader(ctx context.Context, t *testing.T, img string) {
	t.Helper()
	eventually(t, 2*time.Minute, 250*time.Millisecond, "a manager of "+img+" leading", func() error {
		holder, err := kubectl(ctx, "", "-n", system, "get", "lease", "slidegate-controller.ratelimit.slidegate.dev",
			"-o", "jsonpath={.spec.holderIdentity}")
		if err != nil {
			return err
		}
		var pods corev1.PodList
		getJSON(ctx, t, &pods, "-n", system, "get", "pods", "-l", "control-plane=controller-manager")
		for _, p := range pods.Items {
			if strings.HasPrefix(holder, p.Name+"_") && p.Spec.Containers[0].Image == img && p.DeletionTimestamp == nil {
				return nil
			}
		}
		return fmt.Errorf("the lease is held by %q", holder)
	})
}

// waitInjectedBy waits until the webhook injects the sidecar of img into a
// pod of the app, in injectedInARow server-side dry runs of its template in
// a row. A manager rollout that has finished does not mean that: the API
// server may still reach a pod of the release that went for a few seconds
// (a connection it keeps, the node's Service rules not yet updated), and a
// pod created then gets that release's sidecar; on a busy node a rollback's
// restart right after the rollout got one (docs/operations.md, "Upgrading
// slidegate", asks users to check the same way before restarting their
// workloads).
func waitInjectedBy(ctx context.Context, t *testing.T, img string) {
	t.Helper()
	var dep appsv1.Deployment
	getJSON(ctx, t, &dep, "-n", demo, "get", "deployment", "demo-app")
	pod := corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{GenerateName: "demo-app-dry-run-", Namespace: demo, Labels: dep.Spec.Template.Labels},
		Spec:       dep.Spec.Template.Spec,
	}
	manifest, err := json.Marshal(&pod)
	if err != nil {
		t.Fatal(err)
	}
	const injectedInARow = 10
	start, inARow := time.Now(), 0
	eventually(t, 2*time.Minute, 100*time.Millisecond, fmt.Sprintf("%d pods in a row injected with %s", injectedInARow, img), func() error {
		out, err := kubectl(ctx, string(manifest), "create", "--dry-run=server", "-o", "json", "-f", "-")
		if err != nil {
			inARow = 0
			return err
		}
		var got corev1.Pod
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			return err
		}
		i := slices.IndexFunc(got.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.ContainerName })
		if i < 0 || got.Spec.InitContainers[i].Image != img {
			inARow = 0
			return fmt.Errorf("a pod was injected with %v", got.Spec.InitContainers)
		}
		if inARow++; inARow < injectedInARow {
			return fmt.Errorf("%d in a row", inARow)
		}
		return nil
	})
	t.Logf("the webhook injects %s: %d server-side dry runs in a row, %.1fs after the manager's rollout", img, injectedInARow, time.Since(start).Seconds())
}

// configVersion is the version of the namespace's sidecar configuration.
func (u *upgrade) configVersion(ctx context.Context, t *testing.T) string {
	t.Helper()
	var cm corev1.ConfigMap
	getJSON(ctx, t, &cm, "-n", demo, "get", "configmap", sidecarconfig.ConfigMapName)
	return documentVersion(&cm)
}

func documentVersion(cm *corev1.ConfigMap) string {
	var doc struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal([]byte(cm.Data[sidecarconfig.FileName]), &doc); err != nil {
		return "unreadable: " + err.Error()
	}
	return doc.Version
}

func injectionStatus(p *corev1.Pod) (v1alpha1.InjectionStatus, bool) {
	var st v1alpha1.InjectionStatus
	raw, ok := p.Annotations[v1alpha1.InjectedAnnotation]
	if !ok {
		return st, false
	}
	return st, json.Unmarshal([]byte(raw), &st) == nil
}

// legacyPods names the demo pods, terminating ones included, whose sidecar
// is the previous release's: its injection status records no configMinor.
func legacyPods(ctx context.Context, t *testing.T) []string {
	t.Helper()
	var pods corev1.PodList
	getJSON(ctx, t, &pods, "-n", demo, "get", "pods", "-l", "app=demo-app")
	var names []string
	for _, p := range pods.Items {
		if st, ok := injectionStatus(&p); ok && st.ConfigMinor == 0 {
			names = append(names, p.Name)
		}
	}
	return names
}

// checkSidecar checks the pod's injected sidecar: its image, and the release
// and config minor version its injection status records.
func checkSidecar(t *testing.T, p *corev1.Pod, img string, want v1alpha1.InjectionStatus) {
	t.Helper()
	i := slices.IndexFunc(p.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.ContainerName })
	if i < 0 {
		t.Errorf("pod %s has no sidecar", p.Name)
		return
	}
	if got := p.Spec.InitContainers[i].Image; got != img {
		t.Errorf("pod %s: sidecar image %s, want %s", p.Name, got, img)
	}
	st, ok := injectionStatus(p)
	if !ok {
		t.Errorf("pod %s: no readable %s annotation", p.Name, v1alpha1.InjectedAnnotation)
	}
	if st.SidecarVersion != want.SidecarVersion || st.ConfigMinor != want.ConfigMinor {
		t.Errorf("pod %s: injected sidecarVersion %q configMinor %d, want %q and %d",
			p.Name, st.SidecarVersion, st.ConfigMinor, want.SidecarVersion, want.ConfigMinor)
	}
}

// sidecarState is what a sidecar's metrics say about its configuration.
type sidecarState struct {
	loads, failures int  // config_reloads_total by result
	lastOK, loaded  bool // config_last_reload_successful, config_loaded
	buildInfo       string
}

func sidecarMetrics(ctx context.Context, t *testing.T, p *corev1.Pod) sidecarState {
	t.Helper()
	a, err := request(ctx, "GET", fmt.Sprintf("http://%s:%d/metrics", p.Status.PodIP, sidecarAdminPort(t, p)), nil)
	if err != nil {
		t.Fatalf("metrics of pod %s: %v", p.Name, err)
	}
	var s sidecarState
	for _, line := range strings.Split(a.body, "\n") {
		name, value, _ := strings.Cut(line, " ")
		v, _ := strconv.ParseFloat(value, 64)
		switch {
		case name == `slidegate_sidecar_config_reloads_total{result="success"}`:
			s.loads = int(v)
		case name == `slidegate_sidecar_config_reloads_total{result="failure"}`:
			s.failures = int(v)
		case name == "slidegate_sidecar_config_last_reload_successful":
			s.lastOK = v == 1
		case name == "slidegate_sidecar_config_loaded":
			s.loaded = v == 1
		case strings.HasPrefix(name, "slidegate_build_info{"):
			s.buildInfo = name
		}
	}
	return s
}

// waitLoaded waits until the pod's sidecar has loaded its configuration
// loads times in all, none of them refused.
func waitLoaded(ctx context.Context, t *testing.T, p *corev1.Pod, loads int, sync time.Duration) {
	t.Helper()
	// A ConfigMap change reaches the sidecar on a kubelet pod sync (see
	// testLimitChange): twice the period and a margin for a busy machine.
	eventually(t, 2*sync+45*time.Second, 250*time.Millisecond, fmt.Sprintf("pod %s loading its configuration %d times", p.Name, loads), func() error {
		m := sidecarMetrics(ctx, t, p)
		if m.failures != 0 || !m.lastOK {
			t.Fatalf("pod %s: the sidecar refused its configuration: %+v", p.Name, m)
		}
		if m.loads < loads {
			return fmt.Errorf("%+v", m)
		}
		return nil
	})
}

// restartSidecar stops the sidecar of one demo pod of the previous release
// (SIGTERM, as the kubelet stops a container): the kubelet starts the same
// container again, which must load the new controller's document and
// enforce.
func (u *upgrade) restartSidecar(ctx context.Context, t *testing.T) {
	p := demoPods(ctx, t)[0]
	i := slices.IndexFunc(p.Status.InitContainerStatuses, func(s corev1.ContainerStatus) bool { return s.Name == inject.ContainerName })
	if i < 0 {
		t.Fatalf("pod %s reports no sidecar status", p.Name)
	}
	before := p.Status.InitContainerStatuses[i]
	id, ok := strings.CutPrefix(before.ContainerID, "containerd://")
	if !ok {
		t.Fatalf("pod %s: sidecar container %q is not containerd's", p.Name, before.ContainerID)
	}
	addr := net.JoinHostPort(p.Status.PodIP, strconv.Itoa(v1alpha1.SidecarPort))
	stopped := time.Now()
	ctr(ctx, t, "tasks", "kill", "--signal", "SIGTERM", id)
	// The pod stays behind the Service until the kubelet reports the
	// container gone; connections kube-proxy sends it meanwhile are refused.
	var down, up time.Time
	eventually(t, 2*time.Minute, 10*time.Millisecond, "the sidecar of "+p.Name+" listening again", func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			if down.IsZero() {
				down = time.Now()
			}
			return err
		}
		_ = c.Close()
		if down.IsZero() {
			return errors.New("still the stopped process")
		}
		up = time.Now()
		return nil
	})
	u.tr.excuse(p.Name, stopped, up)
	var after corev1.Pod
	eventually(t, 2*time.Minute, 250*time.Millisecond, "pod "+p.Name+" Ready again", func() error {
		getJSON(ctx, t, &after, "-n", demo, "get", "pod", p.Name)
		s := after.Status.InitContainerStatuses[i]
		switch {
		case s.RestartCount != before.RestartCount+1:
			return fmt.Errorf("sidecar restarts %d", s.RestartCount)
		case !s.Ready || !podReady(&after):
			return fmt.Errorf("sidecar ready %v, pod ready %v", s.Ready, podReady(&after))
		}
		return nil
	})
	t.Logf("sidecar of %s stopped: not listening %.2fs later, listening again after %.2fs, Ready after %.1fs",
		p.Name, down.Sub(stopped).Seconds(), up.Sub(stopped).Seconds(), time.Since(stopped).Seconds())
	checkSidecar(t, &after, previousImage, v1alpha1.InjectionStatus{})
	m := sidecarMetrics(ctx, t, &after)
	if m.buildInfo != "" {
		t.Errorf("pod %s: the restarted sidecar is not the previous release's (it reports %s)", p.Name, m.buildInfo)
	}
	if !m.loaded || !m.lastOK || m.failures != 0 {
		t.Fatalf("pod %s: the restarted sidecar of %s did not load the new controller's document: %+v", p.Name, previousRelease, m)
	}
	// It enforces, through Redis, with the other sidecars: exactly the limit
	// of a fresh client's requests sent to it alone.
	url := fmt.Sprintf("http://%s/", addr)
	admitted := 0
	for range userLimit + 3 {
		a, err := request(ctx, "GET", url, map[string]string{"X-User-ID": "restarted-" + p.Name})
		if err != nil {
			t.Fatal(err)
		}
		if a.code == 200 {
			admitted++
		} else if a.code != 429 {
			t.Fatalf("the restarted sidecar answered %d: %s", a.code, a.body)
		}
	}
	if admitted != userLimit {
		t.Errorf("the restarted sidecar admitted %d of %d requests of one client, want exactly %d", admitted, userLimit+3, userLimit)
	}
}

// --- watching the ConfigMap against the pods --------------------------------

// monitor samples the demo namespace every 250 ms: its pods, its
// ConfigMap's version and its policies' Enforced condition, and records
// every moment the ConfigMap was newer than a running sidecar reads, or a
// policy was not enforced.
type monitor struct {
	c    ctrlclient.Client
	stop chan struct{}
	done chan struct{}

	samples    int
	versions   []string // the ConfigMap's versions, in order, without repeats
	violations map[string]int
	first      []string
	// Per sidecar, the most it reported of the requests whose decision hit
	// a Redis error, and of the decisions not made by Redis (fallback,
	// failed closed): an identity that Redis refused shows here.
	redisErrors, notByRedis map[string]int
	// byRedis: the decisions Redis made, read the same way: what shows
	// that the two above are read at all (a renamed metric would read 0).
	byRedis map[string]int
}

func startMonitor(ctx context.Context, t *testing.T) *monitor {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ctrllog.SetLogger(logr.Discard()) // the client's own logging is not needed
	c, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	m := &monitor{c: c, stop: make(chan struct{}), done: make(chan struct{}), violations: map[string]int{},
		redisErrors: map[string]int{}, notByRedis: map[string]int{}, byRedis: map[string]int{}}
	go func() {
		defer close(m.done)
		for {
			m.sample(ctx)
			select {
			case <-m.stop:
				return
			case <-ctx.Done():
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	return m
}

func (m *monitor) violate(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if m.violations[msg] == 0 && len(m.first) < 10 {
		m.first = append(m.first, time.Now().Format("15:04:05.000 ")+msg)
	}
	m.violations[msg]++
}

// sample reads the pods, then the ConfigMap and the policies, then the pods
// again: a pod of the previous release in both lists ran while the
// ConfigMap was read.
func (m *monitor) sample(ctx context.Context) {
	legacy := func() (map[string]bool, error) {
		var pods corev1.PodList
		if err := m.c.List(ctx, &pods, ctrlclient.InNamespace(demo), ctrlclient.MatchingLabels{"app": "demo-app"}); err != nil {
			return nil, err
		}
		m.sampleRedis(ctx, pods.Items)
		out := map[string]bool{}
		for _, p := range pods.Items {
			finished := p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
			if st, ok := injectionStatus(&p); ok && st.ConfigMinor == 0 && !finished {
				out[p.Name] = true
			}
		}
		return out, nil
	}
	before, err := legacy()
	if err != nil {
		m.violate("listing pods: %v", err)
		return
	}
	var cm corev1.ConfigMap
	cmErr := m.c.Get(ctx, ctrlclient.ObjectKey{Namespace: demo, Name: sidecarconfig.ConfigMapName}, &cm)
	var policies v1alpha1.RateLimitPolicyList
	polErr := m.c.List(ctx, &policies, ctrlclient.InNamespace(demo))
	after, err := legacy()
	if err != nil || cmErr != nil || polErr != nil {
		// The ConfigMap gone would mean no limits at all.
		m.violate("reading the namespace: %v", errors.Join(err, cmErr, polErr))
		return
	}
	m.samples++
	v := documentVersion(&cm)
	if len(m.versions) == 0 || m.versions[len(m.versions)-1] != v {
		m.versions = append(m.versions, v)
	}
	var both []string
	for p := range before {
		if after[p] {
			both = append(both, p)
		}
	}
	if len(both) > 0 && v != sidecarconfig.VersionOf(0) {
		slices.Sort(both)
		m.violate("the ConfigMap is %q while pods %v run sidecars of %s, which read %q only", v, both, previousRelease, sidecarconfig.VersionOf(0))
	}
	if len(policies.Items) == 0 {
		m.violate("no policies")
	}
	for _, p := range policies.Items {
		if c := meta.FindStatusCondition(p.Status.Conditions, string(v1alpha1.ConditionEnforced)); c == nil || c.Status != "True" {
			m.violate("policy %s not Enforced: %+v", p.Name, c)
		}
	}
}

// sampleRedis reads, from each running sidecar's metrics, how many of its
// requests hit a Redis error and how many decisions Redis did not make.
func (m *monitor) sampleRedis(ctx context.Context, pods []corev1.Pod) {
	for _, p := range pods {
		port, ok := adminPort(&p)
		if !ok || p.Status.PodIP == "" || p.Status.Phase != corev1.PodRunning {
			continue
		}
		a, err := request(ctx, "GET", fmt.Sprintf("http://%s:%d/metrics", p.Status.PodIP, port), nil)
		if err != nil || a.code != 200 {
			continue // starting or stopping
		}
		errs, notRedis, fromRedis := 0, 0, 0
		for _, line := range strings.Split(a.body, "\n") {
			name, value, _ := strings.Cut(line, " ")
			v, _ := strconv.ParseFloat(value, 64)
			switch name {
			case "slidegate_sidecar_redis_errors_total":
				errs = int(v)
			case `slidegate_sidecar_limiter_decisions_total{source="fallback"}`,
				`slidegate_sidecar_limiter_decisions_total{source="failed-closed"}`:
				notRedis += int(v)
			case `slidegate_sidecar_limiter_decisions_total{source="redis"}`:
				fromRedis = int(v)
			}
		}
		m.redisErrors[p.Name] = max(m.redisErrors[p.Name], errs)
		m.notByRedis[p.Name] = max(m.notByRedis[p.Name], notRedis)
		m.byRedis[p.Name] = max(m.byRedis[p.Name], fromRedis)
	}
}

func (m *monitor) stopAndWait() {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	<-m.done
}

func (m *monitor) report(t *testing.T) {
	t.Helper()
	t.Logf("ConfigMap versions in %d samples: %s", m.samples, strings.Join(m.versions, " → "))
	if len(m.violations) > 0 {
		t.Errorf("%d kinds of violation, first: %s", len(m.violations), strings.Join(m.first, "; "))
	}
	want := []string{sidecarconfig.VersionOf(0), sidecarconfig.Version, sidecarconfig.VersionOf(0)}
	if !slices.Equal(m.versions, want) {
		t.Errorf("the ConfigMap went through %v, want %v", m.versions, want)
	}
	// No window in which a sidecar could not reach Redis: every decision
	// of every sidecar that ran was Redis's.
	errs, notRedis, byRedis := 0, 0, 0
	for p := range m.redisErrors {
		errs += m.redisErrors[p]
		notRedis += m.notByRedis[p]
		if m.byRedis[p] > 0 {
			byRedis++
		}
	}
	t.Logf("sidecars sampled: %d, %d of them with decisions by Redis; requests that hit a Redis error: %d; decisions not by Redis: %d", len(m.redisErrors), byRedis, errs, notRedis)
	if byRedis < 2*demoReplicas {
		t.Errorf("only %d sidecars reported decisions by Redis (%v): the metrics read are not the ones the sidecars write", byRedis, m.byRedis)
	}
	if len(m.redisErrors) < 2*demoReplicas {
		t.Errorf("the metrics of only %d sidecars were read (%v); the upgrade and the rollback run at least %d", len(m.redisErrors), m.redisErrors, 2*demoReplicas)
	}
	if errs > 0 || notRedis > 0 {
		t.Errorf("sidecars could not reach Redis during the upgrade or the rollback: Redis errors %v, decisions not by Redis %v", m.redisErrors, m.notByRedis)
	}
}

// --- traffic through the Service --------------------------------------------

// shot is one request as the client saw it.
type shot struct {
	user       string
	sent, done time.Time
	code       int    // 0: no response (err)
	pod        string // the app pod that answered a 200 (its body names it)
	policy     string // RateLimit-Policy of a 429
	err        error
}

// traffic sends requests through the Service from six clients until
// stopped: four each with one user for the whole run, a request every
// 100 ms (the limit's windows run across every change), and two with a new
// user per request (each admitted, through to the app).
type traffic struct {
	gate sync.RWMutex // checkApp holds it to stop the clients for a moment
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	shots   []shot
	excused []excuse
}

// excuse is a sidecar that the test stopped: connections kube-proxy sends
// its pod until it listens again are refused.
type excuse struct {
	pod      string
	from, to time.Time
}

const steadyClients, freshClients = 4, 2

func startTraffic(ctx context.Context, url string) *traffic {
	tr := &traffic{stop: make(chan struct{})}
	for w := range steadyClients + freshClients {
		tr.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-tr.stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				user := fmt.Sprintf("upgrade-steady-%d", w)
				if w >= steadyClients {
					user = fmt.Sprintf("upgrade-fresh-%d-%d", w, i)
				}
				tr.send(ctx, url, user)
			}
		})
	}
	return tr
}

func (tr *traffic) send(ctx context.Context, url, user string) {
	tr.gate.RLock()
	defer tr.gate.RUnlock()
	s := shot{user: user, sent: time.Now()}
	a, err := request(ctx, "GET", url, map[string]string{"X-User-ID": user})
	s.done, s.code, s.err = time.Now(), a.code, err
	if err == nil && a.code == 200 {
		s.pod, _, _ = strings.Cut(a.body, " ")
	}
	if err == nil && a.code == 429 {
		s.policy = a.header.Get("RateLimit-Policy")
	}
	tr.mu.Lock()
	tr.shots = append(tr.shots, s)
	tr.mu.Unlock()
}

func (tr *traffic) excuse(pod string, from, to time.Time) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.excused = append(tr.excused, excuse{pod, from, to})
}

func (tr *traffic) stopAndWait() {
	select {
	case <-tr.stop:
	default:
		close(tr.stop)
	}
	tr.wg.Wait()
}

// checkApp compares, for every demo pod, what the app counted of each
// client with the 200s the clients got from that pod: equal, or the app
// received requests the clients did not see admitted (or the reverse). The
// clients wait while the counters are read.
func (tr *traffic) checkApp(ctx context.Context, t *testing.T) {
	t.Helper()
	tr.gate.Lock()
	app := appStats(ctx, t)
	tr.gate.Unlock()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	seen := map[string]map[string]int{}
	for _, s := range tr.shots {
		if s.code == 200 {
			if seen[s.pod] == nil {
				seen[s.pod] = map[string]int{}
			}
			seen[s.pod][s.user]++
		}
	}
	checked := 0
	for pod, s := range app {
		got := map[string]int{}
		for u, c := range s.ByUser {
			if strings.HasPrefix(u, "upgrade-") {
				got[u] = c
			}
		}
		want := seen[pod]
		for u := range mergeKeys(got, want) {
			if got[u] != want[u] {
				t.Errorf("pod %s: the app received %d requests of %s, its clients got %d admitted from it", pod, got[u], u, want[u])
			}
			checked += got[u]
		}
	}
	t.Logf("the app's own counters on %d pods hold the %d requests its clients got admitted from them", len(app), checked)
}

func mergeKeys(a, b map[string]int) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// phase is a stretch of the traffic, reported on its own.
type phase struct {
	name     string
	from, to time.Time
}

// report judges the traffic: every response a 200 or a 429 but for the
// refused connections of a stopped sidecar, and the per-user limit exact over
// the whole run (no window with more admits, no denial before the window
// was full; windows run across the phases), with the figures per phase.
func (tr *traffic) report(t *testing.T, phases []phase) {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	excused := func(s shot) bool {
		for _, e := range tr.excused {
			if s.sent.Before(e.to) && s.done.After(e.from) {
				return true
			}
		}
		return false
	}
	type tally struct {
		sent, ok, limited, refused, failed int
		latency                            []time.Duration
	}
	tallies := make([]tally, len(phases))
	var failures []string
	var ds []testsupport.Decision
	for _, s := range tr.shots {
		ph := slices.IndexFunc(phases, func(ph phase) bool { return !s.sent.Before(ph.from) && s.sent.Before(ph.to) })
		if ph < 0 {
			continue
		}
		tl := &tallies[ph]
		tl.sent++
		tl.latency = append(tl.latency, s.done.Sub(s.sent))
		at := s.sent.Format("15:04:05.000 ")
		switch {
		case s.code == 200:
			tl.ok++
		case s.code == 429 && strings.Contains(s.policy, `"`+userPolicy+`"`):
			tl.limited++
		case s.code == 429:
			tl.failed++
			failures = append(failures, fmt.Sprintf("%sa 429 of %s by %q", at, s.user, s.policy))
			continue
		case s.err != nil && excused(s):
			tl.refused++
			continue
		case s.err != nil:
			tl.failed++
			failures = append(failures, at+s.err.Error())
			continue
		default:
			tl.failed++
			failures = append(failures, fmt.Sprintf("%sstatus %d", at, s.code))
			continue
		}
		ds = append(ds, testsupport.Decision{Key: s.user, Sent: s.sent, Done: s.done, Admitted: s.code == 200})
	}
	for i, ph := range phases {
		tl := tallies[i]
		slices.Sort(tl.latency)
		q := func(f float64) time.Duration {
			if len(tl.latency) == 0 {
				return 0
			}
			return tl.latency[int(f*float64(len(tl.latency)-1))].Round(time.Millisecond)
		}
		t.Logf("%s: %d requests in %.1fs: %d admitted, %d limited by %s, %d failed, %d refused by a stopped sidecar's pod; latency p50 %s, p99 %s, max %s",
			ph.name, tl.sent, ph.to.Sub(ph.from).Seconds(), tl.ok, tl.limited, userPolicy, tl.failed, tl.refused, q(0.5), q(0.99), q(1))
		if tl.ok == 0 || tl.limited == 0 {
			t.Errorf("%s: the traffic did not exercise the limit", ph.name)
		}
	}
	for _, e := range tr.excused {
		t.Logf("sidecar of %s stopped: refused connections excused from %s to %s (%.2fs)",
			e.pod, e.from.Format("15:04:05.000"), e.to.Format("15:04:05.000"), e.to.Sub(e.from).Seconds())
	}
	if len(failures) > 0 {
		t.Errorf("%d requests failed other than by a 429 of %s, first: %v", len(failures), userPolicy, failures[:min(5, len(failures))])
	}
	most, where := testsupport.BusiestWindow(ds, userWindow)
	below := testsupport.DenialsBelowLimit(ds, userLimit, userWindow)
	t.Logf("most admits of one client in one window: %d (limit %d): %s; denials before the window was full: %d", most, userLimit, where, len(below))
	if most > userLimit {
		t.Errorf("over the limit: %s", where)
	}
	if len(below) > 0 {
		t.Errorf("%d denials with the window not full, first: %v", len(below), below[:min(5, len(below))])
	}
}
