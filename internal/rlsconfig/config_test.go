package rlsconfig

import (
	"bytes"
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestParseValid: the golden document parses and Marshal writes it back
// byte for byte (the controller's output is canonical).
func TestParseValid(t *testing.T) {
	data, err := os.ReadFile("testdata/valid.json")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Policies) != 2 || c.Policies[1].Descriptor[0].Value != "api" {
		t.Fatalf("parsed %+v", c)
	}
	out, err := Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, data) {
		t.Fatalf("Marshal does not round-trip:\n%s", out)
	}
}

// withCost gives the policy a cost, in the version that carries it.
func withCost(cost Cost) func(c *Config) {
	return func(c *Config) {
		c.Policies[0].Cost = &cost
		c.Version = VersionFor(c.Policies)
	}
}

// TestValidCost: the two costs a policy for the rate limit service can have.
func TestValidCost(t *testing.T) {
	for _, cost := range []Cost{{Request: &RequestCost{}}, {Response: &ResponseCost{}}} {
		p := Policy{Namespace: "ns", Name: "p", ID: "rls/ns/p", Domain: "d", Descriptor: []Entry{{Key: "remote_address"}},
			WindowMillis: 60_000, Limit: 100_000, Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce", Cost: &cost}
		c := &Config{Version: VersionFor([]Policy{p}), Policies: []Policy{p}}
		data, err := Marshal(c)
		if err != nil {
			t.Fatalf("%+v: %v", cost, err)
		}
		back, err := Parse(data)
		if err != nil || back.Version != "v1.2" || !reflect.DeepEqual(back.Policies[0].Cost, &cost) {
			t.Errorf("%s read back as %+v, %v", data, back, err)
		}
	}
}

// New cases go at the end of the table: a mutation of the golden policy
// and the error text it must produce.
func TestParseInvalid(t *testing.T) {
	valid := func() Policy {
		return Policy{
			Namespace: "ns", Name: "p", ID: "rls/ns/p", Domain: "d",
			Descriptor:   []Entry{{Key: "remote_address"}},
			WindowMillis: 1000, Limit: 10, Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce",
		}
	}
	cases := []struct {
		name   string
		mutate func(c *Config)
		want   string
	}{
		{"version", func(c *Config) { c.Version = "v2" }, `version "v2": major version 2 is not 1`},
		{"unsorted", func(c *Config) {
			p := valid()
			p.Name, p.ID = "a", "rls/ns/a"
			c.Policies = append(c.Policies, p)
		}, "not sorted by id"},
		{"duplicate", func(c *Config) { c.Policies = append(c.Policies, valid()) }, "appears twice"},
		{"id", func(c *Config) { c.Policies[0].ID = "ns/p" }, `id is not "rls/ns/p"`},
		{"no domain", func(c *Config) { c.Policies[0].Domain = "" }, "domain must have 1 to 256 bytes"},
		{"no descriptor", func(c *Config) { c.Policies[0].Descriptor = nil }, "descriptor has 0 entries"},
		{"too many entries", func(c *Config) {
			c.Policies[0].Descriptor = make([]Entry, MaxEntries+1)
			for i := range c.Policies[0].Descriptor {
				c.Policies[0].Descriptor[i].Key = "k"
			}
		}, "descriptor has 17 entries"},
		{"empty key", func(c *Config) { c.Policies[0].Descriptor[0].Key = "" }, "descriptor[0].key must have"},
		{"long value", func(c *Config) { c.Policies[0].Descriptor[0].Value = strings.Repeat("v", 257) }, "descriptor[0].value longer than 256"},
		{"window", func(c *Config) { c.Policies[0].WindowMillis = 0 }, "windowMillis 0 is outside"},
		{"limit", func(c *Config) { c.Policies[0].Limit = -1 }, "limit -1 is outside"},
		// The CRD never allowed 0; the document now says so as the sidecars' does.
		{"limit 0", func(c *Config) { c.Policies[0].Limit = 0 }, "limit 0 is outside 1.."},
		{"algorithm", func(c *Config) { c.Policies[0].Algorithm = "FixedWindow" }, `algorithm "FixedWindow"`},
		{"failMode", func(c *Config) { c.Policies[0].FailMode = "" }, `failMode ""`},
		{"mode", func(c *Config) { c.Policies[0].Mode = "Shadow" }, `mode "Shadow"`},
		{"durability", func(c *Config) { c.Policies[0].Durability = "Quorum" }, `durability "Quorum" is not Primary or Replicated`},
		// Cost (issue 27): the gateway sends it, so a cost names no source.
		{"cost in a v1.1 document", func(c *Config) {
			c.Version = VersionOf(1)
			c.Policies[0].Cost = &Cost{Response: &ResponseCost{}}
		}, `policy "rls/ns/p" needs version v1.2, the document is v1.1`},
		{"cost empty", withCost(Cost{}), "cost needs request or response"},
		{"cost request and response", withCost(Cost{Request: &RequestCost{}, Response: &ResponseCost{}}), "cost: set request or response, not both"},
		{"cost request constant", withCost(Cost{Request: &RequestCost{Constant: new(int64)}}), "cost.request must be empty: the gateway sends the cost as hits_addend"},
		{"cost request header", withCost(Cost{Request: &RequestCost{Header: "X-Cost"}}), "cost.request must be empty"},
		{"cost response jsonFields", withCost(Cost{Response: &ResponseCost{JSONFields: []string{"usage.total_tokens"}}}), "cost.response must be empty: the gateway sends the cost as hits_addend"},
		{"cost response default", withCost(Cost{Response: &ResponseCost{Default: 1}}), "cost.response must be empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &Config{Version: Version, Policies: []Policy{valid()}}
			tc.mutate(c)
			if _, err := Marshal(c); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
	for _, bad := range []string{`{"version":"v1","policies":[],"extra":1}`, `{"version":"v1","policies":[]} {}`, `[`} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%s) succeeded", bad)
		}
	}
}
