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

package redisidentity

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/clienthash"
	"github.com/slidegate/slidegate/internal/policystatus"
	"github.com/slidegate/slidegate/internal/redisconn"
)

// SecretData is the data of namespace ns's slidegate-redis-credentials
// Secret, for its sidecar policies and its running pods: the client hash
// key; from the manager's Secret, the TLS keys, the sentinels' identity
// when it is fit for tenants (sentinelCredentials), and the shared
// identity while it is the mode, or while a sidecar of the namespace uses
// it and the namespace holds it already (holdsShared); and the namespace's
// own identity once it is set up on every node. A nil map with a problem
// leaves the Secret as it is (the manager's Secret is missing: the
// sidecars keep what they have). Secret data is never logged nor put into
// messages.
func (ri *Identities) SecretData(ctx context.Context, ns string, policies []v1alpha1.RateLimitPolicy, pods []corev1.Pod) (map[string][]byte, *policystatus.Problem, error) {
	data := map[string][]byte{}
	if key := ri.Key.NamespaceKey(ctx, ns); key != "" {
		data[clienthash.SecretDataKey] = []byte(key)
	}
	var prob *policystatus.Problem
	if ri.SharedSecret.Name != "" {
		src, missing, err := ri.sharedData(ctx)
		if missing != nil || err != nil {
			return nil, missing, err
		}
		shared := ri.CurrentMode() == Shared
		if !shared && len(sharedSidecars(pods)) > 0 {
			if shared, err = ri.holdsShared(ctx, ns, src); err != nil {
				return nil, nil, err
			}
		}
		sentinel, sprob, unknown := ri.sentinelCredentials(ctx, src)
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
	if ri.Administered() {
		user, password, p := ri.namespaceIdentity(ctx, ns, policies)
		if user != "" {
			data[redisconn.SecretNamespaceUsernameKey], data[redisconn.SecretNamespacePasswordKey] = []byte(user), []byte(password)
		}
		if p != nil && ri.CurrentMode() == Namespace && prob == nil {
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
func (ri *Identities) sentinelCredentials(ctx context.Context, src map[string][]byte) (handOut bool, prob *policystatus.Problem, unknown bool) {
	user, password := src[redisconn.SecretSentinelUsernameKey], src[redisconn.SecretSentinelPasswordKey]
	check := ri.sentinelCheck()
	if check == nil || (user == nil && password == nil) {
		return false, nil, false
	}
	powers, err := check.Powers(ctx, string(user), string(password))
	if err != nil {
		return false, policystatus.Credentials(fmt.Sprintf("the sentinels' identity in the Secret %s could not be checked (no sentinel answered): %v", ri.SharedSecret, err)), true
	}
	if len(powers) > 0 {
		return false, policystatus.Credentials(fmt.Sprintf("the sentinels' identity in the Secret %s (%s, %s) may change what the sentinels monitor (%s): "+
			"every namespace would hold it, so it is not handed out and the sidecars cannot find the master; "+
			"give the sidecars an identity of their own with only the discovery ACL (docs/security.md, \"Sentinel\")",
			ri.SharedSecret, redisconn.SecretSentinelUsernameKey, redisconn.SecretSentinelPasswordKey, strings.Join(powers, ", "))), false
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
func (ri *Identities) holdsShared(ctx context.Context, ns string, src map[string][]byte) (bool, error) {
	var cur corev1.Secret
	err := ri.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}, &cur)
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

// sharedData reads the credential keys of the manager's Secret, or the
// problem that keeps them from the sidecars.
func (ri *Identities) sharedData(ctx context.Context) (map[string][]byte, *policystatus.Problem, error) {
	var reader client.Reader = ri.Client
	if ri.SharedReader != nil {
		reader = ri.SharedReader
	}
	var src corev1.Secret
	if err := reader.Get(ctx, ri.SharedSecret, &src); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, policystatus.Credentials(fmt.Sprintf("the Redis credentials Secret %s configured on the manager does not exist", ri.SharedSecret)), nil
		}
		return nil, nil, fmt.Errorf("reading the Redis credentials Secret %s: %w", ri.SharedSecret, err)
	}
	data := map[string][]byte{}
	for _, k := range redisconn.SecretKeys {
		if v, ok := src.Data[k]; ok {
			data[k] = v
		}
	}
	if len(data) == 0 {
		return nil, policystatus.Credentials(fmt.Sprintf("the Redis credentials Secret %s has none of the keys %s",
			ri.SharedSecret, strings.Join(redisconn.SecretKeys, ", "))), nil
	}
	return data, nil, nil
}

// sharedSidecars names the pods whose sidecar authenticates with the
// identity shared by every namespace: injected ones whose status does not
// say RedisIdentityNamespace (those of earlier releases say nothing). While
// one runs (terminating included), the namespace keeps the shared
// credentials: its sidecar reads them from the environment (resolved again
// when it restarts in place) or from its mounted Secret.
func sharedSidecars(pods []corev1.Pod) []string {
	var names []string
	for i := range pods {
		raw, injected := pods[i].Annotations[v1alpha1.InjectedAnnotation]
		if !injected {
			continue
		}
		var st v1alpha1.InjectionStatus
		if json.Unmarshal([]byte(raw), &st) != nil || st.RedisIdentity != v1alpha1.RedisIdentityNamespace {
			names = append(names, pods[i].Name)
		}
	}
	slices.Sort(names)
	return names
}
