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

// Package kubecache builds the caches the manager keeps beside its own:
// each holds only the objects it is given (in one namespace, by name or
// label), so that RBAC can grant list and watch on those alone.
package kubecache

import (
	"context"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Scoped is a cache, beside the manager's, of only the objects that
// byObject selects. Its informers exist before the manager starts, so the
// manager starts it with its own caches, and the controllers wait for both
// to sync.
func Scoped(ctx context.Context, mgr ctrl.Manager, byObject map[client.Object]cache.ByObject) (cache.Cache, error) {
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme:           mgr.GetScheme(),
		Mapper:           mgr.GetRESTMapper(),
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject:         byObject,
	})
	if err != nil {
		return nil, err
	}
	for obj := range byObject {
		if _, err := c.GetInformer(ctx, obj); err != nil {
			return nil, err
		}
	}
	return c, mgr.Add(managerCache{c})
}

// NameSelector selects the objects of one name.
func NameSelector(name string) fields.Selector {
	return fields.OneTermEqualSelector("metadata.name", name)
}

// NamedIn selects the object named key.Name in namespace key.Namespace.
func NamedIn(key types.NamespacedName) cache.ByObject {
	return cache.ByObject{Namespaces: map[string]cache.Config{key.Namespace: {FieldSelector: NameSelector(key.Name)}}}
}

// managerCache makes the manager run a cache with its own caches: started
// before the controllers, and synced before they run.
type managerCache struct{ cache.Cache }

// GetCache hands the manager the cache to start and wait for.
func (c managerCache) GetCache() cache.Cache { return c.Cache }
