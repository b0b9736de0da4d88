package kubectlplugin

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// PolicyStatus is one policy as `kubectl slidegate status` shows it: what
// the controller reported, read from the policy alone (no sidecar is
// asked).
type PolicyStatus struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Accepted, Ready and Enforced are the conditions' statuses (Unknown
	// while the controller has not reported one).
	Accepted string `json:"accepted"`
	Ready    string `json:"ready"`
	Enforced string `json:"enforced"`
	// Reason is the reason of the first of Accepted, Ready, Enforced that
	// is not True (e.g. SidecarsOutdated, ServiceBypassesSidecar); empty
	// when all three are.
	Reason string `json:"reason,omitempty"`
	// MatchedPods and EnforcedPods are the status's counts.
	MatchedPods  int32 `json:"matchedPods"`
	EnforcedPods int32 `json:"enforcedPods"`
	// Revision is the sidecar configuration revision the policy is in.
	Revision string `json:"revision,omitempty"`
	// Current is false while the status describes an earlier generation
	// of the spec (the controller has not caught up).
	Current bool `json:"current"`
	// Conditions are the policy's conditions, with their messages.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Status reads the policies of namespace ns (every namespace when ns is
// empty), or only the one named name, in namespace and name order.
func (c *Client) Status(ctx context.Context, ns, name string) ([]PolicyStatus, error) {
	var policies []v1alpha1.RateLimitPolicy
	if name != "" {
		p, err := c.Policy(ctx, ns, name)
		if err != nil {
			return nil, err
		}
		policies = append(policies, *p)
	} else {
		gvr := v1alpha1.GroupVersion.WithResource("ratelimitpolicies")
		list, err := c.dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			where := ns
			if where == "" {
				where = "(all)"
			}
			return nil, refused(err, "list", "ratelimitpolicies.ratelimit.slidegate.dev", where)
		}
		for _, u := range list.Items {
			var p v1alpha1.RateLimitPolicy
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
				return nil, err
			}
			policies = append(policies, p)
		}
	}
	out := make([]PolicyStatus, 0, len(policies))
	for i := range policies {
		out = append(out, statusOf(&policies[i]))
	}
	slices.SortFunc(out, func(a, b PolicyStatus) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out, nil
}

// statusOf is p's PolicyStatus.
func statusOf(p *v1alpha1.RateLimitPolicy) PolicyStatus {
	s := PolicyStatus{
		Namespace: p.Namespace, Name: p.Name,
		MatchedPods: p.Status.MatchedPods, EnforcedPods: p.Status.EnforcedPods,
		Revision:   p.Status.Revision,
		Current:    p.Status.ObservedGeneration == p.Generation,
		Conditions: p.Status.Conditions,
	}
	for _, t := range []struct {
		typ v1alpha1.ConditionType
		dst *string
	}{{v1alpha1.ConditionAccepted, &s.Accepted}, {v1alpha1.ConditionReady, &s.Ready}, {v1alpha1.ConditionEnforced, &s.Enforced}} {
		*t.dst = string(metav1.ConditionUnknown)
		if c := meta.FindStatusCondition(p.Status.Conditions, string(t.typ)); c != nil {
			*t.dst = string(c.Status)
			if c.Status != metav1.ConditionTrue && s.Reason == "" {
				s.Reason = c.Reason
			}
		}
	}
	return s
}

// PrintStatus writes the policies as a table (with one policy, its
// conditions' messages below), JSON or YAML.
func PrintStatus(w io.Writer, res []PolicyStatus, format string) error {
	if done, err := printJSON(w, res, format); done {
		return err
	}
	if len(res) == 0 {
		_, err := fmt.Fprintln(w, "No RateLimitPolicies found.")
		return err
	}
	rows := [][]string{{"NAMESPACE", "NAME", "ACCEPTED", "READY", "ENFORCED", "PODS", "REVISION", "REASON"}}
	for _, s := range res {
		reason := s.Reason
		if !s.Current {
			reason = strings.TrimSpace(reason + " (status of an earlier generation)")
		}
		rows = append(rows, []string{s.Namespace, s.Name, s.Accepted, s.Ready, s.Enforced,
			strconv.Itoa(int(s.EnforcedPods)) + "/" + strconv.Itoa(int(s.MatchedPods)) + " enforced", orDash(s.Revision), orDash(reason)})
	}
	if err := writeTable(w, rows); err != nil {
		return err
	}
	if len(res) != 1 {
		return nil
	}
	for _, c := range res[0].Conditions {
		if _, err := fmt.Fprintf(w, "\n%s=%s (%s): %s", c.Type, c.Status, c.Reason, c.Message); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintln(w)
	return err
}
