// Package limiter decides whether a request may pass a distributed
// sliding-window rate limit kept in one shared Redis. It does not import
// controller-runtime: it is the pure core that the sidecar wraps.
package limiter
