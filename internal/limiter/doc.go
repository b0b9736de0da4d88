// Package limiter decides whether a request may pass a distributed
// sliding-window rate limit kept in one shared Redis. It does not import
// controller-runtime: it is the pure core that the sidecar wraps.
//
// # Algorithms
//
// SlidingLog is exact: one Lua script trims, counts and admits atomically
// with Redis's own clock (TIME), one sorted-set member per admit, each
// member unique (8 random bytes), so no window (t-W, t] ever holds more
// than the limit, across every sidecar.
//
// SlidingWindowCounter keeps two fixed-window counts per client (O(1)
// memory) and estimates the sliding window as prev×(1-f)+cur, f the elapsed
// fraction of the current fixed window. Its error bound: every aligned fixed
// window holds at most limit admits, and a sliding window at most
// limit + P×f < 2×limit, P being the previous fixed window's admits; the
// worst case is a burst at the very end of one fixed window followed by
// steady traffic. With admits spread evenly the estimate is exact. It can
// also deny early (when the previous window's admits came early in it).
//
// # Speed
//
// Concurrent Decide calls are coalesced: up to Options.MaxInflight
// pipelined round trips are in flight, each carrying whatever decisions were
// queued when its connection became free (at most MaxBatch), and one
// script call decides all of them whose keys share a slot
// (redisschema.DecideBatch). Throughput is then bounded by Redis executing the
// scripts, not by round trips.
//
// # Failure
//
// Each decision waits at most Options.Timeout. A circuit breaker stops
// calling a Redis that keeps failing and PINGs it until it answers. Rules
// then fail open (a local, bounded, per-replica sliding window) or closed
// (deny); Decision.Source says which path decided.
package limiter
