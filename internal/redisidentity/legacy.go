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
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/redisadmin"
	"github.com/slidegate/slidegate/internal/redisconn"
)

// LegacyPasswordGrace is how long a namespace's password of an earlier
// release (derived from its name alone) stays valid once the manager
// replaces it: the kubelet updates the mounted Secrets within about a
// minute, and the sidecars read them for every new connection.
const LegacyPasswordGrace = 5 * time.Minute

// keepLegacyPassword notes, the first time it sees it, that namespace ns
// (UID uid) holds a password of an earlier release, which its sidecars
// keep using until the kubelet brings them the new one: it stays valid for
// LegacyPasswordGrace. Only a Secret the namespace holds counts, and the
// note is by UID, so a namespace created again under the name gets none.
func (ri *Identities) keepLegacyPassword(ctx context.Context, install []byte, ns string, uid types.UID, now time.Time) {
	var cur corev1.Secret
	if err := ri.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}, &cur); err != nil {
		return
	}
	held := string(cur.Data[redisconn.SecretNamespacePasswordKey])
	if held == "" {
		return
	}
	// An earlier release derived it from the name, with this rotation
	// period or (its default) none.
	_, legacy := redisadmin.Passwords(install, redisadmin.NamespaceUser(ns), "", ri.Rotation, now)
	_, unrotated := redisadmin.Passwords(install, redisadmin.NamespaceUser(ns), "", 0, now)
	if !slices.Contains(legacy, held) && !slices.Contains(unrotated, held) {
		return
	}
	ri.mu.Lock()
	defer ri.mu.Unlock()
	if _, seen := ri.legacy[uid]; seen {
		return
	}
	if ri.legacy == nil {
		ri.legacy = map[types.UID]legacyPassword{}
	}
	grace := ri.LegacyGrace
	if grace <= 0 {
		grace = LegacyPasswordGrace
	}
	ri.legacy[uid] = legacyPassword{password: held, until: now.Add(grace)}
}

// legacyPassword is a namespace's password of an earlier release, valid
// until.
type legacyPassword struct {
	password string
	until    time.Time
}

// legacyPasswords is what keepLegacyPassword keeps valid for the namespace
// of UID uid at now.
func (ri *Identities) legacyPasswords(uid types.UID, now time.Time) []string {
	ri.mu.Lock()
	defer ri.mu.Unlock()
	if l, ok := ri.legacy[uid]; ok && now.Before(l.until) {
		return []string{l.password}
	}
	return nil
}

// SetLegacyGrace changes LegacyGrace while the manager runs (tests).
func (ri *Identities) SetLegacyGrace(d time.Duration) {
	ri.mu.Lock()
	defer ri.mu.Unlock()
	ri.LegacyGrace = d
}
