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
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/policystatus"
	"github.com/slidegate/slidegate/internal/redisconn"
)

// mirrorCredentials keeps the namespace's slidegate-redis-credentials
// Secret (credentialsFor): only in a namespace labelled for injection
// (optedIn), which has a sidecar policy since it is reconciled; in any
// other the Secret and the namespace's Redis user go. It returns a problem
// (for the Ready condition) when the sidecars cannot get credentials, and
// an error when the API fails. Secret data is never logged nor put into
// messages.
func (r *RateLimitPolicyReconciler) mirrorCredentials(ctx context.Context, ns string, policies []v1alpha1.RateLimitPolicy, pods []corev1.Pod,
	optedIn bool, owners []metav1.OwnerReference) (*policystatus.Problem, error) {
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
func (r *RateLimitPolicyReconciler) credentialsFor(ctx context.Context, ns string, policies []v1alpha1.RateLimitPolicy, pods []corev1.Pod) (map[string][]byte, *policystatus.Problem, error) {
	data := withClientHashKey(map[string][]byte{}, r.clientHashKey(ctx, ns))
	var prob *policystatus.Problem
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
func (r *RateLimitPolicyReconciler) sentinelCredentials(ctx context.Context, src map[string][]byte) (handOut bool, prob *policystatus.Problem, unknown bool) {
	user, password := src[redisconn.SecretSentinelUsernameKey], src[redisconn.SecretSentinelPasswordKey]
	check := r.sentinelCheck()
	if check == nil || (user == nil && password == nil) {
		return false, nil, false
	}
	powers, err := check.Powers(ctx, string(user), string(password))
	if err != nil {
		return false, policystatus.Credentials(fmt.Sprintf("the sentinels' identity in the Secret %s could not be checked (no sentinel answered): %v", r.RedisCredentials, err)), true
	}
	if len(powers) > 0 {
		return false, policystatus.Credentials(fmt.Sprintf("the sentinels' identity in the Secret %s (%s, %s) may change what the sentinels monitor (%s): "+
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
func (r *RateLimitPolicyReconciler) credentialsData(ctx context.Context) (map[string][]byte, *policystatus.Problem, error) {
	var src corev1.Secret
	if err := r.credentialsReader().Get(ctx, r.RedisCredentials, &src); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, policystatus.Credentials(fmt.Sprintf("the Redis credentials Secret %s configured on the manager does not exist", r.RedisCredentials)), nil
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
		return nil, policystatus.Credentials(fmt.Sprintf("the Redis credentials Secret %s has none of the keys %s",
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
