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
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/slidegate/slidegate/internal/clienthash"
	"github.com/slidegate/slidegate/internal/owned"
)

// The install key: one random key in the manager's namespace
// (clienthash.InstallSecretName), from which the namespaces' Redis
// passwords (redisadmin.Passwords) and the keys of the client hashes that
// the sidecars' /debug answers show (package clienthash) are derived; the
// latter is mirrored into each namespace's slidegate-redis-credentials
// Secret, next to the Redis credentials.
//
// It is read once per manager start, by the leader, with a get of that one
// Secret by name; a missing Secret is created with a random key. To rotate
// the client hash key, delete the Secret and restart the manager; the
// sidecars take the new key when their pods restart.

// +kubebuilder:rbac:groups="",namespace=system,resources=secrets,verbs=get,resourceNames=slidegate-install-secret

// InstallKey reads the install key, once. A nil *InstallKey has none.
type InstallKey struct {
	// Secret holds the key; empty Name: none (no key is mirrored, and the
	// sidecars hash with keys of their own; no namespace gets a Redis
	// identity of its own).
	Secret types.NamespacedName
	// Reader reads the API server itself (the manager's cache does not
	// hold the Secret), Writer creates the Secret.
	Reader client.Reader
	Writer client.Writer

	mu sync.Mutex
	// read: the Secret was read (key is what it held, nil when unusable).
	read bool
	key  []byte
	// lastErr is the last failure to read it, as logged.
	lastErr string
}

// Get is the install key; it creates the Secret when it does not exist. A
// Secret without a usable key disables the key (logged once) until the
// manager restarts: nil, nil.
func (k *InstallKey) Get(ctx context.Context) ([]byte, error) {
	if k == nil || k.Secret.Name == "" {
		return nil, nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.read {
		return k.key, nil
	}
	log := logf.FromContext(ctx).WithValues("secret", klog.KRef(k.Secret.Namespace, k.Secret.Name))
	var s corev1.Secret
	err := k.Reader.Get(ctx, k.Secret, &s)
	switch {
	case apierrors.IsNotFound(err):
		s = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: k.Secret.Name, Namespace: k.Secret.Namespace, Labels: owned.Labels("install-secret")},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{clienthash.SecretDataKey: []byte(clienthash.NewInstallKey())},
		}
		if err := k.Writer.Create(ctx, &s); err != nil {
			// Another manager may have made it meanwhile: the retry reads it.
			return nil, fmt.Errorf("creating the install Secret %s: %w", k.Secret, err)
		}
		owned.Wrote("secret", "create")
		log.Info("created the install Secret with a random client hash key")
	case err != nil:
		return nil, fmt.Errorf("reading the install Secret %s: %w", k.Secret, err)
	}
	k.read = true
	key := s.Data[clienthash.SecretDataKey]
	if len(key) < clienthash.MinKeyBytes {
		log.Error(nil, "the install Secret has no usable client hash key: the sidecars hash /debug's client keys with keys of their own; "+
			"delete the Secret and restart the manager to have one made", "key", clienthash.SecretDataKey, "minBytes", clienthash.MinKeyBytes)
		return nil, nil
	}
	k.key = key
	return key, nil
}

// NamespaceKey is namespace ns's client hash key, "" when there is no
// usable install key. A key that cannot be had never holds up the rest of
// the reconcile (the sidecars then hash with keys of their own): the
// failure is logged when it changes, and a failed read is tried again on
// the next reconcile.
func (k *InstallKey) NamespaceKey(ctx context.Context, ns string) string {
	install, err := k.Get(ctx)
	if err != nil {
		k.mu.Lock()
		if msg := err.Error(); msg != k.lastErr {
			k.lastErr = msg
			logf.FromContext(ctx).Error(err, "no client hash key to mirror; retrying with the next reconcile")
		}
		k.mu.Unlock()
		return ""
	}
	if install == nil {
		return ""
	}
	return clienthash.NamespaceKey(install, ns)
}
