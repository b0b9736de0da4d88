package rlsconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// The document's version is "v<major>.<minor>", and it follows the sidecar
// configuration's compatibility rule (internal/sidecarconfig/version.go): a
// minor version only adds optional policy fields, tagged `minor:"N"`; a
// server reads every minor of its major, a newer one policy by policy,
// skipping (log, slidegate_rls_config_policies_skipped) the policies with
// fields it does not know. The first release wrote and read only "v1",
// refusing unknown fields; the controller therefore writes the oldest
// version that carries its policies (VersionFor): "v1" as long as no policy
// uses a newer field, so that servers of the first release keep reading
// what they can enforce while a rollout replaces them.
const (
	// Major is the major version this package reads and writes.
	Major = 1
	// Minor is the newest minor version this package reads and writes.
	// Minor 1 added durability; minor 2 added cost (issue 27), which a
	// server of minor 1 skips rather than enforcing as a count policy;
	// minor 3 added additionalLimits (issue 37), which a server of minor 2
	// skips rather than enforce the first window alone; minor 4 added
	// quotas, which a server of minor 3 skips rather than enforce the
	// windows alone.
	Minor = 4
	// Version is the version string of minor 0, the first release's.
	Version = "v1"
)

// VersionOf is the version string of a minor version of Major.
func VersionOf(minor int) string {
	if minor == 0 {
		return Version
	}
	return "v" + strconv.Itoa(Major) + "." + strconv.Itoa(minor)
}

// VersionFor is the oldest version that carries policies.
func VersionFor(policies []Policy) string {
	m := 0
	for i := range policies {
		m = max(m, sidecarconfig.MinMinorOf(&policies[i]))
	}
	return VersionOf(m)
}

func decode(data []byte, c *Config) error {
	var head struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return err
	}
	major, minor, err := sidecarconfig.ParseVersionOf("v", head.Version)
	if err != nil {
		return err
	}
	if major != Major {
		return fmt.Errorf("version %q: this server reads major version %d only", head.Version, Major)
	}
	if minor <= Minor {
		return sidecarconfig.DecodeStrict(data, c)
	}
	var doc struct {
		Config
		Policies []json.RawMessage `json:"policies"`
	}
	if err := sidecarconfig.DecodeStrict(data, &doc); err != nil {
		return err
	}
	*c = doc.Config
	c.Policies, c.Skipped, err = sidecarconfig.DecodePolicies[Policy](doc.Policies, "id")
	return err
}

// checkVersion: the document is of Major, and every policy fits its minor.
func (c *Config) checkVersion() error {
	major, minor, err := sidecarconfig.ParseVersionOf("v", c.Version)
	if err != nil {
		return err
	}
	if major != Major {
		return fmt.Errorf("version %q: major version %d is not %d", c.Version, major, Major)
	}
	var errs []error
	for i := range c.Policies {
		if m := sidecarconfig.MinMinorOf(&c.Policies[i]); m > minor {
			errs = append(errs, fmt.Errorf("policy %q needs version %s, the document is %s", c.Policies[i].ID, VersionOf(m), c.Version))
		}
	}
	return errors.Join(errs...)
}
