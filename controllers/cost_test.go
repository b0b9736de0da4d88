package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/policystatus"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// asMinor makes an injected pod's status say that its sidecar reads the
// configuration up to minor version minor, as a sidecar of an earlier
// release records it.
func asMinor(t *testing.T, pod interface {
	GetAnnotations() map[string]string
	SetAnnotations(map[string]string)
}, minor int) {
	t.Helper()
	a := pod.GetAnnotations()
	raw := a[v1alpha1.InjectedAnnotation]
	own := fmt.Sprintf(`"configMinor":%d`, sidecarconfig.Minor)
	if !strings.Contains(raw, own) {
		t.Fatalf("injection status %s lacks %s", raw, own)
	}
	a[v1alpha1.InjectedAnnotation] = strings.Replace(raw, own, fmt.Sprintf(`"configMinor":%d`, minor), 1)
	pod.SetAnnotations(a)
}

// TestCostPolicySkippedBySidecarsOfMinor1: a sidecar of the release before
// cost (configuration minor 1) reads the namespace's document but leaves a
// cost policy out (sidecarconfig's compatibility rule). The policy is
// published for the others, and its Enforced condition names the pods that
// do not enforce it, until they are gone; a count policy on the same pods
// is enforced by all of them. Before, Enforced said all selected pods
// enforced the cost policy.
func TestCostPolicySkippedBySidecarsOfMinor1(t *testing.T) {
	ns := newNamespace(t)
	tokens := newPolicy(ns, "tokens", func(s *v1alpha1.RateLimitPolicySpec) {
		s.Limit = 100_000
		s.Cost = &v1alpha1.Cost{Response: &v1alpha1.ResponseCost{JSONFields: []v1alpha1.JSONFieldPath{"usage.total_tokens"}, Default: new(int64(0))}}
	})
	count := newPolicy(ns, "count")
	old := newPod(ns, "old", map[string]string{"app": "checkout"}, true)
	asMinor(t, old, 1)
	create(t, tokens, count, newPod(ns, "new", map[string]string{"app": "checkout"}, true), old)

	eventually(t, "tokens not enforced by the minor 1 sidecar", enforcedIs(t, tokens, metav1.ConditionFalse, v1alpha1.ReasonSidecarsOutdated,
		"pods old run sidecars of an earlier slidegate, which leave this policy out (it needs sidecar configuration slidegate.dev/sidecar-config/v1.2)"))
	eventually(t, "count enforced by both", enforcedIs(t, count, metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 2 selected pods"))
	_, cfg, err := readConfig(ns)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Version != sidecarconfig.Version || !slices.Equal(policyNames(cfg), []string{"count", "tokens"}) {
		t.Errorf("document %s with %v, want %s with both policies (the new sidecar enforces tokens)", cfg.Version, policyNames(cfg), sidecarconfig.Version)
	}

	if err := k.Delete(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	eventually(t, "tokens enforced once the old pod is gone", enforcedIs(t, tokens, metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 1 selected pods"))
}

// TestSeveralWindowsSkippedBySidecarsOfMinor2: a policy with
// additionalLimits is published in minor 3 for the sidecars that know it,
// and its Enforced condition names the pods whose sidecars (minor 2, the
// release before it) leave it out rather than enforce its first window
// alone.
func TestSeveralWindowsSkippedBySidecarsOfMinor2(t *testing.T) {
	ns := newNamespace(t)
	multi := newPolicy(ns, "multi", func(s *v1alpha1.RateLimitPolicySpec) {
		s.AdditionalLimits = []v1alpha1.AdditionalLimit{{Window: "24h", Limit: 10_000}, {Window: "1h", Limit: 1000}}
	})
	old := newPod(ns, "old", map[string]string{"app": "checkout"}, true)
	asMinor(t, old, 2)
	create(t, multi, newPod(ns, "new", map[string]string{"app": "checkout"}, true), old)

	eventually(t, "multi not enforced by the minor 2 sidecar", enforcedIs(t, multi, metav1.ConditionFalse, v1alpha1.ReasonSidecarsOutdated,
		"pods old run sidecars of an earlier slidegate, which leave this policy out (it needs sidecar configuration slidegate.dev/sidecar-config/v1.3)"))
	_, cfg, err := readConfig(ns)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Version != sidecarconfig.Version || len(cfg.Policies) != 1 ||
		fmt.Sprint(cfg.Policies[0].AdditionalLimits) != "[{3600000 1000} {86400000 10000}]" {
		t.Errorf("document %s with %+v, want %s with the windows sorted", cfg.Version, cfg.Policies, sidecarconfig.Version)
	}
	if err := k.Delete(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	eventually(t, "multi enforced once the old pod is gone", enforcedIs(t, multi, metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 1 selected pods"))
}

// TestSkippingSidecars: which pods leave a policy of a given minor out.
func TestSkippingSidecars(t *testing.T) {
	p := newPolicy("shop", "p")
	pod := func(name string, minor int, lbls map[string]string) corev1.Pod {
		po := newPod("shop", name, lbls, minor >= 0)
		if minor >= 0 && minor != sidecarconfig.Minor {
			asMinor(t, po, minor)
		}
		return *po
	}
	sel := map[string]string{"app": "checkout"}
	pods := []corev1.Pod{
		pod("first-release", 0, sel), pod("minor-1", 1, sel), pod("current", sidecarconfig.Minor, sel),
		pod("minor-1-elsewhere", 1, map[string]string{"app": "other"}), pod("no-sidecar", -1, sel),
	}
	for _, tc := range []struct {
		minor int
		want  []string
	}{
		{0, nil}, {1, nil}, {2, []string{"minor-1"}},
		{sidecarconfig.Minor + 1, []string{"current", "minor-1"}},
	} {
		if got := policystatus.SkippingSidecars(p, pods, tc.minor); !slices.Equal(got, tc.want) {
			t.Errorf("SkippingSidecars(minor %d) = %v, want %v", tc.minor, got, tc.want)
		}
	}
	if policystatus.Skipped(2, nil, "shop") != nil {
		t.Error("a problem without pods")
	}
}

// TestQuotasSkippedBySidecarsOfMinor3: a policy with quotas is published
// in minor 4, Day before Month, and its Enforced condition names the pods
// whose sidecars (minor 3, the release before quotas) leave it out rather
// than enforce it without them.
func TestQuotasSkippedBySidecarsOfMinor3(t *testing.T) {
	ns := newNamespace(t)
	quota := newPolicy(ns, "quota", func(s *v1alpha1.RateLimitPolicySpec) {
		s.Quotas = []v1alpha1.Quota{{Period: v1alpha1.QuotaPeriodMonth, Limit: 5_000_000_000, TimeZone: "Asia/Tokyo"}, {Period: v1alpha1.QuotaPeriodDay, Limit: 200_000}}
	})
	old := newPod(ns, "old", map[string]string{"app": "checkout"}, true)
	asMinor(t, old, 3)
	create(t, quota, newPod(ns, "new", map[string]string{"app": "checkout"}, true), old)

	eventually(t, "quota not enforced by the minor 3 sidecar", enforcedIs(t, quota, metav1.ConditionFalse, v1alpha1.ReasonSidecarsOutdated,
		"pods old run sidecars of an earlier slidegate, which leave this policy out (it needs sidecar configuration slidegate.dev/sidecar-config/v1.4)"))
	_, cfg, err := readConfig(ns)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Version != sidecarconfig.Version || len(cfg.Policies) != 1 ||
		fmt.Sprint(cfg.Policies[0].Quotas) != "[{Day 200000 } {Month 5000000000 Asia/Tokyo}]" {
		t.Errorf("document %s with %+v, want %s with the quotas Day first", cfg.Version, cfg.Policies, sidecarconfig.Version)
	}
	if err := k.Delete(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	eventually(t, "quota enforced once the old pod is gone", enforcedIs(t, quota, metav1.ConditionTrue, v1alpha1.ReasonEnforced, "all 1 selected pods"))
}

// TestQuotaUnknownTimeZoneNotAccepted: a time zone the API server's
// pattern lets through but no database knows keeps the policy from being
// accepted, with the reason; the namespace's other policies stay
// published.
func TestQuotaUnknownTimeZoneNotAccepted(t *testing.T) {
	ns := newNamespace(t)
	bad := newPolicy(ns, "bad", func(s *v1alpha1.RateLimitPolicySpec) {
		s.Quotas = []v1alpha1.Quota{{Period: v1alpha1.QuotaPeriodDay, Limit: 5, TimeZone: "Mars/Olympus_Mons"}}
	})
	good := newPolicy(ns, "good")
	create(t, bad, good)
	eventually(t, "bad not accepted", acceptedIs(bad, metav1.ConditionFalse, v1alpha1.ReasonInvalid, `quotas[0]: time zone "Mars/Olympus_Mons"`, true))
	eventually(t, "good published alone", func() error {
		_, cfg, err := readConfig(ns)
		if err != nil {
			return err
		}
		if names := policyNames(cfg); !slices.Equal(names, []string{"good"}) {
			return fmt.Errorf("published %v, want good alone", names)
		}
		return nil
	})
}
