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
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/kubecache"
	"github.com/slidegate/slidegate/internal/policystatus"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// CacheOptions are the manager's cache settings the controller relies on: it
// caches only slidegate's own ConfigMaps and Secrets, selected by name (a
// field selector on metadata.name, which is what lets RBAC restrict the
// list and watch to that name) and by label; Pods only while they have not
// finished (unfinishedPods), trimmed to what the status reads (TrimPod).
// Managed fields are dropped to save memory. The manager's own credentials
// Secret, the slidegate-jwks ConfigMaps and the rate limit service's
// objects are read through caches of their own (internal/kubecache), built
// by internal/manager.
func CacheOptions() cache.Options {
	managed := labels.SelectorFromSet(labels.Set{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue})
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.ConfigMap{}: {Label: managed, Field: kubecache.NameSelector(sidecarconfig.ConfigMapName)},
			&corev1.Secret{}:    {Label: managed, Field: kubecache.NameSelector(v1alpha1.RedisCredentialsSecretName)},
			&corev1.Pod{}:       {Field: unfinishedPods, Transform: policystatus.TrimPod},
			// All of them: another one that admits the app's port undoes
			// ours (policystatus.Guards.ReopeningPolicies). Their annotations are not read
			// (last-applied-configuration can be large).
			&networkingv1.NetworkPolicy{}: {Transform: dropAnnotations},
		},
	}
}

// unfinishedPods selects the pods that have not finished: a pod that
// succeeded (a completed Job's) or failed (an evicted one) runs no
// container, so it needs no sidecar, yet it may stay as an object for a long
// time. The API server filters, and sends a pod that finishes to the watch
// as deleted: the counts drop it as they drop a deleted pod.
var unfinishedPods = fields.AndSelectors(
	fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
	fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)),
)
