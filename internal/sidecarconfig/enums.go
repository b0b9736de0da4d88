package sidecarconfig

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
