package rlsconfig

import (
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
	doc := `{"version":"v1.7","policies":[` + policy("rls/a/p", "") + `,` + policy("rls/a/q", `,"cost":{"header":"x"}`) + `]}`
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Policies) != 1 || c.Policies[0].ID != "rls/a/p" {
		t.Errorf("policies %+v, want rls/a/p only", c.Policies)
	}
	if want := []sidecarconfig.Skipped{{Policy: "rls/a/q", Fields: []string{"cost"}}}; !reflect.DeepEqual(c.Skipped, want) {
		t.Errorf("skipped %+v, want %+v", c.Skipped, want)
	}
	for _, bad := range []string{
		strings.Replace(doc, `"v1.7"`, `"v1.1"`, 1), // its own minor: strict
		strings.Replace(doc, `"v1.7"`, `"v2.0"`, 1), // another major
		strings.Replace(doc, `"policies"`, `"extra":1,"policies"`, 1),
	} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("parsed %s", bad[:40])
		}
	}
}
