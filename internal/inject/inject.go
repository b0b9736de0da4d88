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
//
// The files: inject.go (Inject, Remove and the checks before them),
// options.go (what shapes the sidecar, and its defaults), container.go (the
// sidecar's container), volumes.go (the volumes it mounts), ports.go
// (taking over the app's port name, and giving it back), image.go (the
// sidecar's image reference), guard.go (reading what a pod's sidecar
// guards).
package inject

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
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
	setVolumes(work, opts)
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
