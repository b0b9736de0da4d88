package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestDemoFlow runs what `make demo` runs, against the binaries built from
// this tree, and asserts the numbers the demo prints.
func TestDemoFlow(t *testing.T) {
	if _, err := testsupport.EnvtestAssets(); err != nil {
		testsupport.Missing(t, "envtest control plane", err)
	}
	if _, err := testsupport.RedisServerPath(); err != nil {
		testsupport.Missing(t, "redis-server", err)
	}
	if _, err := exec.LookPath("kubectl"); err != nil {
		testsupport.Missing(t, "kubectl", err)
	}
	root, err := testsupport.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	for _, b := range []string{"manager", "sidecar"} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(bin, b), filepath.Join(root, "cmd", b)).CombinedOutput()
		if err != nil {
			t.Fatalf("go build %s: %v\n%s", b, err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := Run(ctx, Options{ManagerBin: filepath.Join(bin, "manager"), SidecarBin: filepath.Join(bin, "sidecar"), Out: &out})
	t.Log("demo output:\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range Check(res) {
		t.Error(p)
	}
	// What Check does not cover: the injected pod is the one the webhook
	// made, with the sidecar first and the port taken over.
	if res.Injected.Spec.InitContainers[0].Name != inject.ContainerName {
		t.Errorf("first init container is %s", res.Injected.Spec.InitContainers[0].Name)
	}
	if !strings.Contains(out.String(), "kubectl get rlp") || !strings.Contains(out.String(), "per-user") {
		t.Error("the demo output lacks the policy status table")
	}
	if _, err := os.Stat(filepath.Join(bin, "manager")); err != nil {
		t.Error(err)
	}
}

// TestCheckCatchesWrongNumbers shows Check is not vacuous: a result where a
// client got one request too many fails it.
func TestCheckCatchesWrongNumbers(t *testing.T) {
	r := &Result{Limit: 5, Round1: map[string]Counts{}, Round2: Counts{Admitted: RaisedLimit, Rejected: 2}}
	for _, c := range Clients {
		r.Round1[c] = Counts{Admitted: 5, Rejected: 3, RejectedBy: map[string]int{UserPolicy: 3}}
	}
	r.Round1["alice"] = Counts{Admitted: 6, Rejected: 2, RejectedBy: map[string]int{UserPolicy: 2}}
	if len(Check(r)) == 0 {
		t.Fatal("Check accepted a client admitted over its limit")
	}
}
