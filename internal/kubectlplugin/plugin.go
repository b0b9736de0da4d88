// Package kubectlplugin is `kubectl slidegate`: on-call introspection of
// slidegate through the Kubernetes API only. It finds a ready pod that a
// policy selects and that carries the sidecar, and calls the sidecar's debug
// port, which listens on the pod's loopback address only, through a
// port-forward of the API server and the kubelet
// (/api/v1/namespaces/NS/pods/POD/portforward, as `kubectl port-forward`
// does, without a local listener): a laptop needs kubeconfig access (create
// on pods/portforward, see config/rbac/debugger_role.yaml), never Redis
// credentials or network access to the pods, and nothing on the pod network
// reaches /debug.
package kubectlplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/debugapi"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// DebuggerRole is the ClusterRole of config/rbac/debugger_role.yaml, as
// config/default names it: the name the refusal messages point at.
const DebuggerRole = "slidegate-debugger"

// Client reaches policies, pods and the sidecars' debug ports through the
// API server.
type Client struct {
	cfg  *rest.Config
	kube kubernetes.Interface
	dyn  dynamic.Interface
}

// NewClient builds a Client on cfg.
func NewClient(cfg *rest.Config) (*Client, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Client{cfg: cfg, kube: kube, dyn: dyn}, nil
}

// Target is one sidecar's debug port (0: a sidecar injected before it
// had one, whose /debug the plugin does not reach).
type Target struct {
	Namespace, Pod string
	Port           int32
}

// refused turns the API server's 403 into a message naming the missing
// permission and the role that grants it; other errors pass unchanged.
func refused(err error, verb, resource, ns string) error {
	if !apierrors.IsForbidden(err) {
		return err
	}
	return &RefusedError{Verb: verb, Resource: resource, Namespace: ns, Err: err}
}

// RefusedError is the API server's 403 for a permission the plugin needs.
// Its message is its own: the proxied 403's text names neither the verb
// nor the subresource.
type RefusedError struct {
	Verb, Resource, Namespace string
	// Role is the ClusterRole that grants it (DebuggerRole when empty).
	Role string
	// Note, when set, ends the message.
	Note string
	Err  error
}

func (e *RefusedError) Error() string {
	role := e.Role
	if role == "" {
		role = DebuggerRole
	}
	msg := fmt.Sprintf("not allowed (403 Forbidden): you lack %q on %q in namespace %q, which `kubectl slidegate` needs; "+
		"ask for a RoleBinding in %[3]q to the ClusterRole %s", e.Verb, e.Resource, e.Namespace, role)
	if e.Note != "" {
		msg += " (" + e.Note + ")"
	}
	return msg
}

func (e *RefusedError) Unwrap() error { return e.Err }

// Policy reads the RateLimitPolicy ns/name.
func (c *Client) Policy(ctx context.Context, ns, name string) (*v1alpha1.RateLimitPolicy, error) {
	gvr := v1alpha1.GroupVersion.WithResource("ratelimitpolicies")
	u, err := c.dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, refused(err, "get", "ratelimitpolicies.ratelimit.slidegate.dev", ns)
	}
	var p v1alpha1.RateLimitPolicy
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Targets lists the sidecars of the pods that policy p selects, in pod name
// order; p must select pods (not address Envoy's rate limit service).
func (c *Client) Targets(ctx context.Context, p *v1alpha1.RateLimitPolicy) ([]Target, error) {
	if p.Spec.TargetSelector == nil {
		return nil, fmt.Errorf("policy %s/%s is enforced by Envoy's rate limit service, not by sidecars", p.Namespace, p.Name)
	}
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.TargetSelector.AsMeta())
	if err != nil {
		return nil, fmt.Errorf("policy %s/%s: %w", p.Namespace, p.Name, err)
	}
	pods, err := c.kube.CoreV1().Pods(p.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, refused(err, "list", "pods", p.Namespace)
	}
	return SidecarTargets(pods.Items), nil
}

// SidecarTargets are the debug ports of the pods that are ready, not
// terminating, and carry the injected sidecar, in pod name order.
func SidecarTargets(pods []corev1.Pod) []Target {
	var out []Target
	for i := range pods {
		pod := &pods[i]
		if pod.DeletionTimestamp != nil || !podReady(pod) {
			continue
		}
		if port, ok := debugPort(pod); ok {
			out = append(out, Target{Namespace: pod.Namespace, Pod: pod.Name, Port: port})
		}
	}
	slices.SortFunc(out, func(a, b Target) int { return strings.Compare(a.Pod, b.Pod) })
	return out
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// debugPort is the sidecar's debug port, by the name the injector gives
// it; 0 for a sidecar injected before it had one.
func debugPort(pod *corev1.Pod) (int32, bool) {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if c.Name != v1alpha1.SidecarContainerName {
				continue
			}
			for _, p := range c.Ports {
				if p.Name == v1alpha1.SidecarDebugPortName {
					return p.ContainerPort, true
				}
			}
			return 0, true
		}
	}
	return 0, false
}

// Get calls GET path (with query) on the target's debug port through a
// port-forward (portforward.go); header, when not empty, is sent as
// request headers. A sidecar's own refusal (a 4xx/5xx with a text body,
// e.g. "policy ... does not apply to this pod") is the error.
func (c *Client) Get(ctx context.Context, t Target, path string, query map[string]string, header http.Header) ([]byte, error) {
	return c.call(ctx, t, http.MethodGet, path, query, header)
}

// Post is Get with POST: a request that changes something (/debug/reset).
func (c *Client) Post(ctx context.Context, t Target, path string, query map[string]string, header http.Header) ([]byte, error) {
	return c.call(ctx, t, http.MethodPost, path, query, header)
}

func (c *Client) call(ctx context.Context, t Target, method, path string, query map[string]string, header http.Header) ([]byte, error) {
	if t.Port == 0 {
		return nil, fmt.Errorf("pod %s: its sidecar was injected before /debug moved to a port of its own on the pod's loopback "+
			"(container port %s); re-create the pod (kubectl rollout restart) to reach it", t.Pod, v1alpha1.SidecarDebugPortName)
	}
	q := url.Values{}
	for k, v := range query {
		q.Set(k, v)
	}
	code, body, err := c.forward(ctx, t, method, "/"+strings.TrimPrefix(path, "/")+"?"+q.Encode(), header)
	switch {
	case err != nil:
		if forbidden(err) {
			return nil, &RefusedError{Verb: "create", Resource: "pods/portforward", Namespace: t.Namespace, Err: err}
		}
		return nil, fmt.Errorf("pod %s: %w", t.Pod, err)
	case code != http.StatusOK:
		return nil, fmt.Errorf("pod %s: %d: %s", t.Pod, code, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// WhyOptions is one `kubectl slidegate why` question.
type WhyOptions struct {
	Namespace, Policy string
	// Source is a sidecarconfig source (Header, QueryParameter, JWTClaim,
	// RemoteAddress, Global) and Value the client's value for it.
	Source, Value string
	// Pod, when set, asks that pod's sidecar instead of the first ready one.
	Pod          string
	Method, Path string
}

// WhyResult is the answer and the sidecar that gave it.
type WhyResult struct {
	Pod string `json:"pod"`
	debugapi.WhyResponse
}

// Why asks a sidecar of the policy's pods about a client's window.
func (c *Client) Why(ctx context.Context, o WhyOptions) (*WhyResult, error) {
	_, t, q, h, err := c.ask(ctx, o)
	if err != nil {
		return nil, err
	}
	body, err := c.Get(ctx, t, debugapi.WhyPath, q, h)
	if err != nil {
		return nil, err
	}
	res := &WhyResult{Pod: t.Pod}
	if err := json.Unmarshal(body, &res.WhyResponse); err != nil {
		return nil, fmt.Errorf("pod %s: unexpected answer: %w", t.Pod, err)
	}
	if len(res.Policies) == 0 || !res.Policies[0].Target {
		return nil, fmt.Errorf("pod %s: the answer does not cover policy %s", t.Pod, o.Policy)
	}
	return res, nil
}

// ask is what a question o about a client goes with: the policy, the
// sidecar to ask (the first ready one, or o.Pod's), and the /debug query
// and headers that carry the identity.
func (c *Client) ask(ctx context.Context, o WhyOptions) (*v1alpha1.RateLimitPolicy, Target, map[string]string, http.Header, error) {
	p, err := c.Policy(ctx, o.Namespace, o.Policy)
	if err != nil {
		return nil, Target{}, nil, nil, err
	}
	targets, err := c.Targets(ctx, p)
	if err != nil {
		return nil, Target{}, nil, nil, err
	}
	if o.Pod != "" {
		targets = slices.DeleteFunc(targets, func(t Target) bool { return t.Pod != o.Pod })
	}
	if len(targets) == 0 {
		return nil, Target{}, nil, nil, fmt.Errorf("no ready pod with the slidegate sidecar is selected by policy %s/%s%s", p.Namespace, p.Name, podSuffix(o.Pod))
	}
	q := map[string]string{"policy": o.Policy, "source": o.Source}
	if o.Method != "" {
		q["method"] = o.Method
	}
	if o.Path != "" {
		q["path"] = o.Path
	}
	h := http.Header{}
	if o.Value != "" {
		h.Set(debugapi.WhyValueHeader, o.Value)
	}
	return p, targets[0], q, h, nil
}

func podSuffix(pod string) string {
	if pod == "" {
		return ""
	}
	return " named " + pod
}

// PrintWhy writes res as a table (format "") or JSON ("json").
func PrintWhy(w io.Writer, res *WhyResult, format string) error {
	if done, err := printJSON(w, res, format); done {
		return err
	}
	var others []string
	for _, p := range res.Policies[1:] {
		others = append(others, p.Name)
	}
	rows := [][]string{{"POLICY", "KEY", "IN-WINDOW", "LIMIT", "REMAINING", "OLDEST-AGE", "RETRY-AFTER", "OTHER-MATCHING-POLICIES"}}
	for i, p := range res.Policies {
		row := whyRow(p.Name, p.ClientKey, p.Limit, p.Window, p.Error)
		if i == 0 && len(others) > 0 {
			row[7] = strings.Join(others, ",")
		}
		if p.Unknown != "" {
			row[1] = "(" + p.Unknown + ")"
		}
		if win := p.Window; win != nil && win.Unit != "" {
			// A cost policy: the window holds cost (tokens), not admits.
			row[2] += " " + win.Unit
		}
		if p.Mode == sidecarconfig.ModeDryRun {
			row[0] += " (dry-run)"
		}
		rows = append(rows, row)
		// The policy's other windows for the same client, a row each.
		for _, l := range p.AdditionalLimits {
			rows = append(rows, whyRow(l.Name, p.ClientKey, l.Limit, l.Window, l.Error))
		}
	}
	if err := writeTable(w, rows); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nasked pod %s (config revision %s) for a %s request to %s\n", res.Pod, res.Revision, res.Method, res.Path)
	return err
}

// whyRow is the row of one window: name, key, limit and what the window
// holds (or why it could not be read).
func whyRow(name, key string, limit int64, win *debugapi.WhyWindow, errText string) []string {
	row := []string{"  " + name, orDash(key), "-", strconv.FormatInt(limit, 10), "-", "-", "-", "-"}
	if errText != "" {
		row[2] = "error: " + errText
	}
	if win != nil {
		row[2] = strconv.FormatFloat(win.InWindow, 'f', -1, 64)
		if win.Current != nil {
			row[2] = strconv.FormatFloat(win.InWindow, 'f', 2, 64) + " (est.)"
		}
		row[4] = strconv.FormatInt(win.Remaining, 10)
		if win.OldestAgeSeconds != nil {
			row[5] = seconds(*win.OldestAgeSeconds)
		}
		if win.Allowed {
			row[6] = "0 (allowed)"
		} else {
			row[6] = seconds(win.RetryAfterSeconds)
		}
	}
	return row
}

// printJSON writes v when format is json or yaml; done is false for a
// table.
func printJSON(w io.Writer, v any, format string) (done bool, err error) {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return true, enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = w.Write(b)
		return true, err
	case "", "table":
		return false, nil
	}
	return true, fmt.Errorf("unknown output format %q (table, json or yaml)", format)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// seconds prints a duration given in seconds to the millisecond.
func seconds(s float64) string {
	return strconv.FormatFloat(s, 'f', 3, 64) + "s"
}

// writeTable aligns rows in columns three spaces apart, like kubectl get.
func writeTable(w io.Writer, rows [][]string) error {
	widths := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], len(c))
		}
	}
	var b strings.Builder
	for _, r := range rows {
		for i, c := range r {
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-len(c)+3))
			}
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// ErrUsage marks a command line that cannot be run.
var ErrUsage = errors.New("usage")
