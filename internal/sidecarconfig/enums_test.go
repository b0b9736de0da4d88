package sidecarconfig

import (
	"testing"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/limiter"
)

// TestEnumSpellings: the documents spell every enumeration as the API
// writes it and as the limiter reads it, so that the renderer can copy the
// API's value and the front ends can convert it to the limiter's type.
func TestEnumSpellings(t *testing.T) {
	for _, s := range []struct{ wire, api, limiter string }{
		{AlgorithmSlidingLog, string(v1alpha1.AlgorithmSlidingLog), string(limiter.SlidingLog)},
		{AlgorithmSlidingWindowCounter, string(v1alpha1.AlgorithmSlidingWindowCounter), string(limiter.SlidingWindowCounter)},
		{FailOpen, string(v1alpha1.FailOpen), string(limiter.FailOpen)},
		{FailClosed, string(v1alpha1.FailClosed), string(limiter.FailClosed)},
		{ModeEnforce, string(v1alpha1.ModeEnforce), ""},
		{ModeDryRun, string(v1alpha1.ModeDryRun), ""},
	} {
		if s.wire != s.api || s.limiter != "" && s.wire != s.limiter {
			t.Errorf("wire %q, API %q, limiter %q: spelled differently", s.wire, s.api, s.limiter)
		}
	}
	for _, bad := range []string{"", "slidinglog", "open", "dryrun", "Sliding Log"} {
		if ValidAlgorithm(bad) || ValidFailMode(bad) || ValidMode(bad) {
			t.Errorf("%q accepted", bad)
		}
	}
}
