package policystatus

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
)

// TestArgoCDHealth runs the shipped Argo CD health check
// (config/argocd/argocd-cm-health.yaml) the way Argo CD does — gopher-lua,
// the object as the global obj — on statuses the controller itself computes,
// and shows kstatus's (Flux's) answer for the same objects beside it.
func TestArgoCDHealth(t *testing.T) {
	script := argoHealthScript(t)
	base := func(gen int64) *v1alpha1.RateLimitPolicy {
		p := newPolicy("shop", "per-user")
		p.Generation = gen
		return p
	}
	reconciled := func(in Input) *v1alpha1.RateLimitPolicy {
		p := base(1)
		p.Status = Desired(p, in)
		return p
	}
	ok := Input{Revision: "abc", Matched: 3, Enforced: 3}
	// Policies for the rate limit service, with servers that loaded
	// revision "abc" or an older one.
	rls := func(in ServiceInput) *v1alpha1.RateLimitPolicy {
		p := newRLSPolicy("shop", "login")
		p.Generation = 1
		in.Namespace, in.Service, in.AdminPort = "slidegate-system", "slidegate-rls", "admin"
		p.Status = DesiredService(p, in)
		return p
	}
	loaded := func(rev string) Server {
		return Server{Addr: "10.0.0.1:8082", Loaded: map[string]bool{rev: true}}
	}
	specChanged := reconciled(ok)
	specChanged.Generation = 2
	for _, tc := range []struct {
		name    string
		p       *v1alpha1.RateLimitPolicy
		argo    string
		kstatus status.Status
	}{
		{"new, not reconciled", base(1), "Progressing", status.InProgressStatus},
		{"spec changed, not reconciled", specChanged, "Progressing", status.InProgressStatus},
		{"invalid", reconciled(Input{NotAccepted: NotAccepted(errors.New("window 0s"))}), "Degraded", status.FailedStatus},
		{"no room in the ConfigMap", reconciled(Input{NotAccepted: NotAccepted(&render.ConfigTooLargeError{Namespace: "shop", Name: "p", PolicyBytes: 40_000, TotalBytes: 1_010_000, MaxBytes: 1_000_000}), Matched: 1, Enforced: 1}), "Degraded", status.FailedStatus},
		{"no Redis credentials", reconciled(Input{Revision: "abc", Credentials: Credentials("Secret slidegate-redis not found"), Matched: 1, Enforced: 1, Now: time.Now(), Grace: time.Minute}), "Degraded", status.InProgressStatus},
		{"no Redis credentials for over a minute", reconciled(Input{Revision: "abc", Credentials: Credentials("Secret slidegate-redis not found"), Matched: 1, Enforced: 1, Now: time.Now().Add(time.Minute + time.Second), Grace: time.Minute}), "Degraded", status.FailedStatus},
		{"no pod selected", reconciled(Input{Revision: "abc"}), "Healthy", status.CurrentStatus},
		{"a Service bypasses the sidecar", reconciled(Input{Revision: "abc", Matched: 2, Enforced: 2, Bypass: "Service web targets port 8080"}), "Degraded", status.CurrentStatus},
		{"some pods without the sidecar", reconciled(Input{Revision: "abc", Matched: 3, Enforced: 1}), "Degraded", status.CurrentStatus},
		{"enforced", reconciled(ok), "Healthy", status.CurrentStatus},
		{"rate limit service: enforced", rls(ServiceInput{Revision: "abc", Servers: []Server{loaded("abc"), loaded("abc")}}), "Healthy", status.CurrentStatus},
		{"rate limit service: a server still loading", rls(ServiceInput{Revision: "abc", Servers: []Server{loaded("abc"), loaded("old")}}), "Progressing", status.CurrentStatus},
		{"rate limit service: no server", rls(ServiceInput{Revision: "abc"}), "Degraded", status.CurrentStatus},
		{"rate limit service: no room", rls(ServiceInput{NotAccepted: NotAccepted(&render.ConfigTooLargeError{Namespace: "shop", Name: "login", PolicyBytes: 400, TotalBytes: 1_000_100, MaxBytes: 1_000_000, RateLimitService: true})}), "Degraded", status.FailedStatus},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(tc.p)
			if err != nil {
				t.Fatal(err)
			}
			if tc.p.Status.ObservedGeneration == 0 && tc.p.Status.Conditions == nil {
				// As the API server stores a new policy: the schema's defaults.
				u["status"] = map[string]any{"observedGeneration": int64(0), "matchedPods": int64(0), "enforcedPods": int64(0)}
			}
			health, msg := runArgoHealth(t, script, u)
			if health != tc.argo {
				t.Errorf("Argo CD health %s (%q), want %s", health, msg, tc.argo)
			}
			if msg == "" {
				t.Error("Argo CD health without a message")
			}
			res, err := status.Compute(&unstructured.Unstructured{Object: u})
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != tc.kstatus {
				t.Errorf("kstatus %s (%s), want %s", res.Status, res.Message, tc.kstatus)
			}
		})
	}
}

func argoHealthScript(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../../config/argocd/argocd-cm-health.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(raw, &cm); err != nil {
		t.Fatal(err)
	}
	script := cm.Data["resource.customizations.health.ratelimit.slidegate.dev_RateLimitPolicy"]
	if script == "" {
		t.Fatal("no health check for ratelimit.slidegate.dev_RateLimitPolicy in the argocd-cm snippet")
	}
	return script
}

// runArgoHealth evaluates script with obj set, as Argo CD's Lua VM does, and
// returns the status and message of the table it returns.
func runArgoHealth(t *testing.T, script string, obj map[string]any) (health, msg string) {
	t.Helper()
	L := lua.NewState()
	defer L.Close()
	L.SetGlobal("obj", toLua(L, obj))
	if err := L.DoString(script); err != nil {
		t.Fatalf("the health check fails: %v", err)
	}
	ret, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		t.Fatalf("the health check returned %s, want a table", L.Get(-1).Type())
	}
	return ret.RawGetString("status").String(), ret.RawGetString("message").String()
}

func toLua(ls *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case map[string]any:
		tb := ls.NewTable()
		for k, e := range v {
			tb.RawSetString(k, toLua(ls, e))
		}
		return tb
	case []any:
		tb := ls.NewTable()
		for _, e := range v {
			tb.Append(toLua(ls, e))
		}
		return tb
	case string:
		return lua.LString(v)
	case bool:
		return lua.LBool(v)
	case int64:
		return lua.LNumber(v)
	case float64:
		return lua.LNumber(v)
	case nil:
		return lua.LNil
	}
	return lua.LString(fmt.Sprint(v))
}
