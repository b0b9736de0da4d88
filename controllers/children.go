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
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

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
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// childLabels are the labels of every object the controller creates.
func childLabels(component string) map[string]string {
	return map[string]string{
		v1alpha1.ManagedByLabel:       v1alpha1.ManagedByValue,
		"app.kubernetes.io/name":      "slidegate",
		"app.kubernetes.io/component": component,
	}
}

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
	lbls := childLabels(component)
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
	if err := c.Apply(ctx, ac, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		if namespaceTerminating(err) {
			return nil // its policies are going too; the next reconcile cleans up
		}
		return fmt.Errorf("applying ConfigMap %s: %w", key, err)
	}
	writesCounter.WithLabelValues("configmap", "apply").Inc()
	logf.FromContext(ctx).Info("applied the configuration", "configMap", klog.KRef(key.Namespace, key.Name), "revision", revision)
	return nil
}

// mirrorCredentials keeps the namespace's slidegate-redis-credentials
// Secret (credentialsFor): only in a namespace labelled for injection
// (optedIn), which has a sidecar policy since it is reconciled; in any
// other the Secret and the namespace's Redis user go. It returns a problem
// (for the Ready condition) when the sidecars cannot get credentials, and
// an error when the API fails. Secret data is never logged nor put into
// messages.
func (r *RateLimitPolicyReconciler) mirrorCredentials(ctx context.Context, ns string, policies []v1alpha1.RateLimitPolicy, pods []corev1.Pod,
	optedIn bool, owners []metav1.OwnerReference) (*problem, error) {
	key := types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}
	if key == r.RedisCredentials {
		return nil, nil // the manager's Secret itself: nothing to copy
	}
	if !optedIn {
		// No sidecar is injected here: no credentials to hand out.
		r.removeIdentity(ctx, ns)
		return nil, deleteManaged(ctx, r.Client, r.Client, key, &corev1.Secret{}, "secret", "the namespace is not labelled for injection")
	}
	data, prob, err := r.credentialsFor(ctx, ns, policies, pods)
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

// credentialsFor is the data of namespace ns's Secret: the client hash
// key; from the manager's Secret, the TLS keys, the sentinels' identity
// when it is fit for tenants (sentinelCredentials), and the shared
// identity while it is the mode, or while a sidecar of the namespace uses
// it and the namespace holds it already (holdsShared); and the namespace's
// own identity once it is set up on every node. A nil map with a problem leaves the Secret as it
// is (the manager's Secret is missing: the sidecars keep what they have).
func (r *RateLimitPolicyReconciler) credentialsFor(ctx context.Context, ns string, policies []v1alpha1.RateLimitPolicy, pods []corev1.Pod) (map[string][]byte, *problem, error) {
	data := withClientHashKey(map[string][]byte{}, r.clientHashKey(ctx, ns))
	var prob *problem
	if r.RedisCredentials.Name != "" {
		src, missing, err := r.credentialsData(ctx)
		if missing != nil || err != nil {
			return nil, missing, err
		}
		shared := r.mode() == IdentityShared
		if !shared && len(sharedSidecars(pods)) > 0 {
			if shared, err = r.holdsShared(ctx, ns, src); err != nil {
				return nil, nil, err
			}
		}
		sentinel, sprob, unknown := r.sentinelCredentials(ctx, src)
		if unknown {
			return nil, sprob, nil // as it is, until the sentinels answer
		}
		for k, v := range src {
			if !shared && (k == redisconn.SecretUsernameKey || k == redisconn.SecretPasswordKey) {
				continue
			}
			if !sentinel && (k == redisconn.SecretSentinelUsernameKey || k == redisconn.SecretSentinelPasswordKey) {
				continue
			}
			data[k] = v
		}
		prob = sprob
	}
	if r.administered() {
		user, password, p := r.namespaceIdentity(ctx, ns, policies)
		if user != "" {
			data[redisconn.SecretNamespaceUsernameKey], data[redisconn.SecretNamespacePasswordKey] = []byte(user), []byte(password)
		}
		if p != nil && r.mode() == IdentityNamespace && prob == nil {
			// New sidecars authenticate as the namespace: without it they
			// cannot. (In the shared mode it is only being prepared.)
			prob = p
		}
	}
	return data, prob, nil
}

// sentinelCredentials reports whether the sentinels' identity of src
// (sentinel-username, sentinel-password) goes to the namespaces: only in
// sentinel mode (elsewhere no sidecar reads it) and only when the
// sentinels refuse it every command beyond discovery
// (redisadmin.SentinelPowers). Every tenant reads its namespace's copy:
// with SENTINEL REMOVE it takes the master from every namespace, with
// SENTINEL MONITOR it points the sidecars at a master of its own, which
// collects their AUTH. A problem says why it is held back; the namespaces'
// sidecars then find no master. unknown: no sentinel answered and the
// identity was never checked; the copies stay as they are (taking the
// identity away during an outage would keep the sidecars from the master
// after it).
func (r *RateLimitPolicyReconciler) sentinelCredentials(ctx context.Context, src map[string][]byte) (handOut bool, prob *problem, unknown bool) {
	user, password := src[redisconn.SecretSentinelUsernameKey], src[redisconn.SecretSentinelPasswordKey]
	check := r.sentinelCheck()
	if check == nil || (user == nil && password == nil) {
		return false, nil, false
	}
	powers, err := check.Powers(ctx, string(user), string(password))
	if err != nil {
		return false, credentialsProblem(fmt.Sprintf("the sentinels' identity in the Secret %s could not be checked (no sentinel answered): %v", r.RedisCredentials, err)), true
	}
	if len(powers) > 0 {
		return false, credentialsProblem(fmt.Sprintf("the sentinels' identity in the Secret %s (%s, %s) may change what the sentinels monitor (%s): "+
			"every namespace would hold it, so it is not handed out and the sidecars cannot find the master; "+
			"give the sidecars an identity of their own with only the discovery ACL (docs/security.md, \"Sentinel\")",
			r.RedisCredentials, redisconn.SecretSentinelUsernameKey, redisconn.SecretSentinelPasswordKey, strings.Join(powers, ", "))), false
	}
	return true, nil, false
}

// holdsShared reports whether namespace ns's Secret already holds the
// shared identity of src, as the manager's earlier release or the shared
// mode wrote it. Only there is it kept for the sidecars that use it: a
// pod's injection status is the pod author's to write (an annotation can be
// changed after the webhook), so a status that claims a sidecar of an
// earlier release must not bring the identity that reaches every
// namespace's keys to a namespace that does not already hold it.
func (r *RateLimitPolicyReconciler) holdsShared(ctx context.Context, ns string, src map[string][]byte) (bool, error) {
	var cur corev1.Secret
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}, &cur)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading the Secret %s/%s: %w", ns, v1alpha1.RedisCredentialsSecretName, err)
	}
	for _, k := range []string{redisconn.SecretUsernameKey, redisconn.SecretPasswordKey} {
		if !bytes.Equal(cur.Data[k], src[k]) {
			return false, nil
		}
	}
	return true, nil
}

// credentialsData reads the credential keys of the manager's Secret, or the
// problem that keeps them from the sidecars.
func (r *RateLimitPolicyReconciler) credentialsData(ctx context.Context) (map[string][]byte, *problem, error) {
	var src corev1.Secret
	if err := r.credentialsReader().Get(ctx, r.RedisCredentials, &src); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, credentialsProblem(fmt.Sprintf("the Redis credentials Secret %s configured on the manager does not exist", r.RedisCredentials)), nil
		}
		return nil, nil, fmt.Errorf("reading the Redis credentials Secret %s: %w", r.RedisCredentials, err)
	}
	data := map[string][]byte{}
	for _, k := range redisconn.SecretKeys {
		if v, ok := src.Data[k]; ok {
			data[k] = v
		}
	}
	if len(data) == 0 {
		return nil, credentialsProblem(fmt.Sprintf("the Redis credentials Secret %s has none of the keys %s",
			r.RedisCredentials, strings.Join(redisconn.SecretKeys, ", "))), nil
	}
	return data, nil, nil
}

// applyCredentials makes the Secret key hold data, with our labels, the
// source annotation and owners, unless the cached copy already does.
func (r *RateLimitPolicyReconciler) applyCredentials(ctx context.Context, key types.NamespacedName, data map[string][]byte, owners []metav1.OwnerReference) error {
	lbls := childLabels("redis-credentials")
	annotations := map[string]string{}
	if r.RedisCredentials.Name != "" {
		annotations[v1alpha1.SourceAnnotation] = r.RedisCredentials.String()
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
	if err := r.Client.Apply(ctx, ac, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		if namespaceTerminating(err) {
			return nil
		}
		return fmt.Errorf("applying Secret %s: %w", key, err)
	}
	writesCounter.WithLabelValues("secret", "apply").Inc()
	logf.FromContext(ctx).Info("mirrored the Redis credentials", "secret", klog.KRef(key.Namespace, key.Name), "source", klog.KRef(r.RedisCredentials.Namespace, r.RedisCredentials.Name))
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
	writesCounter.WithLabelValues(resource, "delete").Inc()
	logf.FromContext(ctx).Info("deleted: "+why, resource, klog.KRef(key.Namespace, key.Name))
	return nil
}
