package kubectlplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/clienthash"
	"github.com/slidegate/slidegate/internal/debugapi"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/sidecar"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// These tests run the plugin against a real API server (envtest) with RBAC,
// whose port-forward reaches a real sidecar's debug port (sidecar.Serve, its
// debug port on 127.0.0.1, its admin port on the pod IP 192.0.2.77, which
// the test puts on the loopback interface), which reads a real
// redis-server. envtest lacks a kubelet: pods exist only as objects whose
// status the test writes, and the API server's port-forward goes to the
// kubelet endpoint of kubelet_test.go.

var (
	env    *envtest.Environment
	admin  client.Client
	scheme = runtime.NewScheme()
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	if _, err := testsupport.RedisServerPath(); err != nil {
		testsupport.MissingInMain("redis-server", err)
	}
	undo, err := onLoopback()
	if err != nil {
		testsupport.MissingInMain(podIP+" on the loopback interface", err)
	}
	defer undo()
	if env, admin, err = testsupport.StartControlPlane(scheme); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	if err := installDebuggerRole(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "installing the debugger ClusterRole:", err)
		return 1
	}
	var stopKubelet func()
	if kubelet, stopKubelet, err = startKubelet(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "starting the test kubelet:", err)
		return 1
	}
	defer stopKubelet()
	return m.Run()
}

// kubelet is the port-forward endpoint of the envtest node (kubelet_test.go).
var kubelet *testKubelet

// installDebuggerRole creates the ClusterRoles slidegate-debugger and
// slidegate-resetter exactly as config/default renders them.
func installDebuggerRole(ctx context.Context) error {
	root, err := testsupport.RepoRoot()
	if err != nil {
		return err
	}
	out, err := exec.Command("kubectl", "kustomize", filepath.Join(root, "config", "default")).Output()
	if err != nil {
		return fmt.Errorf("kubectl kustomize config/default: %w", err)
	}
	want := map[string]bool{DebuggerRole: true, ResetterRole: true}
	for _, doc := range bytes.Split(out, []byte("\n---\n")) {
		var role rbacv1.ClusterRole
		if err := yaml.Unmarshal(doc, &role); err != nil || role.Kind != "ClusterRole" || !want[role.Name] {
			continue
		}
		if err := admin.Create(ctx, &role); err != nil {
			return err
		}
		delete(want, role.Name)
	}
	if len(want) > 0 {
		return fmt.Errorf("config/default renders no ClusterRole %v", slices.Sorted(maps.Keys(want)))
	}
	return nil
}

// podIP is the IP the test's pods report and their sidecars' admin ports
// listen on. The API server proxies only to global unicast addresses, and
// the test's traffic must not leave loopback, so the test puts this address
// of TEST-NET-1 (RFC 5737: documentation only, never routed) on the
// loopback interface for its run (onLoopback).
const podIP = "192.0.2.77"

// onLoopback adds podIP to the loopback interface unless it is there, and
// returns how to undo what it did. It needs root (CAP_NET_ADMIN).
func onLoopback() (undo func(), err error) {
	out, err := exec.Command("ip", "-4", "addr", "show", "dev", "lo").Output()
	if err != nil {
		return nil, fmt.Errorf("ip addr show dev lo: %w", err)
	}
	if bytes.Contains(out, []byte(" "+podIP+"/")) {
		return func() {}, nil
	}
	if out, err := exec.Command("ip", "addr", "add", podIP+"/32", "dev", "lo").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip addr add %s/32 dev lo (needs root): %w: %s", podIP, err, out)
	}
	return func() { _ = exec.Command("ip", "addr", "del", podIP+"/32", "dev", "lo").Run() }, nil
}

// recorder is the real limiter, remembering the last decision of the
// request path, for comparing with the plugin's answer.
type recorder struct {
	*limiter.Limiter
	mu           sync.Mutex
	reqs         []limiter.Request
	ds           []limiter.Decision
	begun, ended time.Time
}

func (r *recorder) Decide(ctx context.Context, reqs []limiter.Request) []limiter.Decision {
	begun := time.Now()
	ds := r.Limiter.Decide(ctx, reqs)
	r.mu.Lock()
	r.reqs, r.ds, r.begun, r.ended = reqs, ds, begun, time.Now()
	r.mu.Unlock()
	return ds
}

// shop is a namespace with two policies and pods of which one runs a real
// sidecar.
type shop struct {
	ns     string
	fronts []string // the sidecars' proxied ports, for live traffic
	admins []string // their admin ports, on the pod IP
	recs   []*recorder
	front  string // web-1's, the one why asks
	rec    *recorder
}

func newShop(t *testing.T, ns string) *shop {
	t.Helper()
	ctx := context.Background()
	r := testsupport.StartRedis(t)
	mustCreate(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	web := &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "web"}}
	policies := []v1alpha1.RateLimitPolicy{
		{ObjectMeta: metav1.ObjectMeta{Name: "per-api-key", Namespace: ns}, Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: web, Window: "1m", Limit: 3,
			Key: v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-Api-Key", OnMissing: v1alpha1.MissingKeyDeny},
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: "site-wide", Namespace: ns}, Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: web, Window: "1s", Limit: 1000, Key: v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal},
		}},
	}
	for i := range policies {
		mustCreate(t, &policies[i])
	}
	// The sidecar, configured as the controller renders the policies.
	rendered, err := render.Render(policies, render.Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	data, err := sidecarconfig.Marshal(rendered)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "app\n") }), ReadHeaderTimeout: time.Second}
	appLn := listen(t, "127.0.0.1:0")
	go func() { _ = app.Serve(appLn) }()
	t.Cleanup(func() { _ = app.Close() })

	sh := &shop{ns: ns}
	// Two sidecars (pods web-1 and web-3), one limiter each, one Redis, one
	// client hash key (the namespace's).
	type ports struct{ admin, debug int32 }
	startSidecar := func() ports {
		o := sidecar.DefaultOptions()
		o.ConfigFile = write(sidecarconfig.FileName, data)
		o.PodLabelsFile = write("labels", []byte("app=\"web\"\n"))
		o.Upstream = "http://" + appLn.Addr().String()
		o.ListenAddress, o.AdminAddress, o.DebugAddress = "127.0.0.1:0", podIP+":0", "127.0.0.1:0"
		o.ClientHashKeyFile = write(clienthash.SecretDataKey, []byte(clienthash.NamespaceKey([]byte("the install key of this test run"), ns)))
		o.Redis.Addrs = []string{r.Addr}
		rdb, err := redisconn.NewClient(redisconn.Config{Addrs: []string{r.Addr}})
		if err != nil {
			t.Fatal(err)
		}
		// No deny cache: its retry instant is, by design, up to one round
		// trip earlier than Redis's (internal/limiter/view.go), and the
		// test holds the plugin's answer to the next decision's to the
		// millisecond. (Seen under stress-ng: 2.8 ms early.)
		lim, err := limiter.New(rdb, limiter.Options{Timeout: 10 * time.Second, DenyCacheMax: -1})
		if err != nil {
			t.Fatal(err)
		}
		rec := &recorder{Limiter: lim}
		s, err := sidecar.New(o, rec, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		ln, adminLn, debugLn := listen(t, o.ListenAddress), listen(t, o.AdminAddress), listen(t, o.DebugAddress)
		sctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = s.Serve(sctx, ln, adminLn, debugLn) }()
		t.Cleanup(func() { stop(); <-done; _ = lim.Close(); _ = rdb.Close() })
		testsupport.Eventually(t, 10*time.Second, 10*time.Millisecond, "sidecar ready", func() error {
			if !s.Ready() {
				return fmt.Errorf("not ready")
			}
			return nil
		})
		sh.fronts = append(sh.fronts, "http://"+ln.Addr().String())
		sh.recs = append(sh.recs, rec)
		sh.admins = append(sh.admins, adminLn.Addr().String())
		return ports{int32(adminLn.Addr().(*net.TCPAddr).Port), int32(debugLn.Addr().(*net.TCPAddr).Port)}
	}
	sidecars := []ports{startSidecar(), startSidecar()}

	// Pods: the injector's own sidecar container; web-1 and web-3 are
	// ready and reachable. web-0 is not ready, web-2 has no sidecar, db is
	// not selected.
	pod := func(name string, labels map[string]string, sc *ports, ready bool) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
			Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "app", Image: "app:1",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
		}
		if sc != nil {
			if err := inject.Inject(p, inject.Options{AdminPort: sc.admin, DebugPort: sc.debug}); err != nil {
				t.Fatal(err)
			}
		}
		mustCreate(t, p)
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		p.Status = corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: podIP, PodIPs: []corev1.PodIP{{IP: podIP}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}},
		}
		if err := admin.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	pod("web-0", map[string]string{"app": "web"}, &sidecars[1], false)
	pod("web-1", map[string]string{"app": "web"}, &sidecars[0], true)
	pod("web-2", map[string]string{"app": "web"}, nil, true)
	pod("web-3", map[string]string{"app": "web"}, &sidecars[1], true)
	pod("db-0", map[string]string{"app": "db"}, &sidecars[0], true)
	sh.front, sh.rec = sh.fronts[0], sh.recs[0]
	return sh
}

func listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func mustCreate(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := admin.Create(context.Background(), o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// kubeconfigFor provisions a user of the API server (a client certificate,
// authorised by RBAC only) and writes its kubeconfig.
func kubeconfigFor(t *testing.T, name string, groups ...string) string {
	t.Helper()
	u, err := env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := u.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func bind(t *testing.T, ns, group, kind, role string) {
	t.Helper()
	mustCreate(t, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: group + "-" + role, Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: kind, Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: group}},
	})
}

// run runs `kubectl slidegate` as the plugin binary would.
func run(args ...string) (code int, stdout, stderr string) { return runIn("", args...) }

// runIn is run with stdin.
func runIn(stdin string, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = Env{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errOut}.Main(context.Background(), args)
	return code, out.String(), errOut.String()
}

func (s *shop) get(t *testing.T, key string) int { return s.getVia(t, s.front, key) }

func (s *shop) getVia(t *testing.T, front, key string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, front+"/", nil)
	req.Header.Set("X-Api-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// TestWhyThroughAPortForward: an on-call user bound to slidegate-debugger in
// the namespace asks, through the API server's port-forward, about a client
// that live traffic has limited; the plugin picks the one ready pod with the
// sidecar and prints the window that the sidecar's next decision confirms.
func TestWhyThroughAPortForward(t *testing.T) {
	s := newShop(t, "shop")
	bind(t, s.ns, "shop-oncall", "ClusterRole", DebuggerRole)
	kc := kubeconfigFor(t, "alice", "shop-oncall")
	const apiKey = "k-123-secret"
	for range 3 {
		if code := s.get(t, apiKey); code != http.StatusOK {
			t.Fatalf("admit: %d", code)
		}
	}
	if code := s.get(t, apiKey); code != http.StatusTooManyRequests {
		t.Fatalf("4th: %d", code)
	}

	code, out, errOut := run("why", "--kubeconfig", kc, "-n", s.ns, "per-api-key", "--header", apiKey)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	t.Logf("kubectl slidegate why -n shop per-api-key --header %s\n%s", apiKey, out)
	lines := strings.Split(out, "\n")
	if f := strings.Fields(lines[0]); strings.Join(f, " ") != "POLICY KEY IN-WINDOW LIMIT REMAINING OLDEST-AGE RETRY-AFTER OTHER-MATCHING-POLICIES" {
		t.Errorf("header %q", lines[0])
	}
	if f := strings.Fields(lines[1]); len(f) != 8 || f[0] != "per-api-key" || !strings.HasPrefix(f[1], "h:") ||
		f[2] != "3" || f[3] != "3" || f[4] != "0" || f[7] != "site-wide" {
		t.Errorf("target row %q", lines[1])
	}
	if !strings.Contains(out, "asked pod web-1 ") || strings.Contains(out, apiKey) {
		t.Errorf("output:\n%s", out)
	}
	if f := kubelet.forwarded(); len(f) == 0 || !strings.HasPrefix(f[len(f)-1], s.ns+"/web-1:") {
		t.Errorf("the kubelet forwarded %v, want web-1's debug port", f)
	}

	// JSON, then the sidecar's next decision: the same key, and the retry
	// instant the plugin announced.
	code, out, errOut = run("why", "--kubeconfig", kc, "-n", s.ns, "per-api-key", "--header", apiKey, "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	t.Logf("-o json:\n%s", out)
	var res WhyResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if s.get(t, apiKey) != http.StatusTooManyRequests {
		t.Fatal("not limited any more")
	}
	s.rec.mu.Lock()
	reqs, ds, begun, ended := s.rec.reqs, s.rec.ds, s.rec.begun, s.rec.ended
	s.rec.mu.Unlock()
	target := res.Policies[0]
	var found bool
	for i, r := range reqs {
		if r.Rule.ID != s.ns+"/per-api-key" {
			continue
		}
		found = true
		// The key as /debug/top names the client: a keyed hash of the
		// request path's key, which the Redis key holds.
		if h, _ := clienthash.New(clienthash.NamespaceKey([]byte("the install key of this test run"), s.ns)); target.ClientKey != h.Sum(r.Client) ||
			!strings.Contains(target.RedisKey, ":"+r.Client+"}") {
			t.Errorf("plugin key %q (Redis key %q), request path key %q", target.ClientKey, target.RedisKey, r.Client)
		}
		w := target.Window
		lo, hi := begun.Add(ds[i].RetryAfter), ended.Add(ds[i].RetryAfter)
		if w == nil || w.Allowed || w.Remaining != 0 || ds[i].Remaining != 0 ||
			w.RetryAt.Before(lo.Add(-time.Millisecond)) || w.RetryAt.After(hi.Add(time.Millisecond)) {
			t.Errorf("plugin %+v; decision %+v within [%v, %v]", w, ds[i], lo, hi)
		}
	}
	if !found || res.Pod != "web-1" || len(res.Policies) != 2 || res.Policies[1].ClientKey != "global" {
		t.Errorf("answer %s", out)
	}

	// The value from stdin (out of the shell history) is the same client.
	code, out2, errOut := runIn(apiKey+"\n", "why", "--kubeconfig", kc, "-n", s.ns, "per-api-key", "--header", "-", "-o", "json")
	if code != 0 || !strings.Contains(out2, `"clientKey": "`+target.ClientKey+`"`) {
		t.Errorf("--header - : %d %s %s", code, out2, errOut)
	}
	if code, _, errOut := runIn("", "why", "--kubeconfig", kc, "-n", s.ns, "per-api-key", "--header", "-"); code != 2 || !strings.Contains(errOut, "empty") {
		t.Errorf("empty stdin: %d %s", code, errOut)
	}

	// A sidecar's own refusal reaches the user in its words: here a
	// policy the API server has but that sidecar has not loaded.
	mustCreate(t, &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "brand-new", Namespace: s.ns}, Spec: v1alpha1.RateLimitPolicySpec{
		TargetSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "web"}},
		Window:         "1m", Limit: 1, Key: v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal},
	}})
	if code, _, errOut := run("why", "--kubeconfig", kc, "-n", s.ns, "brand-new", "--global"); code != 1 ||
		!strings.Contains(errOut, `pod web-1: 404: policy "brand-new" does not apply to this pod (policies here: per-api-key, site-wide)`) {
		t.Errorf("policy not loaded: %d %s", code, errOut)
	}

	// Another client's window is its own; an unknown policy is named.
	if code, out, _ := run("why", "--kubeconfig", kc, "-n", s.ns, "per-api-key", "--header", "other", "-o", "json"); code != 0 || !strings.Contains(out, `"remaining": 3`) {
		t.Errorf("other client: %d %s", code, out)
	}
	if code, _, errOut := run("why", "--kubeconfig", kc, "-n", s.ns, "nope", "--global"); code != 1 || !strings.Contains(errOut, `"nope" not found`) {
		t.Errorf("unknown policy: %d %s", code, errOut)
	}
}

// TestWhyRefusedWithoutPortForward: RBAC decides, for real. A user who may
// read pods and policies, and even get pods/proxy (what the plugin needed
// before), but not create pods/portforward is refused by the API server
// with a message naming the missing verb; the debugger role bound in one
// namespace does not reach another.
func TestWhyRefusedWithoutPortForward(t *testing.T) {
	s := newShop(t, "shop2")
	mustCreate(t, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "reader", Namespace: s.ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
			{APIGroups: []string{""}, Resources: []string{"pods/proxy", "pods/portforward"}, Verbs: []string{"get"}},
			{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"ratelimitpolicies"}, Verbs: []string{"get", "list"}},
		},
	})
	bind(t, s.ns, "readers", "Role", "reader")
	code, out, errOut := run("why", "--kubeconfig", kubeconfigFor(t, "bob", "readers"), "-n", s.ns, "per-api-key", "--header", "x")
	if code != 1 || !strings.Contains(errOut, `you lack "create" on "pods/portforward" in namespace "shop2"`) ||
		!strings.Contains(errOut, DebuggerRole) || !strings.Contains(errOut, "403") {
		t.Errorf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	t.Logf("refused: %s", errOut)

	// The debugger role bound by a RoleBinding in another namespace gives
	// nothing here.
	mustCreate(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop2-other"}})
	bind(t, "shop2-other", "other-oncall", "ClusterRole", DebuggerRole)
	code, _, errOut = run("why", "--kubeconfig", kubeconfigFor(t, "carol", "other-oncall"), "-n", s.ns, "per-api-key", "--global")
	if code != 1 || !strings.Contains(errOut, `you lack "get" on "ratelimitpolicies.ratelimit.slidegate.dev" in namespace "shop2"`) {
		t.Errorf("exit %d: %s", code, errOut)
	}
}

// TestTopAcrossPods: 429s counted by two sidecars, merged by the plugin
// through port-forwards: the heavy client's total over both pods, exact
// while the sketches hold every key, under keyed hashes that both sidecars
// of the namespace share.
func TestTopAcrossPods(t *testing.T) {
	s := newShop(t, "shop3")
	bind(t, s.ns, "shop3-oncall", "ClusterRole", DebuggerRole)
	kc := kubeconfigFor(t, "erin", "shop3-oncall")
	// per-api-key admits 3 a minute per key, over both pods.
	sent := map[string][2]int{"heavy": {6, 5}, "medium": {2, 3}, "light": {4, 0}}
	for key, n := range sent {
		for i, front := range s.fronts {
			for range n[i] {
				s.getVia(t, front, key)
			}
		}
	}
	code, out, errOut := run("top", "--kubeconfig", kc, "-n", s.ns, "per-api-key")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	t.Logf("kubectl slidegate top -n %s per-api-key\n%s", s.ns, out)
	code, out, errOut = run("top", "--kubeconfig", kc, "-n", s.ns, "per-api-key", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var res TopResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// 11-3 = 8 for heavy, 5-3 = 2 for medium, 4-3 = 1 for light.
	want := []uint64{8, 2, 1}
	if len(res.Items) != 3 || fmt.Sprint(res.Pods) != "[web-1 web-3]" || res.Total != 11 || res.Min != 0 {
		t.Fatalf("answer %s", out)
	}
	for i, it := range res.Items {
		if it.Count != want[i] || it.Err != 0 || !strings.HasPrefix(it.Key, "h:") {
			t.Errorf("item %d: %+v, want count %d", i, it, want[i])
		}
	}
	if strings.Contains(out, "heavy") {
		t.Errorf("raw key in the answer: %s", out)
	}
}

func TestSidecarTargets(t *testing.T) {
	mk := func(name string, ready, sidecar, deleting bool) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}
		p.Spec.Containers = []corev1.Container{{Name: "app", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}
		if sidecar {
			if err := inject.Inject(&p, inject.Options{}); err != nil {
				t.Fatal(err)
			}
		}
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
		if deleting {
			p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		}
		return p
	}
	// A sidecar injected before the debug port existed: a target without
	// a port, which the plugin does not try to reach.
	old := mk("f", true, true, false)
	sc := &old.Spec.InitContainers[0]
	sc.Ports = slices.DeleteFunc(sc.Ports, func(p corev1.ContainerPort) bool { return p.Name == inject.DebugPortName })
	got := SidecarTargets([]corev1.Pod{
		mk("c", true, true, false), mk("a", true, true, false), mk("b", false, true, false),
		mk("d", true, false, false), mk("e", true, true, true), old,
	})
	want := []Target{{"ns", "a", inject.DefaultDebugPort}, {"ns", "c", inject.DefaultDebugPort}, {"ns", "f", 0}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if _, err := (&Client{}).Get(context.Background(), want[2], debugapi.TopPath, nil, nil); err == nil || !strings.Contains(err.Error(), "re-create the pod") {
		t.Errorf("an old sidecar: %v", err)
	}
}

// TestDebugNotOnThePodNetwork: what anything on the pod network can reach
// of a sidecar, its admin port on the pod IP, answers no /debug route, and
// the debug port does not answer there at all; not even the API server's
// pod proxy (what the plugin used before, for which the debugger role
// granted get on pods/proxy) gets a /debug answer.
func TestDebugNotOnThePodNetwork(t *testing.T) {
	s := newShop(t, "shop4")
	for range 4 {
		s.get(t, "k-123")
	}
	for _, admin := range s.admins {
		for _, target := range []string{"/debug/why?policy=per-api-key&header=k-123", "/debug/top?policy=per-api-key"} {
			resp, err := http.Get("http://" + admin + target)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("GET http://%s%s from the pod network: %d %s, want 404", admin, target, resp.StatusCode, body)
			}
		}
		if resp, err := http.Get("http://" + admin + "/metrics"); err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("/metrics on %s: %v %v", admin, resp, err)
		} else {
			_ = resp.Body.Close()
		}
	}
	var pods corev1.PodList
	if err := admin.List(context.Background(), &pods, client.InNamespace(s.ns)); err != nil {
		t.Fatal(err)
	}
	for _, tg := range SidecarTargets(pods.Items) {
		if conn, err := net.DialTimeout("tcp", net.JoinHostPort(podIP, strconv.Itoa(int(tg.Port))), 5*time.Second); err == nil {
			_ = conn.Close()
			t.Errorf("pod %s: its debug port %d answers on the pod IP", tg.Pod, tg.Port)
		}
	}
	// The pod proxy to the admin port, as cluster admin.
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	_, adminPort, _ := net.SplitHostPort(s.admins[0])
	_, err = kube.CoreV1().RESTClient().Get().Namespace(s.ns).Resource("pods").SubResource("proxy").
		Name("web-1:"+adminPort).Suffix(debugapi.TopPath).Param("policy", "per-api-key").DoRaw(context.Background())
	if !apierrors.IsNotFound(err) {
		t.Errorf("the pod proxy to the admin port's /debug/top: %v, want 404", err)
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "the commands are status, why, quota, reset, top, convert, completion and version"},
		{[]string{"quota", "p"}, "exactly one of --header"},
		{[]string{"reset", "p"}, "exactly one of --header"},
		{[]string{"why", "p", "--global", "--reason", "x"}, "unknown flag: --reason"},
		{[]string{"top", "p", "--limit", "0"}, "--limit must be at least 1"},
		{[]string{"why", "p"}, "exactly one of --header"},
		{[]string{"why", "p", "--header", "a", "--ip", "1.2.3.4"}, "exactly one of --header"},
		{[]string{"why", "--global"}, "exactly one POLICY"},
		{[]string{"top", "p", "-o", "xml"}, "unknown output format"},
	} {
		if code, _, errOut := run(tc.args...); code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, %s", tc.args, code, errOut)
		}
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		if code, out, errOut := run(args...); code != 0 || !strings.HasPrefix(out, "kubectl-slidegate ") {
			t.Errorf("%v: exit %d, %q %s", args, code, out, errOut)
		}
	}
	// Asked for, the usage is the answer: on stdout, exit 0, nothing on
	// stderr; with the flags of the command asked about.
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--help"}, "--header"}, {[]string{"-h"}, "--header"}, {[]string{"help"}, "--header"},
		{[]string{"why", "--help"}, "--header"}, {[]string{"quota", "--help"}, "--header"}, {[]string{"top", "-h"}, "--limit"},
	} {
		code, out, errOut := run(tc.args...)
		if code != 0 || errOut != "" || !strings.HasPrefix(out, "kubectl slidegate: ") || !strings.Contains(out, tc.flag) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 0 and the usage with %s on stdout only", tc.args, code, out, errOut, tc.flag)
		}
	}
	// A usage error prints the usage on stderr, none on stdout.
	if code, out, errOut := run(); code != 2 || out != "" || !strings.Contains(errOut, "Usage:") {
		t.Errorf("no arguments: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
