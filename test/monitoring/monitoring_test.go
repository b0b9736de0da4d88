/*
Copyright 2026 The slidegate Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

// Package monitoring_test checks the monitoring component
// (config/components/monitoring): the PrometheusRule passes `promtool check
// rules` and its unit tests (testdata/alerts_test.yaml), every alert has a
// runbook in docs/operations.md, the Grafana dashboard is well formed and
// its queries parse, and every metric the rules, their tests and the
// dashboard name is one the code registers.
//
// PromQL is parsed by promtool (hack/tools.sh promtool), not by importing
// github.com/prometheus/prometheus: that module would pull its whole
// dependency graph into go.mod and go.sum for a test.
package monitoring_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	// Registering their metrics in controller-runtime's registry: the
	// controller's own, and (through the webhook server) controller-runtime's
	// webhook metrics.
	_ "github.com/slidegate/slidegate/controllers"
	_ "github.com/slidegate/slidegate/internal/webhook"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/sidecar"
	"github.com/slidegate/slidegate/internal/testsupport"
)

const (
	component     = "config/components/monitoring"
	ruleFile      = component + "/prometheusrule.yaml"
	dashboardFile = component + "/dashboards/slidegate.json"
	alertTests    = "test/monitoring/testdata/alerts_test.yaml"
	runbooks      = "docs/operations.md"
	// extractedRules is the name alertTests' rule_files expects.
	extractedRules = "slidegate-rules.yaml"
)

func root(t *testing.T) string {
	t.Helper()
	dir, err := testsupport.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func read(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// promtool finds promtool: $PROMTOOL, else bin/promtool (hack/tools.sh
// promtool). Missing: a skip, or a failure under CI=true.
func promtool(t *testing.T) string {
	t.Helper()
	p := os.Getenv("PROMTOOL")
	if p == "" {
		p = filepath.Join(root(t), "bin", "promtool")
	}
	if _, err := exec.LookPath(p); err != nil {
		testsupport.Missing(t, "promtool (hack/tools.sh promtool)", err)
	}
	return p
}

func runPromtool(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(context.Background(), promtool(t), args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// --- The PrometheusRule ---------------------------------------------------

type rule struct {
	Alert       string            `json:"alert"`
	Record      string            `json:"record"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type ruleGroups struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

// prometheusRule reads the PrometheusRule; spec is its .spec as promtool
// reads a rules file.
func prometheusRule(t *testing.T) (spec []byte, groups ruleGroups) {
	t.Helper()
	var obj struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       map[string]any `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(read(t, ruleFile), &obj); err != nil {
		t.Fatalf("%s: %v", ruleFile, err)
	}
	if obj.APIVersion != "monitoring.coreos.com/v1" || obj.Kind != "PrometheusRule" {
		t.Fatalf("%s is a %s %s, not a monitoring.coreos.com/v1 PrometheusRule", ruleFile, obj.APIVersion, obj.Kind)
	}
	spec, err := yaml.Marshal(obj.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(spec, &groups); err != nil {
		t.Fatalf("%s spec: %v", ruleFile, err)
	}
	return spec, groups
}

func alerts(groups ruleGroups) []rule {
	var out []rule
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r)
			}
		}
	}
	return out
}

// TestAlertRules runs `promtool check rules` on the PrometheusRule's spec
// and `promtool test rules` on testdata/alerts_test.yaml against it.
func TestAlertRules(t *testing.T) {
	spec, _ := prometheusRule(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, extractedRules), spec, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), read(t, alertTests), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Log(runPromtool(t, "check", "rules", filepath.Join(dir, extractedRules)))
	t.Log(runPromtool(t, "test", "rules", filepath.Join(dir, "alerts_test.yaml")))
}

type alertTestFile struct {
	Tests []struct {
		Name        string `json:"name"`
		InputSeries []struct {
			Series string `json:"series"`
		} `json:"input_series"`
		AlertRuleTest []struct {
			Alertname string            `json:"alertname"`
			ExpAlerts []json.RawMessage `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestEveryAlertIsTestedAndHasARunbook: each alert has a severity, a
// summary and a description, a runbook_url whose anchor is a heading of
// docs/operations.md, and at least one unit test where it fires and one
// where it must not.
func TestEveryAlertIsTestedAndHasARunbook(t *testing.T) {
	_, groups := prometheusRule(t)
	var tests alertTestFile
	if err := yaml.Unmarshal(read(t, alertTests), &tests); err != nil {
		t.Fatalf("%s: %v", alertTests, err)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	anchors := headingAnchors(string(read(t, runbooks)))
	const base = "https://github.com/slidegate/slidegate/blob/main/" + runbooks + "#"
	all := alerts(groups)
	if len(all) == 0 {
		t.Fatalf("%s has no alerts", ruleFile)
	}
	for _, a := range all {
		if !fires[a.Alert] || !silent[a.Alert] {
			t.Errorf("%s: needs a test case in %s where it fires (%t) and one where it must not (%t)", a.Alert, alertTests, fires[a.Alert], silent[a.Alert])
		}
		if !slices.Contains([]string{"critical", "warning", "info"}, a.Labels["severity"]) {
			t.Errorf("%s: severity %q is not critical, warning or info", a.Alert, a.Labels["severity"])
		}
		if a.Annotations["summary"] == "" || a.Annotations["description"] == "" {
			t.Errorf("%s: needs a summary and a description", a.Alert)
		}
		url := a.Annotations["runbook_url"]
		anchor, ok := strings.CutPrefix(url, base)
		if !ok || !anchors[anchor] {
			t.Errorf("%s: runbook_url %q is not %s<an anchor of a heading of %s>", a.Alert, url, base, runbooks)
		}
		if anchor != strings.ToLower(a.Alert) {
			t.Errorf("%s: runbook anchor %q; want a heading named after the alert (#%s)", a.Alert, anchor, strings.ToLower(a.Alert))
		}
	}
}

// headingAnchors are the anchors GitHub gives the Markdown headings of doc:
// lower case, punctuation but - and _ dropped, spaces as -.
func headingAnchors(doc string) map[string]bool {
	drop := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	out := map[string]bool{}
	inFence := false
	for line := range strings.Lines(doc) {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		out[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")] = true
	}
	return out
}

// --- The dashboard --------------------------------------------------------

type target struct {
	RefID string `json:"refId"`
	Expr  string `json:"expr"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []target `json:"targets"`
	Panels  []panel  `json:"panels"` // of a collapsed row
}

type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// panelExpr is one query of the dashboard, named for messages.
type panelExpr struct{ where, expr string }

// loadDashboard parses the dashboard and checks its shape; it returns every
// PromQL query in it (panel targets, and the selectors of the variables'
// label_values queries).
func loadDashboard(t *testing.T, raw []byte) (dashboard, []panelExpr) {
	t.Helper()
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardFile, err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion == 0 {
		t.Errorf("dashboard needs a uid, a title and a schemaVersion: %q %q %d", d.UID, d.Title, d.SchemaVersion)
	}
	vars := map[string]bool{}
	var exprs []panelExpr
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Errorf("variable %s: query: %v", v.Name, err)
			continue
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(<selector>, <label>)", v.Name, q.Query)
			continue
		}
		exprs = append(exprs, panelExpr{"variable " + v.Name, m[1]})
	}
	if !vars["datasource"] {
		t.Errorf("dashboard has no datasource variable: panels must not name a data source of one Grafana")
	}
	ids := map[int]bool{}
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
			if p.ID == 0 || ids[p.ID] {
				t.Errorf("%s: id missing or not unique", where)
			}
			ids[p.ID] = true
			if p.Title == "" || p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 {
				t.Errorf("%s: needs a title and a gridPos", where)
			}
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
				t.Errorf("%s: datasource %+v; want prometheus ${datasource}", where, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: no query", where)
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if tg.RefID == "" || refs[tg.RefID] || strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("%s: target %q: refId missing or repeated, or no expr", where, tg.RefID)
				}
				refs[tg.RefID] = true
				exprs = append(exprs, panelExpr{where + " " + tg.RefID, tg.Expr})
			}
		}
	}
	walk(d.Panels)
	// Every $variable a query uses exists (Grafana's own are $__...).
	varRef := regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)`)
	for _, e := range exprs {
		for _, m := range varRef.FindAllStringSubmatch(e.expr, -1) {
			if !strings.HasPrefix(m[1], "__") && !vars[m[1]] {
				t.Errorf("%s: variable $%s is not defined", e.where, m[1])
			}
		}
	}
	return d, exprs
}

// grafanaVars stands in for Grafana's variables so promtool can parse a
// query: intervals become durations, dashboard variables (used in regex
// matchers) ".*".
var grafanaVars = regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)\}?`)

func substitute(expr string) string {
	return grafanaVars.ReplaceAllStringFunc(expr, func(v string) string {
		switch strings.Trim(v, "${}") {
		case "__rate_interval", "__interval", "__range":
			return "5m"
		default:
			return ".*"
		}
	})
}

// TestDashboard checks the dashboard's shape and parses each of its queries
// with promtool (as recording rules of a throwaway rules file).
func TestDashboard(t *testing.T) {
	_, exprs := loadDashboard(t, read(t, dashboardFile))
	if len(exprs) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	type rec struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rec
	for i, e := range exprs {
		rules = append(rules, rec{Record: fmt.Sprintf("dashboard:query_%d", i), Expr: substitute(e.expr)})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(context.Background(), promtool(t), "check", "rules", file)
	if out, err := cmd.CombinedOutput(); err != nil {
		// Name the panel of each query promtool refused.
		for i, e := range exprs {
			if strings.Contains(string(out), fmt.Sprintf("%q", rules[i].Record)) {
				t.Errorf("%s: %s", e.where, e.expr)
			}
		}
		t.Fatalf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}
	t.Logf("%d dashboard queries parse", len(exprs))
}

// --- Metric names -------------------------------------------------------------

// metricPrefixes are the metrics the component's queries take from
// slidegate's code (the sidecar, the manager with controller-runtime) and
// from the kube-apiserver. Other names (up) are Prometheus's own.
var metricPrefixes = []string{"slidegate_", "controller_runtime_", "apiserver_"}

var (
	quoted     = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	identifier = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
)

// metricNames are the names with metricPrefixes a query uses (string
// literals, where label values live, left out).
func metricNames(expr string) []string {
	var out []string
	for _, id := range identifier.FindAllString(quoted.ReplaceAllString(expr, `""`), -1) {
		for _, p := range metricPrefixes {
			if strings.HasPrefix(id, p) {
				out = append(out, id)
			}
		}
	}
	return out
}

// probe is a collector of one descriptor, to ask a registry whether a
// metric of that name is registered: a registry refuses a second
// descriptor with a registered name and another help text.
type probe struct{ desc *prometheus.Desc }

func (p probe) Describe(ch chan<- *prometheus.Desc) { ch <- p.desc }
func (p probe) Collect(chan<- prometheus.Metric)    {}

func registeredIn(reg prometheus.Registerer, name string) bool {
	p := probe{prometheus.NewDesc(name, "probe: is this name registered?", nil, nil)}
	err := reg.Register(p)
	if err == nil {
		reg.Unregister(p)
		return false
	}
	return strings.Contains(err.Error(), "same fully-qualified name")
}

type nopLimiter struct{}

func (nopLimiter) Decide(context.Context, []limiter.Request) []limiter.Decision { return nil }
func (nopLimiter) Healthy() bool                                                { return true }

// registries are where the code registers the metrics of metricPrefixes:
// a real sidecar's registry, controller-runtime's (the manager's /metrics,
// with the controllers' and the webhook server's metrics), and the
// kube-apiserver's admission metrics, read from the k8s.io/apiserver source
// of the version this module builds against.
func registries(t *testing.T) func(name string) bool {
	t.Helper()
	opts := sidecar.DefaultOptions()
	opts.ConfigFile = filepath.Join(t.TempDir(), "none.json")
	sc, err := sidecar.New(opts, nopLimiter{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	apiserver := apiserverAdmissionMetrics(t)
	return func(name string) bool {
		return registeredIn(sc.Registry(), name) || registeredIn(ctrlmetrics.Registry, name) || apiserver[name]
	}
}

// apiserverAdmissionMetrics reads the names of the kube-apiserver's
// admission metrics (apiserver_admission_*) from k8s.io/apiserver.
func apiserverAdmissionMetrics(t *testing.T) map[string]bool {
	t.Helper()
	// The version go.mod requires; downloaded if this build did not need it.
	out, err := exec.CommandContext(context.Background(), "go", "mod", "download", "-json", "k8s.io/apiserver").Output()
	if err != nil {
		t.Fatalf("go mod download k8s.io/apiserver: %v", err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download k8s.io/apiserver: no directory in %s (%v)", out, err)
	}
	file := filepath.Join(mod.Dir, "pkg", "admission", "metrics", "metrics.go")
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("the kube-apiserver's admission metrics: %v", err)
	}
	if !bytes.Contains(src, []byte(`namespace = "apiserver"`)) || !bytes.Contains(src, []byte(`subsystem = "admission"`)) {
		t.Fatalf("%s no longer names its metrics apiserver_admission_*", file)
	}
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`Name:\s+"([a-z_]+)"`).FindAllSubmatch(src, -1) {
		names["apiserver_admission_"+string(m[1])] = true
	}
	return names
}

// exists reports whether name is registered, as itself or as a series of a
// registered histogram or summary (the type is not checked: a _bucket of a
// gauge passes here, and stays empty in Prometheus).
func exists(registered func(string) bool, name string) bool {
	if registered(name) {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && registered(base) {
			return true
		}
	}
	return false
}

// TestMetricNamesExist: every slidegate, controller-runtime and API server
// metric that the alerts, their unit tests and the dashboard use is one the
// code registers. A misspelt name would make an alert that never fires and
// a panel that stays empty.
func TestMetricNamesExist(t *testing.T) {
	registered := registries(t)
	// The check itself: a registered name is found, a misspelt one is not.
	if !exists(registered, "slidegate_sidecar_decision_duration_seconds_bucket") || !exists(registered, "slidegate_policies_not_enforced") ||
		!exists(registered, "controller_runtime_webhook_requests_total") || !exists(registered, "apiserver_admission_webhook_rejection_count") {
		t.Fatal("registered metrics are not found: the check is broken")
	}
	if exists(registered, "slidegate_sidecar_request_total") || exists(registered, "slidegate_policies_enforced") {
		t.Fatal("unregistered metrics are found: the check is broken")
	}

	var uses []panelExpr
	_, groups := prometheusRule(t)
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			uses = append(uses, panelExpr{ruleFile + " " + r.Alert + r.Record, r.Expr})
		}
	}
	var tests alertTestFile
	if err := yaml.Unmarshal(read(t, alertTests), &tests); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests.Tests {
		for _, s := range tc.InputSeries {
			uses = append(uses, panelExpr{alertTests + " " + tc.Name, s.Series})
		}
	}
	_, dash := loadDashboard(t, read(t, dashboardFile))
	for _, e := range dash {
		uses = append(uses, panelExpr{dashboardFile + " " + e.where, e.expr})
	}
	seen := map[string]bool{}
	for _, u := range uses {
		for _, name := range metricNames(u.expr) {
			seen[name] = true
			if !exists(registered, name) {
				t.Errorf("%s: metric %s is not registered by the code", u.where, name)
			}
		}
	}
	if len(seen) == 0 {
		t.Fatal("no metric names found in the rules and the dashboard")
	}
	t.Logf("%d metric names checked", len(seen))
}
