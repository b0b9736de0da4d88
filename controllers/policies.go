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
	"slices"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// livePolicies lists the policies (of the namespace, with
// client.InNamespace) that are not being deleted and belong to one of the
// two controllers: those for the rate limit service (forRLS) or those for
// the sidecars.
func livePolicies(ctx context.Context, c client.Reader, forRLS bool, opts ...client.ListOption) ([]v1alpha1.RateLimitPolicy, error) {
	var list v1alpha1.RateLimitPolicyList
	if err := c.List(ctx, &list, opts...); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(list.Items, func(p v1alpha1.RateLimitPolicy) bool {
		return !p.DeletionTimestamp.IsZero() || p.Spec.ServedByRLS() != forRLS
	}), nil
}
