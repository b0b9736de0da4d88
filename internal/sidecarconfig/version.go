package sidecarconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// The document's schema version is major.minor, written
// "slidegate.dev/sidecar-config/v<major>.<minor>"; the first release wrote
// minor 0 as ".../v1" and read nothing else, with unknown fields refused.
//
// The compatibility rule (docs/architecture.md, "Upgrades"):
//   - A minor version only adds optional fields to a policy, each tagged
//     with the minor that added it (`minor:"N"`), whose absence means what
//     the policy meant before; the renderer writes such a field only when a
//     policy uses it. So a policy that uses nothing new renders to the same
//     bytes in every minor version.
//   - A sidecar reads every document of its major version. One of its own
//     minor or older is decoded strictly, so a typo in a hand-edited
//     ConfigMap is still an error. One of a newer minor is read policy by
//     policy: a policy with a field the sidecar does not know is skipped (it
//     cannot tell whether ignoring the field would loosen the limit), and
//     the sidecar says which (log, slidegate_sidecar_config_policies_skipped),
//     while it enforces the others. A top-level field it does not know makes
//     it refuse the document and keep its last good one: the controller
//     renders top-level fields only for sidecars that know them.
//   - Anything else (a field whose absence would change an older sidecar's
//     reading, a removed or renamed field) is a new major version, which
//     sidecars refuse.
//   - Sidecars of minor 0 (the first release) refuse every field they do
//     not know, so while one runs in a namespace the controller renders
//     minor 0 there and holds back the policies that need more (their
//     status says so); the injection status annotation records each pod's
//     sidecar minor (v1alpha1.InjectionStatus.ConfigMinor).
const (
	// Major is the major version this package reads and writes.
	Major = 1
	// Minor is the newest minor version this package reads and writes.
	//
	// Minor 1 added durability, key.forwardedHeader, key.ipv6PrefixLength,
	// key.jwt and match.pathCase; minor 2 added cost (issue 27), which a
	// sidecar of minor 1 must not enforce as a count policy: it skips it;
	// minor 3 added additionalLimits (issue 37), which an older sidecar
	// skips rather than enforce the first window alone; minor 4 added
	// quotas (issue 37), which an older sidecar skips rather than enforce
	// the policy without them.
	Minor = 4
	// Version is the version string of the newest document, VersionOf(Minor).
	Version = "slidegate.dev/sidecar-config/v1.4"

	versionPrefix = "slidegate.dev/sidecar-config/v"
)

// VersionOf is the version string of minor version minor of the current
// major version: minor 0 is written as the first release wrote it.
func VersionOf(minor int) string {
	if minor == 0 {
		return versionPrefix + strconv.Itoa(Major)
	}
	return versionPrefix + strconv.Itoa(Major) + "." + strconv.Itoa(minor)
}

// ParseVersion reads a document's version string.
func ParseVersion(v string) (major, minor int, err error) { return ParseVersionOf(versionPrefix, v) }

// ParseVersionOf reads a version string "<prefix><major>[.<minor>]" (the
// rate limit service's document uses this scheme too, with prefix "v").
func ParseVersionOf(prefix, v string) (major, minor int, err error) {
	rest, ok := strings.CutPrefix(v, prefix)
	if !ok {
		return 0, 0, fmt.Errorf("version %q is not %s<major>.<minor>", v, prefix)
	}
	maj, min, hasMinor := strings.Cut(rest, ".")
	if major, err = strconv.Atoi(maj); err != nil || major < 0 || maj != strconv.Itoa(major) {
		return 0, 0, fmt.Errorf("version %q: bad major version", v)
	}
	if hasMinor {
		if minor, err = strconv.Atoi(min); err != nil || minor < 0 || min != strconv.Itoa(minor) {
			return 0, 0, fmt.Errorf("version %q: bad minor version", v)
		}
	}
	return major, minor, nil
}

// MinMinor is the oldest minor version that can carry p: the newest minor
// among the fields p sets. A sidecar of an older minor cannot enforce p.
func MinMinor(p *Policy) int { return MinMinorOf(p) }

// MinMinorOf is MinMinor for any policy struct (or pointer to one) whose
// fields carry minor tags: the rate limit service's policies follow the
// same rule.
func MinMinorOf(p any) int {
	v := reflect.ValueOf(p)
	for v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	return minMinor(v)
}

func minMinor(v reflect.Value) int {
	m := 0
	t := v.Type()
	for i := range t.NumField() {
		f, fv := t.Field(i), v.Field(i)
		if fv.IsZero() {
			continue
		}
		if tag := f.Tag.Get("minor"); tag != "" {
			n, err := strconv.Atoi(tag)
			if err != nil {
				panic(fmt.Sprintf("sidecarconfig: field %s has minor tag %q", f.Name, tag))
			}
			m = max(m, n)
		}
		if fv.Kind() == reflect.Struct {
			m = max(m, minMinor(fv))
		}
	}
	return m
}

// Skipped is a policy of a newer minor version that this sidecar cannot
// read: it has fields this version does not know.
type Skipped struct {
	// Policy is the policy's name (empty if even that was unreadable).
	Policy string
	// Fields are the unknown fields, as JSON paths within the policy.
	Fields []string
}

func (s Skipped) String() string {
	return fmt.Sprintf("%s (unknown fields %s)", s.Policy, strings.Join(s.Fields, ", "))
}

// SkippedNames are skipped's strings, for a log line.
func SkippedNames(skipped []Skipped) []string {
	names := make([]string, len(skipped))
	for i, sk := range skipped {
		names[i] = sk.String()
	}
	return names
}

// decode reads a document into c: strictly when its minor version is this
// package's or older, policy by policy when it is newer (see the rule
// above), and refuses any other major version.
func decode(data []byte, c *Config) error {
	var head struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return err
	}
	major, minor, err := ParseVersion(head.Version)
	if err != nil {
		return err
	}
	if major != Major {
		return fmt.Errorf("version %q: this sidecar reads major version %d only", head.Version, Major)
	}
	if minor <= Minor {
		return DecodeStrict(data, c)
	}
	// A newer minor version: the top level strictly (with the policies
	// left raw), then each policy on its own.
	var doc struct {
		Config
		Policies []json.RawMessage `json:"policies"`
	}
	if err := DecodeStrict(data, &doc); err != nil {
		return err
	}
	*c = doc.Config
	c.Policies, c.Skipped, err = DecodePolicies[Policy](doc.Policies, "name")
	return err
}

// DecodePolicies decodes the policies of a document of a newer minor
// version: each strictly, and a policy with fields P does not know is left
// out and listed in skipped, named by its field nameField. Any other error
// is the document's.
func DecodePolicies[P any](raws []json.RawMessage, nameField string) (out []P, skipped []Skipped, err error) {
	out = make([]P, 0, len(raws))
	for _, raw := range raws {
		var p P
		err := DecodeStrict(raw, &p)
		if err == nil {
			out = append(out, p)
			continue
		}
		unknown := unknownFields(raw, reflect.TypeFor[P](), "")
		if len(unknown) == 0 {
			return nil, nil, fmt.Errorf("policy: %w", err)
		}
		var named map[string]json.RawMessage
		var name string
		_ = json.Unmarshal(raw, &named)
		_ = json.Unmarshal(named[nameField], &name)
		skipped = append(skipped, Skipped{Policy: name, Fields: unknown})
	}
	return out, skipped, nil
}

// unknownFields lists the JSON object keys in raw that type t (a struct,
// or a slice or map of them) has no field for, as paths below prefix.
func unknownFields(raw json.RawMessage, t reflect.Type, prefix string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Slice:
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) != nil {
			return nil
		}
		var out []string
		for i, it := range items {
			out = append(out, unknownFields(it, t.Elem(), prefix+"["+strconv.Itoa(i)+"]")...)
		}
		return out
	case reflect.Struct:
	default:
		return nil
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return nil
	}
	known := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		known[name] = f.Type
	}
	var out []string
	for k, v := range obj {
		path := k
		if prefix != "" {
			path = prefix + "." + k
		}
		ft, ok := known[k]
		if !ok {
			out = append(out, path)
			continue
		}
		out = append(out, unknownFields(v, ft, path)...)
	}
	slices.Sort(out)
	return out
}

// checkVersion is Validate's part for the version: a document this package
// writes or has read is of its major version and at most its minor, and
// every policy fits the document's minor version.
func (c *Config) checkVersion() error {
	major, minor, err := ParseVersion(c.Version)
	if err != nil {
		return err
	}
	if major != Major {
		return fmt.Errorf("version %q: major version %d is not %d", c.Version, major, Major)
	}
	var errs []error
	for i := range c.Policies {
		if m := MinMinor(&c.Policies[i]); m > minor {
			errs = append(errs, fmt.Errorf("policy %q needs version %s, the document is %s", c.Policies[i].Name, VersionOf(m), c.Version))
		}
	}
	return errors.Join(errs...)
}
