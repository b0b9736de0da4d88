package rlsconfig

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// TestVersionFor: the oldest version that carries the policies, so that a
// server of the first release (which read "v1" only, strictly) keeps
// reading a document whose policies use nothing newer.
func TestVersionFor(t *testing.T) {
	plain := Policy{ID: "rls/a/p"}
	durable := Policy{ID: "rls/a/d", Durability: sidecarconfig.DurabilityReplicated}
	if v := VersionFor([]Policy{plain}); v != "v1" {
		t.Errorf("VersionFor(plain) = %q, want v1", v)
	}
	if v := VersionFor([]Policy{plain, durable}); v != "v1.1" {
		t.Errorf("VersionFor(plain, durable) = %q, want v1.1", v)
	}
	// The first release's strict reading of a document with durability.
	if err := sidecarconfig.DecodeStrict([]byte(`{"version":"v1","policies":[{"durability":"Replicated"}]}`), &struct {
		Version  string `json:"version"`
		Policies []struct {
			Namespace string `json:"namespace"`
		} `json:"policies"`
	}{}); err == nil {
		t.Error("a strict reader of the first release's fields accepted durability: this case cannot fail")
	}
}

// TestParseNewerMinor: a document of a newer minor version is read policy
// by policy; a policy with a field this server does not know is skipped.
func TestParseNewerMinor(t *testing.T) {
	policy := func(id, extra string) string {
		return `{"namespace":"a","name":"p","id":"` + id + `","domain":"edge","descriptor":[{"key":"remote_address"}],"windowMillis":1000,"limit":5,"algorithm":"SlidingLog","failMode":"Open","mode":"Enforce"` + extra + `}`
	}
	doc := `{"version":"v1.7","policies":[` + policy("rls/a/p", "") + `,` + policy("rls/a/q", `,"quota":{"header":"x"}`) + `]}`
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Policies) != 1 || c.Policies[0].ID != "rls/a/p" {
		t.Errorf("policies %+v, want rls/a/p only", c.Policies)
	}
	if want := []sidecarconfig.Skipped{{Policy: "rls/a/q", Fields: []string{"quota"}}}; !reflect.DeepEqual(c.Skipped, want) {
		t.Errorf("skipped %+v, want %+v", c.Skipped, want)
	}
	for _, bad := range []string{
		strings.Replace(doc, `"v1.7"`, `"v1.2"`, 1), // its own minor: strict
		strings.Replace(doc, `"v1.7"`, `"v2.0"`, 1), // another major
		strings.Replace(doc, `"policies"`, `"extra":1,"policies"`, 1),
	} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("parsed %s", bad[:40])
		}
	}
}

// minor1Policy is Policy as a server of minor version 1 (the release
// before cost) reads it: every field but cost.
type minor1Policy struct {
	Namespace    string  `json:"namespace"`
	Name         string  `json:"name"`
	ID           string  `json:"id"`
	Domain       string  `json:"domain"`
	Descriptor   []Entry `json:"descriptor"`
	WindowMillis int64   `json:"windowMillis"`
	Limit        int64   `json:"limit"`
	Algorithm    string  `json:"algorithm"`
	FailMode     string  `json:"failMode"`
	Mode         string  `json:"mode"`
	Durability   string  `json:"durability,omitempty" minor:"1"`
}

// TestMinor1ServerSkipsCostPolicies: a server of the release before cost
// leaves a policy with cost out of a rendered document (it would enforce
// it as a count policy: 100,000 requests through a 100,000-token limit),
// and keeps enforcing the others; the document is v1.2 as soon as one
// policy has cost, so that such a server reads it policy by policy.
func TestMinor1ServerSkipsCostPolicies(t *testing.T) {
	// Policy has minor 1's fields, cost (minor 2), additionalLimits
	// (minor 3) and quotas (minor 4).
	if n, m := reflect.TypeFor[Policy]().NumField(), reflect.TypeFor[minor1Policy]().NumField(); n != m+3 {
		t.Fatalf("Policy has %d fields, minor1Policy %d: update minor1Policy to minor 1's fields", n, m)
	}
	count := Policy{Namespace: "a", Name: "p", ID: "rls/a/p", Domain: "edge", Descriptor: []Entry{{Key: "remote_address"}},
		WindowMillis: 60_000, Limit: 100, Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce"}
	tokens := count
	tokens.Name, tokens.ID, tokens.Limit, tokens.Cost = "q", "rls/a/q", 100_000, &Cost{Response: &ResponseCost{}}
	policies := []Policy{count, tokens}
	version, kept, skipped := readAsOlder[minor1Policy](t, policies)
	if version != "v1.2" {
		t.Fatalf("version %s, want v1.2 (a minor 1 server reads v1.1 strictly and would refuse it whole)", version)
	}
	if len(kept) != 1 || kept[0].ID != "rls/a/p" {
		t.Errorf("a minor 1 server enforces %+v, want rls/a/p only", kept)
	}
	if want := []sidecarconfig.Skipped{{Policy: "rls/a/q", Fields: []string{"cost"}}}; !reflect.DeepEqual(skipped, want) {
		t.Errorf("a minor 1 server skipped %v, want %v", skipped, want)
	}
	if v := VersionFor([]Policy{count}); v != "v1" {
		t.Errorf("VersionFor(a count policy) = %s, want v1", v)
	}
}

// minor2Policy is Policy as a server of minor version 2 (the release
// before additionalLimits) reads it.
type minor2Policy struct {
	Namespace    string  `json:"namespace"`
	Name         string  `json:"name"`
	ID           string  `json:"id"`
	Domain       string  `json:"domain"`
	Descriptor   []Entry `json:"descriptor"`
	WindowMillis int64   `json:"windowMillis"`
	Limit        int64   `json:"limit"`
	Algorithm    string  `json:"algorithm"`
	FailMode     string  `json:"failMode"`
	Mode         string  `json:"mode"`
	Durability   string  `json:"durability,omitempty" minor:"1"`
	Cost         *Cost   `json:"cost,omitempty" minor:"2"`
}

// TestMinor2ServerSkipsSeveralWindows: a server of the release before
// additionalLimits leaves such a policy out (enforcing its first window
// alone would let 10 calls a second through all day where the policy
// allows 1,000 an hour) and keeps enforcing the others; the document is
// v1.3 as soon as one policy has them.
func TestMinor2ServerSkipsSeveralWindows(t *testing.T) {
	count := Policy{Namespace: "a", Name: "p", ID: "rls/a/p", Domain: "edge", Descriptor: []Entry{{Key: "remote_address"}},
		WindowMillis: 1000, Limit: 10, Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce"}
	multi := count
	multi.Name, multi.ID, multi.AdditionalLimits = "q", "rls/a/q", []Limit{{WindowMillis: 3_600_000, Limit: 1000}}
	policies := []Policy{count, multi}
	if err := (&Config{Version: VersionFor(policies), Policies: policies}).Validate(); err != nil {
		t.Fatal(err)
	}
	version, kept, skipped := readAsOlder[minor2Policy](t, policies)
	if version != "v1.3" {
		t.Fatalf("version %s, want v1.3", version)
	}
	if len(kept) != 1 || kept[0].ID != "rls/a/p" {
		t.Errorf("a minor 2 server enforces %+v, want rls/a/p only", kept)
	}
	if want := []sidecarconfig.Skipped{{Policy: "rls/a/q", Fields: []string{"additionalLimits"}}}; !reflect.DeepEqual(skipped, want) {
		t.Errorf("a minor 2 server skipped %v, want %v", skipped, want)
	}
	bad := multi
	bad.AdditionalLimits = []Limit{{WindowMillis: 1000, Limit: 5}}
	if err := (&Config{Version: VersionFor([]Policy{bad}), Policies: []Policy{bad}}).Validate(); err == nil || !strings.Contains(err.Error(), "the policy's own window") {
		t.Errorf("a window equal to the policy's: %v", err)
	}
}

// minor3Policy is Policy as a server of minor version 3 (the release
// before quotas) reads it.
type minor3Policy struct {
	Namespace        string  `json:"namespace"`
	Name             string  `json:"name"`
	ID               string  `json:"id"`
	Domain           string  `json:"domain"`
	Descriptor       []Entry `json:"descriptor"`
	WindowMillis     int64   `json:"windowMillis"`
	Limit            int64   `json:"limit"`
	Algorithm        string  `json:"algorithm"`
	FailMode         string  `json:"failMode"`
	Mode             string  `json:"mode"`
	Durability       string  `json:"durability,omitempty" minor:"1"`
	Cost             *Cost   `json:"cost,omitempty" minor:"2"`
	AdditionalLimits []Limit `json:"additionalLimits,omitempty" minor:"3"`
}

// TestMinor3ServerSkipsQuotas: a server of the release before quotas
// leaves a policy with them out (enforcing its window alone would let a
// client spend its month's quota in a day) and keeps enforcing the
// others; the document is v1.4 as soon as one policy has them, and a
// quota in a zone no database knows is refused.
func TestMinor3ServerSkipsQuotas(t *testing.T) {
	count := Policy{Namespace: "a", Name: "p", ID: "rls/a/p", Domain: "edge", Descriptor: []Entry{{Key: "remote_address"}},
		WindowMillis: 1000, Limit: 10, Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce"}
	quota := count
	quota.Name, quota.ID, quota.Quotas = "q", "rls/a/q", []Quota{{Period: sidecarconfig.QuotaMonth, Limit: 1_000_000, TimeZone: "Europe/Berlin"}}
	policies := []Policy{count, quota}
	version, kept, skipped := readAsOlder[minor3Policy](t, policies)
	if version != "v1.4" {
		t.Fatalf("version %s, want v1.4", version)
	}
	if len(kept) != 1 || kept[0].ID != "rls/a/p" {
		t.Errorf("a minor 3 server enforces %+v, want rls/a/p only", kept)
	}
	if want := []sidecarconfig.Skipped{{Policy: "rls/a/q", Fields: []string{"quotas"}}}; !reflect.DeepEqual(skipped, want) {
		t.Errorf("a minor 3 server skipped %v, want %v", skipped, want)
	}
	bad := quota
	bad.Quotas = []Quota{{Period: sidecarconfig.QuotaDay, Limit: 5, TimeZone: "Mars/Olympus_Mons"}}
	if err := (&Config{Version: VersionFor([]Policy{bad}), Policies: []Policy{bad}}).Validate(); err == nil || !strings.Contains(err.Error(), "unknown time zone") {
		t.Errorf("a quota in an unknown zone: %v", err)
	}
}

// readAsOlder marshals policies as the controller writes them and decodes
// the document as a server of an older minor version reads it (P, that
// minor's Policy): the document's version, the policies it keeps and
// those it skips.
func readAsOlder[P any](t *testing.T, policies []Policy) (string, []P, []sidecarconfig.Skipped) {
	t.Helper()
	data, err := Marshal(&Config{Version: VersionFor(policies), Policies: policies})
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Version  string            `json:"version"`
		Policies []json.RawMessage `json:"policies"`
	}
	if err := sidecarconfig.DecodeStrict(data, &doc); err != nil {
		t.Fatal(err)
	}
	kept, skipped, err := sidecarconfig.DecodePolicies[P](doc.Policies, "id")
	if err != nil {
		t.Fatal(err)
	}
	return doc.Version, kept, skipped
}
