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
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/clienthash"
	"github.com/slidegate/slidegate/internal/owned"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// applyConfigMap makes the namespace's sidecar ConfigMap hold data, unless
// the cached copy already matches.
func (r *RateLimitPolicyReconciler) applyConfigMap(ctx context.Context, ns string, data []byte, revision string, owners []metav1.OwnerReference) error {
	return applyConfigMap(ctx, r.Client, r.Client, types.NamespacedName{Namespace: ns, Name: sidecarconfig.ConfigMapName},
		sidecarconfig.FileName, "sidecar-config", data, revision, owners)
}

// applyConfigMap makes the ConfigMap key hold data under fileName, with the
// revision annotation and owners, unless the copy that reader has already
// matches (so an unchanged render writes nothing).
func applyConfigMap(ctx context.Context, c client.Client, reader client.Reader, key types.NamespacedName, fileName, component string,
	data []byte, revision string, owners []metav1.OwnerReference) error {
	lbls := owned.Labels(component)
	annotations := map[string]string{v1alpha1.RevisionAnnotation: revision}

	var cur corev1.ConfigMap
	err := reader.Get(ctx, key, &cur)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("reading ConfigMap %s: %w", key, err)
	case metaUpToDate(&cur.ObjectMeta, lbls, annotations, owners) && cur.Data[fileName] == string(data):
		return nil
	}

	ac := corev1ac.ConfigMap(key.Name, key.Namespace).
		WithLabels(lbls).
		WithAnnotations(annotations).
		WithOwnerReferences(ownerReferenceApplyConfigs(owners)...).
		WithData(map[string]string{fileName: string(data)})
	if err := c.Apply(ctx, ac, client.FieldOwner(owned.FieldOwner), client.ForceOwnership); err != nil {
		if namespaceTerminating(err) {
			return nil // its policies are going too; the next reconcile cleans up
		}
		return fmt.Errorf("applying ConfigMap %s: %w", key, err)
	}
	owned.Wrote("configmap", "apply")
	logf.FromContext(ctx).Info("applied the configuration", "configMap", klog.KRef(key.Namespace, key.Name), "revision", revision)
	return nil
}

// mirroredKeys are the data keys of slidegate-redis-credentials that the
// controller writes.
var mirroredKeys = append(slices.Clone(redisconn.SecretKeys), clienthash.SecretDataKey,
	redisconn.SecretNamespaceUsernameKey, redisconn.SecretNamespacePasswordKey)

// credentialsEqual compares the credential keys and the client hash key
// only: keys someone else added are not ours to judge (server-side apply
// leaves them alone too).
func credentialsEqual(cur, want map[string][]byte) bool {
	for _, k := range mirroredKeys {
		c, inCur := cur[k]
		w, inWant := want[k]
		if inCur != inWant || string(c) != string(w) {
			return false
		}
	}
	return true
}

// metaUpToDate reports whether obj carries the wanted labels and annotations
// and exactly the wanted owner references to policies.
func metaUpToDate(obj *metav1.ObjectMeta, lbls, annotations map[string]string, owners []metav1.OwnerReference) bool {
	for k, v := range lbls {
		if got, ok := obj.Labels[k]; !ok || got != v {
			return false
		}
	}
	for k, v := range annotations {
		if got, ok := obj.Annotations[k]; !ok || got != v {
			return false
		}
	}
	var cur []metav1.OwnerReference
	for _, o := range obj.OwnerReferences {
		if o.APIVersion == v1alpha1.GroupVersion.String() && o.Kind == "RateLimitPolicy" {
			cur = append(cur, o)
		}
	}
	key := func(o metav1.OwnerReference) string { return string(o.UID) + "/" + o.Name }
	byKey := func(refs []metav1.OwnerReference) map[string]metav1.OwnerReference {
		m := make(map[string]metav1.OwnerReference, len(refs))
		for _, o := range refs {
			m[key(o)] = o
		}
		return m
	}
	return len(cur) == len(owners) && maps.EqualFunc(byKey(cur), byKey(owners), func(a, b metav1.OwnerReference) bool {
		return a.Controller == nil && a.BlockOwnerDeletion == nil && a.Kind == b.Kind && a.APIVersion == b.APIVersion
	})
}

// ownerReferenceApplyConfigs are owners as server-side apply takes them.
func ownerReferenceApplyConfigs(owners []metav1.OwnerReference) []*metav1ac.OwnerReferenceApplyConfiguration {
	out := make([]*metav1ac.OwnerReferenceApplyConfiguration, 0, len(owners))
	for _, o := range owners {
		out = append(out, metav1ac.OwnerReference().
			WithAPIVersion(o.APIVersion).WithKind(o.Kind).WithName(o.Name).WithUID(o.UID))
	}
	return slices.Clip(out)
}

// namespaceTerminating reports whether a write failed because its namespace
// is being deleted: nothing to repair there.
func namespaceTerminating(err error) bool {
	return apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause)
}

// deleteManaged deletes one of the namespace's children when its last policy
// has gone.
func (r *RateLimitPolicyReconciler) deleteManaged(ctx context.Context, key types.NamespacedName, obj client.Object, resource string) error {
	return deleteManaged(ctx, r.Client, r.Client, key, obj, resource, "the namespace has no policy left")
}

// ownerReferences points at every policy of the namespace, none as
// controller: they all contribute to the children.
func ownerReferences(policies []v1alpha1.RateLimitPolicy) []metav1.OwnerReference {
	refs := make([]metav1.OwnerReference, 0, len(policies))
	for i := range policies {
		refs = append(refs, metav1.OwnerReference{
			APIVersion: v1alpha1.GroupVersion.String(),
			Kind:       "RateLimitPolicy",
			Name:       policies[i].Name,
			UID:        policies[i].UID,
		})
	}
	return refs
}

// deleteManaged deletes the object at key if it is slidegate's (labelled so)
// and not already going; why is for the log.
func deleteManaged(ctx context.Context, c client.Client, reader client.Reader, key types.NamespacedName, obj client.Object, resource, why string) error {
	if err := reader.Get(ctx, key, obj); err != nil {
		return client.IgnoreNotFound(err)
	}
	if obj.GetLabels()[v1alpha1.ManagedByLabel] != v1alpha1.ManagedByValue || !obj.GetDeletionTimestamp().IsZero() {
		return nil
	}
	uid := obj.GetUID()
	if err := c.Delete(ctx, obj, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting %s %s: %w", resource, key, err)
	}
	owned.Wrote(resource, "delete")
	logf.FromContext(ctx).Info("deleted: "+why, resource, klog.KRef(key.Namespace, key.Name))
	return nil
}
