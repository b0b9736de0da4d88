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
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/redisadmin"
)

// testQuickstart runs docs/quickstart.md's commands as written, its four
// steps in order in one shell session, with this node in place of kind: a
// `kind` first on PATH whose `create cluster` finds the node up and whose
// `load image-archive` imports into the node's containerd as kind does.
// The public images the page names (redis:7, agnhost) are stand-ins that
// hack/node-images.sh packed under those names: this machine's
// redis-server, and the demo app. Between the steps it checks what the page
// promises: the sidecar in every demo pod, five requests of alice admitted
// and three refused, the namespace's Redis user in the quickstart's Redis
// and gone after the demo's removal, and nothing of slidegate's left in the
// cluster after the last step.
func testQuickstart(ctx context.Context, t *testing.T, n *node) {
	doc := filepath.Join(n.root, "docs", "quickstart.md")
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Join(n.root, "config", ".quickstart")) })
	sh := newDocShell(t, n)
	start := time.Now()

	sh.run(ctx, t, onlyBlock(t, doc, "## 1. A cluster and a Redis"))
	sh.run(ctx, t, onlyBlock(t, doc, "## 2. Build and install slidegate"))
	t.Logf("steps 1 and 2: the manager rolled out %.1fs after the start", time.Since(start).Seconds())

	protect := docBlocks(t, doc, "## 3. Protect an app")
	if len(protect) != 2 {
		t.Fatalf("docs/quickstart.md step 3: %d shell blocks, want 2 (apply and look; the requests)", len(protect))
	}
	out := sh.run(ctx, t, protect[0])
	pods := regexp.MustCompile(`(?m)^(demo-app-\S+): (.*)$`).FindAllStringSubmatch(out, -1)
	if len(pods) != demoReplicas {
		t.Errorf("step 3 lists %d demo pods, want %d:\n%s", len(pods), demoReplicas, out)
	}
	var listed []string
	for _, p := range pods {
		listed = append(listed, p[0])
		if !slices.Contains(strings.Fields(p[2]), inject.ContainerName) {
			t.Errorf("step 3: pod %s has init containers %q, want the sidecar %s", p[1], p[2], inject.ContainerName)
		}
	}
	codes := regexp.MustCompile(`(?m)^\d{3}$`).FindAllString(sh.run(ctx, t, protect[1]), -1)
	t.Logf("step 3: %q; alice's eight requests: %v", listed, codes)
	if want := "200 200 200 200 200 429 429 429"; strings.Join(codes, " ") != want {
		t.Errorf("step 3's eight requests of alice answered %v, want %s (the page's 200 ×5, then 429)", codes, want)
	}
	user := redisadmin.NamespaceUser(demo)
	if users := quickstartRedisUsers(ctx, t, sh, n); !slices.Contains(users, user) {
		t.Errorf("the quickstart's Redis has users %v, want the demo namespace's own, %s", users, user)
	}

	// Step 4 line by line: the page says the first deletes the namespace's
	// Redis user, which only the quickstart's Redis, deleted last, shows.
	remove := strings.Split(strings.TrimSpace(onlyBlock(t, doc, "## 4. Remove")), "\n")
	if len(remove) != 3 || !strings.HasPrefix(remove[0], "kubectl delete -k config/samples") {
		t.Fatalf("docs/quickstart.md step 4: want three commands, the samples' deletion first; got %q", remove)
	}
	sh.run(ctx, t, remove[0])
	eventually(t, 2*time.Minute, time.Second, "the demo namespace's Redis user deleted with the namespace", func() error {
		if users := quickstartRedisUsers(ctx, t, sh, n); slices.Contains(users, user) {
			return fmt.Errorf("users %v", users)
		}
		return nil
	})
	sh.run(ctx, t, strings.Join(remove[1:], "\n"))
	nothingLeftInCluster(ctx, t)
	if out := mustKubectl(ctx, t, "get", "namespace", "redis", "--ignore-not-found", "-o", "name"); strings.TrimSpace(out) != "" {
		t.Errorf("the quickstart's Redis namespace is left: %s", out)
	}
	t.Logf("docs/quickstart.md ran as written in %.1fs", time.Since(start).Seconds())
}

// quickstartRedisUsers is ACL USERS of the quickstart's Redis, asked in its
// pod with its administrative user (the page's NetworkPolicy admits only
// slidegate's pods to Redis).
func quickstartRedisUsers(ctx context.Context, t *testing.T, sh *docShell, n *node) []string {
	t.Helper()
	out := mustKubectl(ctx, t, "-n", "redis", "exec", "deploy/redis", "--", "redis-cli", "--no-auth-warning",
		"--user", n.redisAdminUser, "--pass", sh.variable(ctx, t, "ADMIN_PW"), "ACL", "USERS")
	return strings.Fields(out)
}

// docShell runs a document's shell blocks one after the other as a user's
// one terminal session would: what a block sets (ADMIN_PW) the next one
// sees, every block starts in the repository, and a block's background
// jobs (a port-forward) end with it.
type docShell struct {
	root string
	env  string // the variables the blocks exported, as `export -p` writes them
	path string
}

func newDocShell(t *testing.T, n *node) *docShell {
	t.Helper()
	dir := t.TempDir()
	kind := filepath.Join(dir, "kind")
	if err := os.WriteFile(kind, []byte(kindOnTheNode), 0o755); err != nil {
		t.Fatal(err)
	}
	env := filepath.Join(dir, "env")
	if err := os.WriteFile(env, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return &docShell{root: n.root, env: env, path: dir + ":" + filepath.Join(n.root, "bin") + ":" + os.Getenv("PATH")}
}

// kindOnTheNode is kind as docs/quickstart.md uses it, with the node that
// hack/node.sh brought up in place of a kind cluster. kind loads an image
// archive with `ctr images import --all-platforms --digests` on its node.
const kindOnTheNode = `#!/usr/bin/env bash
set -euo pipefail
case "${1:-} ${2:-}" in
"create cluster") echo "kind: the node $SLIDEGATE_NODE_NAME is up (hack/node.sh)" ;;
"load image-archive") ctr --address "$SLIDEGATE_NODE_STATE/containerd/containerd.sock" -n k8s.io images import --all-platforms --digests "$3" ;;
*) echo "kind on the node: $* is not a command of docs/quickstart.md" >&2; exit 2 ;;
esac
`

// run runs script in bash -euo pipefail, as a session with every variable
// exported, and returns its output; it fails the test if the script fails.
func (s *docShell) run(ctx context.Context, t *testing.T, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 6*time.Minute)
	defer cancel()
	session := "set -a\n. " + s.env + "\n" + script + "\nexport -p >" + s.env + "\n"
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", session)
	cmd.Dir = s.root
	cmd.Env = append(os.Environ(), "PATH="+s.path)
	// Its own process group, so that what it left running goes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if err != nil && !errors.Is(err, exec.ErrWaitDelay) {
		t.Fatalf("%s\n%v\n%s", script, err, out)
	}
	return string(out)
}

// variable is the value a block gave the shell variable name.
func (s *docShell) variable(ctx context.Context, t *testing.T, name string) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, "bash", "-c", `. "$1"; printf %s "${!2}"`, "-", s.env, name).Output()
	if err != nil || len(out) == 0 {
		t.Fatalf("no %s in the quickstart's session: %v", name, err)
	}
	return string(out)
}

// docBlocks are the ```sh blocks of the Markdown section under heading
// (up to the next heading of its level or above): the commands a user
// copies.
func docBlocks(t *testing.T, path, heading string) []string {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	level := strings.IndexByte(heading, ' ')
	var (
		blocks                []string
		block                 strings.Builder
		in, found, fenced, sh bool
	)
	for _, line := range strings.Split(string(doc), "\n") {
		switch {
		case fenced && strings.HasPrefix(line, "```"):
			fenced = false
			if in && sh {
				blocks = append(blocks, block.String())
			}
		case fenced:
			block.WriteString(line + "\n")
		case strings.HasPrefix(line, "```"):
			fenced, sh = true, line == "```sh"
			block.Reset()
		case line == heading:
			in, found = true, true
		case strings.HasPrefix(line, "#"):
			// A heading of the section's level or above ends it.
			if h := strings.IndexByte(line, ' '); h > 0 && h <= level {
				in = false
			}
		}
	}
	if !found {
		t.Fatalf("%s: no heading %q", path, heading)
	}
	return blocks
}

// onlyBlock is the one ```sh block of the section under heading.
func onlyBlock(t *testing.T, path, heading string) string {
	t.Helper()
	blocks := docBlocks(t, path, heading)
	if len(blocks) != 1 {
		t.Fatalf("%s, %q: %d shell blocks, want 1", path, heading, len(blocks))
	}
	return blocks[0]
}
