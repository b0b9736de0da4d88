package inject

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/clienthash"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// sidecar is the injected container for the pod's status st: a native
// sidecar (restartPolicy Always) that proxies st's port to the app,
// with the Pod Security restricted profile's security context.
func sidecar(o Options, st Status) corev1.Container {
	args := sidecarArgs(o, st)
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

// sidecarArgs are the sidecar's command-line arguments.
func sidecarArgs(o Options, st Status) []string {
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
	return args
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
