package sidecarconfig

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

// TestValidateAdditionalLimits: the sidecar's last line of defence behind
// the CRD schema for a hand-edited document.
func TestValidateAdditionalLimits(t *testing.T) {
	two := []Limit{{WindowMillis: 60_000, Limit: 100}, {WindowMillis: 3_600_000, Limit: 1000}}
	tests := []struct {
		name    string
		mod     func(*Policy)
		wantErr string
	}{
		{name: "absent", mod: func(*Policy) {}},
		{name: "two windows", mod: func(p *Policy) { p.AdditionalLimits = two }},
		{name: "four windows", mod: func(p *Policy) {
			p.AdditionalLimits = []Limit{{2, 1}, {3, 1}, {4, 1}, {5, 1}}
		}},
		{name: "five windows", mod: func(p *Policy) {
			p.AdditionalLimits = []Limit{{2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}}
		}, wantErr: "additionalLimits has 5 windows, more than 4"},
		{name: "the policy's own window", mod: func(p *Policy) { p.AdditionalLimits = []Limit{{1000, 5}} },
			wantErr: "additionalLimits[0]: windowMillis 1000 is the policy's own window"},
		{name: "unsorted", mod: func(p *Policy) { p.AdditionalLimits = []Limit{two[1], two[0]} },
			wantErr: "additionalLimits[1]: windows are not sorted and distinct (60000 after 3600000)"},
		{name: "twice", mod: func(p *Policy) { p.AdditionalLimits = []Limit{two[0], two[0]} },
			wantErr: "additionalLimits[1]: windows are not sorted and distinct"},
		{name: "window 0", mod: func(p *Policy) { p.AdditionalLimits = []Limit{{0, 5}} },
			wantErr: "additionalLimits[0]: windowMillis 0 is outside 1..86400000"},
		{name: "window over 24h", mod: func(p *Policy) { p.AdditionalLimits = []Limit{{MaxWindowMillis + 1, 5}} },
			wantErr: "additionalLimits[0]: windowMillis 86400001 is outside"},
		{name: "limit 0", mod: func(p *Policy) { p.AdditionalLimits = []Limit{{5000, 0}} },
			wantErr: "additionalLimits[0]: limit 0 is outside 1..1000000"},
		{name: "with cost", mod: func(p *Policy) {
			p.AdditionalLimits = two
			p.Cost = &Cost{Response: &ResponseCost{JSONFields: []string{"usage.total_tokens"}}}
		}, wantErr: "additionalLimits and cost cannot be used together"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := policy(tt.mod).Validate()
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("Validate() = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// minor2Policy is Policy as a sidecar of minor version 2 (the release
// before additionalLimits) decodes it.
type minor2Policy struct {
	Name         string   `json:"name"`
	ID           string   `json:"id"`
	Selector     Selector `json:"selector"`
	WindowMillis int64    `json:"windowMillis"`
	Limit        int64    `json:"limit"`
	Algorithm    string   `json:"algorithm"`
	FailMode     string   `json:"failMode"`
	Mode         string   `json:"mode"`
	Key          Key      `json:"key"`
	Match        Match    `json:"match"`
	Replicas     int32    `json:"replicas,omitempty"`
	Durability   string   `json:"durability,omitempty" minor:"1"`
	Cost         *Cost    `json:"cost,omitempty" minor:"2"`
}

// TestMinor2SidecarSkipsAdditionalLimits: a sidecar of the release before
// additionalLimits (minor 2) leaves a policy with them out rather than
// enforce its first window alone (which would let 10 requests a second
// through all day where the policy allows 1,000 an hour), and keeps
// enforcing the policy beside it. A policy without them renders as before,
// byte for byte.
func TestMinor2SidecarSkipsAdditionalLimits(t *testing.T) {
	plain := policy(func(*Policy) {}).Policies[0]
	plain.Name, plain.ID = "a-plain", "shop/a-plain"
	multi := plain
	multi.Name, multi.ID = "b-multi", "shop/b-multi"
	multi.AdditionalLimits = []Limit{{WindowMillis: 3_600_000, Limit: 1000}}
	if m := MinMinor(&multi); m != 3 {
		t.Fatalf("MinMinor of a policy with additionalLimits = %d, want 3", m)
	}
	if m := MinMinor(&plain); m != 0 {
		t.Fatalf("MinMinor of a plain policy = %d, want 0", m)
	}
	if err := (&Config{Version: VersionOf(2), Namespace: "shop", Policies: []Policy{plain, multi}}).Validate(); err == nil {
		t.Error("a minor 2 document carries additionalLimits")
	}
	data, err := Marshal(&Config{Version: Version, Namespace: "shop", Policies: []Policy{plain, multi}})
	if err != nil {
		t.Fatal(err)
	}
	one, err := Marshal(&Config{Version: Version, Namespace: "shop", Policies: []Policy{plain}})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(one, []byte("additionalLimits")) {
		t.Errorf("a policy without additional limits is written with them: %s", one)
	}

	kept, skipped := decodeAsOlder[minor2Policy](t, data)
	if len(kept) != 1 || kept[0].Name != "a-plain" {
		t.Errorf("a minor 2 sidecar enforces %+v, want a-plain only", kept)
	}
	if want := []Skipped{{Policy: "b-multi", Fields: []string{"additionalLimits"}}}; !reflect.DeepEqual(skipped, want) {
		t.Errorf("a minor 2 sidecar skipped %v, want %v", skipped, want)
	}

	c, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Policies) != 2 || len(c.Skipped) != 0 || !reflect.DeepEqual(c.Policies[1].AdditionalLimits, multi.AdditionalLimits) {
		t.Errorf("parsed %+v, skipped %v", c.Policies, c.Skipped)
	}
}
