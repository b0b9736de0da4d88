package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/kubectlplugin"
)

// testDebugAccess: the sidecars' /debug answers only through what
// Kubernetes authorized. An on-call user bound to slidegate-debugger in the
// demo namespace runs `kubectl slidegate why` and `top`, which reach the
// sidecars' loopback debug port through the API server's port-forward and
// this node's kubelet and containerd; a user without the binding is
// refused; and anything on the pod network (this test, from the node's
// network namespace) gets no /debug answer from the admin port and no
// connection to the debug port. `top` merges both replicas once both hash
// with the namespace's key, which the kubelet mounts even when the pods
// started before the controller mirrored it.
func testDebugAccess(ctx context.Context, t *testing.T, _ *node) {
	mustKubectl(ctx, t, "-n", demo, "create", "rolebinding", "demo-oncall-slidegate",
		"--clusterrole=slidegate-debugger", "--group=demo-oncall")
	oncall := []string{"-n", demo, "--as=oncall", "--as-group=demo-oncall"}
	plugin := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := kubectlplugin.Env{Stdout: &out, Stderr: &errOut}.Main(ctx, args)
		return code, out.String(), errOut.String()
	}

	// dana goes over per-user (5 per 10 s): a 429 for top to count.
	url := "http://" + serviceIP(ctx, t, "demo-app") + "/"
	limited := false
	for range 6 {
		a, err := request(ctx, "GET", url, map[string]string{"X-User-ID": "dana"})
		if err != nil {
			t.Fatal(err)
		}
		limited = limited || a.code == 429
	}
	if !limited {
		t.Fatal("dana was not limited")
	}

	// why, as the on-call user: dana's key, as the sidecar derives it.
	code, out, errOut := plugin(append([]string{"why", userPolicy, "--header", "dana", "-o", "json"}, oncall...)...)
	if code != 0 {
		t.Fatalf("kubectl slidegate why: exit %d: %s", code, errOut)
	}
	var why kubectlplugin.WhyResult
	if err := json.Unmarshal([]byte(out), &why); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	sum := sha256.Sum256([]byte("dana"))
	unkeyed := "h:" + base64.RawURLEncoding.EncodeToString(sum[:16])
	target := why.Policies[0]
	if !strings.Contains(target.RedisKey, unkeyed+"}") || target.ClientKey == unkeyed || !strings.HasPrefix(target.ClientKey, "h:") ||
		target.Window == nil || strings.Contains(out, `"dana"`) {
		t.Errorf("why: %s", out)
	}
	t.Logf("kubectl slidegate why %s --header dana (as demo-oncall): pod %s, key %s, %v in the window",
		userPolicy, why.Pod, target.ClientKey, target.Window.InWindow)

	// A reader of pods and policies, even with get on pods/proxy (what the
	// plugin used before), but no port-forward: the API server refuses.
	mustKubectl(ctx, t, "-n", demo, "create", "role", "demo-reader", "--verb=get,list",
		"--resource=pods,pods/proxy,ratelimitpolicies.ratelimit.slidegate.dev")
	mustKubectl(ctx, t, "-n", demo, "create", "rolebinding", "demo-reader", "--role=demo-reader", "--group=demo-readers")
	code, _, errOut = plugin("why", userPolicy, "--header", "dana", "-n", demo, "--as=reader", "--as-group=demo-readers")
	if code != 1 || !strings.Contains(errOut, `you lack "create" on "pods/portforward"`) {
		t.Errorf("kubectl slidegate why as a reader: exit %d: %s", code, errOut)
	}

	// From the pod network: no /debug on the admin port, no debug port.
	for _, p := range demoPods(ctx, t) {
		admin := net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(sidecarAdminPort(t, &p))))
		for _, path := range []string{"/debug/why?policy=" + userPolicy + "&header=dana", "/debug/top?policy=" + userPolicy} {
			a, err := request(ctx, "GET", "http://"+admin+path, nil)
			if err != nil || a.code != 404 {
				t.Errorf("pod %s: GET http://%s%s from the pod network: %d %v, want 404", p.Name, admin, path, a.code, err)
			}
		}
		debug := net.JoinHostPort(p.Status.PodIP, strconv.Itoa(inject.DefaultDebugPort))
		if conn, err := net.DialTimeout("tcp", debug, 5*time.Second); err == nil {
			_ = conn.Close()
			t.Errorf("pod %s: the debug port answers on the pod IP (%s)", p.Name, debug)
		}
	}

	// top merges both replicas: both hash with the namespace's key (a pod
	// that started before it was mirrored gets it on a kubelet sync).
	var top kubectlplugin.TopResult
	took := eventually(t, 3*time.Minute, time.Second, "top merges both replicas", func() error {
		code, out, errOut := plugin(append([]string{"top", userPolicy, "-o", "json"}, oncall...)...)
		if code != 0 {
			return fmt.Errorf("exit %d: %s", code, errOut)
		}
		top = kubectlplugin.TopResult{}
		if err := json.Unmarshal([]byte(out), &top); err != nil {
			return err
		}
		if len(top.Pods) != demoReplicas || len(top.Failed) > 0 {
			return fmt.Errorf("pods %v, failed %v", top.Pods, top.Failed)
		}
		return nil
	})
	t.Logf("kubectl slidegate top %s: %d pods merged after %v, key %s, %d 429s", userPolicy, len(top.Pods), took, top.HashKeyID, top.Total)
	for _, it := range top.Items {
		if it.Key == unkeyed || strings.Contains(it.Key, "dana") {
			t.Errorf("top names a client: %+v", it)
		}
	}
}
