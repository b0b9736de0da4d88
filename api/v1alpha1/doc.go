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

// Package v1alpha1 contains the API types of the ratelimit.slidegate.dev
// group: RateLimitPolicy, an exact, distributed sliding-window rate limit for
// the pods of one namespace.
//
// The package holds types and well-known names only; it imports apimachinery
// and k8s.io/api and nothing of slidegate's internals.
//
// +kubebuilder:object:generate=true
// +groupName=ratelimit.slidegate.dev
package v1alpha1
