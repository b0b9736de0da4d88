package rlsconvert

import (
	"flag"
	"os"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/policies.golden.yaml")

// TestConvertGolden: testdata/config.yaml, a case of each kind, converts
// to testdata/policies.golden.yaml (go test -update rewrites it): a policy
// for each rate limit that maps, with the file's descriptor, window and
// limit, shadow mode as DryRun; a note for each one that does not, and for
// each difference in meaning.
func TestConvertGolden(t *testing.T) {
	in, err := os.ReadFile("testdata/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Convert(in, "gateways")
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile("testdata/policies.golden.yaml", got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/policies.golden.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("converted:\n%s\nwant (testdata/policies.golden.yaml):\n%s", got, want)
	}
	// What the golden file must say, whatever its wording.
	var names []string
	for _, p := range r.Policies {
		names = append(names, p.Name+"="+string(p.Spec.Window)+"/"+itoa(p.Spec.Limit)+"/"+string(p.Spec.Mode))
	}
	if strings.Join(names, " ") != "edge-remote-address=1s/10/ edge-generic-key-api-user=1m/100/ vip=1m/1000/ edge-generic-key-api-user-bot=1h/50/DryRun edge-generic-key-everything=24h/10000/" {
		t.Errorf("policies: %v", names)
	}
	notes := map[string]string{}
	for _, n := range r.Notes {
		notes[n.Descriptor] += n.Message + "|"
	}
	for descriptor, want := range map[string]string{
		"edge.generic_key_api.user_vip":   "applies to this value too",
		"edge.generic_key_api.user_admin": "unlimited: no policy written; a policy has no exemption",
		"edge.generic_key_api.user_bot":   "detailed_metric",
		"edge.plan_free":                  `unit "month"`,
		"edge.blocked":                    "0 requests per second",
		"edge.path_/static/*":             "wildcard",
	} {
		if !strings.Contains(notes[descriptor], want) {
			t.Errorf("%s: notes %q, want one with %q", descriptor, notes[descriptor], want)
		}
	}
	if !strings.Contains(notes["edge.generic_key_api.user_vip"], "replaces") {
		t.Errorf("vip's replaces not noted: %q", notes["edge.generic_key_api.user_vip"])
	}
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// TestConvertRefuses: a file that is not envoyproxy/ratelimit's, or has no
// domain, is refused with the reason, as envoyproxy/ratelimit refuses it.
func TestConvertRefuses(t *testing.T) {
	for in, want := range map[string]string{
		"domain: edge\ndescriptors:\n  - key: a\n    ratelimit: {unit: second}\n": "unknown field",
		"descriptors: []\n": "no domain",
		"- a\n":             "not an envoyproxy/ratelimit configuration",
	} {
		if _, err := Convert([]byte(in), "ns"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}
