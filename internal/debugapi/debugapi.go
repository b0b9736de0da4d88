// Package debugapi is the sidecar's /debug interface as its clients see it
// (kubectl slidegate why and top): the routes, the request header and the
// answers. It is a leaf, so that the plugin links neither the sidecar nor
// the limiter, Redis client and Prometheus behind it; the sidecar serves
// these types (package sidecar, why.go and top.go say what they mean).
package debugapi

import (
	"time"

	"github.com/slidegate/slidegate/internal/topk"
)

// The routes, on the sidecar's loopback debug port (container port
// v1alpha1.SidecarDebugPortName), reached through pods/portforward.
const (
	WhyPath = "/debug/why"
	TopPath = "/debug/top"
	// ResetPath takes a POST, with /debug/why's parameters and a policy:
	// it empties that client's counters under the policy (ResetResponse).
	ResetPath = "/debug/reset"
)

// WhyValueHeader carries the client value of a /debug/why request.
const WhyValueHeader = "Slidegate-Client-Value"

// WhyResponse is the answer of GET /debug/why.
type WhyResponse struct {
	Namespace string `json:"namespace"`
	// Revision is the sidecar's config revision (see /metrics).
	Revision string `json:"revision"`
	// HashKeyID names the key of the ClientKeys (see TopResponse).
	HashKeyID string `json:"hashKeyID"`
	// Source is the kind of client identity asked about.
	Source string `json:"source"`
	Method string `json:"method"`
	Path   string `json:"path"`
	// Policies are the policy asked about first (Target), then every
	// other policy of this pod that applies to the same request.
	Policies []WhyPolicy `json:"policies"`
}

// WhyPolicy is one policy's view of the client.
type WhyPolicy struct {
	Name   string `json:"name"`
	Target bool   `json:"target,omitempty"`
	// MatchesRequest is false when the target policy does not apply to
	// the request's method and path.
	MatchesRequest bool    `json:"matchesRequest"`
	Mode           string  `json:"mode"`
	Algorithm      string  `json:"algorithm"`
	Limit          int64   `json:"limit"`
	WindowSeconds  float64 `json:"windowSeconds"`
	KeySource      string  `json:"keySource"`
	KeyName        string  `json:"keyName,omitempty"`
	// ClientKey is the keyed hash of the client key the sidecar derives,
	// as /debug/top names the client; RedisKey is the key holding its
	// window (header, query and claim values in it are hashed, unkeyed).
	ClientKey string `json:"clientKey,omitempty"`
	RedisKey  string `json:"redisKey,omitempty"`
	// Unknown says why no key could be derived from the identity given
	// (the policy keys on something else).
	Unknown string     `json:"unknown,omitempty"`
	Window  *WhyWindow `json:"window,omitempty"`
	// Error is why the window could not be read (Redis unreachable).
	Error string `json:"error,omitempty"`
	// AdditionalLimits are the policy's other windows (its
	// additionalLimits) for the same client, each read as Window is.
	AdditionalLimits []WhyLimit `json:"additionalLimits,omitempty"`
}

// WhyLimit is one additional window of a policy for one client.
type WhyLimit struct {
	// Name is the window's item in the RateLimit fields: the policy's
	// name and the window, e.g. "api/1h".
	Name          string     `json:"name"`
	Limit         int64      `json:"limit"`
	WindowSeconds float64    `json:"windowSeconds"`
	RedisKey      string     `json:"redisKey,omitempty"`
	Window        *WhyWindow `json:"window,omitempty"`
	Error         string     `json:"error,omitempty"`
	// Quota is set for a quota (spec.quotas): its calendar period, in
	// which Window counts. WindowSeconds is then that period's length.
	Quota *WhyQuota `json:"quota,omitempty"`
}

// WhyQuota is the calendar period a quota counts in (WhyLimit.Quota): the
// one that holds Redis's clock at the read.
type WhyQuota struct {
	Period   string `json:"period"`   // "Day" or "Month"
	TimeZone string `json:"timeZone"` // the IANA zone of its midnights
	// Start and End bound the period: its count resets to zero at End.
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
}

// WhyWindow is limiter.Window on the wire; durations in seconds.
type WhyWindow struct {
	// InWindow is the admits in the sliding window (SlidingLog) or the
	// counter's weighted estimate (SlidingWindowCounter, with its
	// fixed-window counts in Current and Previous).
	InWindow float64 `json:"inWindow"`
	// Unit is "cost" when the policy limits cost (spec.cost: InWindow,
	// Current, Previous and Remaining are cost, e.g. tokens, and Allowed
	// and the retry answer a request that needs one unit); absent, admits.
	Unit      string `json:"unit,omitempty"`
	Current   *int64 `json:"current,omitempty"`
	Previous  *int64 `json:"previous,omitempty"`
	Allowed   bool   `json:"allowed"`
	Remaining int64  `json:"remaining"`
	// OldestAgeSeconds: the oldest admit in the window (SlidingLog only).
	OldestAgeSeconds  *float64  `json:"oldestAgeSeconds,omitempty"`
	RetryAfterSeconds float64   `json:"retryAfterSeconds"`
	RetryAt           time.Time `json:"retryAt"`
	ResetAfterSeconds float64   `json:"resetAfterSeconds"`
	ServerTime        time.Time `json:"serverTime"`
}

// ResetResponse is the answer of POST /debug/reset: what was emptied.
type ResetResponse struct {
	Namespace string `json:"namespace"`
	Policy    string `json:"policy"`
	// ClientKey is the keyed hash of the client key, as /debug/why and
	// /debug/top name the client.
	ClientKey string `json:"clientKey"`
	// RedisKeys are the keys emptied: the policy's window, its additional
	// windows and its quotas' current periods; NonEmpty how many of them
	// held anything.
	RedisKeys []string `json:"redisKeys"`
	NonEmpty  int64    `json:"nonEmpty"`
}

// TopResponse is the answer of GET /debug/top.
type TopResponse struct {
	Namespace string `json:"namespace"`
	Policy    string `json:"policy"`
	// Since is when the counting of this answer began.
	Since time.Time `json:"since"`
	// HashKeyID names the key the client keys are hashed with
	// (clienthash.Hasher.ID): answers of sidecars with different keys do
	// not merge.
	HashKeyID string `json:"hashKeyID"`
	topk.Summary
}
