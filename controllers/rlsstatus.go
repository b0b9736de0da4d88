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

package controllers

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/rlsconfig"
)

// rlsStatusInput is what the reconcile learned about one policy for the
// rate limit service.
type rlsStatusInput struct {
	notAccepted *problem // as statusInput's
	// unclaimed: its domain is claimed by no namespace (open to all).
	unclaimed bool
	revision  string // the policy's revision in the document
	servers   []serverState
	// namespace and service locate the RLS servers, for the messages.
	namespace, service string
}

// rlsDesiredStatus is the policy's status after this reconcile: Accepted and
// Ready as for the sidecars' policies; matchedPods counts the ready RLS
// servers and enforcedPods those that loaded the policy at its revision. A
// policy not accepted is in effect on no server: both are 0.
func rlsDesiredStatus(p *v1alpha1.RateLimitPolicy, in rlsStatusInput) v1alpha1.RateLimitPolicyStatus {
	st, c := newStatus(p)
	st.MatchedPods, st.EnforcedPods = 0, 0
	if in.notAccepted != nil {
		c.notAccepted(in.notAccepted, "not enforced: the policy is not accepted")
		return *st
	}
	st.MatchedPods = int32(len(in.servers))
	cm := in.namespace + "/" + rlsconfig.ConfigMapName
	c.accepted(in.revision, cm)
	if in.unclaimed {
		c.set(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted, fmt.Sprintf(
			"rendered into ConfigMap %s; its domain %q is claimed by no namespace, so policies of any namespace may limit it too (ConfigMap %s/%s lists who may use which domain)",
			cm, p.Spec.RateLimitService.Domain, in.namespace, render.RLSDomainsConfigMapName))
	}
	c.set(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonPublished,
		"the configuration is published in ConfigMap "+cm+" for the rate limit service")
	loaded := serversLoaded(in)
	st.EnforcedPods = loaded.enforced
	if prob := loaded.problem(in); prob != nil {
		c.failed(v1alpha1.ConditionEnforced, prob)
	} else {
		c.set(v1alpha1.ConditionEnforced, metav1.ConditionTrue, v1alpha1.ReasonEnforced,
			fmt.Sprintf("all %d rate limit service servers loaded revision %s", st.MatchedPods, in.revision))
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

// serversLoaded sorts in.servers by whether they loaded the policy's
// revision, in.revision.
func serversLoaded(in rlsStatusInput) rlsLoaded {
	var out rlsLoaded
	for _, s := range in.servers {
		switch {
		case s.err != nil:
			out.unreachable = append(out.unreachable, s.addr+" ("+s.err.Error()+")")
		case s.loaded[in.revision]:
			out.enforced++
		default:
			out.behind = append(out.behind, s.addr)
		}
	}
	return out
}

// problem is why an accepted policy is not enforced by every ready RLS
// server; nil when it is.
func (l rlsLoaded) problem(in rlsStatusInput) *problem {
	switch {
	case len(in.servers) == 0:
		return &problem{v1alpha1.ReasonNoRateLimitService,
			fmt.Sprintf("no ready endpoint of Service %s/%s with a port named %q: install the rate limit service (config/components/rls, docs/rls.md)",
				in.namespace, in.service, RLSAdminPortName)}
	case l.enforced < int32(len(in.servers)):
		var why []string
		if len(l.behind) > 0 {
			why = append(why, fmt.Sprintf("%s serve an older configuration (the kubelet refreshes the mounted ConfigMap within about a minute)", listOf(l.behind)))
		}
		if len(l.unreachable) > 0 {
			why = append(why, fmt.Sprintf("%s could not be asked", listOf(l.unreachable)))
		}
		return &problem{v1alpha1.ReasonPartiallyEnforced,
			fmt.Sprintf("%d of %d rate limit service servers loaded revision %s; %s", l.enforced, len(in.servers), in.revision, strings.Join(why, "; "))}
	}
	return nil
}
