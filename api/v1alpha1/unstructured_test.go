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

package v1alpha1_test

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// unstructuredPolicy reads a policy as the API server serves it, without the
// Go types' omitempty and defaults.
type unstructuredPolicy struct{ u unstructured.Unstructured }

func (p *unstructuredPolicy) obj() client.Object {
	p.u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("RateLimitPolicy"))
	return &p.u
}

func (p *unstructuredPolicy) nestedInt64(fields ...string) (int64, bool, error) {
	return unstructured.NestedInt64(p.u.Object, fields...)
}
