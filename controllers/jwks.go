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
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/jwksfetch"
	"github.com/slidegate/slidegate/internal/jwtverify"
	"github.com/slidegate/slidegate/internal/kubecache"
	"github.com/slidegate/slidegate/internal/policystatus"
	"github.com/slidegate/slidegate/internal/render"
)

// Key sets of the policies that verify tokens (key.jwt, issue 23). A
// policy names its keys by a key of its namespace's ConfigMap
// slidegate-jwks (v1alpha1.JWKSConfigMapName) or by URL. The manager reads
// that one ConfigMap name (RBAC by name: it reads no other ConfigMap, and
// no Secret a policy names, since a policy's author need not be allowed to
// read what the manager can, and whatever it reads it publishes in the
// sidecar configuration), and fetches the URLs itself (jwksfetch): the
// sidecars make no network call.
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=list;watch,resourceNames=slidegate-jwks

// jwksURLIndex indexes RateLimitPolicies by the URL of their key set, for
// the fetcher: which namespaces to reconcile when a URL's keys change, and
// whether any policy still names a URL.
const jwksURLIndex = "spec.key.jwt.jwks.url"

// jwksURL is the IndexerFunc of jwksURLIndex.
func jwksURL(obj client.Object) []string {
	p, ok := obj.(*v1alpha1.RateLimitPolicy)
	if !ok || p.Spec.Key.JWT == nil || p.Spec.Key.JWT.JWKS == nil || p.Spec.Key.JWT.JWKS.URL == "" {
		return nil
	}
	return []string{p.Spec.Key.JWT.JWKS.URL}
}

// KeySetObjects are the objects of the cache of key sets
// (RateLimitPolicyReconciler.KeySets): the ConfigMaps named slidegate-jwks,
// in every namespace, and no other (the field selector is what lets RBAC
// restrict the list and watch to that name).
func KeySetObjects() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{&corev1.ConfigMap{}: {Field: kubecache.NameSelector(v1alpha1.JWKSConfigMapName)}}
}

// NewKeySetFetcher builds the fetcher of key set URLs from opts: it asks
// the policy index (through policies, the manager's client) whether a URL
// is still named, and on a change sends the namespaces whose policies name
// the URL to wake. It runs on the leader only, as the controller does.
func NewKeySetFetcher(opts jwksfetch.Options, policies client.Reader, wake chan<- event.TypedGenericEvent[client.Object]) *jwksfetch.Fetcher {
	namespaces := func(url string) ([]string, error) {
		var list v1alpha1.RateLimitPolicyList
		if err := policies.List(context.Background(), &list, client.MatchingFields{jwksURLIndex: url}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, err
		}
		var out []string
		for i := range list.Items {
			if !slices.Contains(out, list.Items[i].Namespace) {
				out = append(out, list.Items[i].Namespace)
			}
		}
		return out, nil
	}
	opts.NamedBy = namespaces
	opts.Changed = func(ctx context.Context, url string) {
		ns, _ := namespaces(url)
		for _, n := range ns {
			obj := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: n}}
			select {
			case wake <- event.TypedGenericEvent[client.Object]{Object: obj}:
			case <-ctx.Done(): // the manager stops: nobody reads wake any more
				return
			}
		}
	}
	return jwksfetch.New(opts)
}

// keySets resolves the key sets of the policies that verify tokens, by
// render.KeySetRef, and says for each policy whose set is unavailable why
// (policystatus.Keys), or, for one whose URL failed to refresh, that it renders
// the last good keys (keysNote).
func (r *RateLimitPolicyReconciler) keySets(ctx context.Context, ns string, policies []v1alpha1.RateLimitPolicy) (sets map[string][]byte, problems map[string]*policystatus.Problem, notes map[string]string, err error) {
	sets, problems, notes = map[string][]byte{}, map[string]*policystatus.Problem{}, map[string]string{}
	var cm *corev1.ConfigMap
	cmRead := false
	for i := range policies {
		p := &policies[i]
		j := p.Spec.Key.JWT
		if p.Spec.Key.Source != v1alpha1.KeySourceJWTClaim || j == nil || j.JWKS == nil || j.InsecureSkipVerification != "" {
			continue
		}
		ref := render.KeySetRef(j.JWKS)
		var keys []byte
		var why, note string
		if j.JWKS.URL != "" {
			keys, why, note = r.fetchedKeySet(j.JWKS.URL, ns)
		} else {
			if !cmRead {
				cmRead = true
				if cm, err = r.jwksConfigMap(ctx, ns); err != nil {
					return nil, nil, nil, err
				}
			}
			keys, why = configMapKeySet(cm, ns, j.JWKS.ConfigMapKey)
		}
		if keys != nil {
			sets[ref] = keys
		}
		if why != "" {
			problems[p.Name] = policystatus.Keys(why, p)
		}
		if note != "" {
			notes[p.Name] = note
		}
	}
	return sets, problems, notes, nil
}

// jwksConfigMap reads the namespace's slidegate-jwks ConfigMap; nil when
// there is none.
func (r *RateLimitPolicyReconciler) jwksConfigMap(ctx context.Context, ns string) (*corev1.ConfigMap, error) {
	var reader client.Reader = r.Client
	if r.KeySets != nil {
		reader = r.KeySets
	}
	cm := &corev1.ConfigMap{}
	err := reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.JWKSConfigMapName}, cm)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading ConfigMap %s/%s: %w", ns, v1alpha1.JWKSConfigMapName, err)
	}
	return cm, nil
}

// configMapKeySet is the canonical key set under key of cm, or why there
// is none.
func configMapKeySet(cm *corev1.ConfigMap, ns, key string) ([]byte, string) {
	if cm == nil {
		return nil, fmt.Sprintf("ConfigMap %s does not exist in namespace %s (create it with the key set under the key %q)", v1alpha1.JWKSConfigMapName, ns, key)
	}
	data, ok := cm.Data[key]
	raw := []byte(data)
	if !ok {
		if raw, ok = cm.BinaryData[key]; !ok {
			return nil, fmt.Sprintf("ConfigMap %s has no key %q", v1alpha1.JWKSConfigMapName, key)
		}
	}
	keys, _, err := jwtverify.Normalize(raw)
	if err != nil {
		return nil, fmt.Sprintf("the key set under %q of ConfigMap %s is not usable: %v", key, v1alpha1.JWKSConfigMapName, err)
	}
	return keys, ""
}

// fetchedKeySet is the key set of url, for a policy of namespace ns, as
// last fetched, or why there is none; note says that the last refresh
// failed while older keys render.
func (r *RateLimitPolicyReconciler) fetchedKeySet(url, ns string) (keys []byte, why, note string) {
	if r.Fetcher == nil {
		return nil, "this manager fetches no key set URLs (its controller was set up without the fetcher)", ""
	}
	res, done := r.Fetcher.Get(url, ns)
	switch {
	case !done:
		return nil, fmt.Sprintf("fetching the key set from %s (first fetch under way)", url), ""
	case res.Keys == nil:
		return nil, fmt.Sprintf("fetching the key set from %s failed: %s", url, fetchError(res)), ""
	case res.Err != nil:
		return res.Keys, "", fmt.Sprintf("; the keys are those last fetched from %s, whose refresh fails: %s", url, fetchError(res))
	}
	return res.Keys, "", ""
}

// fetchError is what a policy's status says of a failed fetch: not what an
// internal host answered (a status code, a refused port, a certificate's
// names), which would make the manager a tenant's probe of the cluster's
// network; the manager's log has it.
func fetchError(res jwksfetch.Result) string {
	if res.Internal {
		return "the host is internal, so why is in the manager's log only"
	}
	return res.Err.Error()
}
