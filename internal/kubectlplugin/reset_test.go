package kubectlplugin

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestResetThroughAPortForward: a user bound to slidegate-debugger only
// is refused a reset, and nothing is reset (the client stays limited);
// one bound to slidegate-resetter resets the client through a sidecar, the
// client is admitted again by both sidecars' pods (the other sidecar did
// not cache the denial), and the reset is recorded as an Event on the
// policy that names the user, the client's hashed key and the reason,
// never the client's value.
func TestResetThroughAPortForward(t *testing.T) {
	s := newShop(t, "shop-reset")
	bind(t, s.ns, "shop-reset-oncall", "ClusterRole", DebuggerRole)
	bind(t, s.ns, "shop-reset-admins", "ClusterRole", ResetterRole)
	oncall := kubeconfigFor(t, "olga", "shop-reset-oncall")
	adminKC := kubeconfigFor(t, "bob", "shop-reset-admins")
	const apiKey = "k-reset-secret"
	for range 3 {
		if code := s.get(t, apiKey); code != http.StatusOK {
			t.Fatalf("admit: %d", code)
		}
	}
	if code := s.get(t, apiKey); code != http.StatusTooManyRequests {
		t.Fatalf("4th: %d", code)
	}

	code, _, errOut := run("reset", "--kubeconfig", oncall, "-n", s.ns, "per-api-key", "--header", apiKey)
	if code != 1 || !strings.Contains(errOut, ResetterRole) || !strings.Contains(errOut, `"events"`) || !strings.Contains(errOut, "nothing was reset") {
		t.Errorf("the debugger's reset: exit %d, %s; want a refusal naming %s", code, errOut, ResetterRole)
	}
	if code := s.get(t, apiKey); code != http.StatusTooManyRequests {
		t.Fatalf("after a refused reset: %d, want the client still limited", code)
	}

	code, out, errOut := run("reset", "--kubeconfig", adminKC, "-n", s.ns, "per-api-key", "--header", apiKey, "--reason", "ticket 4711", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var res ResetResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if res.RequestedBy != "bob" || res.Policy != "per-api-key" || res.NonEmpty != 1 || len(res.RedisKeys) != 1 || res.Event == "" || strings.Contains(out, apiKey) {
		t.Fatalf("reset answered %s", out)
	}
	for i := range 3 {
		if code := s.get(t, apiKey); code != http.StatusOK {
			t.Fatalf("request %d after the reset: %d, want the limit's 3 again", i, code)
		}
	}
	if code := s.get(t, apiKey); code != http.StatusTooManyRequests {
		t.Fatalf("the 4th after the reset: %d, want 429", code)
	}

	// The table form, for people; the client's value stays out of it.
	code, out, errOut = run("reset", "--kubeconfig", adminKC, "-n", s.ns, "per-api-key", "--header", apiKey)
	if code != 0 || !strings.Contains(out, "reset client "+res.ClientKey+" of policy "+s.ns+"/per-api-key: 1 of 1 counters held admits") ||
		!strings.Contains(out, "recorded as Event per-api-key.") || strings.Contains(out, apiKey) {
		t.Errorf("table: exit %d, %s %s", code, out, errOut)
	}
	t.Logf("kubectl slidegate reset -n %s per-api-key --header %s\n%s", s.ns, apiKey, out)

	var evs corev1.EventList
	if err := admin.List(context.Background(), &evs, client.InNamespace(s.ns)); err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, ev := range evs.Items {
		if ev.Name != res.Event {
			continue
		}
		found = true
		if ev.Reason != ReasonClientReset || ev.InvolvedObject.Kind != "RateLimitPolicy" || ev.InvolvedObject.Name != "per-api-key" ||
			!strings.Contains(ev.Message, "bob") || !strings.Contains(ev.Message, res.ClientKey) || !strings.Contains(ev.Message, "ticket 4711") ||
			strings.Contains(ev.Message, apiKey) {
			t.Errorf("event %+v", ev)
		}
		t.Logf("event: %s %s: %s", ev.Reason, ev.InvolvedObject.Name, ev.Message)
	}
	if !found {
		t.Errorf("no Event %s in %s", res.Event, s.ns)
	}
}
