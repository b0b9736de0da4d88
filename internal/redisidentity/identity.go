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

// Package redisidentity administers the identities the shared Redis knows
// slidegate's parts by (docs/security.md, boundary 1), and decides what a
// namespace's slidegate-redis-credentials Secret holds.
//
// In the namespace mode each namespace labelled for injection that has a
// sidecar policy gets a Redis ACL user of its own, slidegate-ns-<namespace>,
// which may call the slidegate Functions library on that namespace's keys
// only; the rate limit service gets slidegate-rls for the rls/ keys. The
// leader sets them up on every node with the platform team's administrative
// identity, which stays in its namespace (a mounted Secret), derives their
// passwords from the install key (installkey.go, redisadmin.Passwords), and
// hands each namespace its own. In the shared mode every namespace gets the
// one identity of the manager's credentials Secret (it isolates nothing
// inside Redis); with an administrative identity the manager still prepares
// the namespaces' own, so that switching modes leaves no namespace without
// credentials.
//
// The files: identity.go (the configuration, a namespace's user, the users
// wanted on Redis), secretdata.go (what a namespace's Secret holds),
// installkey.go (the install key and the client hash keys derived from it),
// sync.go (the leader's periodic pass and what it reports), legacy.go (the
// passwords of an earlier release, kept for a grace), memory.go (the
// namespaces' memory budget) and metrics.go. The reconciler
// (controllers/credentials.go) writes the Secret; this package decides its
// data, and talks to Redis.
package redisidentity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/policystatus"
	"github.com/slidegate/slidegate/internal/redisadmin"
	"github.com/slidegate/slidegate/internal/rlsconfig"
)

// Mode is how the sidecars authenticate with Redis (--redis-identity).
type Mode string

// The identity modes.
const (
	// Namespace: each namespace's sidecars authenticate as the namespace's
	// own user and decide through the Functions library.
	Namespace Mode = "namespace"
	// Shared: every sidecar authenticates as the one user of the manager's
	// credentials Secret and sends the scripts (EVALSHA).
	Shared Mode = "shared"
)

// Identities configures the manager's administration of the shared Redis's
// identities, and holds what its periodic pass found.
type Identities struct {
	// Mode is the identity the webhook gives new sidecars, which decides
	// whether the namespaces keep the shared identity (set before the
	// reconciler starts; "" is Shared).
	Mode Mode
	// Admin administers Redis (the library, the users, the open check);
	// nil: nothing is administered and the namespaces get no identity of
	// their own.
	Admin *redisadmin.Admin
	// Interval is how often every node is brought to the whole desired
	// state (default DefaultInterval): a node that restarted without
	// persistence or was replaced has its users and the library back
	// within it.
	Interval time.Duration
	// Rotation is the password rotation period (0: never;
	// redisadmin.Passwords).
	Rotation time.Duration
	// RLSSecret is the Secret, in the manager's namespace, that the
	// leader writes the rate limit service's credentials into (username,
	// password); empty Name: none.
	RLSSecret types.NamespacedName
	// Pod is the manager's own Pod, which events about Redis itself are
	// about; empty Name: no events.
	Pod types.NamespacedName
	// Sentinel checks the sentinels' identity of the manager's Secret
	// before it is handed to the namespaces; nil: not sentinel mode, and
	// the namespaces get none.
	Sentinel *redisadmin.SentinelCheck
	// MemoryBudget is the most memory, in bytes, that one namespace's keys
	// may hold in Redis before its user is switched off (memory.go); 0:
	// not measured.
	MemoryBudget int64
	// MemoryInterval is how often the namespaces' memory is measured
	// (default DefaultMemoryCheckInterval).
	MemoryInterval time.Duration
	// LegacyGrace is how long a password of an earlier release stays valid
	// (default LegacyPasswordGrace; shorter in tests).
	LegacyGrace time.Duration

	// SharedSecret is the manager's credentials Secret (--redis-secret-name, in
	// its namespace), whose keys the namespaces' Secrets mirror; empty
	// Name: none.
	SharedSecret types.NamespacedName

	// What it works through, set by whoever builds it (internal/manager).
	//
	// Client reads the namespaces, their slidegate-redis-credentials
	// Secrets and the policies from the manager's cache, and writes the
	// rate limit service's Secret.
	Client client.Client
	// SharedReader reads SharedSecret: a cache of that one Secret (nil:
	// Client).
	SharedReader client.Reader
	// Key is the install key the passwords and the client hash keys are
	// derived from.
	Key *InstallKey
	// Recorder records the events about Redis itself on Pod (nil: none).
	Recorder events.EventRecorder
	// Wake reconciles a namespace (a generic event naming it) whose user
	// the memory check switched (nil: none).
	Wake chan<- event.TypedGenericEvent[client.Object]

	// mu guards the state of the periodic pass, read by the reconciles,
	// and Mode and Sentinel, which tests change while it runs.
	mu sync.Mutex
	// open is the nodes that last answered without AUTH.
	open []string
	// rlsWritten is the password last written into RLSSecret.
	rlsWritten string
	// legacy is, by namespace UID, the password of an earlier release a
	// namespace held when this manager first set its user up
	// (keepLegacyPassword).
	legacy map[types.UID]legacyPassword
	// over is, by namespace, what the keys of each namespace over its
	// memory budget held at the last check: their users are switched off.
	over map[string]int64
}

// DefaultInterval is Identities.Interval's default.
const DefaultInterval = 10 * time.Second

// RLSCredentialsSecretName is the Secret, in the manager's namespace, that
// holds the rate limit service's Redis identity (config/components/rls
// mounts it).
const RLSCredentialsSecretName = "slidegate-rls-redis-credentials"

func (ri *Identities) interval() time.Duration {
	if ri.Interval > 0 {
		return ri.Interval
	}
	return DefaultInterval
}

// Administered reports whether the manager sets up identities on Redis.
func (ri *Identities) Administered() bool {
	return ri != nil && ri.Admin != nil
}

// CurrentMode is the identity mode of new sidecars (Shared when unset).
func (ri *Identities) CurrentMode() Mode {
	if ri == nil {
		return Shared
	}
	ri.mu.Lock()
	defer ri.mu.Unlock()
	if ri.Mode == "" {
		return Shared
	}
	return ri.Mode
}

// sentinelCheck is Sentinel.
func (ri *Identities) sentinelCheck() *redisadmin.SentinelCheck {
	ri.mu.Lock()
	defer ri.mu.Unlock()
	return ri.Sentinel
}

// SetSentinel changes Sentinel while the manager runs (tests).
func (ri *Identities) SetSentinel(s *redisadmin.SentinelCheck) {
	ri.mu.Lock()
	defer ri.mu.Unlock()
	ri.Sentinel = s
}

// SetMode changes Mode while the manager runs (tests).
func (ri *Identities) SetMode(m Mode) {
	ri.mu.Lock()
	defer ri.mu.Unlock()
	ri.Mode = m
}

// +kubebuilder:rbac:groups="",namespace=system,resources=secrets,verbs=patch,resourceNames=slidegate-rls-redis-credentials

// namespaceIdentity sets up namespace ns's user on every node, for its
// sidecar policies, and returns its name and current password; or the
// problem that keeps the namespace from having one (or, over its memory
// budget, from using the one it has: then with its name and password).
// None of them stops the reconcile: the configuration is applied all the
// same (sidecars that already hold credentials keep deciding), and the
// problem is retried with the credentials grace.
func (ri *Identities) namespaceIdentity(ctx context.Context, ns string, policies []v1alpha1.RateLimitPolicy) (user, password string, prob *policystatus.Problem) {
	install, err := ri.Key.Get(ctx)
	if install == nil {
		msg := "the manager has no install key to derive the namespace's Redis password from (see its log)"
		if err != nil {
			msg = "the manager could not read or create its install key, from which the namespace's Redis password is derived: " + err.Error()
		}
		return "", "", policystatus.Credentials(msg)
	}
	uid, ok, err := ri.optedIn(ctx, ns)
	if err != nil {
		return "", "", policystatus.Credentials(err.Error())
	}
	if !ok {
		return "", "", policystatus.Credentials("the namespace is not labelled for injection, or is being deleted")
	}
	now := time.Now()
	ri.keepLegacyPassword(ctx, install, ns, uid, now)
	u, current, err := ri.namespaceUser(install, ns, uid, policies, now)
	if err != nil {
		return "", "", policystatus.Credentials(err.Error())
	}
	if _, err := ri.Admin.Apply(ctx, []redisadmin.User{u}, nil); err != nil {
		// Redis says why (down, NOPERM for the administrative identity...).
		return "", "", policystatus.Credentials(fmt.Sprintf("the namespace's Redis user %s could not be set up: %v", u.Name, err))
	}
	if u.Off {
		// The credentials stay in the namespace, for when it is switched on.
		bytes, _ := ri.overBudget(ns)
		return u.Name, current, ri.budgetProblem(ns, bytes)
	}
	return u.Name, current, nil
}

// namespaceUser is the user of namespace ns (UID uid) with the sidecar
// policies policies, and its current password. Its passwords are bound to
// the UID: the holders of a deleted namespace's credentials hold nothing
// for the next namespace of its name.
func (ri *Identities) namespaceUser(install []byte, ns string, uid types.UID, policies []v1alpha1.RateLimitPolicy, now time.Time) (redisadmin.User, string, error) {
	ids := make([]string, 0, len(policies))
	for i := range policies {
		ids = append(ids, ns+"/"+policies[i].Name)
	}
	name := redisadmin.NamespaceUser(ns)
	current, valid := redisadmin.Passwords(install, name, string(uid), ri.Rotation, now)
	valid = append(valid, ri.legacyPasswords(uid, now)...)
	u, err := redisadmin.NamespaceIdentity("", ns, ids, valid)
	_, u.Off = ri.overBudget(ns)
	return u, current, err
}

// Remove deletes namespace ns's user from every node, best effort: the
// periodic pass deletes it too.
func (ri *Identities) Remove(ctx context.Context, ns string) {
	if !ri.Administered() {
		return
	}
	if _, err := ri.Admin.Apply(ctx, nil, []string{redisadmin.NamespaceUser(ns)}); err != nil {
		logf.FromContext(ctx).Info("the namespace's Redis user could not be deleted now; the next periodic pass deletes it", "user", redisadmin.NamespaceUser(ns), "error", err.Error())
	}
}

// desiredUsers is every user the manager wants on Redis now: one per
// namespace labelled for injection with a sidecar policy (but the
// reserved one), and the rate limit service's.
func (ri *Identities) desiredUsers(ctx context.Context) ([]redisadmin.User, error) {
	install, err := ri.Key.Get(ctx)
	if err != nil {
		return nil, err
	}
	if install == nil {
		return nil, errors.New("no install key to derive the Redis passwords from")
	}
	var list v1alpha1.RateLimitPolicyList
	if err := ri.Client.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing the policies: %w", err)
	}
	sidecar := map[string][]v1alpha1.RateLimitPolicy{}
	var rlsIDs []string
	for _, p := range list.Items {
		switch {
		case !p.DeletionTimestamp.IsZero():
		case p.Spec.ServedByRLS():
			rlsIDs = append(rlsIDs, rlsconfig.IDPrefix+p.Namespace+"/"+p.Name)
		default:
			sidecar[p.Namespace] = append(sidecar[p.Namespace], p)
		}
	}
	now := time.Now()
	var users []redisadmin.User
	for ns, policies := range sidecar {
		uid, ok, err := ri.optedIn(ctx, ns)
		if err != nil {
			return nil, err // this pass is skipped: Redis stays as it is
		}
		if ns == redisadmin.RLSScope || !ok {
			continue
		}
		// The first pass after an upgrade may come before the namespace's
		// reconcile: the earlier password must not go before the grace.
		ri.keepLegacyPassword(ctx, install, ns, uid, now)
		u, _, err := ri.namespaceUser(install, ns, uid, policies, now)
		if err != nil {
			return nil, err
		}
		users = append(users, u)
	}
	_, valid := redisadmin.Passwords(install, redisadmin.RLSUser, "", ri.Rotation, now)
	users = append(users, redisadmin.RLSIdentity("", rlsIDs, valid))
	slices.SortFunc(users, func(a, b redisadmin.User) int { return strings.Compare(a.Name, b.Name) })
	return users, nil
}

// optedIn reports whether namespace ns is labelled for injection, as the
// cache has it (a namespace it does not know is not), and its UID. An
// error reading it is returned, not taken for "not opted in": the
// periodic sync would then leave the namespace's user out of the desired
// state and delete it from Redis, and every sidecar of the namespace
// would lose Redis at once (as the reconciler, which retries on it).
func (ri *Identities) optedIn(ctx context.Context, ns string) (types.UID, bool, error) {
	var namespace corev1.Namespace
	if err := ri.Client.Get(ctx, types.NamespacedName{Name: ns}, &namespace); err != nil {
		if apierrors.IsNotFound(err) {
			return "", false, nil
		}
		return "", false, fmt.Errorf("reading the namespace %s: %w", ns, err)
	}
	return namespace.UID, inject.NamespaceOptedIn(namespace.Labels) && namespace.DeletionTimestamp.IsZero(), nil
}
