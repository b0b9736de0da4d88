package inject

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/redisconn"
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
