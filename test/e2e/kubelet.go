package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// Sidecar is the sidecar binary running as a local process, started the way
// a kubelet would start the injected container: its args and environment
// from the pod spec, its volumes as directories. The only changes are paths
// and ports, which a pod has to itself and a shared machine does not.
type Sidecar struct {
	cmd      *exec.Cmd
	URL      string // the proxied listener (the pod's named port)
	AdminURL string // /metrics, /healthz, /readyz
	// DebugURL serves /debug/why and /debug/top, which kubectl slidegate
	// reaches through a port-forward (a kubelet's; here, directly).
	DebugURL string
	Args     []string
	// Log is the file the sidecar's output goes to.
	Log string
	// ConfigSyncs counts how often the ConfigMap content was (re)projected.
	configDir string
	last      string
}

// StartSidecar runs the injected sidecar of pod in front of upstream.
func (c *Cluster) StartSidecar(ctx context.Context, sidecarBin string, pod *corev1.Pod, upstream string, logf func(string, ...any), extraArgs ...string) (*Sidecar, error) {
	var spec *corev1.Container
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == inject.ContainerName {
			spec = &pod.Spec.InitContainers[i]
		}
	}
	if spec == nil {
		return nil, fmt.Errorf("pod %s has no %s container: the webhook did not inject it", pod.Name, inject.ContainerName)
	}
	root := filepath.Join(c.Dir, "pods", pod.Name)
	addrs, err := freeAddrs(3)
	if err != nil {
		return nil, err
	}
	listen, admin, debug := addrs[0], addrs[1], addrs[2]
	s := &Sidecar{URL: "http://" + listen, AdminURL: "http://" + admin, DebugURL: "http://" + debug}
	for _, a := range spec.Args {
		name, value, _ := strings.Cut(a, "=")
		switch name {
		case "--listen-address":
			a = name + "=" + listen
		case "--admin-address":
			a = name + "=" + admin
		case "--debug-address":
			a = name + "=" + debug
		case "--upstream":
			a = name + "=" + upstream
		case "--config-file", "--pod-labels-file", "--client-hash-key-file", "--redis-credentials-dir", "--redis-tls-dir":
			a = name + "=" + filepath.Join(root, value)
		}
		s.Args = append(s.Args, a)
	}

	// Volumes: the ConfigMap (kept in sync by the caller through Sync) and
	// the downward-API labels file.
	for _, m := range spec.VolumeMounts {
		dir := filepath.Join(root, m.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		switch m.Name {
		case inject.ConfigVolume:
			s.configDir = dir
		case inject.PodInfoVolume:
			if err := os.WriteFile(filepath.Join(dir, "labels"), []byte(downwardLabels(pod.Labels)), 0o644); err != nil {
				return nil, err
			}
		default:
			// An optional Secret volume (the client hash key, the Redis
			// credentials, the TLS files) as the kubelet fills it at start
			// (no later refresh here): the items it maps, those the Secret
			// has.
			if err := c.projectSecret(ctx, pod, m.Name, dir); err != nil {
				return nil, err
			}
		}
	}
	if err := c.SyncConfig(ctx, s, pod.Namespace); err != nil {
		return nil, err
	}

	env := []string{"PATH=" + os.Getenv("PATH")}
	for _, e := range spec.Env {
		v := e.Value
		if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
			var sec corev1.Secret
			err := c.Client.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: ref.SecretKeyRef.Name}, &sec)
			if err != nil && (ref.SecretKeyRef.Optional == nil || !*ref.SecretKeyRef.Optional) {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			v = string(sec.Data[ref.SecretKeyRef.Key])
		}
		env = append(env, e.Name+"="+v)
	}
	s.Args = append(s.Args, extraArgs...)
	s.Log = filepath.Join(c.Dir, "sidecar-"+pod.Name+".log")
	cmd := exec.CommandContext(ctx, sidecarBin, s.Args...)
	cmd.Env = env
	logf("starting the sidecar binary with the injected container's arguments:\n      %s %s", spec.Command[0], strings.Join(s.Args, " "))
	if err := c.procs.start(c.Dir, "sidecar-"+pod.Name, cmd); err != nil {
		return nil, err
	}
	s.cmd = cmd
	if err := waitHTTP(ctx, s.AdminURL+"/readyz", 30*time.Second); err != nil {
		return nil, fmt.Errorf("sidecar not ready (log: %s): %w", s.Log, err)
	}
	return s, nil
}

// LogTail returns the last n lines of the sidecar's output, for a failure's
// message (the directory is gone when the test ends).
func (s *Sidecar) LogTail(n int) string {
	b, err := os.ReadFile(s.Log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// projectSecret writes, into dir, the items of the pod's Secret volume
// named volume that its Secret holds; nothing for another kind of volume or
// a Secret that does not exist (the volumes are optional).
func (c *Cluster) projectSecret(ctx context.Context, pod *corev1.Pod, volume, dir string) error {
	for _, v := range pod.Spec.Volumes {
		if v.Name != volume || v.Secret == nil {
			continue
		}
		var sec corev1.Secret
		if err := c.Client.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: v.Secret.SecretName}, &sec); err != nil {
			return client.IgnoreNotFound(err)
		}
		for _, it := range v.Secret.Items {
			if b, ok := sec.Data[it.Key]; ok {
				if err := os.WriteFile(filepath.Join(dir, it.Path), b, 0o600); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Pid is the sidecar's process id.
func (s *Sidecar) Pid() int { return s.cmd.Process.Pid }

// Running reports whether the process is alive (signal 0 succeeds).
func (s *Sidecar) Running() bool { return s.cmd.Process.Signal(syscall.Signal(0)) == nil }

// SyncConfig projects the rendered ConfigMap into the sidecar's config
// directory the way the kubelet does: files in a timestamped directory, a
// ..data symlink swapped atomically, and file links through ..data. It
// does nothing when the content is unchanged.
func (c *Cluster) SyncConfig(ctx context.Context, s *Sidecar, namespace string) error {
	var cm corev1.ConfigMap
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: sidecarconfig.ConfigMapName}, &cm); err != nil {
		return fmt.Errorf("reading the rendered ConfigMap: %w", err)
	}
	keys := slices.Sorted(maps.Keys(cm.Data))
	var sum strings.Builder
	for _, k := range keys {
		sum.WriteString(k + "\x00" + cm.Data[k] + "\x00")
	}
	if sum.String() == s.last {
		return nil
	}
	ts := filepath.Join(s.configDir, "..."+strconv.FormatInt(time.Now().UnixNano(), 10))
	if err := os.MkdirAll(ts, 0o755); err != nil {
		return err
	}
	for _, k := range keys {
		if err := os.WriteFile(filepath.Join(ts, k), []byte(cm.Data[k]), 0o644); err != nil {
			return err
		}
	}
	tmp := filepath.Join(s.configDir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		return err
	}
	old, _ := os.Readlink(filepath.Join(s.configDir, "..data"))
	if err := os.Rename(tmp, filepath.Join(s.configDir, "..data")); err != nil {
		return err
	}
	for _, k := range keys {
		link := filepath.Join(s.configDir, k)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", k), link); err != nil {
				return err
			}
		}
	}
	if old != "" {
		_ = os.RemoveAll(filepath.Join(s.configDir, old))
	}
	s.last = sum.String()
	return nil
}

// KeepSynced projects the ConfigMap into s's config directory every 100ms
// until the cluster is closed, as the kubelet keeps ConfigMap volumes in
// sync. Close waits for it before it removes the directories.
func (c *Cluster) KeepSynced(s *Sidecar, namespace string) {
	c.syncs.Add(1)
	go func() {
		defer c.syncs.Done()
		for {
			_ = c.SyncConfig(c.syncCtx, s, namespace)
			select {
			case <-c.syncCtx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
}

// downwardLabels writes labels as the downward API does: key="value" lines,
// sorted, values quoted Go-style.
func downwardLabels(l map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(l)) {
		b.WriteString(k + "=" + strconv.Quote(l[k]) + "\n")
	}
	return b.String()
}
