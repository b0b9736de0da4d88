// Package webhook is the admission glue around inject.Inject: it decodes the
// Pod, finds the RateLimitPolicies of its namespace that select it, and
// answers with a JSON patch. The injected shape lives in internal/inject.
package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
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
	Reader  client.Reader
	Decoder admission.Decoder
	Options inject.Options
}

// Handle injects the sidecar when the pod's namespace opted in and some
// policy selects the pod. Every other case admits the pod unchanged.
func (h *PodInjector) Handle(ctx context.Context, req admission.Request) admission.Response {
	log := logf.FromContext(ctx).WithValues("namespace", req.Namespace, "name", req.Name)
	if req.Kind.Kind != "Pod" || req.Operation != "CREATE" {
		return admission.Allowed("not a pod creation")
	}
	pod := &corev1.Pod{}
	if err := h.Decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the pod: %w", err))
	}
	// Pods of a Deployment have no name yet and sometimes no namespace.
	ns := req.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	if reason := inject.SkipReason(pod); reason != "" {
		return admission.Allowed(reason)
	}
	var namespace corev1.Namespace
	if err := h.Reader.Get(ctx, client.ObjectKey{Name: ns}, &namespace); err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("reading namespace %s: %w", ns, err))
	}
	// The webhook's namespaceSelector does the same; checking here keeps
	// the opt-in true whatever the webhook configuration says.
	if namespace.Labels[v1alpha1.InjectionLabel] != v1alpha1.InjectionEnabled {
		return admission.Allowed("namespace did not opt in")
	}
	var list v1alpha1.RateLimitPolicyList
	if err := h.Reader.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("listing policies: %w", err))
	}
	matched := Matching(pod.Labels, list.Items)
	if len(matched) == 0 {
		return admission.Allowed("no policy selects the pod")
	}
	opts := h.Options
	opts.TargetPort = matched[0].Spec.TargetPort
	injected := pod.DeepCopy()
	if err := inject.Inject(injected, opts); err != nil {
		// Admit it: refusing would break the workload's rollout over a port
		// name. The policy's Enforced condition reports the pod as lacking
		// the sidecar, and the warning reaches whoever created the pod.
		log.Info("pod not injected", "reason", err.Error())
		return admission.Allowed("not injected").WithWarnings(
			fmt.Sprintf("slidegate: pod selected by RateLimitPolicy %s is NOT rate limited: %v", matched[0].Name, err))
	}
	raw, err := json.Marshal(injected)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	resp := admission.PatchResponseFromRaw(req.Object.Raw, raw)
	// A pod is immutable where the takeover changed it (the app's port lost
	// its name to the sidecar), so the same manifest applied again is
	// refused. Controllers create new pods instead; a bare pod's owner must
	// be told before the second apply fails.
	if metav1.GetControllerOf(pod) == nil {
		resp = resp.WithWarnings(fmt.Sprintf("slidegate: the sidecar took over port name %q of this bare pod; "+
			"applying this manifest again (kubectl apply, Argo CD, Flux) will be refused (\"pod updates may not change fields\"): "+
			"manage the pod with a Deployment or StatefulSet, or delete and recreate it to change it", opts.TargetPort))
	}
	// One sidecar guards one port name; a policy naming another port is not
	// enforced on this pod (its status says so too).
	for _, p := range matched[1:] {
		if p.Spec.TargetPort != opts.TargetPort {
			resp = resp.WithWarnings(fmt.Sprintf("slidegate: RateLimitPolicy %s names targetPort %q, but the sidecar takes over %q (from %s): %s is not enforced on this pod",
				p.Name, p.Spec.TargetPort, opts.TargetPort, matched[0].Name, p.Name))
		}
	}
	return resp
}

// Matching returns the policies whose targetSelector selects a pod with
// these labels, sorted by name; the first one's targetPort is taken over.
// Invalid selectors select nothing (the API server's validation keeps them
// out; this is the last guard).
func Matching(podLabels map[string]string, policies []v1alpha1.RateLimitPolicy) []v1alpha1.RateLimitPolicy {
	var out []v1alpha1.RateLimitPolicy
	set := labels.Set(podLabels)
	for i := range policies {
		sel, err := metav1.LabelSelectorAsSelector(policies[i].Spec.TargetSelector.AsMeta())
		if err != nil || !sel.Matches(set) {
			continue
		}
		out = append(out, policies[i])
	}
	slices.SortFunc(out, func(a, b v1alpha1.RateLimitPolicy) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}
