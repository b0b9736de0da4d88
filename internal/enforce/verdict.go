// Package enforce is where the limiter's decisions for one request become
// what the front ends do with them, shared by the sidecar (HTTP) and the
// rate limit service (Envoy's gRPC): the Decider both decide through (the
// one seam between a front end and the limiter), the verdict (which policy answers for
// a refused request), the outcome of each policy (the decision label of
// slidegate_{sidecar,rls}_requests_total) and the metrics both count them
// in. It is written over the limiter's types only, index for index with
// the requests, so that it sees neither front end's policy type and each
// front end keeps its own way of answering (a 429 or 503, an OVER_LIMIT).
package enforce

import (
	"github.com/slidegate/slidegate/internal/limiter"
)

// Verdict is what the decisions of one request add up to. FailedClosed is
// the fail-closed policy that Redis could not decide, Denied the enforced
// policy that denied the request, each an index into the request's
// decisions, -1 for none. Of several, each is the one with the longest
// wait, after which every one of them admits again: a client that obeys
// Retry-After is then not refused again by another of the limits.
type Verdict struct {
	FailedClosed, Denied int
	// RedisErr is the error of the last decision that Redis could not make
	// (fallback or failed closed), nil when Redis made them all.
	RedisErr error
}

// Sum sums up the decisions ds of the requests reqs (index for index).
// DryRun requests refuse nothing, whatever their decision says.
func Sum(reqs []limiter.Request, ds []limiter.Decision) Verdict {
	v := Verdict{FailedClosed: -1, Denied: -1}
	for i := range ds {
		d := &ds[i]
		if d.Err != nil {
			v.RedisErr = d.Err
		}
		if reqs[i].DryRun || d.Allowed {
			continue
		}
		if d.Source == limiter.SourceFailedClosed {
			if v.FailedClosed < 0 || d.RetryAfter > ds[v.FailedClosed].RetryAfter {
				v.FailedClosed = i
			}
		} else if v.Denied < 0 || d.RetryAfter > ds[v.Denied].RetryAfter {
			v.Denied = i
		}
	}
	return v
}

// Rejected reports whether the request is refused.
func (v *Verdict) Rejected() bool { return v.FailedClosed >= 0 || v.Denied >= 0 }

// Refusal is the decision that answers for a refused request where a
// front end has one kind of refusal only (the rate limit service's
// OVER_LIMIT, for either cause): of FailedClosed and Denied the one with
// the longer wait; -1 when the request is admitted. The sidecar tells the
// two apart (503 before 429).
func (v *Verdict) Refusal(ds []limiter.Decision) int {
	switch {
	case v.FailedClosed < 0:
		return v.Denied
	case v.Denied < 0 || ds[v.FailedClosed].RetryAfter >= ds[v.Denied].RetryAfter:
		return v.FailedClosed
	default:
		return v.Denied
	}
}

// OutcomeOf is what one policy did to a request, given its decision d,
// whether the policy is DryRun, and whether the request was refused (by
// any policy, which undoes the admits of the others).
//
// A DryRun policy's outcome is allowed or dry_run_rejected, also when
// Redis could not decide it and it fails closed: it refused nothing, and
// failed_closed counts the requests clients saw refused with a 503 (the
// SlidegateFailClosed alert's runbook reads it to find the policies that
// fail closed). The rate limit service counted those failed_closed until
// both front ends shared this rule.
func OutcomeOf(dryRun bool, d *limiter.Decision, rejected bool) Outcome {
	switch {
	case dryRun && d.Allowed:
		return Allowed
	case dryRun:
		return DryRunRejected
	case d.Allowed && rejected:
		return NotCounted
	case d.Allowed:
		return Allowed
	case d.Source == limiter.SourceFailedClosed:
		return FailedClosed
	default:
		return Rejected
	}
}

// Graver is the graver of two outcomes of one policy for one request, for
// a policy decided as several windows (each a decision): a request one
// window refused is refused by the policy, whatever the others said.
// Failed closed (a 503) before rejected, before dry-run rejected, before
// not counted, before allowed.
func Graver(a, b Outcome) Outcome {
	if gravity(b) > gravity(a) {
		return b
	}
	return a
}

func gravity(o Outcome) int {
	switch o {
	case FailedClosed:
		return 4
	case Rejected:
		return 3
	case DryRunRejected:
		return 2
	case NotCounted:
		return 1
	}
	return 0
}
