package sidecarconfig

import "fmt"

// The spellings of a policy's enumerations in the documents the
// controller renders, the sidecars' and the rate limit service's
// (package rlsconfig) alike: the API's values (api/v1alpha1), which the
// limiter's typed constants spell the same way. They live here, in a wire
// package, so that a reader of the documents needs neither the API types
// nor the limiter; TestEnumSpellings ties the three together.
const (
	AlgorithmSlidingLog           = "SlidingLog"
	AlgorithmSlidingWindowCounter = "SlidingWindowCounter"

	FailOpen   = "Open"
	FailClosed = "Closed"

	ModeEnforce = "Enforce"
	ModeDryRun  = "DryRun"
)

// ValidAlgorithm reports whether a is an algorithm's spelling.
func ValidAlgorithm(a string) bool {
	return a == AlgorithmSlidingLog || a == AlgorithmSlidingWindowCounter
}

// ValidFailMode reports whether f is a fail mode's spelling.
func ValidFailMode(f string) bool { return f == FailOpen || f == FailClosed }

// ValidMode reports whether m is a mode's spelling.
func ValidMode(m string) bool { return m == ModeEnforce || m == ModeDryRun }

// RuleFields are the fields of a policy's rule that the sidecars' and the
// rate limit service's documents both carry.
type RuleFields struct {
	WindowMillis, Limit                   int64
	Algorithm, FailMode, Mode, Durability string
}

// ValidateRule checks a rule's fields, with the same bounds for both
// documents (they were checked apart, and the rate limit service's took a
// limit of 0, which no policy can have).
func ValidateRule(r RuleFields) []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if r.WindowMillis < 1 || r.WindowMillis > MaxWindowMillis {
		add("windowMillis %d is outside 1..%d", r.WindowMillis, MaxWindowMillis)
	}
	if r.Limit < 1 || r.Limit > MaxLimit {
		add("limit %d is outside 1..%d", r.Limit, MaxLimit)
	}
	if !ValidAlgorithm(r.Algorithm) {
		add("algorithm %q is not %s or %s", r.Algorithm, AlgorithmSlidingLog, AlgorithmSlidingWindowCounter)
	}
	if !ValidFailMode(r.FailMode) {
		add("failMode %q is not %s or %s", r.FailMode, FailOpen, FailClosed)
	}
	if !ValidMode(r.Mode) {
		add("mode %q is not %s or %s", r.Mode, ModeEnforce, ModeDryRun)
	}
	if !ValidDurability(r.Durability) {
		add("durability %q is not Primary or %s", r.Durability, DurabilityReplicated)
	}
	return errs
}
