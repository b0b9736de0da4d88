package inject

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// What a pod's spec says about its sidecar. Enforcement is read from here,
// never from the injection status annotation: any pod author can write an
// annotation, and can change it after the pod is created, while a pod's
// containers and ports are fixed once it exists and passed the webhook on
// the way in.

// Guard is what a pod's sidecar guards: the port name it holds, which
// Services reach it by, and the app's port it forwards to.
type Guard struct {
	Port    string
	AppPort int32
	// Image is the sidecar container's image.
	Image string
}

// Why a pod's spec shows no working sidecar.
var (
	// ErrNoSidecar: the pod has no init container named like the sidecar.
	ErrNoSidecar = errors.New("no sidecar")
	// ErrNotSidecar: a container is named like the sidecar but is not one
	// that can limit anything (not a native sidecar, no port name taken
	// over, nowhere to forward to). The webhook strips such containers from
	// the pods it admits, so one is left only on a pod it never saw.
	ErrNotSidecar = errors.New("a container named like the sidecar is not a working sidecar")
	// ErrAround: the sidecar is there, but traffic reaches the app around
	// it.
	ErrAround = errors.New("traffic reaches the app around the sidecar")
)

// upstreamFlag is how the sidecar is told the app's port (see sidecar).
const upstreamFlag = "--upstream=http://127.0.0.1:"

// ReadGuard reads from a pod's spec alone what its sidecar guards, or why
// it guards nothing (ErrNoSidecar, ErrNotSidecar, ErrAround, wrapped with
// the detail): a pod on the node's network, a container other than the
// sidecar holding the sidecar's port name where the EndpointSlice
// controller looks first, and the app's port number published on the node
// (hostPort) all let traffic reach the app around the sidecar.
func ReadGuard(spec *corev1.PodSpec) (Guard, error) {
	for _, c := range spec.Containers {
		if c.Name == ContainerName {
			return Guard{}, fmt.Errorf("%w: %s is a regular container", ErrNotSidecar, ContainerName)
		}
	}
	i := sidecarIndex(spec.InitContainers)
	if i < 0 {
		return Guard{}, ErrNoSidecar
	}
	sc := &spec.InitContainers[i]
	if !isNative(sc) {
		return Guard{}, fmt.Errorf("%w: it is not a native sidecar (restartPolicy Always)", ErrNotSidecar)
	}
	g := Guard{Image: sc.Image}
	for _, p := range sc.Ports {
		if p.Name != "" && p.Name != AdminPortName && isTCP(p.Protocol) {
			g.Port = p.Name
			break
		}
	}
	for _, a := range sc.Args {
		if v, ok := strings.CutPrefix(a, upstreamFlag); ok {
			if n, err := strconv.ParseInt(v, 10, 32); err == nil && n > 0 && n <= 65535 {
				g.AppPort = int32(n)
			}
		}
	}
	switch {
	case g.Port == "":
		return Guard{}, fmt.Errorf("%w: it holds no port name", ErrNotSidecar)
	case g.AppPort == 0:
		return Guard{}, fmt.Errorf("%w: it forwards to no app port", ErrNotSidecar)
	case spec.HostNetwork:
		return g, fmt.Errorf("%w: the pod uses hostNetwork, so its ports are the node's", ErrAround)
	}
	if c, _ := PortHolder(spec, g.Port); c != ContainerName {
		return g, fmt.Errorf("%w: container %s holds port name %q, and Services reach it before the sidecar", ErrAround, c, g.Port)
	}
	for _, cs := range [][]corev1.Container{spec.Containers, spec.InitContainers} {
		for _, c := range cs {
			for _, p := range c.Ports {
				if c.Name != ContainerName && p.ContainerPort == g.AppPort && p.HostPort != 0 && isTCP(p.Protocol) {
					return g, fmt.Errorf("%w: container %s publishes the app's port %d on the node (hostPort %d)", ErrAround, c.Name, g.AppPort, p.HostPort)
				}
			}
		}
	}
	return g, nil
}

// Covers reports whether a Service's traffic to the pod's port name passes
// the sidecar: the sidecar holds that name, or no container does (so no
// Service reaches the app by it). A pod whose sidecar took over another
// port (its own target-port annotation, or another policy's targetPort)
// while a container keeps this name is not covered for it.
func (g Guard) Covers(spec *corev1.PodSpec, name string) bool {
	c, _ := PortHolder(spec, name)
	return name == g.Port || c == "" || c == ContainerName
}

// PortHolder resolves a TCP port name on a pod as the EndpointSlice
// controller resolves a Service's targetPort (FindPort in
// k8s.io/endpointslice): the first regular container with a port of that
// name, else the first native sidecar; "" when none has it.
func PortHolder(spec *corev1.PodSpec, name string) (container string, port int32) {
	for _, pass := range []struct {
		cs     []corev1.Container
		native bool
	}{{spec.Containers, false}, {spec.InitContainers, true}} {
		for i := range pass.cs {
			c := &pass.cs[i]
			if pass.native && !isNative(c) {
				continue
			}
			for _, p := range c.Ports {
				if p.Name == name && isTCP(p.Protocol) {
					return c.Name, p.ContainerPort
				}
			}
		}
	}
	return "", 0
}
