// Package sidecar is the enforcement sidecar: a reverse proxy that runs next
// to the application in its pod, admits or rejects every request through the
// shared Redis limiter (package limiter) and forwards the admitted ones to
// the application on localhost.
//
// The pieces, each in its own file:
//
//   - options.go, flags.go: settings and their flags (each also read from
//     SLIDEGATE_<UPPER_SNAKE>); cmd/sidecar only wires them.
//   - reload.go: loads the rendered config file and the pod's downward-API
//     labels file, watches both directories (a ConfigMap volume changes by an
//     atomic ..data symlink swap) and swaps in a compiled state atomically;
//     an invalid file keeps the last good state.
//   - policy.go, selector.go, labels.go: the compiled state: the policies
//     whose selector matches this pod, with everything a request needs
//     precomputed.
//   - clientip.go, key.go: the client key of a request for each policy.
//   - handler.go: the per-request decision, in phases: gather the limiter
//     requests, decide, sum up the verdict, record it, respond.
//   - answer.go: the sidecar's own answers (429, 503, 502) as values, with
//     the IETF RateLimit headers (package ratelimitheader).
//   - why.go, top.go: the admin port's /debug/why and /debug/top.
//   - proxy.go: the reverse proxy to the application.
//   - server.go: the Sidecar, admin endpoints, graceful shutdown.
//   - run.go: the whole process (Redis client, limiter, listeners) for
//     cmd/sidecar.
//   - metrics.go: Prometheus metrics, prefix slidegate_sidecar_.
package sidecar
