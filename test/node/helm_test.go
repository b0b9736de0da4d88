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

package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/slidegate/slidegate/internal/redisadmin"
)

// testHelmChart installs slidegate through its Helm chart with the
// commands of docs/install.md's "With Helm", run as written (helm built
// from go.mod's helm, hack/tools.sh helm); the Redis they name,
// redis.redis.svc.cluster.local, is this node's behind a Service of that
// name. Then it upgrades the release (one manager replica) and uninstalls
// it as the document says: all but the CRD goes, which the test deletes
// last, and nothing is left. The policies of the demo are enforced
// before and after the upgrade, through the namespace's own Redis user.
func testHelmChart(ctx context.Context, t *testing.T, n *node) {
	helm := filepath.Join(n.root, "bin", "helm")
	if _, err := os.Stat(helm); err != nil {
		t.Fatalf("helm is not built (hack/tools.sh helm; make test builds it): %v", err)
	}
	script := onlyBlock(t, filepath.Join(n.root, "docs", "install.md"), "## With Helm")
	mustKubectl(ctx, t, "create", "namespace", "redis")
	if _, err := kubectl(ctx, redisServiceIn("redis", n.ip, "redis"), "apply", "--server-side", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(script, "--from-literal=username="+n.redisAdminUser+" ") {
		t.Fatalf("docs/install.md's Helm install names another administrative user than the quickstart's Redis (%s):\n%s", n.redisAdminUser, script)
	}
	start := time.Now()
	run := func(script string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
		cmd.Dir = n.root
		cmd.Env = append(os.Environ(), "ADMIN_PW="+n.redisAdminPassword, "PATH="+filepath.Join(n.root, "bin")+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
		return string(out)
	}
	run(script)
	t.Logf("docs/install.md's Helm install: manager rolled out in %.1fs", time.Since(start).Seconds())

	dir := n.overlay(t, demoKustomization)
	mustKubectl(ctx, t, "apply", "--server-side", "-k", dir)
	mustKubectl(ctx, t, "-n", demo, "rollout", "status", "deployment/demo-app", "--timeout=3m")
	waitEnforced(ctx, t, userPolicy, demoReplicas)
	rdb := n.redis.testClient()
	defer func() { _ = rdb.Close() }()
	eventually(t, time.Minute, time.Second, "the demo namespace's own Redis user", func() error {
		users, err := rdb.Do(ctx, "ACL", "USERS").StringSlice()
		if err == nil && !slices.Contains(users, redisadmin.NamespaceUser(demo)) {
			err = fmt.Errorf("users %v", users)
		}
		return err
	})

	out := run("helm upgrade slidegate charts/slidegate -n slidegate-system --reuse-values --set manager.replicas=1 && " +
		"kubectl -n slidegate-system rollout status deploy/slidegate-controller-manager --timeout=3m && helm status slidegate -n slidegate-system")
	if !strings.Contains(out, "REVISION: 2") {
		t.Errorf("helm status after the upgrade:\n%s", out)
	}
	var d appsv1.Deployment
	getJSON(ctx, t, &d, "-n", system, "get", manager)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Errorf("after helm upgrade --set manager.replicas=1 the manager has %v replicas", d.Spec.Replicas)
	}
	waitEnforced(ctx, t, userPolicy, demoReplicas)

	mustKubectl(ctx, t, "delete", "--wait=true", "--timeout=3m", "-k", dir)
	run("helm uninstall slidegate -n slidegate-system --wait --timeout 3m")
	// docs/install.md: all but the CRD; the user deletes it, and the
	// namespaces they created.
	if out := mustKubectl(ctx, t, "get", "crd", "ratelimitpolicies.ratelimit.slidegate.dev", "--ignore-not-found", "-o", "name"); strings.TrimSpace(out) == "" {
		t.Error("helm uninstall deleted the CRD, which the chart keeps (crds.keep)")
	}
	mustKubectl(ctx, t, "delete", "--wait=true", "--timeout=3m", "--ignore-not-found", "crd", "ratelimitpolicies.ratelimit.slidegate.dev")
	mustKubectl(ctx, t, "delete", "--wait=true", "--timeout=3m", "namespace", system, "redis")
	nothingLeft(ctx, t, n)
	t.Logf("installed, upgraded and uninstalled through the chart in %.1fs", time.Since(start).Seconds())
}
