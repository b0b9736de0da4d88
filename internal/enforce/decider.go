package enforce

import (
	"context"

	"github.com/slidegate/slidegate/internal/limiter"
)

// Decider is what a front end needs of the shared limiter, and the only
// seam between them (as envoyproxy/ratelimit's RateLimitCache is between its
// gRPC service and its backend): the sidecar's HTTP proxy and the rate limit
// service's gRPC server both decide through it. *limiter.Limiter implements
// it; tests and benchmarks put their own in its place.
//
// What else a limiter can do is asked for by type assertion where it is
// used (limiter.Announcer: counting the replicas of a fail-open share;
// reading a window for /debug/why), so that a Decider without it still
// decides.
type Decider interface {
	// Decide decides all the rules of one request together, all or
	// nothing, one decision per request, index for index (see package
	// limiter).
	Decide(ctx context.Context, reqs []limiter.Request) []limiter.Decision
	// Healthy is false while the limiter's circuit to Redis is open: the
	// decisions come from the fallback or fail closed.
	Healthy() bool
}
