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

package rlsconfig

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"slices"
)

// Revision is the content hash of a document: the first 16 hex digits of
// its SHA-256, as the controller writes it on the ConfigMap.
func Revision(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

// PolicyRevisions returns the revision of each policy of c, by ID: the hash
// of its entry and the document's version. It moves only when what the
// server enforces for that policy changes, not when other policies do. The
// controller puts it in the policy's status.revision, and the RLS server
// reports the revisions it loaded (Loaded), which is how the controller
// knows that the servers enforce a policy. Two policies never share one:
// the entry includes the ID.
func PolicyRevisions(c *Config) map[string]string {
	out := make(map[string]string, len(c.Policies))
	for i := range c.Policies {
		// Marshal cannot fail on these plain types.
		b, _ := json.Marshal(struct {
			Version string `json:"version"`
			Policy  Policy `json:"policy"`
		}{c.Version, c.Policies[i]})
		out[c.Policies[i].ID] = Revision(b)
	}
	return out
}

// LoadedPath is the RLS server's admin endpoint that reports what it
// loaded, as Loaded in JSON.
const LoadedPath = "/loaded"

// Loaded is what an RLS server serves at LoadedPath: what the controller
// needs to report a policy Enforced, and nothing more. The admin port is
// reachable by whatever the network lets through, so it names no policy,
// namespace, domain or descriptor: a policy revision is a hash over the
// policy's whole entry (its namespace and name included), which tells
// whoever knows a policy whether it is loaded, and nobody what is.
type Loaded struct {
	// Revision is the revision of the document in force ("" before the
	// first load).
	Revision string `json:"revision"`
	// PolicyRevisions are the revisions of its policies (PolicyRevisions),
	// sorted.
	PolicyRevisions []string `json:"policyRevisions"`
	// Policies is what servers of earlier releases report instead: each
	// policy's revision by ID ("rls/<namespace>/<name>"). Read, so that a
	// manager upgraded before its servers still sees what they loaded;
	// never written.
	Policies map[string]string `json:"policies,omitempty"`
}

// Revisions is the set of policy revisions l reports, in either form.
func (l *Loaded) Revisions() map[string]bool {
	out := make(map[string]bool, len(l.PolicyRevisions)+len(l.Policies))
	for _, r := range l.PolicyRevisions {
		out[r] = true
	}
	for _, r := range l.Policies {
		out[r] = true
	}
	return out
}

// LoadedHandler serves Loaded at LoadedPath for the document that current
// returns (nil: none loaded yet). The RLS server mounts it on its admin
// port; the controller reads it to report a policy Enforced only once every
// ready server loaded the policy at its revision.
func LoadedHandler(current func() (c *Config, revision string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			http.Error(w, "use GET", http.StatusMethodNotAllowed)
			return
		}
		l := Loaded{PolicyRevisions: []string{}}
		if c, rev := current(); c != nil {
			l.Revision = rev
			for _, r := range PolicyRevisions(c) {
				l.PolicyRevisions = append(l.PolicyRevisions, r)
			}
			slices.Sort(l.PolicyRevisions)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(l)
	})
}
