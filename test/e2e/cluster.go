// Package e2e runs slidegate's whole flow on one machine with no cluster:
// a real API server and etcd (envtest), a real redis-server, the manager
// binary (controller and webhook), and the sidecar binary started exactly as
// the injected pod spec says, in front of a small local upstream. `make demo`
// prints it; the e2e test asserts it.
package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// Scheme knows the built-in kinds and RateLimitPolicy.
var Scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}()

// processes tracks every child process so Close can stop them all.
type processes struct {
	mu    sync.Mutex
	procs []*exec.Cmd
}

func (p *processes) start(logDir, name string, cmd *exec.Cmd) error {
	f, err := os.Create(filepath.Join(logDir, name+".log"))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = f, f
	// Children die with us even if we are killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	p.mu.Lock()
	p.procs = append(p.procs, cmd)
	p.mu.Unlock()
	return nil
}

// stopAll sends SIGTERM, waits a little, then kills.
func (p *processes) stopAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.procs) - 1; i >= 0; i-- {
		c := p.procs[i]
		_ = c.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
	}
	p.procs = nil
}

// Cluster is the local stand-in for a Kubernetes cluster with slidegate
// installed: control plane, Redis and the manager process.
type Cluster struct {
	Env        *envtest.Environment
	Client     client.Client
	Redis      *testsupport.Redis
	Kubeconfig string
	Dir        string

	procs processes
	// syncCtx ends at Close, which waits for the syncs (KeepSynced).
	syncCtx  context.Context
	stopSync context.CancelFunc
	syncs    sync.WaitGroup
}

// StartCluster starts the control plane (with slidegate's CRD and the
// webhook configuration that config/webhook renders, pointed at the local
// manager), a redis-server, and the manager binary.
func StartCluster(ctx context.Context, managerBin string, logf func(string, ...any)) (*Cluster, error) {
	c := &Cluster{}
	c.syncCtx, c.stopSync = context.WithCancel(context.WithoutCancel(ctx))
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()
	var err error
	if c.Dir, err = os.MkdirTemp("", "slidegate-e2e-"); err != nil {
		return nil, err
	}
	logf("starting the control plane (kube-apiserver and etcd from bin/envtest)")
	if c.Env, err = testsupport.NewEnvironment(); err != nil {
		return nil, err
	}
	hooks, err := testsupport.RenderedWebhooks()
	if err != nil {
		return nil, err
	}
	c.Env.WebhookInstallOptions = envtest.WebhookInstallOptions{MutatingWebhooks: hooks}
	c.Env.Scheme = Scheme
	if _, err := c.Env.Start(); err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	if c.Client, err = client.New(c.Env.Config, client.Options{Scheme: Scheme}); err != nil {
		return nil, err
	}
	// The manager's namespace, as an install has it: the manager keeps its
	// install key there, from which it derives the namespaces' Redis
	// passwords (without it the policies are not Ready).
	if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "slidegate-system"}}); err != nil {
		return nil, err
	}
	admin, err := c.Env.AddUser(envtest.User{Name: "slidegate-demo", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, err
	}
	kc, err := admin.KubeConfig()
	if err != nil {
		return nil, err
	}
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err := os.WriteFile(c.Kubeconfig, kc, 0o600); err != nil {
		return nil, err
	}

	logf("starting redis-server")
	if c.Redis, err = testsupport.NewRedis(); err != nil {
		return nil, err
	}

	logf("starting the manager (controller and webhook)")
	wo := &c.Env.WebhookInstallOptions
	probes, err := freeAddrs(1)
	if err != nil {
		return nil, err
	}
	probe := probes[0]
	mgr := exec.CommandContext(ctx, managerBin,
		"--health-probe-bind-address="+probe,
		"--metrics-bind-address=0",
		"--webhook-host="+wo.LocalServingHost,
		"--webhook-port="+strconv.Itoa(wo.LocalServingPort),
		"--webhook-cert-dir="+wo.LocalServingCertDir,
		"--cert-mode=external",
		"--sidecar-image=ghcr.io/slidegate/slidegate:demo",
		"--redis-addrs="+c.Redis.Addr,
		"--trusted-proxies=10.0.0.0/8",
	)
	mgr.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig, "POD_NAMESPACE=slidegate-system")
	if err := c.procs.start(c.Dir, "manager", mgr); err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, "http://"+probe+"/readyz", 60*time.Second); err != nil {
		return nil, fmt.Errorf("manager not ready (log: %s): %w", filepath.Join(c.Dir, "manager.log"), err)
	}
	ok = true
	return c, nil
}

// Kubectl runs kubectl against the local control plane.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "kubectl", args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// Close stops every process and the control plane, and removes the files.
func (c *Cluster) Close() {
	c.stopSync()
	c.syncs.Wait()
	c.procs.stopAll()
	if c.Redis != nil {
		c.Redis.Close()
	}
	if c.Env != nil && c.Env.ControlPlane.APIServer != nil {
		_ = c.Env.Stop()
	}
	if c.Dir != "" && os.Getenv("SLIDEGATE_KEEP_LOGS") == "" {
		_ = os.RemoveAll(c.Dir)
	}
}

// freeAddrs returns n distinct loopback addresses that were free a moment
// ago; all n are held open together so the kernel cannot hand out one port
// twice.
func freeAddrs(n int) ([]string, error) {
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer func() { _ = l.Close() }()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

func waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("%s: %d %s", url, resp.StatusCode, strings.TrimSpace(string(body)))
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
