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

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/owned"
	"github.com/slidegate/slidegate/internal/policystatus"
)

// mirrorCredentials keeps the namespace's slidegate-redis-credentials
// Secret (redisidentity.Identities.SecretData decides its data): only in a
// namespace labelled for injection, which has a sidecar policy since it is
// reconciled; in any other the Secret and the namespace's Redis user go. It returns a problem
// (for the Ready condition) when the sidecars cannot get credentials, and
// an error when the API fails. Secret data is never logged nor put into
// messages.
func (r *RateLimitPolicyReconciler) mirrorCredentials(ctx context.Context, ns string, policies []v1alpha1.RateLimitPolicy, pods []corev1.Pod,
	optedIn bool, owners []metav1.OwnerReference) (*policystatus.Problem, error) {
	key := types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}
	if key == r.Identities.SharedSecret {
		return nil, nil // the manager's Secret itself: nothing to copy
	}
	if !optedIn {
		// No sidecar is injected here: no credentials to hand out.
		r.Identities.Remove(ctx, ns)
		return nil, deleteManaged(ctx, r.Client, r.Client, key, &corev1.Secret{}, "secret", "the namespace is not labelled for injection")
	}
	data, prob, err := r.Identities.SecretData(ctx, ns, policies, pods)
	if err != nil || data == nil {
		return prob, err
	}
	if len(data) == 0 {
		// Nothing to hand out (no credentials configured any more): remove
		// a stale copy.
		return prob, r.deleteManaged(ctx, key, &corev1.Secret{}, "secret")
	}
	return prob, r.applyCredentials(ctx, key, data, owners)
}

// applyCredentials makes the Secret key hold data, with our labels, the
// source annotation and owners, unless the cached copy already does.
func (r *RateLimitPolicyReconciler) applyCredentials(ctx context.Context, key types.NamespacedName, data map[string][]byte, owners []metav1.OwnerReference) error {
	lbls := owned.Labels("redis-credentials")
	annotations := map[string]string{}
	if shared := r.Identities.SharedSecret; shared.Name != "" {
		annotations[v1alpha1.SourceAnnotation] = shared.String()
	}
	var cur corev1.Secret
	err := r.Client.Get(ctx, key, &cur)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("reading Secret %s: %w", key, err)
	case metaUpToDate(&cur.ObjectMeta, lbls, annotations, owners) && credentialsEqual(cur.Data, data):
		return nil
	}

	ac := corev1ac.Secret(key.Name, key.Namespace).
		WithLabels(lbls).
		WithAnnotations(annotations).
		WithOwnerReferences(ownerReferenceApplyConfigs(owners)...).
		WithType(corev1.SecretTypeOpaque).
		WithData(data)
	if err := r.Client.Apply(ctx, ac, client.FieldOwner(owned.FieldOwner), client.ForceOwnership); err != nil {
		if namespaceTerminating(err) {
			return nil
		}
		return fmt.Errorf("applying Secret %s: %w", key, err)
	}
	owned.Wrote("secret", "apply")
	logf.FromContext(ctx).Info("mirrored the Redis credentials", "secret", klog.KRef(key.Namespace, key.Name), "source", klog.KRef(r.Identities.SharedSecret.Namespace, r.Identities.SharedSecret.Name))
	return nil
}
