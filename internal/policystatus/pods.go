/*
Copyright 2026 The slidegate Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package policystatus

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/selection"
)

// Live are the pods that are not being deleted: those a policy's status
// counts.
func Live(pods []corev1.Pod) []corev1.Pod {
	return slices.DeleteFunc(slices.Clone(pods), func(p corev1.Pod) bool { return !p.DeletionTimestamp.IsZero() })
}

// LegacySidecars names the pods of pods whose sidecar reads only minor
// version 0 of the configuration: injected by the first release, whose
// injection status records no ConfigMinor (an unreadable one counts as such
// too). While one runs, the namespace's document is rendered as minor 0,
// which it reads. The status is the webhook's own: it strips one a pod
// brought (inject.Remove), and v0.1.0's webhook wrote what it injected.
func LegacySidecars(pods []corev1.Pod) []string {
	var names []string
	for i := range pods {
		if minor, injected := ConfigMinor(&pods[i]); injected && minor == 0 {
			names = append(names, pods[i].Name)
		}
	}
	slices.Sort(names)
	return names
}

// ConfigMinor is the newest minor version of the configuration that the
// pod's sidecar reads, from its injection status (0 when it records none or
// is unreadable), and whether the pod was injected at all.
func ConfigMinor(pod *corev1.Pod) (minor int, injected bool) {
	raw, injected := pod.Annotations[v1alpha1.InjectedAnnotation]
	if !injected {
		return 0, false
	}
	var st v1alpha1.InjectionStatus
	if json.Unmarshal([]byte(raw), &st) != nil {
		return 0, true
	}
	return int(st.ConfigMinor), true
}

// SkippingSidecars names the pods p selects whose sidecars read the
// configuration but not minor version minor, which p needs: from 1 to
// minor-1, they read the document policy by policy and leave p out
// (sidecarconfig's compatibility rule), so they do not enforce it; a cost
// policy (minor 2) on a sidecar of minor 1, for instance. Sidecars of
// minor 0 are LegacySidecars' (the policy is held back for them).
func SkippingSidecars(p *v1alpha1.RateLimitPolicy, pods []corev1.Pod, minor int) []string {
	if minor <= 1 {
		return nil
	}
	sel := selection.Selector(p)
	var names []string
	for i := range pods {
		if m, injected := ConfigMinor(&pods[i]); injected && m >= 1 && m < minor && sel.Matches(labels.Set(pods[i].Labels)) {
			names = append(names, pods[i].Name)
		}
	}
	slices.Sort(names)
	return names
}

// CountPods counts the pods the policy selects and those of them whose
// sidecar protects the policy's targetPort (Protects); selected pods without
// it are added to unprotected.
func (gs Guards) CountPods(p *v1alpha1.RateLimitPolicy, pods []corev1.Pod, unprotected map[types.UID]bool) (matched, enforced int32) {
	sel := selection.Selector(p)
	for i := range pods {
		if !sel.Matches(labels.Set(pods[i].Labels)) {
			continue
		}
		matched++
		if gs.Protects(p, &pods[i]) {
			enforced++
		} else {
			unprotected[pods[i].UID] = true
		}
	}
	return matched, enforced
}

// TargetPort is the port name the policy's sidecar takes over.
func TargetPort(p *v1alpha1.RateLimitPolicy) string {
	if p.Spec.TargetPort == "" {
		return inject.DefaultTargetPort
	}
	return p.Spec.TargetPort
}

// Guards reads pods' sidecars as the status judges them: inject.ReadGuard,
// and an image from the repository of the manager's --sidecar-image
// (repo; "": any). A pod whose sidecar image was changed after admission
// (before the install's admission policy slidegate-sidecar-image, or while
// its namespace was not opted in) runs something else in the sidecar's
// place: not a sidecar that enforces anything. Any tag of the repository
// counts: sidecars of earlier releases enforce until they are restarted.
type Guards struct{ Repo string }

// Read is inject.ReadGuard with the image check.
func (gs Guards) Read(spec *corev1.PodSpec) (inject.Guard, error) {
	g, err := inject.ReadGuard(spec)
	if err == nil && gs.Repo != "" && inject.ImageRepositoryOf(g.Image) != gs.Repo {
		return g, fmt.Errorf("%w: it runs image %q, not one of slidegate's sidecar (%s)", inject.ErrNotSidecar, g.Image, gs.Repo)
	}
	return g, err
}

// Protects reports whether the pod's spec shows a working sidecar with no
// way around it (inject.ReadGuard) that covers the policy's targetPort: it
// holds that port name, or no other container does. The injection status
// annotation is not read: any pod author can write it (issue 23). A sidecar
// in front of another port (another policy's, or the pod's own choice with
// inject.TargetPortAnnotation) enforces this policy too, on the traffic it
// sees, unless a container keeps this policy's port, whose traffic a
// Service then sends around it.
func (gs Guards) Protects(p *v1alpha1.RateLimitPolicy, pod *corev1.Pod) bool {
	g, err := gs.Read(&pod.Spec)
	return err == nil && g.Covers(&pod.Spec, TargetPort(p))
}

// BypassingServices describes the Services that select a pod of the policy
// whose spec shows a working sidecar, and whose TCP port reaches that pod's
// app around the sidecar: by the app's port number (which the sidecar took
// the name of), or by a port name that the EndpointSlice controller
// resolves to a container other than the sidecar, when that name is the
// policy's targetPort or that container port is the app's (a pod whose
// target-port annotation left the app holding the policy's port). Other
// ports (metrics, a side port) are none of our business.
func (gs Guards) BypassingServices(p *v1alpha1.RateLimitPolicy, pods []corev1.Pod, services []corev1.Service) string {
	sel := selection.Selector(p)
	found := map[string]bool{}
	for i := range services {
		svc := &services[i]
		if len(svc.Spec.Selector) == 0 {
			continue
		}
		svcSel := labels.SelectorFromSet(svc.Spec.Selector)
		for j := range pods {
			pod := &pods[j]
			set := labels.Set(pod.Labels)
			if !svcSel.Matches(set) || !sel.Matches(set) {
				continue
			}
			g, err := gs.Read(&pod.Spec)
			if err != nil {
				continue // no working sidecar: reported as unprotected
			}
			for _, port := range svc.Spec.Ports {
				if d := bypassOf(svc.Name, port, pod, g, TargetPort(p)); d != "" {
					found[d] = true
				}
			}
		}
	}
	return strings.Join(slices.Sorted(maps.Keys(found)), "; ")
}

// bypassOf describes how Service port port reaches the app of pod (whose
// sidecar guard is g) around the sidecar, or is "".
func bypassOf(svc string, port corev1.ServicePort, pod *corev1.Pod, g inject.Guard, policyPort string) string {
	if port.Protocol != "" && port.Protocol != corev1.ProtocolTCP {
		return ""
	}
	target := port.TargetPort
	if target.Type == intstr.String && target.StrVal != "" {
		holder, num := inject.PortHolder(&pod.Spec, target.StrVal)
		if holder != "" && holder != inject.ContainerName && (num == g.AppPort || target.StrVal == policyPort) {
			return fmt.Sprintf("Service %s port %d targets port name %q, which container %s holds, not the sidecar", svc, port.Port, target.StrVal, holder)
		}
		return ""
	}
	num := target.IntVal
	if num == 0 { // unset: the port number itself
		num = port.Port
	}
	if num == g.AppPort {
		return fmt.Sprintf("Service %s port %d targets the app's port number %d", svc, port.Port, num)
	}
	return ""
}

// TrimPod is the controller's cache transform for Pods: it keeps what the status reads
// and drops the rest before the pod is stored. Enforcement is judged from
// the spec (inject.ReadGuard: the containers' names and ports, the init
// containers' restart policies, the sidecar's arguments, hostNetwork),
// the selection from the labels, the causes from the opt-out annotation and
// the creation time. Env, volumes, probes, resources, the status, the
// other annotations (last-applied-configuration can be large) and the
// managed fields are not kept: a cached pod holds a fraction of the pod.
func TrimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{TypeMeta: pod.TypeMeta}
	out.Name, out.Namespace, out.UID, out.ResourceVersion = pod.Name, pod.Namespace, pod.UID, pod.ResourceVersion
	out.Labels, out.CreationTimestamp, out.DeletionTimestamp = pod.Labels, pod.CreationTimestamp, pod.DeletionTimestamp
	// The opt-out, and the injection status for the sidecar's config
	// version (LegacySidecars).
	for _, k := range []string{inject.OptOutAnnotation, v1alpha1.InjectedAnnotation} {
		if v, ok := pod.Annotations[k]; ok {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	out.Spec.HostNetwork = pod.Spec.HostNetwork
	out.Spec.Containers = trimContainers(pod.Spec.Containers)
	out.Spec.InitContainers = trimContainers(pod.Spec.InitContainers)
	return out, nil
}

// trimContainers keeps each container's name, ports and restart policy,
// and the sidecar's arguments (where it forwards) and image (Guards).
func trimContainers(cs []corev1.Container) []corev1.Container {
	if cs == nil {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i, c := range cs {
		out[i] = corev1.Container{Name: c.Name, Ports: c.Ports, RestartPolicy: c.RestartPolicy}
		if c.Name == inject.ContainerName {
			out[i].Args, out[i].Image = c.Args, c.Image
		}
	}
	return out
}
