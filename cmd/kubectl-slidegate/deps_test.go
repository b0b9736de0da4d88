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
// whose enumerations live in those wire packages, not in the limiter; it
// links the limiter for one reason only: it administers the shared Redis
// (internal/redisadmin), loading the limiter's scripts as the Functions
// library and deriving each identity's key patterns from the limiter's key
// layout, whose one home is the limiter.
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
		{"../manager", []string{mod + "internal/sidecar", mod + "internal/rls"}},
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
}
