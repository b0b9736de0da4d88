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
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/attachment"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/rlsconfig"
)

// ServiceInput is what the reconcile learned about one policy for the
// rate limit service.
type ServiceInput struct {
	NotAccepted *Problem // as Input's
	// Ancestors are, for a policy with targetRefs, its status.ancestors.
	Ancestors []v1alpha1.PolicyAncestorStatus
	// Unclaimed: its domain is claimed by no namespace (open to all).
	Unclaimed bool
	Revision  string // the policy's revision in the document
	Servers   []Server
	// Namespace and Service locate the RLS servers, and AdminPort names
	// the port the controller asks them on, for the messages.
	Namespace, Service, AdminPort string
}

// Server is what one ready RLS server reported: the policy revisions it
// loaded, or why it could not be asked.
type Server struct {
	Addr   string
	Loaded map[string]bool
	Err    error
}

// DesiredService is the policy's status after this reconcile: Accepted and
// Ready as for the sidecars' policies; matchedPods counts the ready RLS
// servers and enforcedPods those that loaded the policy at its revision. A
// policy not accepted is in effect on no server: both are 0.
func DesiredService(p *v1alpha1.RateLimitPolicy, in ServiceInput) v1alpha1.RateLimitPolicyStatus {
	st, c := newStatus(p)
	st.MatchedPods, st.EnforcedPods = 0, 0
	st.Ancestors = in.Ancestors
	if in.NotAccepted != nil {
		c.notAccepted(in.NotAccepted, "not enforced: the policy is not accepted")
		if in.NotAccepted.Reason() == v1alpha1.ReasonTargetNotFound {
			// Creating the target fixes it (GitOps tools may apply the
			// policy first): in progress, not failed.
			meta.RemoveStatusCondition(&st.Conditions, string(v1alpha1.ConditionStalled))
		}
		return *st
	}
	st.MatchedPods = int32(len(in.Servers))
	cm := in.Namespace + "/" + rlsconfig.ConfigMapName
	c.accepted(in.Revision, cm)
	if in.Unclaimed {
		c.set(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted, fmt.Sprintf(
			"rendered into ConfigMap %s; its domain %q is claimed by no namespace, so policies of any namespace may limit it too (ConfigMap %s/%s lists who may use which domain)",
			cm, p.Spec.RateLimitService.Domain, in.Namespace, render.RLSDomainsConfigMapName))
	}
	c.set(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonPublished,
		"the configuration is published in ConfigMap "+cm+" for the rate limit service")
	loaded := serversLoaded(in)
	st.EnforcedPods = loaded.enforced
	if prob := loaded.problem(in); prob != nil {
		c.failed(v1alpha1.ConditionEnforced, prob)
	} else {
		c.set(v1alpha1.ConditionEnforced, metav1.ConditionTrue, v1alpha1.ReasonEnforced,
			fmt.Sprintf("all %d rate limit service servers loaded revision %s", st.MatchedPods, in.Revision))
	}
	return *st
}

// rlsLoaded sorts the ready RLS servers by what they did with one policy.
type rlsLoaded struct {
	enforced int32 // loaded it at its revision
	// behind serve an older revision; unreachable could not be asked (with
	// why).
	behind, unreachable []string
}

// serversLoaded sorts in.Servers by whether they loaded the policy's
// revision, in.Revision.
func serversLoaded(in ServiceInput) rlsLoaded {
	var out rlsLoaded
	for _, s := range in.Servers {
		switch {
		case s.Err != nil:
			out.unreachable = append(out.unreachable, s.Addr+" ("+s.Err.Error()+")")
		case s.Loaded[in.Revision]:
			out.enforced++
		default:
			out.behind = append(out.behind, s.Addr)
		}
	}
	return out
}

// Problem is why an accepted policy is not enforced by every ready RLS
// server; nil when it is.
func (l rlsLoaded) problem(in ServiceInput) *Problem {
	switch {
	case len(in.Servers) == 0:
		return New(v1alpha1.ReasonNoRateLimitService,
			fmt.Sprintf("no ready endpoint of Service %s/%s with a port named %q: install the rate limit service (config/components/rls, docs/rls.md)",
				in.Namespace, in.Service, in.AdminPort))
	case l.enforced < int32(len(in.Servers)):
		var why []string
		if len(l.behind) > 0 {
			why = append(why, fmt.Sprintf("%s serve an older configuration (the kubelet refreshes the mounted ConfigMap within about a minute)", ListOf(l.behind)))
		}
		if len(l.unreachable) > 0 {
			why = append(why, fmt.Sprintf("%s could not be asked", ListOf(l.unreachable)))
		}
		return New(v1alpha1.ReasonPartiallyEnforced,
			fmt.Sprintf("%d of %d rate limit service servers loaded revision %s; %s", l.enforced, len(in.Servers), in.Revision, strings.Join(why, "; ")))
	}
	return nil
}

// ServiceStatuses computes the desired status of each policy for the rate
// limit service, in the order of policies, from the document rendered for
// them and what the ready servers (in Service namespace/service, asked on
// port adminPort) loaded.
func ServiceStatuses(policies []v1alpha1.RateLimitPolicy, rendered render.ServiceResult, attached map[types.NamespacedName]attachment.Result, servers []Server, namespace, service, adminPort string) []v1alpha1.RateLimitPolicyStatus {
	want := make([]v1alpha1.RateLimitPolicyStatus, len(policies))
	for i := range policies {
		p := &policies[i]
		k := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
		in := ServiceInput{
			Unclaimed: rendered.Unclaimed[k],
			Revision:  rendered.Revisions[rlsconfig.PolicyID(p.Namespace, p.Name)],
			Servers:   servers,
			Namespace: namespace, Service: service, AdminPort: adminPort,
		}
		if err := rendered.NotAccepted[k]; err != nil {
			in.NotAccepted = NotAccepted(err)
		}
		if a, ok := attached[k]; ok {
			in.Ancestors = a.Ancestors
			if why := a.Problem(); why != "" {
				in.NotAccepted = New(v1alpha1.ReasonTargetNotFound, why)
			}
		}
		want[i] = DesiredService(p, in)
	}
	return want
}

// ServersBehind reports whether st is the status of an accepted policy
// that a ready RLS server has not loaded (yet).
func ServersBehind(st v1alpha1.RateLimitPolicyStatus) bool {
	return meta.IsStatusConditionTrue(st.Conditions, string(v1alpha1.ConditionAccepted)) && st.EnforcedPods < st.MatchedPods
}
