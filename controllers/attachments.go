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
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/attachment"
)

// The Gateway API objects policies attach to, read as unstructured content
// (package attachment says why) at the version every Gateway API release
// since v1.0 serves.
var targetKinds = []string{"Gateway", "HTTPRoute"}

// gatewayAPIRecheck is how often policies are looked at again while the
// Gateway API was not installed when the manager started (so nothing is
// watched that would say when it is).
const gatewayAPIRecheck = time.Minute

// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=gateways;httproutes,verbs=get;list;watch

// targetGVK is the version of kind read.
func targetGVK(kind string) schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: v1alpha1.GatewayAPIGroup, Version: "v1", Kind: kind}
}

// watchTargets adds watches of the Gateway API's Gateways and HTTPRoutes
// (their metadata: a create, a delete or a spec change reconciles) when the
// API server serves them; it reports whether it does.
func watchTargets(b *builder.Builder, mapper meta.RESTMapper, h handler.EventHandler) (bool, error) {
	for _, kind := range targetKinds {
		gvk := targetGVK(kind)
		if _, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			if meta.IsNoMatchError(err) {
				return false, nil
			}
			return false, fmt.Errorf("looking up %s: %w", gvk, err)
		}
	}
	for _, kind := range targetKinds {
		m := &metav1.PartialObjectMetadata{}
		m.SetGroupVersionKind(targetGVK(kind))
		b.Watches(m, h, builder.WithPredicates(predicate.GenerationChangedPredicate{}))
	}
	return true, nil
}

// attachments looks up the targets of each policy with targetRefs and
// resolves them (attachment.Resolve), keyed by policy, with the objects
// found. The lookups read the
// API server (unstructured objects are not cached), one per target; a
// Gateway API that is not installed makes every target missing.
func attachments(ctx context.Context, c client.Reader, policies []v1alpha1.RateLimitPolicy) (map[types.NamespacedName]attachment.Result, map[types.NamespacedName][]attachment.Found, bool, error) {
	out := map[types.NamespacedName]attachment.Result{}
	objects := map[types.NamespacedName][]attachment.Found{}
	noAPI := ""
	for i := range policies {
		p := &policies[i]
		if len(p.Spec.TargetRefs) == 0 {
			continue
		}
		found := make([]attachment.Found, len(p.Spec.TargetRefs))
		for j, ref := range p.Spec.TargetRefs {
			found[j].Ref = ref
			if noAPI != "" {
				continue
			}
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(targetGVK(ref.Kind))
			err := c.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: ref.Name}, u)
			switch {
			case err == nil:
				found[j].Object = u
			case apierrors.IsNotFound(err):
			case meta.IsNoMatchError(err):
				noAPI = "the Gateway API (" + v1alpha1.GatewayAPIGroup + "/v1) is not installed in this cluster"
			default:
				return nil, nil, false, fmt.Errorf("reading %s %s/%s: %w", ref.Kind, p.Namespace, ref.Name, err)
			}
		}
		k := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
		out[k] = attachment.Resolve(p, found, noAPI, p.Generation)
		objects[k] = found
	}
	return out, objects, noAPI != "", nil
}
