package sidecarconfig

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// TestValidateQuotas: the sidecar's last line of defence behind the CRD
// schema for a hand-edited document, and the manager's check of a time
// zone that the schema cannot make.
func TestValidateQuotas(t *testing.T) {
	day := Quota{Period: QuotaDay, Limit: 10_000}
	month := Quota{Period: QuotaMonth, Limit: 10_000_000_000, TimeZone: "Europe/Berlin"}
	tests := []struct {
		name    string
		quotas  []Quota
		cost    bool
		wantErr string
	}{
		{name: "absent"},
		{name: "day and month", quotas: []Quota{day, month}},
		{name: "a limit of 10^12", quotas: []Quota{{Period: QuotaMonth, Limit: MaxQuota}}},
		{name: "over 10^12", quotas: []Quota{{Period: QuotaMonth, Limit: MaxQuota + 1}}, wantErr: "quotas[0]: limit 1000000000001 is outside 1..1000000000000"},
		{name: "limit 0", quotas: []Quota{{Period: QuotaDay}}, wantErr: "quotas[0]: limit 0 is outside"},
		{name: "unknown period", quotas: []Quota{{Period: "Week", Limit: 1}}, wantErr: `quotas[0]: period "Week" is not Day or Month`},
		{name: "unsorted", quotas: []Quota{month, day}, wantErr: "quotas[1]: periods are not sorted and distinct (Day after Month)"},
		{name: "twice", quotas: []Quota{day, day}, wantErr: "quotas[1]: periods are not sorted and distinct"},
		{name: "unknown zone", quotas: []Quota{{Period: QuotaDay, Limit: 1, TimeZone: "Mars/Olympus_Mons"}}, wantErr: `quotas[0]: time zone "Mars/Olympus_Mons"`},
		{name: "a path", quotas: []Quota{{Period: QuotaDay, Limit: 1, TimeZone: "../../etc/passwd"}}, wantErr: `quotas[0]: time zone "../../etc/passwd"`},
		{name: "with cost", quotas: []Quota{day}, cost: true, wantErr: "quotas and cost cannot be used together"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := policy(func(p *Policy) {
				p.Quotas = tt.quotas
				if tt.cost {
					p.Cost = &Cost{Response: &ResponseCost{JSONFields: []string{"usage.total_tokens"}}}
				}
			}).Validate()
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("Validate() = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// minor3Policy is Policy as a sidecar of minor version 3 (the release
// before quotas) decodes it.
type minor3Policy struct {
	Name             string   `json:"name"`
	ID               string   `json:"id"`
	Selector         Selector `json:"selector"`
	WindowMillis     int64    `json:"windowMillis"`
	Limit            int64    `json:"limit"`
	Algorithm        string   `json:"algorithm"`
	FailMode         string   `json:"failMode"`
	Mode             string   `json:"mode"`
	Key              Key      `json:"key"`
	Match            Match    `json:"match"`
	Replicas         int32    `json:"replicas,omitempty"`
	Durability       string   `json:"durability,omitempty" minor:"1"`
	Cost             *Cost    `json:"cost,omitempty" minor:"2"`
	AdditionalLimits []Limit  `json:"additionalLimits,omitempty" minor:"3"`
}

// TestMinor3SidecarSkipsQuotas: a sidecar of the release before quotas
// leaves a policy with them out rather than enforce it without them (its
// window alone would let a month's quota be spent in days), and keeps
// the policy beside it.
func TestMinor3SidecarSkipsQuotas(t *testing.T) {
	plain := policy(func(*Policy) {}).Policies[0]
	plain.Name, plain.ID = "a-plain", "shop/a-plain"
	quota := plain
	quota.Name, quota.ID = "b-quota", "shop/b-quota"
	quota.Quotas = []Quota{{Period: QuotaMonth, Limit: 1_000_000, TimeZone: "America/New_York"}}
	if m := MinMinor(&quota); m != 4 {
		t.Fatalf("MinMinor of a policy with quotas = %d, want 4", m)
	}
	if err := (&Config{Version: VersionOf(3), Namespace: "shop", Policies: []Policy{plain, quota}}).Validate(); err == nil {
		t.Error("a minor 3 document carries quotas")
	}
	data, err := Marshal(&Config{Version: Version, Namespace: "shop", Policies: []Policy{plain, quota}})
	if err != nil {
		t.Fatal(err)
	}
	kept, skipped := decodeAsOlder[minor3Policy](t, data)
	if len(kept) != 1 || kept[0].Name != "a-plain" {
		t.Errorf("a minor 3 sidecar enforces %+v, want a-plain only", kept)
	}
	if want := []Skipped{{Policy: "b-quota", Fields: []string{"quotas"}}}; !reflect.DeepEqual(skipped, want) {
		t.Errorf("a minor 3 sidecar skipped %v, want %v", skipped, want)
	}
	c, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Policies) != 2 || !reflect.DeepEqual(c.Policies[1].Quotas, quota.Quotas) {
		t.Errorf("parsed %+v", c.Policies)
	}
}

// decodeAsOlder reads data, a document of the newest minor, as a sidecar
// whose Policy type is P reads it: policy by policy, leaving out those
// with fields P lacks.
func decodeAsOlder[P any](t *testing.T, data []byte) (kept []P, skipped []Skipped) {
	t.Helper()
	var doc struct {
		Config
		Policies []json.RawMessage `json:"policies"`
	}
	if err := DecodeStrict(data, &doc); err != nil {
		t.Fatal(err)
	}
	kept, skipped, err := DecodePolicies[P](doc.Policies, "name")
	if err != nil {
		t.Fatal(err)
	}
	return kept, skipped
}
