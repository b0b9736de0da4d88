// Package inject adds slidegate's enforcement sidecar to a pod. It is a pure
// function from pod to pod: the admission webhook, the demo and the tests all
// call Inject, and nothing about the injected shape lives in an HTTP handler.
//
// Traffic takeover needs no iptables and no NET_ADMIN: the sidecar takes the
// NAME of the app's container port (e.g. "http") on its own listen port, and
// the app's port keeps its number but loses the name. A Service with
// `targetPort: http` then reaches the sidecar, which forwards to the app on
// 127.0.0.1:<app port>. A Service with a numeric targetPort bypasses the
// sidecar; the controller warns about those.
package inject

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/clienthash"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// Pod annotations (and a label) the injector reads.
const (
	// OptOutAnnotation set to "false", as a label or an annotation, keeps a
	// pod free of the sidecar even when a policy selects it. As a label it
	// also keeps the pod from reaching the webhook at all (objectSelector).
	OptOutAnnotation = "ratelimit.slidegate.dev/inject"
	// TargetPortAnnotation names the container port to take over, overriding
	// the policies' targetPort.
	TargetPortAnnotation = "ratelimit.slidegate.dev/target-port"
)

// Names of what the injector adds.
const (
	ContainerName  = "slidegate-sidecar"
	ConfigVolume   = "slidegate-config"
	PodInfoVolume  = "slidegate-podinfo"
	RedisTLSVolume = "slidegate-redis-tls"
	// ClientHashKeyVolume holds the namespace's client hash key (package
	// clienthash), from the mirrored Secret.
	ClientHashKeyVolume = "slidegate-client-hash-key"
	// NoAPITokenVolume is an empty directory the sidecar mounts where
	// Kubernetes mounts a ServiceAccount token (APITokenDir): the
	// ServiceAccount admission plugin mounts the pod's token into every
	// container that has nothing mounted there, and it runs again after the
	// webhooks when a webhook is reinvoked (ours is, IfNeeded). The sidecar
	// needs no API access, so it gets no token. See docs/operations.md.
	NoAPITokenVolume = "slidegate-no-api-token"
	APITokenDir      = "/var/run/secrets/kubernetes.io/serviceaccount"
	ConfigDir        = "/etc/slidegate/config"
	PodInfoDir       = "/etc/slidegate/podinfo"
	RedisTLSDir      = "/etc/slidegate/redis-tls"
	ClientHashKeyDir = "/etc/slidegate/client-hash"
	AdminPortName    = "sg-admin"
	// DebugPortName is the sidecar's /debug port, on 127.0.0.1 only: it is
	// declared so that kubectl slidegate (and kubectl port-forward) find
	// it by name, and so that the port check covers it; nothing outside
	// the pod can connect to it, a port-forward (pods/portforward) can.
	DebugPortName  = "sg-debug"
	statusVersion  = "v1"
	sidecarUID     = 65532
	podLabelsFile  = "labels"
	defaultCommand = "/sidecar"
)

// The defaults of Options that the manager and the controller share.
const (
	// DefaultImage is the sidecar image when Options.Image is empty, and
	// the default of the manager's --sidecar-image.
	DefaultImage = "ghcr.io/slidegate/slidegate:latest"
	// DefaultTargetPort is the port name taken over when Options.TargetPort
	// is empty: the RateLimitPolicy schema's default targetPort (the
	// +kubebuilder:default marker cannot name a Go constant).
	DefaultTargetPort = "http"
	// DefaultListenPort and DefaultAdminPort are the sidecar's ports when
	// Options.ListenPort and Options.AdminPort are 0, and the defaults of
	// the manager's --sidecar-listen-port and --sidecar-admin-port. They
	// avoid 15000-15090, which Istio reserves for its sidecar (see
	// v1alpha1.SidecarPort).
	DefaultListenPort = v1alpha1.SidecarPort
	DefaultAdminPort  = v1alpha1.SidecarAdminPort
	// DefaultDebugPort is the sidecar's loopback /debug port when
	// Options.DebugPort is 0, next to the admin port.
	DefaultDebugPort = v1alpha1.SidecarAdminPort + 1
)

// Options shape the injected sidecar. Zero values take the defaults.
type Options struct {
	Image           string
	ImagePullPolicy corev1.PullPolicy
	// SidecarVersion is the slidegate release of Image, recorded in the
	// injection status (the manager's own, version.Get: the sidecar image
	// is the manager's). The status also records the sidecar's config
	// minor version, sidecarconfig.Minor, so the controller renders a
	// document every sidecar of the namespace reads.
	SidecarVersion string
	// TargetPort is the name of the app's container port to take over.
	TargetPort string
	// ListenPort is the port the sidecar proxies on, under the target
	// port's name; AdminPort serves its /metrics and probes
	// (AdminPortName); DebugPort its /debug, on 127.0.0.1 only
	// (DebugPortName). None may be a port any container of the pod
	// declares (ErrPortInUse). Validate checks them.
	ListenPort int32
	AdminPort  int32
	DebugPort  int32
	// Redis is the shared Redis. The sidecar gets its topology and TLS
	// switch (Mode, Addrs, MasterName, TLS, TLSServerName) as flags; its
	// credentials and TLS files come from the mirrored Secret
	// (v1alpha1.RedisCredentialsSecretName), the rest is ignored.
	Redis redisconn.Config
	// FallbackReplicas is the share divisor of fail-open decisions
	// (ceil(limit / replicas) per pod while Redis is unreachable).
	FallbackReplicas int32
	Resources        corev1.ResourceRequirements
}

// ErrInvalidPorts means Options name sidecar ports that cannot work.
var ErrInvalidPorts = errors.New("invalid sidecar ports")

// Validate reports sidecar ports that cannot work: out of 1-65535, or one
// port for two uses. Zero ports are valid: they take the defaults.
func (o Options) Validate() error {
	o = withDefaults(o)
	ports := []struct {
		name string
		port int32
	}{{"listen", o.ListenPort}, {"admin", o.AdminPort}, {"debug", o.DebugPort}}
	for i, p := range ports {
		if p.port < 1 || p.port > 65535 {
			return fmt.Errorf("%w: the %s port %d is not a port number (1-65535)", ErrInvalidPorts, p.name, p.port)
		}
		for _, q := range ports[:i] {
			if p.port == q.port {
				return fmt.Errorf("%w: the %s and %s ports are both %d; they must differ", ErrInvalidPorts, q.name, p.name, p.port)
			}
		}
	}
	return nil
}

// Status is recorded in v1alpha1.InjectedAnnotation: what was injected, and
// what re-injection needs to reproduce it (the app port lost its name).
type Status = v1alpha1.InjectionStatus

// ErrPortInUse means an app container already uses a port the sidecar
// listens on; the pod would not work with both.
var ErrPortInUse = errors.New("port already used by the pod")

// portsFree checks that no container but our own uses the sidecar's ports.
func portsFree(pod *corev1.Pod, o Options) error {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if c.Name == ContainerName {
				continue
			}
			for _, p := range c.Ports {
				if p.ContainerPort == o.ListenPort || p.ContainerPort == o.AdminPort || p.ContainerPort == o.DebugPort {
					return fmt.Errorf("%w: container %s port %d is one of the sidecar's (%d, %d, %d)", ErrPortInUse, c.Name, p.ContainerPort, o.ListenPort, o.AdminPort, o.DebugPort)
				}
			}
		}
	}
	return nil
}

// ErrNoTargetPort means no container of the pod has the port to take over,
// so the sidecar cannot sit in front of the app.
var ErrNoTargetPort = errors.New("no container port with that name")

// SkipReason says why a pod must not get the sidecar whatever the policies
// say, or "" when it may.
func SkipReason(pod *corev1.Pod) string {
	switch {
	case pod.Spec.HostNetwork:
		// The sidecar's ports would be the node's ports.
		return "pod uses hostNetwork"
	case OptedOut(pod.Annotations, pod.Labels):
		return "pod opted out with " + OptOutAnnotation + "=false"
	}
	return ""
}

// OptedOut reports whether a pod with these annotations and labels opted
// out of injection (OptOutAnnotation=false as either). The status logic,
// which sees only the pods' metadata, asks it too, so both agree.
func OptedOut(annotations, labels map[string]string) bool {
	return strings.EqualFold(annotations[OptOutAnnotation], "false") || strings.EqualFold(labels[OptOutAnnotation], "false")
}

// Inject adds the sidecar to pod, in place. Injecting an injected pod
// changes nothing: Inject(Inject(p)) == Inject(p).
func Inject(pod *corev1.Pod, opts Options) error {
	opts = withDefaults(opts)
	if err := opts.Validate(); err != nil {
		return err
	}
	if t := pod.Annotations[TargetPortAnnotation]; t != "" {
		opts.TargetPort = t
	}
	if err := portsFree(pod, opts); err != nil {
		return err
	}
	st, err := takeOver(pod, opts.TargetPort)
	if err != nil {
		return err
	}
	st.SidecarVersion, st.ConfigMinor = opts.SidecarVersion, sidecarconfig.Minor
	raw, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[v1alpha1.InjectedAnnotation] = string(raw)

	c := sidecar(opts, st)
	if i := indexContainer(pod.Spec.InitContainers, ContainerName); i >= 0 {
		pod.Spec.InitContainers[i] = c
	} else {
		// First, so it is up before any other init container sends traffic.
		pod.Spec.InitContainers = append([]corev1.Container{c}, pod.Spec.InitContainers...)
	}
	setVolume(pod, corev1.Volume{Name: ConfigVolume, VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: sidecarconfig.ConfigMapName},
			// The controller writes it shortly after the first policy; the
			// sidecar stays unready until it appears, the pod still starts.
			Optional: ptr.To(true),
		},
	}})
	setVolume(pod, corev1.Volume{Name: PodInfoVolume, VolumeSource: corev1.VolumeSource{
		DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{{
			Path: podLabelsFile, FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.labels"},
		}}},
	}})
	setVolume(pod, corev1.Volume{Name: NoAPITokenVolume, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{},
	}})
	// The namespace's client hash key only, optional: the controller may
	// mirror it after the pod starts (a Deployment applied with its first
	// policy); the kubelet then fills the volume on its next pod sync, and
	// the sidecar reads it again with its config.
	setVolume(pod, corev1.Volume{Name: ClientHashKeyVolume, VolumeSource: corev1.VolumeSource{
		Secret: &corev1.SecretVolumeSource{
			SecretName:  v1alpha1.RedisCredentialsSecretName,
			Items:       []corev1.KeyToPath{{Key: clienthash.SecretDataKey, Path: clienthash.SecretDataKey}},
			DefaultMode: ptr.To[int32](0o444),
			Optional:    ptr.To(true),
		},
	}})
	if opts.Redis.TLS {
		// Only the TLS keys of the mirrored Secret, each optional: a CA
		// alone, or none (system roots), is as valid as a client
		// certificate. The kubelet updates the files when the Secret
		// changes, and the sidecar reads them for every new connection.
		var items []corev1.KeyToPath
		for _, k := range []string{v1alpha1.RedisTLSCAKey, v1alpha1.RedisTLSCertKey, v1alpha1.RedisTLSKeyKey} {
			items = append(items, corev1.KeyToPath{Key: k, Path: k})
		}
		setVolume(pod, corev1.Volume{Name: RedisTLSVolume, VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{
				SecretName:  v1alpha1.RedisCredentialsSecretName,
				Items:       items,
				DefaultMode: ptr.To[int32](0o444),
				Optional:    ptr.To(true),
			},
		}})
	} else {
		// Re-injection without TLS: the sidecar no longer mounts it.
		pod.Spec.Volumes = slices.DeleteFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == RedisTLSVolume })
	}
	return nil
}

// takeOver moves the name of the target port from the app's container to the
// sidecar and returns what was done. On an injected pod it returns the
// recorded status instead, so re-injection reproduces the same pod.
func takeOver(pod *corev1.Pod, target string) (Status, error) {
	if prev, ok := pod.Annotations[v1alpha1.InjectedAnnotation]; ok && indexContainer(pod.Spec.InitContainers, ContainerName) >= 0 {
		var st Status
		if err := json.Unmarshal([]byte(prev), &st); err == nil && st.Version == statusVersion && st.AppPort > 0 {
			return st, nil
		}
	}
	for ci := range pod.Spec.Containers {
		c := &pod.Spec.Containers[ci]
		for pi := range c.Ports {
			p := &c.Ports[pi]
			if p.Name != target || (p.Protocol != "" && p.Protocol != corev1.ProtocolTCP) {
				continue
			}
			p.Name = ""
			// Probes and lifecycle hooks addressing the port by name would
			// no longer resolve.
			for _, pr := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
				if pr != nil {
					renumber(pr.HTTPGet, pr.TCPSocket, target, p.ContainerPort)
				}
			}
			if lc := c.Lifecycle; lc != nil {
				for _, h := range []*corev1.LifecycleHandler{lc.PostStart, lc.PreStop} {
					if h != nil {
						renumber(h.HTTPGet, h.TCPSocket, target, p.ContainerPort)
					}
				}
			}
			return Status{Version: statusVersion, Container: ContainerName, TargetPort: target, AppContainer: c.Name, AppPort: p.ContainerPort}, nil
		}
	}
	return Status{}, fmt.Errorf("%w %q (name the app's port, or set %s)", ErrNoTargetPort, target, TargetPortAnnotation)
}

func renumber(get *corev1.HTTPGetAction, tcp *corev1.TCPSocketAction, name string, port int32) {
	num := intstr.FromInt32(port)
	if get != nil && get.Port.Type == intstr.String && get.Port.StrVal == name {
		get.Port = num
	}
	if tcp != nil && tcp.Port.Type == intstr.String && tcp.Port.StrVal == name {
		tcp.Port = num
	}
}

func sidecar(o Options, st Status) corev1.Container {
	args := []string{
		"--listen-address=:" + strconv.Itoa(int(o.ListenPort)),
		"--admin-address=:" + strconv.Itoa(int(o.AdminPort)),
		"--debug-address=127.0.0.1:" + strconv.Itoa(int(o.DebugPort)),
		"--upstream=http://127.0.0.1:" + strconv.Itoa(int(st.AppPort)),
		"--config-file=" + ConfigDir + "/" + sidecarconfig.FileName,
		"--pod-labels-file=" + PodInfoDir + "/" + podLabelsFile,
		"--fallback-replicas=" + strconv.Itoa(int(o.FallbackReplicas)),
		"--client-hash-key-file=" + ClientHashKeyDir + "/" + clienthash.SecretDataKey,
	}
	if o.Redis.Mode != "" {
		args = append(args, "--redis-mode="+string(o.Redis.Mode))
	}
	if len(o.Redis.Addrs) > 0 {
		args = append(args, "--redis-addrs="+strings.Join(o.Redis.Addrs, ","))
	}
	if o.Redis.MasterName != "" {
		args = append(args, "--redis-master-name="+o.Redis.MasterName)
	}
	if o.Redis.TLS {
		args = append(args, "--redis-tls", "--redis-tls-dir="+RedisTLSDir)
		if o.Redis.TLSServerName != "" {
			args = append(args, "--redis-tls-server-name="+o.Redis.TLSServerName)
		}
	}
	secretEnv := func(env, key string) corev1.EnvVar {
		return corev1.EnvVar{Name: env, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: v1alpha1.RedisCredentialsSecretName},
			Key:                  key,
			// A Redis without ACLs needs no Secret.
			Optional: ptr.To(true),
		}}}
	}
	probe := func(path string) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString(AdminPortName)}},
			PeriodSeconds: 5, FailureThreshold: 3, TimeoutSeconds: 1,
		}
	}
	startup := probe("/healthz")
	startup.PeriodSeconds, startup.FailureThreshold = 1, 30
	mounts := []corev1.VolumeMount{
		{Name: ConfigVolume, MountPath: ConfigDir, ReadOnly: true},
		{Name: PodInfoVolume, MountPath: PodInfoDir, ReadOnly: true},
		{Name: NoAPITokenVolume, MountPath: APITokenDir, ReadOnly: true},
		{Name: ClientHashKeyVolume, MountPath: ClientHashKeyDir, ReadOnly: true},
	}
	if o.Redis.TLS {
		mounts = append(mounts, corev1.VolumeMount{Name: RedisTLSVolume, MountPath: RedisTLSDir, ReadOnly: true})
	}
	return corev1.Container{
		Name:            ContainerName,
		Image:           o.Image,
		ImagePullPolicy: o.ImagePullPolicy,
		Command:         []string{defaultCommand},
		Args:            args,
		// A native sidecar: started before the app, stopped after it.
		RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		Ports: []corev1.ContainerPort{
			{Name: st.TargetPort, ContainerPort: o.ListenPort, Protocol: corev1.ProtocolTCP},
			{Name: AdminPortName, ContainerPort: o.AdminPort, Protocol: corev1.ProtocolTCP},
			{Name: DebugPortName, ContainerPort: o.DebugPort, Protocol: corev1.ProtocolTCP},
		},
		Env: []corev1.EnvVar{
			secretEnv(redisconn.EnvUsername, v1alpha1.RedisUsernameKey), secretEnv(redisconn.EnvPassword, v1alpha1.RedisPasswordKey),
			secretEnv(redisconn.EnvSentinelUsername, v1alpha1.RedisSentinelUsernameKey), secretEnv(redisconn.EnvSentinelPassword, v1alpha1.RedisSentinelPasswordKey),
		},
		Resources: o.Resources,
		// The app starts once the proxy listens; readiness also needs a
		// loaded config and a usable limiter.
		StartupProbe:   startup,
		LivenessProbe:  probe("/healthz"),
		ReadinessProbe: probe("/readyz"),
		VolumeMounts:   mounts,
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			RunAsUser:                ptr.To[int64](sidecarUID),
			RunAsGroup:               ptr.To[int64](sidecarUID),
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
}

func withDefaults(o Options) Options {
	if o.Image == "" {
		o.Image = DefaultImage
	}
	if o.ImagePullPolicy == "" {
		o.ImagePullPolicy = corev1.PullIfNotPresent
	}
	if o.TargetPort == "" {
		o.TargetPort = DefaultTargetPort
	}
	if o.ListenPort == 0 {
		o.ListenPort = DefaultListenPort
	}
	if o.AdminPort == 0 {
		o.AdminPort = DefaultAdminPort
	}
	if o.DebugPort == 0 {
		o.DebugPort = DefaultDebugPort
	}
	if o.FallbackReplicas < 1 {
		o.FallbackReplicas = 1
	}
	if o.Resources.Requests == nil && o.Resources.Limits == nil {
		o.Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
		}
	}
	return o
}

func indexContainer(cs []corev1.Container, name string) int {
	for i := range cs {
		if cs[i].Name == name {
			return i
		}
	}
	return -1
}

func setVolume(pod *corev1.Pod, v corev1.Volume) {
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == v.Name {
			pod.Spec.Volumes[i] = v
			return
		}
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, v)
}
