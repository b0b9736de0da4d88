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

package render

import (
	"errors"
	"fmt"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/rlsconfig"
)

// AttachedDescriptor is the rate limit service target of a policy with
// targetRefs: the reserved domain, an entry that names the policy, and one
// without a value that carries the client's key (none for the key source
// Global). The gateway's rate limit actions send exactly that descriptor
// (package envoyrender renders them), so the policy's namespace and name,
// not a domain a tenant chose, say which policy counts a request.
func AttachedDescriptor(p *v1alpha1.RateLimitPolicy) (*v1alpha1.RateLimitServiceTarget, error) {
	k := p.Spec.Key
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if p.Spec.Match != nil {
		add("match does not apply with targetRefs")
	}
	if p.Spec.Cost != nil {
		add("cost is not supported with targetRefs")
	}
	if k.RemoteAddress != nil || k.JWT != nil {
		add("key.remoteAddress and key.jwt do not apply with targetRefs")
	}
	out := &v1alpha1.RateLimitServiceTarget{
		Domain:     v1alpha1.TargetRefsDomain,
		Descriptor: []v1alpha1.DescriptorEntry{{Key: v1alpha1.TargetRefsPolicyKey, Value: p.Namespace + "/" + p.Name}},
	}
	if id := out.Descriptor[0].Value; len(id) > rlsconfig.MaxStringBytes {
		add("the policy's namespace and name together (%d characters) are longer than a descriptor value may be (%d): shorten the name", len(id), rlsconfig.MaxStringBytes)
	}
	switch k.Source {
	case v1alpha1.KeySourceGlobal:
	case v1alpha1.KeySourceRemoteAddress:
		// Envoy's remote_address action has no key of its own choosing.
		out.Descriptor = append(out.Descriptor, v1alpha1.DescriptorEntry{Key: "remote_address"})
	case v1alpha1.KeySourceHeader, v1alpha1.KeySourceQueryParameter:
		if k.OnMissing != v1alpha1.MissingKeyAllow {
			add("key.onMissing must be Allow with targetRefs: the gateway asks nothing about a request without the %s", k.Source)
		}
		out.Descriptor = append(out.Descriptor, v1alpha1.DescriptorEntry{Key: v1alpha1.TargetRefsClientKey})
	default:
		add("key source %q does not apply with targetRefs (RemoteAddress, Header, QueryParameter or Global)", k.Source)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}
