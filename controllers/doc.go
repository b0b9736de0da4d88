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

// Package controllers holds slidegate's reconcilers.
//
// The RateLimitPolicy controller reconciles namespaces, not single policies:
// all policies of a namespace render into one sidecar configuration, so the
// unit of work is the namespace (the reconcile.Request's Name is the
// namespace, its Namespace is empty). One worker never processes the same
// namespace twice at once, so the shared children are never written
// concurrently.
//
// For every namespace that has at least one RateLimitPolicy the controller
// keeps:
//
//   - the ConfigMap slidegate-sidecar-config (sidecarconfig.ConfigMapName)
//     with the rendered document under config.json, its content hash in the
//     annotation ratelimit.slidegate.dev/revision;
//   - the Secret slidegate-redis-credentials
//     (v1alpha1.RedisCredentialsSecretName), only in namespaces labelled for
//     injection and while a sidecar policy there needs it: the namespace's
//     own Redis identity (internal/redisidentity, docs/security.md
//     section 1) or, in
//     the shared mode, the keys of the credentials Secret configured on the
//     manager (--redis-secret-name, in the manager's namespace).
//
// Both carry the label app.kubernetes.io/managed-by=slidegate and are written
// with server-side apply under the field owner "slidegate-controller", with
// force: they belong to the controller, and edits by anyone else are
// reverted (drift repair). They are written only when their content differs
// from the desired state in the cache, and deleted when the namespace's last
// policy goes.
//
// Ownership: every policy of the namespace contributes to these objects, so
// each carries an owner reference to every policy of the namespace (sorted by
// name), none of them as controller (a controller reference must be unique)
// and without blockOwnerDeletion (which would need update rights on the
// policies' finalizers). The controller deletes the children itself when the
// last policy goes; the owner references are the safety net that lets the
// garbage collector remove them if that happens while the controller is
// down, and tell a reader where the objects come from.
//
// Redis: the connection (mode standalone, cluster or sentinel; addresses;
// sentinel master name; TLS) and the credentials are configured once, on the
// manager, by the platform admin, never in a policy, a ConfigMap or a log
// line. The controller mirrors only the credentials, into the namespaces that
// have policies, so that sidecars there can mount them (a pod can mount only
// Secrets of its own namespace); the injector passes the non-secret settings
// to the sidecar as arguments. The Secret's data never appears in logs,
// events, conditions or metrics.
//
// What is pure lives outside: the rendering in internal/render (its two
// entry points, render.Namespace and render.Service) and the statuses in
// internal/policystatus (the facts about pods, Services and
// NetworkPolicies, and each condition from its named checks). What a
// namespace's credentials Secret holds, and the Redis identities behind
// it, are decided by internal/redisidentity; what the manager writes is
// marked by internal/owned. This package reads the cluster, calls them,
// and writes what they return. internal/manager builds both reconcilers
// with what they read through besides the manager's cache (the caches of
// internal/kubecache, the key set fetcher, the identities' periodic pass);
// SetupWithManager only declares the watches.
//
// The files, by phase, shared by both reconcilers where they can be:
// facts.go (gather: what one reconcile of a namespace works from),
// policies.go (the live policies of a namespace), statuswrite.go (writing
// the statuses that changed), children.go (the ConfigMap, deleteManaged
// and the owner references), credentials.go (the namespace's
// slidegate-redis-credentials Secret), networkpolicy.go and jwks.go (the
// other children, and the key sets); setup.go and caches.go (the watches,
// and what the manager's cache holds); ratelimitpolicy_controller.go and
// ratelimitservice_controller.go are the two reconcilers' sequences. The
// rate limit service's reconciler keeps its other phases beside it:
// rlsservers.go (asking each ready server what it loaded) and rlssetup.go
// (its caches' objects and its watches).
package controllers
