package sidecar

import (
	"testing"

	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// TestDurabilityReachesTheRule: a policy rendered with durability
// Replicated makes its limiter rule durable; without it (or Primary), not.
func TestDurabilityReachesTheRule(t *testing.T) {
	for _, tc := range []struct {
		durability string
		want       bool
	}{{"", false}, {"Primary", false}, {sidecarconfig.DurabilityReplicated, true}} {
		p := compiledPolicy(t, testPolicy("p", 10, func(p *sidecarconfig.Policy) { p.Durability = tc.durability }))
		if p.rule.Durable != tc.want {
			t.Errorf("durability %q: rule.Durable %v, want %v", tc.durability, p.rule.Durable, tc.want)
		}
	}
}
