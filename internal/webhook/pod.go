// Package webhook is the admission glue around inject.Inject: it decodes the
// Pod, finds the RateLimitPolicies of its namespace that select it
// (internal/selection, the answer the controller's status counts share), and
// answers with a JSON patch. The injected shape lives in internal/inject.
package webhook

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	// Live reads them from the API server when the cache says there is
	// nothing to inject: a namespace labelled, or a policy created, a
	// moment before the pod (one `kubectl apply` of all three) may not be
	// in the cache yet, and the pod would run without the sidecar until
	// it is restarted. Only pods the cache would leave unprotected pay for
	// the read. nil: the cache's answer stands.
	Live client.Reader
	// Decoder decodes the Pod of a request.
	Decoder admission.Decoder
	// Options are the sidecar's settings; TargetPort is taken from the
	// first policy that selects the pod.
	Options inject.Options
}

// Handle injects the sidecar when the pod's namespace opted in and some
// policy selects the pod. Every other pod of an opted-in namespace is
// admitted without a sidecar or injection status of its own making
// (inject.Remove): only the webhook injects. A namespace labelled
// required refuses the pods that opt out, and the selected pods that
// cannot be injected.
func (h *PodInjector) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Kind.Kind != "Pod" || req.Operation != "CREATE" {
		return admission.Allowed("not a pod creation")
	}
	pod := &corev1.Pod{}
	if err := h.Decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the pod: %w", err))
	}
	ns := namespaceOf(req, pod)
	labels, err := h.namespaceLabels(ctx, ns)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("reading namespace %s: %w", ns, err))
	}
	// The webhook's namespaceSelector does the same; checking here keeps
	// the opt-in true whatever the webhook configuration says.
	if !inject.NamespaceOptedIn(labels) {
		return admission.Allowed("namespace did not opt in")
	}
	required := inject.NamespaceRequires(labels)
	if required && inject.OptedOut(pod.Annotations, pod.Labels) {
		return admission.Denied(fmt.Sprintf("namespace %s requires the rate limit sidecar (%s=%s): pods may not opt out with %s=false; "+
			"remove that label or annotation from the pod (or its template), or ask the namespace's owner",
			ns, v1alpha1.InjectionLabel, v1alpha1.InjectionRequired, inject.OptOutAnnotation))
	}
	var list v1alpha1.RateLimitPolicyList
	if err := h.Reader.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("listing policies: %w", err))
	}
	matched := selection.Matching(pod.Labels, list.Items)
	if len(matched) == 0 && h.Live != nil {
		if err := h.Live.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return admission.Errored(http.StatusInternalServerError, fmt.Errorf("listing policies: %w", err))
		}
		matched = selection.Matching(pod.Labels, list.Items)
	}
	if len(matched) == 0 {
		return admitWithout(req, pod, "no policy selects the pod")
	}
	if reason := inject.SkipReason(pod); reason != "" {
		if required {
			return notInjectable(ns, matched[0].Name, errors.New(reason))
		}
		return admitWithout(req, pod, reason)
	}
	return h.inject(ctx, req, pod, matched, required)
}

// namespaceLabels are the labels of namespace ns: the cache's, or, when
// the cache does not have it opted in, the API server's (Live; a List by
// name, the manager may list namespaces but not get one).
func (h *PodInjector) namespaceLabels(ctx context.Context, ns string) (map[string]string, error) {
	var namespace corev1.Namespace
	err := h.Reader.Get(ctx, client.ObjectKey{Name: ns}, &namespace)
	if (err == nil && inject.NamespaceOptedIn(namespace.Labels)) || h.Live == nil || (err != nil && !apierrors.IsNotFound(err)) {
		return namespace.Labels, err
	}
	var list corev1.NamespaceList
	if err := h.Live.List(ctx, &list, client.MatchingFields{"metadata.name": ns}); err != nil {
		return nil, err
	}
	if len(list.Items) != 1 {
		return nil, apierrors.NewNotFound(corev1.Resource("namespaces"), ns)
	}
	return list.Items[0].Labels, nil
}

// namespaceOf is the pod's namespace: pods of a Deployment have no name yet
// and sometimes no namespace, so the request's comes first.
func namespaceOf(req admission.Request, pod *corev1.Pod) string {
	if req.Namespace != "" {
		return req.Namespace
	}
	return pod.Namespace
}

// admitWithout admits the pod without the sidecar, having taken off any
// sidecar and injection status it brought (inject.Remove): the webhook did
// not inject it, so they are forged or copied from an injected pod, and
// the pod must not pass for protected. A regular container named like the
// sidecar is refused.
func admitWithout(req admission.Request, pod *corev1.Pod, why string, warnings ...string) admission.Response {
	stripped := pod.DeepCopy()
	if err := inject.Remove(stripped); err != nil {
		return admission.Denied(err.Error())
	}
	if equality.Semantic.DeepEqual(pod, stripped) {
		return admission.Allowed(why).WithWarnings(warnings...)
	}
	raw, err := json.Marshal(stripped)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	warnings = append(warnings, fmt.Sprintf("slidegate: removed the %s container and the %s annotation from this pod (%s): only slidegate's webhook injects the sidecar",
		inject.ContainerName, v1alpha1.InjectedAnnotation, why))
	return admission.PatchResponseFromRaw(req.Object.Raw, raw).WithWarnings(warnings...)
}

// notInjectable refuses a pod of a namespace that requires the sidecar,
// which policy selects but which cannot carry it.
func notInjectable(ns, policy string, err error) admission.Response {
	return admission.Denied(fmt.Sprintf("namespace %s requires the rate limit sidecar (%s=%s), and RateLimitPolicy %s selects this pod, but it cannot carry the sidecar: %v",
		ns, v1alpha1.InjectionLabel, v1alpha1.InjectionRequired, policy, err))
}

// inject answers with the patch that adds the sidecar in front of the first
// matched policy's targetPort. A pod that cannot be injected is admitted
// without it, with a warning, or refused where the namespace requires the
// sidecar (or where a regular container has the sidecar's name).
func (h *PodInjector) inject(ctx context.Context, req admission.Request, pod *corev1.Pod, matched []v1alpha1.RateLimitPolicy, required bool) admission.Response {
	opts := h.Options
	opts.TargetPort = matched[0].Spec.TargetPort
	injected := pod.DeepCopy()
	if err := inject.Inject(injected, opts); err != nil {
		switch {
		case errors.Is(err, inject.ErrReservedName):
			return admission.Denied(err.Error())
		case required:
			return notInjectable(namespaceOf(req, pod), matched[0].Name, err)
		}
		// Admit it: refusing would break the workload's rollout over a port
		// name. The policy's Enforced condition reports the pod as lacking
		// the sidecar, and the warning reaches whoever created the pod.
		logf.FromContext(ctx).WithValues("namespace", req.Namespace, "name", req.Name).Info("pod not injected", "reason", err.Error())
		return admitWithout(req, pod, "not injected",
			fmt.Sprintf("slidegate: pod selected by RateLimitPolicy %s is NOT rate limited: %v", matched[0].Name, err))
	}
	raw, err := json.Marshal(injected)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, raw).WithWarnings(injectionWarnings(pod, injected, matched, takenOver(injected, opts.TargetPort))...)
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
// a bare pod cannot be applied again, and a policy naming another port
// than the one taken over, which a container of the pod keeps, is not
// enforced on that port's traffic.
func injectionWarnings(pod, injected *corev1.Pod, matched []v1alpha1.RateLimitPolicy, takenOver string) []string {
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
	// One sidecar guards one port name, and enforces every policy that
	// selects the pod on the traffic it sees. A policy naming another port
	// that a container keeps (another policy's targetPort was taken over,
	// or the pod's inject.TargetPortAnnotation chose another port) is not
	// enforced on that port: a Service targeting it reaches the app.
	for _, p := range matched {
		port := cmp.Or(p.Spec.TargetPort, inject.DefaultTargetPort)
		if port == takenOver {
			continue
		}
		if holder, _ := inject.PortHolder(&injected.Spec, port); holder != "" && holder != inject.ContainerName {
			warnings = append(warnings, fmt.Sprintf("slidegate: RateLimitPolicy %s names targetPort %q, which container %s keeps: its traffic passes around the sidecar (in front of %q), so %s is not enforced on it",
				p.Name, port, holder, takenOver, p.Name))
		}
	}
	return warnings
}
