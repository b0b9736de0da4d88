package sidecarconfig

import (
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestVersions(t *testing.T) {
	for _, tc := range []struct {
		in           string
		major, minor int
		bad          bool
	}{
		{in: "slidegate.dev/sidecar-config/v1", major: 1},
		{in: "slidegate.dev/sidecar-config/v1.0", major: 1},
		{in: "slidegate.dev/sidecar-config/v1.7", major: 1, minor: 7},
		{in: "slidegate.dev/sidecar-config/v2.0", major: 2},
		{in: "slidegate.dev/sidecar-config/v1.01", bad: true},
		{in: "slidegate.dev/sidecar-config/v1.", bad: true},
		{in: "slidegate.dev/sidecar-config/v1.-1", bad: true},
		{in: "slidegate.dev/sidecar-config/v", bad: true},
		{in: "slidegate.dev/rls-config/v1", bad: true},
		{in: "", bad: true},
	} {
		major, minor, err := ParseVersion(tc.in)
		if (err != nil) != tc.bad || major != tc.major || minor != tc.minor {
			t.Errorf("ParseVersion(%q) = %d, %d, %v", tc.in, major, minor, err)
		}
	}
	if VersionOf(0) != "slidegate.dev/sidecar-config/v1" || VersionOf(Minor) != Version {
		t.Errorf("VersionOf(0) = %q, VersionOf(Minor) = %q, Version = %q", VersionOf(0), VersionOf(Minor), Version)
	}
}

// minor0Fields are the policy fields of the first release, minor version
// 0, which its sidecars read and nothing else: frozen. A field may not leave
// this list (that is a major version), and every field not in it must carry
// the minor version that added it (`minor:"N"`), so that MinMinor knows
// which sidecars can read a policy that sets it.
var minor0Fields = []string{
	"algorithm", "failMode", "id",
	"key", "key.name", "key.onMissing", "key.source",
	"limit", "match", "match.methods", "match.pathPrefixes", "mode", "name", "replicas",
	"selector", "selector.matchExpressions", "selector.matchExpressions.key", "selector.matchExpressions.operator",
	"selector.matchExpressions.values", "selector.matchLabels", "windowMillis",
}

type field struct {
	path  string
	minor int // 0: no tag
}

// policyFields lists the JSON paths of t's fields and their minor tags.
func policyFields(t *testing.T, typ reflect.Type, prefix string) []field {
	var out []field
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		path := prefix + name
		minor := 0
		if tag := f.Tag.Get("minor"); tag != "" {
			n, err := strconv.Atoi(tag)
			if err != nil || n < 1 || n > Minor {
				t.Errorf("field %s: minor tag %q is not a minor version from 1 to %d", path, tag, Minor)
			}
			minor = n
		}
		out = append(out, field{path, minor})
		ft := f.Type
		for ft.Kind() == reflect.Slice || ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			out = append(out, policyFields(t, ft, path+".")...)
		}
	}
	return out
}

func TestPolicyFieldsFollowTheCompatibilityRule(t *testing.T) {
	fields := policyFields(t, reflect.TypeFor[Policy](), "")
	seen := map[string]bool{}
	for _, f := range fields {
		seen[f.path] = true
		switch first := slices.Contains(minor0Fields, f.path); {
		case first && f.minor != 0:
			t.Errorf("field %s is of the first release (minor 0) but tagged minor %d", f.path, f.minor)
		case !first && f.minor == 0:
			t.Errorf("field %s is new since the first release: tag it with the minor version that adds it (`minor:\"%d\"`, sidecarconfig.Minor), or the controller renders it for sidecars that refuse it", f.path, Minor)
		}
	}
	for _, f := range minor0Fields {
		if !seen[f] {
			t.Errorf("field %s of minor version 0 is gone: removing or renaming a field is a new major version", f)
		}
	}
}

func TestMinMinor(t *testing.T) {
	type inner struct {
		A string `json:"a"`
		B int    `json:"b" minor:"2"`
	}
	type pol struct {
		N string `json:"n"`
		M int    `json:"m,omitempty" minor:"1"`
		I inner  `json:"i"`
	}
	for _, tc := range []struct {
		p    pol
		want int
	}{
		{pol{N: "x", I: inner{A: "y"}}, 0},
		{pol{N: "x", M: 3}, 1},
		{pol{I: inner{B: 1}}, 2},
		{pol{M: 1, I: inner{B: 1}}, 2},
	} {
		if got := minMinor(reflect.ValueOf(tc.p)); got != tc.want {
			t.Errorf("minMinor(%+v) = %d, want %d", tc.p, got, tc.want)
		}
	}
	// Every policy of the first release's shape needs minor 0.
	p := Policy{Name: "p", ID: "ns/p", WindowMillis: 1000, Limit: 1, Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce",
		Key: Key{Source: SourceHeader, Name: "X", OnMissing: MissingDeny}, Match: Match{Methods: []string{"GET"}, PathPrefixes: []string{"/"}},
		Selector: Selector{MatchLabels: map[string]string{"a": "b"}, MatchExpressions: []Requirement{{Key: "k", Operator: "Exists"}}}, Replicas: 2}
	if got := MinMinor(&p); got != 0 {
		t.Errorf("MinMinor of a first-release policy = %d", got)
	}
}

func TestParseNewerMinor(t *testing.T) {
	doc := func(version, extraTop, extraPolicy string) []byte {
		return []byte(`{"version":"` + version + `","namespace":"ns"` + extraTop + `,"policies":[` +
			`{"name":"a","id":"ns/a","selector":{},"windowMillis":1000,"limit":1,"algorithm":"SlidingLog","failMode":"Open","mode":"Enforce","key":{"source":"Global","onMissing":"Deny"},"match":{}},` +
			`{"name":"b","id":"ns/b","windowMillis":1000,"limit":1,"algorithm":"SlidingLog","failMode":"Open","mode":"Enforce","key":{"source":"Global","onMissing":"Deny"},"match":{}` + extraPolicy + `}]}`)
	}
	c, err := Parse(doc("slidegate.dev/sidecar-config/v1.9", "", `,"quota":{"from":"header"},"selector":{"matchExpressions":[{"key":"k","operator":"Exists","weight":3}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Policies) != 1 || c.Policies[0].Name != "a" {
		t.Errorf("policies %+v, want only a", c.Policies)
	}
	want := []Skipped{{Policy: "b", Fields: []string{"quota", "selector.matchExpressions[0].weight"}}}
	if !reflect.DeepEqual(c.Skipped, want) {
		t.Errorf("skipped %+v, want %+v", c.Skipped, want)
	}
	for _, tc := range []struct{ name, version, top, policy string }{
		{"own minor, unknown field", Version, "", `,"quota":{}`},
		{"first release's version, unknown field", VersionOf(0), "", `,"quota":{}`},
		{"own minor, unknown field within cost", Version, "", `,"cost":{"request":{"constant":1,"weight":2}}`},
		{"newer minor, unknown top-level field", "slidegate.dev/sidecar-config/v1.9", `,"quota":1`, ""},
		{"newer major", "slidegate.dev/sidecar-config/v2.0", "", ""},
		{"newer minor, known field of the wrong type", "slidegate.dev/sidecar-config/v1.9", "", `,"limit":"x"`},
	} {
		if _, err := Parse(doc(tc.version, tc.top, tc.policy)); err == nil {
			t.Errorf("%s: parsed", tc.name)
		}
	}
	// An older document is read as it is.
	c, err = Parse(doc(VersionOf(0), "", `,"selector":{}`))
	if err != nil {
		t.Fatalf("a minor 0 document: %v", err)
	}
	if len(c.Policies) != 2 || len(c.Skipped) != 0 {
		t.Errorf("a minor 0 document: %d policies, skipped %v", len(c.Policies), c.Skipped)
	}
}

// minor1Policy is Policy as a sidecar of minor version 1 (the release
// before cost) reads it: every field but cost. TestMinor1PolicyIsPolicyUpToMinor1
// keeps it honest.
type minor1Policy struct {
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
}

func TestMinor1PolicyIsPolicyUpToMinor1(t *testing.T) {
	var want, got []string
	for _, f := range policyFields(t, reflect.TypeFor[Policy](), "") {
		if f.minor <= 1 {
			want = append(want, f.path)
		}
	}
	for _, f := range policyFields(t, reflect.TypeFor[minor1Policy](), "") {
		got = append(got, f.path)
	}
	if !slices.Equal(got, want) {
		t.Errorf("minor1Policy has the fields %v, Policy up to minor 1 %v", got, want)
	}
}

// TestMinor1SidecarSkipsCostPolicies: a sidecar of the release before cost
// (minor 1) reads a document of minor 2 policy by policy and leaves a
// policy with cost out, rather than enforcing it as a count policy (which
// would let 100,000 requests through a limit of 100,000 tokens); it keeps
// enforcing the count policy beside it. And the document is minor 2 as
// soon as a policy has cost, so that a minor 1 sidecar takes that path.
func TestMinor1SidecarSkipsCostPolicies(t *testing.T) {
	count := Policy{Name: "a-count", ID: "ns/a-count", WindowMillis: 60_000, Limit: 100, Algorithm: AlgorithmSlidingLog, FailMode: FailOpen, Mode: ModeEnforce,
		Key: Key{Source: SourceGlobal, OnMissing: MissingDeny}}
	tokens := count
	tokens.Name, tokens.ID, tokens.Limit = "b-tokens", "ns/b-tokens", 100_000
	tokens.Cost = &Cost{Response: &ResponseCost{JSONFields: []string{"usage.total_tokens"}}}
	if m := MinMinor(&tokens); m != 2 {
		t.Fatalf("MinMinor of a cost policy = %d, want 2", m)
	}
	if err := (&Config{Version: VersionOf(1), Namespace: "ns", Policies: []Policy{count, tokens}}).Validate(); err == nil {
		t.Error("a minor 1 document carries a cost policy")
	}
	data, err := Marshal(&Config{Version: Version, Namespace: "ns", Policies: []Policy{count, tokens}})
	if err != nil {
		t.Fatal(err)
	}

	// The minor 1 sidecar's reading of a newer minor (decode, with its
	// Policy type).
	var doc struct {
		Config
		Policies []json.RawMessage `json:"policies"`
	}
	if err := DecodeStrict(data, &doc); err != nil {
		t.Fatal(err)
	}
	if _, minor, _ := ParseVersion(doc.Version); minor <= 1 {
		t.Fatalf("version %s: a minor 1 sidecar would read it strictly and refuse it whole", doc.Version)
	}
	kept, skipped, err := DecodePolicies[minor1Policy](doc.Policies, "name")
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != 1 || kept[0].Name != "a-count" {
		t.Errorf("a minor 1 sidecar enforces %+v, want a-count only", kept)
	}
	if want := []Skipped{{Policy: "b-tokens", Fields: []string{"cost"}}}; !reflect.DeepEqual(skipped, want) {
		t.Errorf("a minor 1 sidecar skipped %v, want %v", skipped, want)
	}

	// This package reads it whole.
	c, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Policies) != 2 || len(c.Skipped) != 0 || !reflect.DeepEqual(c.Policies[1].Cost, tokens.Cost) {
		t.Errorf("parsed %+v, skipped %v", c.Policies, c.Skipped)
	}
}
