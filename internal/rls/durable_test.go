package rls

import (
	"testing"

	"github.com/slidegate/slidegate/internal/rlsconfig"
)

// TestDurabilityReachesTheRule: a policy rendered with durability
// Replicated makes its limiter rule durable; without it, not.
func TestDurabilityReachesTheRule(t *testing.T) {
	for _, d := range []string{"", rlsconfig.DurabilityReplicated} {
		c := &rlsconfig.Config{Version: rlsconfig.Version, Policies: []rlsconfig.Policy{{
			Namespace: "ns", Name: "p", ID: "rls/ns/p", Domain: "d", Descriptor: []rlsconfig.Entry{{Key: "remote_address"}},
			WindowMillis: 1000, Limit: 10, Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce", Durability: d,
		}}}
		ix, err := newIndex(c)
		if err != nil {
			t.Fatal(err)
		}
		got := ix.domains["d"]
		var durable []bool
		for _, ps := range got {
			for _, p := range ps {
				durable = append(durable, p.rule.Durable)
			}
		}
		if want := d == rlsconfig.DurabilityReplicated; len(durable) != 1 || durable[0] != want {
			t.Errorf("durability %q: rules durable %v, want [%v]", d, durable, want)
		}
	}
}
