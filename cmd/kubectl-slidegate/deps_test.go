package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestLinksOnlyWhatItNeeds: the binaries that never decide do not link
// the decision path. The plugin reads the sidecar's /debug answers
// (package debugapi) and finds the sidecar by the API's names; linking the
// sidecar for them pulled in the proxy, the limiter, the Redis client and
// Prometheus. The manager renders documents (sidecarconfig, rlsconfig)
// whose enumerations live in those wire packages, not in the limiter, and
// administers the shared Redis (internal/redisadmin) from what slidegate
// keeps there (internal/redisschema: the keys, the Functions library, the
// ACL rules); linking the limiter for that pulled in its request path. The
// sidecar, in every protected pod, and the rate limit service link no
// Kubernetes API types.
func TestLinksOnlyWhatItNeeds(t *testing.T) {
	const mod = "github.com/slidegate/slidegate/"
	for _, tt := range []struct {
		pkg       string
		forbidden []string
	}{
		{".", []string{
			mod + "internal/sidecar", mod + "internal/limiter", mod + "internal/inject", mod + "internal/redisconn",
			"github.com/redis/go-redis/v9", "github.com/prometheus/client_golang/prometheus",
		}},
		{"../manager", []string{mod + "internal/sidecar", mod + "internal/rls", mod + "internal/limiter"}},
		// The sidecar reads files (its config, credentials, labels), not
		// the API: the API types linked 75 packages more for one name in
		// a log line.
		{"../sidecar", []string{mod + "api/v1alpha1", "k8s.io/api/core/v1", "k8s.io/apimachinery/pkg/runtime"}},
		// The rate limit service reads its config file, as the sidecar
		// does, and decides through the same limiter.
		{"../rls", []string{mod + "api/v1alpha1", "k8s.io/api/core/v1", "k8s.io/apimachinery/pkg/runtime", mod + "internal/sidecar"}},
	} {
		out, err := exec.Command("go", "list", "-deps", tt.pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", tt.pkg, err, out)
		}
		deps := strings.Fields(string(out))
		for _, f := range tt.forbidden {
			if slices.Contains(deps, f) {
				t.Errorf("%s links %s", tt.pkg, f)
			}
		}
	}
	// What slidegate keeps in Redis is a leaf: the limiter and the manager
	// both import it, so anything internal it imported would be linked by
	// both again.
	out, err := exec.Command("go", "list", "-deps", "../../internal/redisschema").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps internal/redisschema: %v\n%s", err, out)
	}
	for _, d := range strings.Fields(string(out)) {
		if strings.HasPrefix(d, mod) && d != mod+"internal/redisschema" {
			t.Errorf("internal/redisschema imports %s", d)
		}
	}
}
