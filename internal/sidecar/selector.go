package sidecar

import (
	"slices"

	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// selectorMatches evaluates a label selector the way Kubernetes does: every
// matchLabels pair and every expression must hold; an empty selector
// matches every pod.
func selectorMatches(s sidecarconfig.Selector, labels map[string]string) bool {
	for k, v := range s.MatchLabels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	for _, r := range s.MatchExpressions {
		got, ok := labels[r.Key]
		switch r.Operator {
		case "In":
			if !ok || !slices.Contains(r.Values, got) {
				return false
			}
		case "NotIn":
			if ok && slices.Contains(r.Values, got) {
				return false
			}
		case "Exists":
			if !ok {
				return false
			}
		case "DoesNotExist":
			if ok {
				return false
			}
		default:
			// Validate rejects unknown operators; never match on one.
			return false
		}
	}
	return true
}
