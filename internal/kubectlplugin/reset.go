package kubectlplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/debugapi"
)

// ResetterRole is the ClusterRole of config/rbac/resetter_role.yaml: the
// debugger's permissions and create on events, for the reset's record.
const ResetterRole = "slidegate-resetter"

// Event reasons a reset records on its policy.
const (
	ReasonClientReset = "ClientReset"
	// ReportingController names the plugin as the Events' reporter.
	ReportingController = "ratelimit.slidegate.dev/kubectl-slidegate"
)

// ResetResult is what `kubectl slidegate reset` did: the sidecar's answer,
// who asked, and the Event that records it.
type ResetResult struct {
	Pod         string `json:"pod"`
	RequestedBy string `json:"requestedBy"`
	Event       string `json:"event"`
	debugapi.ResetResponse
}

// Reset empties one client's counters under a policy through a sidecar
// of its pods (POST /debug/reset) and records it as an Event on the
// policy, which names who asked and why. It checks first that the user may
// create that Event, so that a reset through the plugin is never left
// unrecorded for want of the permission.
func (c *Client) Reset(ctx context.Context, o WhyOptions, reason string) (*ResetResult, error) {
	p, t, q, h, err := c.ask(ctx, o)
	if err != nil {
		return nil, err
	}
	review, err := c.kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: p.Namespace, Verb: "create", Resource: "events",
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("asking whether you may record the reset: %w", err)
	}
	if !review.Status.Allowed {
		return nil, &RefusedError{Verb: "create", Resource: "events", Namespace: p.Namespace, Role: ResetterRole,
			Note: "a reset is recorded as an Event on the policy: nothing was reset"}
	}
	user := c.whoAmI(ctx)
	body, err := c.Post(ctx, t, debugapi.ResetPath, q, h)
	if err != nil {
		return nil, err
	}
	res := &ResetResult{Pod: t.Pod, RequestedBy: user}
	if err := json.Unmarshal(body, &res.ResetResponse); err != nil {
		return nil, fmt.Errorf("pod %s: unexpected answer (the reset may have happened): %w", t.Pod, err)
	}
	ev, err := c.kube.CoreV1().Events(p.Namespace).Create(ctx, resetEvent(p, res, reason, time.Now()), metav1.CreateOptions{})
	if err != nil {
		return res, fmt.Errorf("the client was reset, but its Event was not recorded: %w", err)
	}
	res.Event = ev.Name
	return res, nil
}

// resetEvent is the Event that records res on policy p at now.
func resetEvent(p *v1alpha1.RateLimitPolicy, res *ResetResult, reason string, now time.Time) *corev1.Event {
	msg := fmt.Sprintf("client %s reset by %s with kubectl slidegate: %d of its %d counters held admits, emptied through pod %s",
		res.ClientKey, res.RequestedBy, res.NonEmpty, len(res.RedisKeys), res.Pod)
	if reason != "" {
		msg += "; reason: " + reason
	}
	const maxMessage = 1024 // the API server's bound on an Event's note
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	ts := metav1.NewTime(now)
	return &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name + "." + strconv.FormatInt(now.UnixNano(), 16), Namespace: p.Namespace},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: v1alpha1.GroupVersion.String(), Kind: "RateLimitPolicy",
			Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion,
		},
		Reason: ReasonClientReset, Message: msg, Type: corev1.EventTypeNormal, Action: "Reset",
		Source:         corev1.EventSource{Component: "kubectl-slidegate"},
		FirstTimestamp: ts, LastTimestamp: ts, Count: 1,
		ReportingController: ReportingController, ReportingInstance: "kubectl-slidegate",
	}
}

// whoAmI is the user the API server knows the plugin as (SelfSubjectReview,
// which every authenticated user may ask), or "an unknown user".
func (c *Client) whoAmI(ctx context.Context) string {
	r, err := c.kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil || r.Status.UserInfo.Username == "" {
		return "an unknown user"
	}
	return r.Status.UserInfo.Username
}

// PrintReset writes res as text (format "") or JSON/YAML.
func PrintReset(w io.Writer, res *ResetResult, format string) error {
	if done, err := printJSON(w, res, format); done {
		return err
	}
	_, err := fmt.Fprintf(w, "reset client %s of policy %s/%s: %d of %d counters held admits (%s)\nrecorded as Event %s\n",
		res.ClientKey, res.Namespace, res.Policy, res.NonEmpty, len(res.RedisKeys), strings.Join(res.RedisKeys, ", "), res.Event)
	return err
}
