package kubectlplugin

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// statusPolicy creates a policy in ns with the controller's status: the
// three conditions with the given statuses (reason Because<Type> when not
// True), the counts and the revision.
func statusPolicy(t *testing.T, ns, name string, generation int64, accepted, ready, enforced metav1.ConditionStatus, matched, enforcedPods int32) {
	t.Helper()
	p := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": v1alpha1.LabelValue(name)}},
			Window:         "10s", Limit: 5, Key: v1alpha1.ClientKey{Source: v1alpha1.KeySourceGlobal},
		},
	}
	mustCreate(t, p)
	p.Status = v1alpha1.RateLimitPolicyStatus{ObservedGeneration: generation, MatchedPods: matched, EnforcedPods: enforcedPods, Revision: "rev-" + name}
	for _, c := range []struct {
		typ    v1alpha1.ConditionType
		status metav1.ConditionStatus
	}{{v1alpha1.ConditionAccepted, accepted}, {v1alpha1.ConditionReady, ready}, {v1alpha1.ConditionEnforced, enforced}} {
		reason := string(c.typ)
		if c.status != metav1.ConditionTrue {
			reason = "Because" + string(c.typ)
		}
		p.Status.Conditions = append(p.Status.Conditions, metav1.Condition{
			Type: string(c.typ), Status: c.status, Reason: reason, Message: name + " says " + reason,
			ObservedGeneration: generation, LastTransitionTime: metav1.Now(),
		})
	}
	if err := admin.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

// TestStatus: `kubectl slidegate status` shows each policy as the
// controller reported it, in one namespace or all, as a table (with one
// policy: each condition's message), JSON or YAML; the reason shown is the
// first condition that is not True; a status of an earlier generation says
// so; a user who may not list policies is told which permission is missing.
func TestStatus(t *testing.T) {
	for _, ns := range []string{"status-a", "status-b"} {
		mustCreate(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	statusPolicy(t, "status-a", "fine", 1, metav1.ConditionTrue, metav1.ConditionTrue, metav1.ConditionTrue, 2, 2)
	statusPolicy(t, "status-a", "bypassed", 1, metav1.ConditionTrue, metav1.ConditionTrue, metav1.ConditionFalse, 3, 1)
	statusPolicy(t, "status-b", "invalid", 0, metav1.ConditionFalse, metav1.ConditionFalse, metav1.ConditionFalse, 0, 0)
	kc := kubeconfigFor(t, "erin", "system:masters")
	run := func(args ...string) (int, string, string) { return run(append(args, "--kubeconfig", kc)...) }

	code, out, errOut := run("status", "-n", "status-a")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAMESPACE") ||
		strings.Join(strings.Fields(lines[1]), " ") != "status-a bypassed True True False 1/3 enforced rev-bypassed BecauseEnforced" ||
		strings.Join(strings.Fields(lines[2]), " ") != "status-a fine True True True 2/2 enforced rev-fine -" {
		t.Errorf("status -n status-a:\n%s", out)
	}

	code, out, errOut = run("status", "-A", "-o", "json")
	var all []PolicyStatus
	if code != 0 || json.Unmarshal([]byte(out), &all) != nil {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}
	var names []string
	for _, s := range all {
		if strings.HasPrefix(s.Namespace, "status-") {
			names = append(names, s.Namespace+"/"+s.Name)
		}
	}
	if strings.Join(names, " ") != "status-a/bypassed status-a/fine status-b/invalid" {
		t.Errorf("status -A: %v", names)
	}
	for _, s := range all {
		if s.Namespace+"/"+s.Name == "status-b/invalid" && (s.Reason != "BecauseAccepted" || s.Current) {
			t.Errorf("status-b/invalid: %+v; want reason BecauseAccepted, not current (observed generation 0)", s)
		}
	}

	code, out, errOut = run("status", "-n", "status-b", "invalid")
	if code != 0 || !strings.Contains(out, "BecauseAccepted (status of an earlier generation)") ||
		!strings.Contains(out, "Accepted=False (BecauseAccepted): invalid says BecauseAccepted") ||
		!strings.Contains(out, "Enforced=False (BecauseEnforced): invalid says BecauseEnforced") {
		t.Errorf("status of one policy: exit %d\n%s%s", code, out, errOut)
	}

	code, out, errOut = run("status", "-n", "status-a", "fine", "-o", "yaml")
	var one []PolicyStatus
	if code != 0 || yaml.UnmarshalStrict([]byte(out), &one) != nil || len(one) != 1 || one[0].Revision != "rev-fine" || len(one[0].Conditions) != 3 {
		t.Errorf("status -o yaml: exit %d\n%s%s", code, out, errOut)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "-A", "fine"}, "give -n, not -A"},
		{[]string{"status", "-n", "status-a", "a", "b"}, "at most one POLICY"},
		{[]string{"status", "-o", "xml"}, "unknown output format"},
	} {
		if code, _, errOut := run(tc.args...); code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, %s", tc.args, code, errOut)
		}
	}

	// Without list on ratelimitpolicies: the missing permission, named.
	mustCreate(t, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "nothing", Namespace: "status-a"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}},
	})
	bind(t, "status-a", "pod-readers", "Role", "nothing")
	code, _, errOut = runIn("", "status", "--kubeconfig", kubeconfigFor(t, "dave", "pod-readers"), "-n", "status-a")
	if code != 1 || !strings.Contains(errOut, `you lack "list" on "ratelimitpolicies.ratelimit.slidegate.dev" in namespace "status-a"`) {
		t.Errorf("refused: exit %d: %s", code, errOut)
	}
}

// TestCompletion: what kubectl_complete-slidegate (the completion command's
// script) answers kubectl in Cobra's protocol: the commands, a command's
// flags, the output formats, file names for convert's -f, and the policies
// of the namespace the words name, read from the API server.
func TestCompletion(t *testing.T) {
	mustCreate(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "complete-a"}})
	statusPolicy(t, "complete-a", "per-user", 1, metav1.ConditionTrue, metav1.ConditionTrue, metav1.ConditionTrue, 1, 1)
	statusPolicy(t, "complete-a", "per-ip", 1, metav1.ConditionTrue, metav1.ConditionTrue, metav1.ConditionTrue, 1, 1)
	statusPolicy(t, "complete-a", "global", 1, metav1.ConditionTrue, metav1.ConditionTrue, metav1.ConditionTrue, 1, 1)
	kc := kubeconfigFor(t, "frank", "system:masters")
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{""}, "status why quota reset top convert completion version help :4"},
		{[]string{"t"}, "top :4"},
		{[]string{"why", "-n", "complete-a", "--kubeconfig", kc, "per-"}, "per-ip per-user :4"},
		{[]string{"top", "--namespace=complete-a", "--kubeconfig", kc, ""}, "global per-ip per-user :4"},
		{[]string{"why", "-n", "complete-a", "--kubeconfig", kc, "global", ""}, ":4"},
		{[]string{"why", "--glo"}, "--global :4"},
		{[]string{"status", "-o", ""}, "table json yaml :4"},
		{[]string{"why", "--header", ""}, ":4"},
		{[]string{"convert", "-f", ""}, ":0"},
		{[]string{"nonsense", ""}, ":4"},
	} {
		code, out, errOut := run(append([]string{"__complete"}, tt.args...)...)
		if got := strings.Join(strings.Fields(out), " "); code != 0 || got != tt.want {
			t.Errorf("__complete %q: exit %d, %q (stderr %q); want %q", tt.args, code, got, errOut, tt.want)
		}
	}
	code, out, _ := run("completion")
	if code != 0 || !strings.Contains(out, `kubectl slidegate __complete "$@"`) {
		t.Errorf("completion: exit %d, %q", code, out)
	}
}
