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
//
// Nothing a pod brings counts as injection: Inject takes off any sidecar
// and injection status the pod carries before injecting it afresh, Remove
// takes them off pods the webhook does not inject, and ReadGuard (guard.go)
// reads what a pod's sidecar guards from its spec alone.
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
	// pod free of the sidecar even when a policy selects it, unless its
	// namespace requires injection (v1alpha1.InjectionRequired): there the
	// webhook refuses the pod. Opted-out pods still pass the webhook, which
	// strips a sidecar or status they bring (Remove).
	OptOutAnnotation = "ratelimit.slidegate.dev/inject"
	// TargetPortAnnotation names the container port to take over, overriding
	// the policies' targetPort.
	TargetPortAnnotation = "ratelimit.slidegate.dev/target-port"
)

// Names of what the injector adds.
const (
	ContainerName  = v1alpha1.SidecarContainerName
	ConfigVolume   = "slidegate-config"
	PodInfoVolume  = "slidegate-podinfo"
	RedisTLSVolume = "slidegate-redis-tls"
	// RedisCredentialsVolume holds the sidecar's Redis credentials, from
	// the namespace's Secret: the keys of its identity under the file
	// names redisconn.Credentials*File, read for every new connection.
	RedisCredentialsVolume = "slidegate-redis-credentials"
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
	// RedisCredentialsDir is where RedisCredentialsVolume is mounted.
	RedisCredentialsDir = "/etc/slidegate/redis-credentials"
	ClientHashKeyDir    = "/etc/slidegate/client-hash"
	AdminPortName       = "sg-admin"
	// DebugPortName is the sidecar's /debug port, on 127.0.0.1 only: it is
	// declared so that kubectl slidegate (and kubectl port-forward) find
	// it by name, and so that the port check covers it; nothing outside
	// the pod can connect to it, a port-forward (pods/portforward) can.
	DebugPortName  = v1alpha1.SidecarDebugPortName
	statusVersion  = "v1"
	sidecarUID     = 65532
	podLabelsFile  = "labels"
	defaultCommand = "/sidecar"
)

// The defaults of Options that the manager and the controller share.
const (
	// ImageRepository is the release image's name (make image); the
	// sidecar image is ImageRepository:<release> when Options.Image is
	// empty (ReleaseImage), and the manager's --sidecar-image default.
	ImageRepository = "ghcr.io/slidegate/slidegate"
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
	// RedisIdentity is the Redis identity the sidecar authenticates as:
	// v1alpha1.RedisIdentityNamespace (the namespace's own user, from the
	// Secret's namespace-username and namespace-password, deciding through
	// the Functions library) or, empty, v1alpha1.RedisIdentityShared (the
	// user shared by every namespace, username and password, sending the
	// scripts). It is recorded in the injection status, so the controller
	// keeps the shared credentials where a sidecar uses them.
	RedisIdentity string
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

// NamespaceOptedIn reports whether a namespace with these labels has its
// pods injected (v1alpha1.InjectionLabel enabled or required).
func NamespaceOptedIn(labels map[string]string) bool {
	v := labels[v1alpha1.InjectionLabel]
	return v == v1alpha1.InjectionEnabled || v == v1alpha1.InjectionRequired
}

// NamespaceRequires reports whether a namespace with these labels lets no
// pod opt out (v1alpha1.InjectionRequired).
func NamespaceRequires(labels map[string]string) bool {
	return labels[v1alpha1.InjectionLabel] == v1alpha1.InjectionRequired
}

// OptedOut reports whether a pod with these annotations and labels opted
// out of injection (OptOutAnnotation=false as either). The status logic,
// which sees only the pods' metadata, asks it too, so both agree.
func OptedOut(annotations, labels map[string]string) bool {
	return strings.EqualFold(annotations[OptOutAnnotation], "false") || strings.EqualFold(labels[OptOutAnnotation], "false")
}

// ErrReservedName means a regular container of the pod has the sidecar's
// name: the injector adds the sidecar as an init container of that name,
// and a container that only looks like it must not pass for it.
var ErrReservedName = errors.New("container name reserved for slidegate's sidecar")

// Inject adds the sidecar to pod, in place. Injecting an injected pod
// changes nothing: Inject(Inject(p)) == Inject(p).
//
// Nothing the pod brings is taken on trust: an injection status
// (v1alpha1.InjectedAnnotation) and an init container named like the
// sidecar are first taken off (release), whoever wrote them, and the pod is
// injected as if it had never been. The status only says where the app's
// port names and hostPorts went, and they are given back only from the
// sidecar being replaced. So a pod author's forged status or look-alike
// container is replaced by the real sidecar; the webhook's reinvocation
// (reinvocationPolicy IfNeeded), which cannot be told apart from a forged
// pod, and a pod re-created from a template copied off an injected pod
// (kubectl get -o yaml) get exactly what a fresh pod gets.
func Inject(pod *corev1.Pod, opts Options) error {
	opts = withDefaults(opts)
	if err := opts.Validate(); err != nil {
		return err
	}
	if t := pod.Annotations[TargetPortAnnotation]; t != "" {
		opts.TargetPort = t
	}
	work := pod.DeepCopy()
	at, err := release(work)
	if err != nil {
		return err
	}
	if err := portsFree(work, opts); err != nil {
		return err
	}
	st, err := takeOver(work, opts.TargetPort, opts.ListenPort)
	if err != nil {
		return err
	}
	st.SidecarVersion, st.ConfigMinor, st.RedisIdentity = opts.SidecarVersion, sidecarconfig.Minor, opts.RedisIdentity
	raw, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if work.Annotations == nil {
		work.Annotations = map[string]string{}
	}
	work.Annotations[v1alpha1.InjectedAnnotation] = string(raw)

	// Where the replaced sidecar was, so that a reinvocation moves nothing;
	// first otherwise, so that it is up before any other init container
	// sends traffic.
	work.Spec.InitContainers = slices.Insert(work.Spec.InitContainers, max(at, 0), sidecar(opts, st))
	setVolume(work, corev1.Volume{Name: ConfigVolume, VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: sidecarconfig.ConfigMapName},
			// The controller writes it shortly after the first policy; the
			// sidecar stays unready until it appears, the pod still starts.
			Optional: ptr.To(true),
		},
	}})
	setVolume(work, corev1.Volume{Name: PodInfoVolume, VolumeSource: corev1.VolumeSource{
		DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{{
			Path: podLabelsFile, FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.labels"},
		}}},
	}})
	setVolume(work, corev1.Volume{Name: NoAPITokenVolume, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{},
	}})
	// The namespace's client hash key only, optional: the controller may
	// mirror it after the pod starts (a Deployment applied with its first
	// policy); the kubelet then fills the volume on its next pod sync, and
	// the sidecar reads it again with its config.
	setVolume(work, corev1.Volume{Name: ClientHashKeyVolume, VolumeSource: corev1.VolumeSource{
		Secret: &corev1.SecretVolumeSource{
			SecretName:  v1alpha1.RedisCredentialsSecretName,
			Items:       []corev1.KeyToPath{{Key: clienthash.SecretDataKey, Path: clienthash.SecretDataKey}},
			DefaultMode: ptr.To[int32](0o444),
			Optional:    ptr.To(true),
		},
	}})
	setVolume(work, corev1.Volume{Name: RedisCredentialsVolume, VolumeSource: corev1.VolumeSource{
		Secret: &corev1.SecretVolumeSource{
			SecretName: v1alpha1.RedisCredentialsSecretName,
			Items:      credentialItems(opts.RedisIdentity),
			// Readable by the sidecar's non-root user (files of a Secret
			// volume are root's); only the sidecar mounts the volume.
			DefaultMode: ptr.To[int32](0o444),
			// A Redis without AUTH needs none; the controller may write them
			// after the pod starts (its first policy): the kubelet fills the
			// volume on its next sync of the pod, and the sidecar reads the
			// files for every new connection.
			Optional: ptr.To(true),
		},
	}})
	if opts.Redis.TLS {
		// Only the TLS keys of the mirrored Secret, each optional: a CA
		// alone, or none (system roots), is as valid as a client
		// certificate. The kubelet updates the files when the Secret
		// changes, and the sidecar reads them for every new connection.
		var items []corev1.KeyToPath
		for _, k := range []string{redisconn.SecretTLSCAKey, redisconn.SecretTLSCertKey, redisconn.SecretTLSKeyKey} {
			items = append(items, corev1.KeyToPath{Key: k, Path: k})
		}
		setVolume(work, corev1.Volume{Name: RedisTLSVolume, VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{
				SecretName:  v1alpha1.RedisCredentialsSecretName,
				Items:       items,
				DefaultMode: ptr.To[int32](0o444),
				Optional:    ptr.To(true),
			},
		}})
	} else {
		// Re-injection without TLS: the sidecar no longer mounts it.
		work.Spec.Volumes = slices.DeleteFunc(work.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == RedisTLSVolume })
	}
	*pod = *work
	return nil
}

// Remove takes the sidecar off pod, in place, with everything that marks
// the pod as injected: the init container named like the sidecar, the
// injection status, and the volumes only the sidecar mounted. The app gets
// back the port names and hostPorts the sidecar took (as far as the
// sidecar being removed holds them). The webhook calls it on every pod it
// admits without injecting, so that no pod carries a sidecar or a status
// it did not write. A pod without those marks is left as it is.
func Remove(pod *corev1.Pod) error {
	work := pod.DeepCopy()
	if _, err := release(work); err != nil {
		return err
	}
	mounted := map[string]bool{}
	for _, cs := range [][]corev1.Container{work.Spec.InitContainers, work.Spec.Containers} {
		for _, c := range cs {
			for _, m := range c.VolumeMounts {
				mounted[m.Name] = true
			}
		}
	}
	ours := []string{ConfigVolume, PodInfoVolume, NoAPITokenVolume, RedisTLSVolume, ClientHashKeyVolume, RedisCredentialsVolume}
	work.Spec.Volumes = slices.DeleteFunc(work.Spec.Volumes, func(v corev1.Volume) bool {
		return slices.Contains(ours, v.Name) && !mounted[v.Name]
	})
	*pod = *work
	return nil
}

// release takes off what an earlier injection, real or forged, put on the
// pod: the init containers named like the sidecar and the injection status.
// The port names and hostPorts the status says were moved to the sidecar
// go back to the app's ports, but only those the removed sidecar holds (and
// the first container publishes on its port): a forged status cannot add a
// name or a hostPort that was not in the pod.
// It returns where the (first) removed sidecar was, or -1.
func release(pod *corev1.Pod) (int, error) {
	if slices.ContainsFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == ContainerName }) {
		return -1, fmt.Errorf("%w: regular container %q; rename it", ErrReservedName, ContainerName)
	}
	at := sidecarIndex(pod.Spec.InitContainers)
	if at < 0 {
		delete(pod.Annotations, v1alpha1.InjectedAnnotation)
		return -1, nil
	}
	if raw, ok := pod.Annotations[v1alpha1.InjectedAnnotation]; ok {
		var st Status
		if err := json.Unmarshal([]byte(raw), &st); err == nil && st.Version == statusVersion {
			giveBack(pod, st, pod.Spec.InitContainers[at])
		}
		delete(pod.Annotations, v1alpha1.InjectedAnnotation)
	}
	pod.Spec.InitContainers = slices.DeleteFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == ContainerName })
	return at, nil
}

// giveBack returns to the app's port entries that st records the name
// that sidecar holds, and the hostPorts that the first container's entries
// publish on sidecar's listen port (takeOver put them there), removing
// those entries.
func giveBack(pod *corev1.Pod, st Status, sidecar corev1.Container) {
	records := st.TakenOver
	if len(records) == 0 && st.AppPort > 0 {
		// A status of before TakenOver: the app's port lost its name only.
		records = []v1alpha1.TakenOverPort{{Container: st.AppContainer, Port: st.AppPort, Named: true}}
	}
	var listen int32 // the sidecar's listen port: where it holds the name
	for _, p := range sidecar.Ports {
		if st.TargetPort != "" && p.Name == st.TargetPort {
			listen = p.ContainerPort
			break
		}
	}
	if listen == 0 {
		return // nothing taken is held by this sidecar
	}
	for _, r := range records {
		c := appContainer(pod, r.Container)
		if c == nil {
			continue
		}
		name := r.Named && !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == st.TargetPort })
		host := r.HostPort != 0 && unpublish(pod, listen, r.HostPort, r.HostIP)
		if !name && !host {
			continue
		}
		for i := range c.Ports {
			p := &c.Ports[i]
			if p.ContainerPort != r.Port || !isTCP(p.Protocol) || name && p.Name != "" || host && p.HostPort != 0 {
				continue
			}
			if name {
				p.Name = st.TargetPort
			}
			if host {
				p.HostPort, p.HostIP = r.HostPort, r.HostIP
			}
			break
		}
	}
}

// publish adds to the pod's first container an entry that publishes the
// sidecar's listen port on the node as hostPort (on hostIP): the kubelet
// publishes the hostPorts of regular containers only, never of init
// containers, native sidecars included, and a hostPort maps to a port of
// the pod's one network namespace, whichever container declares it.
func publish(pod *corev1.Pod, listen, hostPort int32, hostIP string) {
	c := &pod.Spec.Containers[0]
	c.Ports = append(c.Ports, corev1.ContainerPort{ContainerPort: listen, Protocol: corev1.ProtocolTCP, HostPort: hostPort, HostIP: hostIP})
}

// unpublish removes the entry publish added, and reports whether there was
// one.
func unpublish(pod *corev1.Pod, listen, hostPort int32, hostIP string) bool {
	if len(pod.Spec.Containers) == 0 {
		return false
	}
	c := &pod.Spec.Containers[0]
	i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool {
		return p.ContainerPort == listen && p.HostPort == hostPort && p.HostIP == hostIP && isTCP(p.Protocol) && p.Name == ""
	})
	if i < 0 {
		return false
	}
	c.Ports = slices.Delete(c.Ports, i, i+1)
	return true
}

// appContainer is the pod's container (or init container) of that name,
// other than the sidecar.
func appContainer(pod *corev1.Pod, name string) *corev1.Container {
	if name == ContainerName {
		return nil
	}
	for _, cs := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	return nil
}

func isTCP(p corev1.Protocol) bool { return p == "" || p == corev1.ProtocolTCP }

// isNative reports whether c is a native sidecar (an init container that
// runs beside the app): the EndpointSlice controller resolves named ports
// in these after the regular containers.
func isNative(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// takeOver moves the name of the target port from every container that
// has it to the sidecar, and the hostPorts of those port numbers too, and
// returns what was done. The containers share one network namespace, so a
// port number is the same socket in every container: any entry of it with
// a hostPort, named or not, would publish the app on the node.
//
// Every holder of the name loses it, not only the first: the EndpointSlice
// controller resolves a named targetPort in the regular containers first,
// then in the native sidecars (FindPort), so a second container still
// named like the target would take the Service's traffic past the sidecar.
// The sidecar forwards to the first holder, the one FindPort chose before.
// A hostPort taken off the app's port publishes the sidecar's listen port
// instead (publish), so node:hostPort keeps working, through the sidecar.
func takeOver(pod *corev1.Pod, target string, listen int32) (Status, error) {
	st := Status{Version: statusVersion, Container: ContainerName, TargetPort: target}
	st.AppContainer, st.AppPort = PortHolder(&pod.Spec, target)
	if st.AppContainer == "" {
		return Status{}, fmt.Errorf("%w %q (name the app's port, or set %s)", ErrNoTargetPort, target, TargetPortAnnotation)
	}
	// The entries to change: every entry of the name in a container where
	// FindPort looks (regular containers, native sidecars), and every TCP
	// entry with a hostPort on one of their numbers, in any container.
	type entry struct {
		c     *corev1.Container
		p     *corev1.ContainerPort
		named bool
	}
	var entries []entry
	numbers := map[int32]bool{}
	for _, pass := range []struct {
		cs   []corev1.Container
		init bool
	}{{pod.Spec.Containers, false}, {pod.Spec.InitContainers, true}} {
		for ci := range pass.cs {
			c := &pass.cs[ci]
			for pi := range c.Ports {
				// A plain init container's port names are never resolved.
				e := entry{c, &c.Ports[pi], c.Ports[pi].Name == target && isTCP(c.Ports[pi].Protocol) && (!pass.init || isNative(c))}
				entries = append(entries, e)
				if e.named {
					numbers[e.p.ContainerPort] = true
				}
			}
		}
	}
	for _, e := range entries {
		r := v1alpha1.TakenOverPort{Container: e.c.Name, Port: e.p.ContainerPort}
		if e.named {
			r.Named = true
			e.p.Name = ""
			renumberContainer(e.c, target, e.p.ContainerPort)
		}
		if e.p.HostPort != 0 && isTCP(e.p.Protocol) && numbers[e.p.ContainerPort] {
			r.HostPort, r.HostIP = e.p.HostPort, e.p.HostIP
			e.p.HostPort, e.p.HostIP = 0, ""
		}
		if r.Named || r.HostPort != 0 {
			st.TakenOver = append(st.TakenOver, r)
		}
	}
	// After the loop: publish appends to a slice the entries point into.
	for _, r := range st.TakenOver {
		if r.HostPort != 0 {
			publish(pod, listen, r.HostPort, r.HostIP)
		}
	}
	return st, nil
}

// renumberContainer points the probes and lifecycle hooks of c that address
// the port by name at its number: the name is gone.
func renumberContainer(c *corev1.Container, name string, port int32) {
	for _, pr := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		if pr != nil {
			renumber(pr.HTTPGet, pr.TCPSocket, name, port)
		}
	}
	if lc := c.Lifecycle; lc != nil {
		for _, h := range []*corev1.LifecycleHandler{lc.PostStart, lc.PreStop} {
			if h != nil {
				renumber(h.HTTPGet, h.TCPSocket, name, port)
			}
		}
	}
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
		upstreamFlag + strconv.Itoa(int(st.AppPort)),
		"--config-file=" + ConfigDir + "/" + sidecarconfig.FileName,
		"--pod-labels-file=" + PodInfoDir + "/" + podLabelsFile,
		"--fallback-replicas=" + strconv.Itoa(int(o.FallbackReplicas)),
		"--client-hash-key-file=" + ClientHashKeyDir + "/" + clienthash.SecretDataKey,
	}
	// The connection as the manager has it, with the sidecar's own paths:
	// the TLS material and the credentials from files of the namespace's
	// Secret, read for every new connection (a rotation needs no restart).
	conn := redisconn.Config{
		Mode: o.Redis.Mode, Addrs: o.Redis.Addrs, MasterName: o.Redis.MasterName,
		TLS: o.Redis.TLS, TLSServerName: o.Redis.TLSServerName, CredentialsDir: RedisCredentialsDir,
	}
	if conn.TLS {
		conn.TLSDir = RedisTLSDir
	}
	args = append(args, conn.Args()...)
	if o.RedisIdentity == v1alpha1.RedisIdentityNamespace {
		args = append(args, "--redis-functions")
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
		{Name: RedisCredentialsVolume, MountPath: RedisCredentialsDir, ReadOnly: true},
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

// credentialItems maps the namespace Secret's keys of the identity to the
// credential files the sidecar reads (redisconn.Credentials*File).
func credentialItems(identity string) []corev1.KeyToPath {
	user, pass := redisconn.SecretUsernameKey, redisconn.SecretPasswordKey
	if identity == v1alpha1.RedisIdentityNamespace {
		user, pass = redisconn.SecretNamespaceUsernameKey, redisconn.SecretNamespacePasswordKey
	}
	return []corev1.KeyToPath{
		{Key: user, Path: redisconn.CredentialsUsernameFile},
		{Key: pass, Path: redisconn.CredentialsPasswordFile},
		{Key: redisconn.SecretSentinelUsernameKey, Path: redisconn.CredentialsSentinelUsernameFile},
		{Key: redisconn.SecretSentinelPasswordKey, Path: redisconn.CredentialsSentinelPasswordFile},
	}
}

func withDefaults(o Options) Options {
	if o.Image == "" {
		o.Image = ReleaseImage(o.SidecarVersion)
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
	if o.RedisIdentity == "" {
		o.RedisIdentity = v1alpha1.RedisIdentityShared
	}
	if o.Resources.Requests == nil && o.Resources.Limits == nil {
		o.Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
		}
	}
	return o
}

// sidecarIndex is the index of the container named like the sidecar, or -1.
func sidecarIndex(cs []corev1.Container) int {
	for i := range cs {
		if cs[i].Name == ContainerName {
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

// ReleaseImage is the release image of slidegate release v (make image's
// tag): ImageRepository:v.
func ReleaseImage(v string) string {
	if v == "" {
		v = "devel"
	}
	return ImageRepository + ":" + v
}

// ImageRepositoryOf is the repository of image reference ref: without its
// digest and tag ("ghcr.io/slidegate/slidegate" of
// "ghcr.io/slidegate/slidegate:v0.2.0@sha256:..."). A ':' before the last
// '/' is a registry's port, not a tag.
func ImageRepositoryOf(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	slash := strings.LastIndex(ref, "/")
	if i := strings.LastIndex(ref, ":"); i > slash {
		ref = ref[:i]
	}
	return ref
}

// CheckImage refuses a sidecar image that may change under its name: one
// without a tag or digest, or tagged latest. With IfNotPresent, a moving
// tag lets each node run whichever sidecar it pulled first, so one
// policy's pods would enforce with different releases.
func CheckImage(image string) error {
	rest, digest, pinned := strings.Cut(image, "@")
	if pinned {
		hexDigits := strings.TrimPrefix(digest, "sha256:")
		if len(hexDigits) != 64 || len(digest) == len(hexDigits) || strings.Trim(hexDigits, "0123456789abcdef") != "" {
			return fmt.Errorf("sidecar image %q: the digest is not sha256:<64 hex digits>", image)
		}
		return nil
	}
	// The tag follows the last ':' after the last '/' (a ':' before it
	// is a registry's port).
	last := rest[strings.LastIndex(rest, "/")+1:]
	_, tag, tagged := strings.Cut(last, ":")
	switch {
	case rest == "":
		return errors.New("sidecar image: empty")
	case !tagged || tag == "":
		return fmt.Errorf("sidecar image %q: no tag; give a release tag (and its digest), not the implied latest", image)
	case tag == "latest":
		return fmt.Errorf("sidecar image %q: latest moves; give a release tag (and its digest)", image)
	}
	return nil
}
