// Package webhook is the admission glue around inject.Inject: it decodes the
// Pod, finds the RateLimitPolicies of its namespace that select it
// (internal/selection, the answer the controller's status counts share), and
// answers with a JSON patch. The injected shape lives in internal/inject.
package webhook

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/selection"
)

// Path is where the manager serves the pod injector.
const Path = "/inject-v1-pod"

// The webhook configuration is generated from this marker (make manifests);
// config/webhook adds the namespaceSelector.
//
// failurePolicy=fail: a pod a policy protects must not start without its
// sidecar, which would silently lift the limit. The blast radius is only the
// namespaces that opted in; system namespaces and the operator's own are
// excluded, so the webhook's own pods always start.
// reinvocationPolicy=IfNeeded: if a later webhook changes the pod (adds a
// port, renames one), we run again; Inject is idempotent, so that is safe.
//
// +kubebuilder:webhook:path=/inject-v1-pod,mutating=true,failurePolicy=fail,sideEffects=None,groups="",resources=pods,verbs=create,versions=v1,name=inject.ratelimit.slidegate.dev,admissionReviewVersions=v1,timeoutSeconds=5,reinvocationPolicy=IfNeeded
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=list;watch
// +kubebuilder:rbac:groups=ratelimit.slidegate.dev,resources=ratelimitpolicies,verbs=list;watch

// PodInjector answers admission requests for Pod CREATE.
type PodInjector struct {
	// Reader reads Namespaces and RateLimitPolicies (the manager's cache).
	Reader client.Reader
	// Decoder decodes the Pod of a request.
	Decoder admission.Decoder
	// Options are the sidecar's settings; TargetPort is taken from the
	// first policy that selects the pod.
	Options inject.Options
}

// Handle injects the sidecar when the pod's namespace opted in and some
// policy selects the pod. Every other case admits the pod unchanged.
func (h *PodInjector) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Kind.Kind != "Pod" || req.Operation != "CREATE" {
		return admission.Allowed("not a pod creation")
	}
	pod := &corev1.Pod{}
	if err := h.Decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the pod: %w", err))
	}
	if reason := inject.SkipReason(pod); reason != "" {
		return admission.Allowed(reason)
	}
	matched, notSelected, err := h.selectingPolicies(ctx, namespaceOf(req, pod), pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if notSelected != "" {
		return admission.Allowed(notSelected)
	}
	return h.inject(ctx, req, pod, matched)
}

// namespaceOf is the pod's namespace: pods of a Deployment have no name yet
// and sometimes no namespace, so the request's comes first.
func namespaceOf(req admission.Request, pod *corev1.Pod) string {
	if req.Namespace != "" {
		return req.Namespace
	}
	return pod.Namespace
}

// selectingPolicies returns the policies of namespace ns that select the
// pod, sorted by name (selection.Matching), or why the pod is admitted
// unchanged (notSelected).
func (h *PodInjector) selectingPolicies(ctx context.Context, ns string, pod *corev1.Pod) (matched []v1alpha1.RateLimitPolicy, notSelected string, err error) {
	var namespace corev1.Namespace
	if err := h.Reader.Get(ctx, client.ObjectKey{Name: ns}, &namespace); err != nil {
		return nil, "", fmt.Errorf("reading namespace %s: %w", ns, err)
	}
	// The webhook's namespaceSelector does the same; checking here keeps
	// the opt-in true whatever the webhook configuration says.
	if namespace.Labels[v1alpha1.InjectionLabel] != v1alpha1.InjectionEnabled {
		return nil, "namespace did not opt in", nil
	}
	var list v1alpha1.RateLimitPolicyList
	if err := h.Reader.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, "", fmt.Errorf("listing policies: %w", err)
	}
	matched = selection.Matching(pod.Labels, list.Items)
	if len(matched) == 0 {
		return nil, "no policy selects the pod", nil
	}
	return matched, "", nil
}

// inject answers with the patch that adds the sidecar in front of the first
// matched policy's targetPort, or admits the pod unchanged, with a warning,
// when it cannot be injected.
func (h *PodInjector) inject(ctx context.Context, req admission.Request, pod *corev1.Pod, matched []v1alpha1.RateLimitPolicy) admission.Response {
	opts := h.Options
	opts.TargetPort = matched[0].Spec.TargetPort
	injected := pod.DeepCopy()
	if err := inject.Inject(injected, opts); err != nil {
		// Admit it: refusing would break the workload's rollout over a port
		// name. The policy's Enforced condition reports the pod as lacking
		// the sidecar, and the warning reaches whoever created the pod.
		logf.FromContext(ctx).WithValues("namespace", req.Namespace, "name", req.Name).Info("pod not injected", "reason", err.Error())
		return admission.Allowed("not injected").WithWarnings(
			fmt.Sprintf("slidegate: pod selected by RateLimitPolicy %s is NOT rate limited: %v", matched[0].Name, err))
	}
	raw, err := json.Marshal(injected)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, raw).WithWarnings(injectionWarnings(pod, matched, takenOver(injected, opts.TargetPort))...)
}

// takenOver is the port name the sidecar of the injected pod took over, as
// its injection status records it: the pod's inject.TargetPortAnnotation
// wins over the policy's targetPort (asked, the fallback).
func takenOver(injected *corev1.Pod, asked string) string {
	var st v1alpha1.InjectionStatus
	if err := json.Unmarshal([]byte(injected.Annotations[v1alpha1.InjectedAnnotation]), &st); err == nil && st.TargetPort != "" {
		return st.TargetPort
	}
	if asked == "" {
		return inject.DefaultTargetPort
	}
	return asked
}

// injectionWarnings are what the creator of an injected pod must be told:
// a bare pod cannot be applied again, and policies naming another port than
// the one taken over are not enforced on it.
func injectionWarnings(pod *corev1.Pod, matched []v1alpha1.RateLimitPolicy, takenOver string) []string {
	var warnings []string
	// A pod is immutable where the takeover changed it (the app's port lost
	// its name to the sidecar), so the same manifest applied again is
	// refused. Controllers create new pods instead; a bare pod's owner must
	// be told before the second apply fails.
	if metav1.GetControllerOf(pod) == nil {
		warnings = append(warnings, fmt.Sprintf("slidegate: the sidecar took over port name %q of this bare pod; "+
			"applying this manifest again (kubectl apply, Argo CD, Flux) will be refused (\"pod updates may not change fields\"): "+
			"manage the pod with a Deployment or StatefulSet, or delete and recreate it to change it", takenOver))
	}
	// One sidecar guards one port name; a policy naming another port is not
	// enforced on this pod (its status says so too). Unless the pod chose
	// the port (inject.TargetPortAnnotation): its sidecar then enforces every
	// policy that selects it, whatever port they name.
	if pod.Annotations[inject.TargetPortAnnotation] != "" {
		return warnings
	}
	for _, p := range matched[1:] {
		if port := cmp.Or(p.Spec.TargetPort, inject.DefaultTargetPort); port != takenOver {
			warnings = append(warnings, fmt.Sprintf("slidegate: RateLimitPolicy %s names targetPort %q, but the sidecar takes over %q (from %s): %s is not enforced on this pod",
				p.Name, port, takenOver, matched[0].Name, p.Name))
		}
	}
	return warnings
}
