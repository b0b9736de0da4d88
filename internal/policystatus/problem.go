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
	"errors"
	"fmt"
	"strings"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// Problem is why a condition is not True: its reason is the condition's
// reason (for machines: kstatus, alerts, event reasons), its message the
// condition's message (for people). Conditions are built from problems,
// never from a loose error or string, so a reason cannot travel without its
// message or the other way round. A nil *Problem is no problem.
type Problem struct {
	reason  v1alpha1.ConditionReason
	message string
}

// New is the problem of reason, told by message.
func New(reason v1alpha1.ConditionReason, message string) *Problem {
	return &Problem{reason: reason, message: message}
}

// Reason is the condition reason the problem is reported with.
func (p *Problem) Reason() v1alpha1.ConditionReason { return p.reason }

// Message says what is wrong and, where we know it, what to do.
func (p *Problem) Message() string { return p.message }

// NotAccepted is the problem of a policy the renderer left out of the
// configuration (render.NamespaceResult's or render.ServiceResult's
// NotAccepted): err is a *render.InvalidPolicyError, a
// *render.FootprintTooLargeError, a *render.ConfigTooLargeError or a
// *render.DomainNotAllowedError (possibly wrapped).
func NotAccepted(err error) *Problem {
	if notAllowed, ok := errors.AsType[*render.DomainNotAllowedError](err); ok {
		return New(v1alpha1.ReasonDomainNotAllowed, "not published: "+notAllowed.Error())
	}
	if footprint, ok := errors.AsType[*render.FootprintTooLargeError](err); ok {
		return New(v1alpha1.ReasonFootprintTooLarge, "not published: "+footprint.Error())
	}
	if tooLarge, ok := errors.AsType[*render.ConfigTooLargeError](err); ok {
		hint := "; make room by deleting or shrinking policies of this namespace (fewer or shorter pathPrefixes, smaller selectors)"
		if tooLarge.RateLimitService {
			hint = "; make room by deleting or shrinking this namespace's policies for the rate limit service (fewer descriptor entries, shorter keys and values)"
		}
		return New(v1alpha1.ReasonConfigTooLarge, "not published: "+tooLarge.Error()+hint)
	}
	return New(v1alpha1.ReasonInvalid, "the spec cannot be enforced: "+err.Error())
}

// HeldBack is the problem of a valid policy that needs minor version minor
// of the sidecar configuration while the pods legacy of namespace ns run
// sidecars that read only minor version 0; nil for minor 0.
func HeldBack(minor int, legacy []string, ns string) *Problem {
	if minor == 0 {
		return nil
	}
	return New(v1alpha1.ReasonSidecarsOutdated, fmt.Sprintf(
		"not published yet: the policy needs sidecar configuration %s, and pods %s run sidecars of an earlier slidegate, which read %s only and would refuse the whole configuration; "+
			"restart them to update their sidecars (kubectl -n %s rollout restart ...)",
		sidecarconfig.VersionOf(minor), ListOf(legacy), sidecarconfig.VersionOf(0), ns))
}

// Skipped is the problem of a published policy that the sidecars of pods
// skip: they read minor versions older than minor, which the policy needs
// (SkippingSidecars); nil when there are none.
func Skipped(minor int, pods []string, ns string) *Problem {
	if len(pods) == 0 {
		return nil
	}
	return New(v1alpha1.ReasonSidecarsOutdated, fmt.Sprintf(
		"pods %s run sidecars of an earlier slidegate, which leave this policy out (it needs sidecar configuration %s) and so do not enforce it; "+
			"restart them to update their sidecars (kubectl -n %s rollout restart ...)",
		ListOf(pods), sidecarconfig.VersionOf(minor), ns))
}

// Credentials is the problem of sidecars that cannot get their Redis
// credentials; why says what is wrong.
func Credentials(why string) *Problem {
	return New(v1alpha1.ReasonRedisCredentialsUnavailable, why)
}

// Keys is the problem of a policy that verifies tokens without keys: no
// token verifies, so onMissing decides every request.
func Keys(why string, p *v1alpha1.RateLimitPolicy) *Problem {
	onMissing := p.Spec.Key.OnMissing
	if onMissing == "" {
		onMissing = v1alpha1.MissingKeyRemoteAddress
	}
	return New(v1alpha1.ReasonJWTKeysUnavailable, fmt.Sprintf(
		"no keys to verify bearer tokens with: %s; until there are, no token verifies and onMissing %s decides every request", why, onMissing))
}

// Unverified is what the Accepted condition of a policy stored before
// key.jwt existed says: its tokens are read unverified.
func Unverified() *Problem {
	return New(v1alpha1.ReasonUnverifiedJWT, "rendered into ConfigMap "+sidecarconfig.ConfigMapName+
		", but key.jwt is not set, so bearer tokens are read WITHOUT verification: a client that reaches the pods chooses its own claim, "+
		"and so its own budget, with every request. Set key.jwt: issuer, audiences and jwks to verify tokens, "+
		"or insecureSkipVerification: VerifiedUpstream if a gateway in front of the pods verifies every token")
}

// ListOf names at most three items and counts the rest.
func ListOf(items []string) string {
	if len(items) > 3 {
		return fmt.Sprintf("%s and %d more", strings.Join(items[:3], ", "), len(items)-3)
	}
	return strings.Join(items, ", ")
}
