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

// Package policystatus computes the status of RateLimitPolicies: pure
// functions of what the controller read once (Facts, the render's result,
// the credentials' problem, the clock), no API calls, so that each
// behaviour is a row in a table test.
//
// A condition that is not True carries a Problem: a reason for machines
// (kstatus, Argo CD, alerts) and a message for people, never one without
// the other. Each condition of an accepted policy comes from a chain of
// named checks (policy.go: readyChecks, enforcedChecks); the first problem
// is the condition's, and none makes it True.
//
// Files: problem.go (Problem and the problems made from other packages'
// errors), conditions.go (setting conditions without losing their
// transition times), policy.go (a sidecar policy's status and its checks),
// service.go (a rate limit service policy's), namespace.go (Facts and
// Statuses, a namespace's statuses in one call), pods.go (what a pod's
// sidecar protects, and TrimPod, what the controller's cache keeps of a
// pod for it), unprotected.go (why selected pods lack the sidecar) and
// networkpolicy.go (NetworkPolicies that reopen the app's port).
package policystatus
