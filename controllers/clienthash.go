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
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/slidegate/slidegate/internal/clienthash"
)

// The key of the client hashes that the sidecars' /debug answers show
// (package clienthash): one install key in the manager's namespace
// (InstallSecret), from which each namespace's key is derived and mirrored
// into its slidegate-redis-credentials Secret, next to the Redis
// credentials.
//
// The install key is read once per manager start, by the leader (the
// reconciler), with a get of that one Secret by name; a missing Secret is
// created with a random key. To rotate it, delete the Secret and restart
// the manager; the sidecars take the new key when their pods restart.

// +kubebuilder:rbac:groups="",namespace=system,resources=secrets,verbs=get,resourceNames=slidegate-install-secret

// clientHashKey is namespace ns's client hash key, "" when the reconciler
// has no InstallSecret or no usable key. A key that cannot be had never
// holds up the rest of the reconcile (the sidecars then hash with keys of
// their own): the failure is logged when it changes, and a failed read is
// tried again on the next reconcile.
func (r *RateLimitPolicyReconciler) clientHashKey(ctx context.Context, ns string) string {
	if r.InstallSecret.Name == "" {
		return ""
	}
	install, err := r.installKey(ctx)
	if err != nil {
		r.installMu.Lock()
		if msg := err.Error(); msg != r.installErr {
			r.installErr = msg
			logf.FromContext(ctx).Error(err, "no client hash key to mirror; retrying with the next reconcile")
		}
		r.installMu.Unlock()
		return ""
	}
	if install == nil {
		return ""
	}
	return clienthash.NamespaceKey(install, ns)
}

// installKey reads the install key, once; it creates the Secret when it
// does not exist. A Secret without a usable key disables the hashes' key
// (logged once) until the manager restarts.
func (r *RateLimitPolicyReconciler) installKey(ctx context.Context) ([]byte, error) {
	r.installMu.Lock()
	defer r.installMu.Unlock()
	if r.installRead {
		return r.install, nil
	}
	log := logf.FromContext(ctx).WithValues("secret", klog.KRef(r.InstallSecret.Namespace, r.InstallSecret.Name))
	var s corev1.Secret
	err := r.apiReader().Get(ctx, r.InstallSecret, &s)
	switch {
	case apierrors.IsNotFound(err):
		s = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: r.InstallSecret.Name, Namespace: r.InstallSecret.Namespace, Labels: childLabels("install-secret")},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{clienthash.SecretDataKey: []byte(clienthash.NewInstallKey())},
		}
		if err := r.Client.Create(ctx, &s); err != nil {
			// Another manager may have made it meanwhile: the retry reads it.
			return nil, fmt.Errorf("creating the install Secret %s: %w", r.InstallSecret, err)
		}
		writesCounter.WithLabelValues("secret", "create").Inc()
		log.Info("created the install Secret with a random client hash key")
	case err != nil:
		return nil, fmt.Errorf("reading the install Secret %s: %w", r.InstallSecret, err)
	}
	r.installRead = true
	key := s.Data[clienthash.SecretDataKey]
	if len(key) < clienthash.MinKeyBytes {
		log.Error(nil, "the install Secret has no usable client hash key: the sidecars hash /debug's client keys with keys of their own; "+
			"delete the Secret and restart the manager to have one made", "key", clienthash.SecretDataKey, "minBytes", clienthash.MinKeyBytes)
		return nil, nil
	}
	r.install = key
	return key, nil
}

// apiReader reads from the API server itself: set by SetupWithManager
// (the manager's cache does not hold the install Secret), else the client.
func (r *RateLimitPolicyReconciler) apiReader() client.Reader {
	if r.uncached != nil {
		return r.uncached
	}
	return r.Client
}

// withClientHashKey adds a namespace's client hash key to the data of its
// slidegate-redis-credentials Secret.
func withClientHashKey(data map[string][]byte, key string) map[string][]byte {
	if key == "" {
		return data
	}
	if data == nil {
		data = map[string][]byte{}
	}
	data[clienthash.SecretDataKey] = []byte(key)
	return data
}
