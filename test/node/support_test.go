package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// node is the cluster hack/node.sh brought up; the test runs inside its
// network namespace, so pod and Service addresses are reachable directly.
type node struct {
	name  string
	ip    string
	root  string        // the repository
	sync  time.Duration // the kubelet's syncFrequency
	redis *redisProc
	// The administrative Redis identity (TestNode: the quickstart's).
	redisAdminUser, redisAdminPassword string
}

func nodeFromEnv() (*node, error) {
	n := &node{name: os.Getenv("SLIDEGATE_NODE_NAME"), ip: os.Getenv("SLIDEGATE_NODE_IP")}
	if n.name == "" || n.ip == "" || os.Getenv("KUBECONFIG") == "" {
		return nil, fmt.Errorf("not running on a node: run `make test-node` (hack/node.sh run -- go test ./test/node)")
	}
	d, err := time.ParseDuration(os.Getenv("SLIDEGATE_NODE_SYNC_FREQUENCY"))
	if err != nil {
		return nil, fmt.Errorf("SLIDEGATE_NODE_SYNC_FREQUENCY: %w", err)
	}
	n.sync = d
	if n.root, err = testsupport.RepoRoot(); err != nil {
		return nil, err
	}
	return n, nil
}

// kubectl runs kubectl against the node and returns its standard output.
func kubectl(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "kubectl", args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

func mustKubectl(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	out, err := kubectl(ctx, "", args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func getJSON(ctx context.Context, t *testing.T, v any, args ...string) {
	t.Helper()
	out := mustKubectl(ctx, t, append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("kubectl %v: %v", args, err)
	}
}

// eventually polls cond every interval until it returns nil or the timeout
// passes; it returns how long it took, or fails the test with cond's last
// error.
func eventually(t *testing.T, timeout, interval time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	var err error
	for {
		if err = cond(); err == nil {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: not after %s: %v", what, timeout, err)
		}
		time.Sleep(interval)
	}
}

// overlay writes a kustomization into a temporary directory inside config/
// (kustomize loads other kustomizations by relative path only) and returns
// that directory.
func (n *node) overlay(t *testing.T, kustomization string) string {
	t.Helper()
	dir, err := os.MkdirTemp(filepath.Join(n.root, "config"), ".node-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// redisProc is a redis-server on the node's address, behind the selector-less
// Service the default install points the manager at
// (redis.slidegate-system.svc.cluster.local:6379). Debian's redis-server is
// dynamically linked, so it runs as a process of the node instead of a pod.
type redisProc struct {
	bin  string
	addr string
	dir  string
	args []string // more redis-server arguments (an ACL file)
	cmd  *exec.Cmd
}

func startRedis(t *testing.T, ip string, args ...string) *redisProc {
	t.Helper()
	bin, err := testsupport.RedisServerPath()
	if err != nil {
		testsupport.Missing(t, "redis-server", err)
	}
	r := &redisProc{bin: bin, addr: net.JoinHostPort(ip, "6379"), dir: t.TempDir(), args: args}
	r.start(t)
	t.Cleanup(r.stop)
	return r
}

func (r *redisProc) start(t *testing.T) {
	t.Helper()
	host, port, _ := net.SplitHostPort(r.addr)
	r.cmd = exec.Command(r.bin, append([]string{"--bind", host, "--port", port, "--protected-mode", "no",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--logfile", filepath.Join(r.dir, "redis.log")}, r.args...)...)
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, 50*time.Millisecond, "redis-server up", func() error {
		c, err := net.DialTimeout("tcp", r.addr, time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// stop kills redis-server at once, as a crashed or evicted Redis would go.
func (r *redisProc) stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		r.cmd = nil
	}
}

// answer is one HTTP response as the test needs it.
type answer struct {
	code   int
	header http.Header
	body   string
}

// client opens a new connection per request, so that kube-proxy picks a
// backend per request, as it does for separate clients.
var client = &http.Client{
	Timeout:   5 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

func request(ctx context.Context, method, url string, header map[string]string) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return answer{}, err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, header: resp.Header, body: string(body)}, err
}
