package inject

import (
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

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
