package rlsconfig

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"
)

// TestLoadedRevisions: the controller reads both forms of Loaded, the
// revisions alone (this release's servers) and the revisions by policy ID
// (servers of earlier releases, while a manager upgraded first waits for
// them), as the same set.
func TestLoadedRevisions(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []string
	}{
		{"this release", `{"revision":"d1","policyRevisions":["a1","b2"]}`, []string{"a1", "b2"}},
		{"an earlier release", `{"revision":"d1","policies":{"rls/ns/p":"a1","rls/ns/q":"b2"}}`, []string{"a1", "b2"}},
		{"nothing loaded yet", `{"revision":"","policyRevisions":[]}`, nil},
	} {
		var l Loaded
		if err := json.Unmarshal([]byte(tc.body), &l); err != nil {
			t.Fatal(err)
		}
		if got := slices.Sorted(maps.Keys(l.Revisions())); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
