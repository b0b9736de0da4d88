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

package manifests_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	chartcommon "helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	chartv2 "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// The Helm chart (charts/slidegate) is a second way to install what
// config/ installs. It renders the same objects: with its default values
// config/default's, and with each option the objects of the kustomize
// overlay that option stands for, compared object by object (Helm's own
// engine renders the chart, as `helm template` does).

// chartNamespace is the namespace the chart is rendered into: config/'s.
const chartNamespace = "slidegate-system"

// loadChart loads charts/slidegate as Helm does.
func loadChart(t *testing.T) *chartv2.Chart {
	t.Helper()
	root, err := testsupport.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ch, err := loader.LoadDir(filepath.Join(root, "charts", "slidegate"))
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	return ch
}

// renderChart renders the chart into chartNamespace with values (YAML over
// values.yaml), validated against values.schema.json as `helm install`
// validates them.
func renderChart(ch *chartv2.Chart, values string) ([][]byte, error) {
	return renderChartIn(ch, chartNamespace, values)
}

func renderChartIn(ch *chartv2.Chart, namespace, values string) ([][]byte, error) {
	vals, err := chartcommon.ReadValues([]byte(values))
	if err != nil {
		return nil, err
	}
	top, err := chartutil.ToRenderValues(ch, vals, chartcommon.ReleaseOptions{Name: "slidegate", Namespace: namespace, IsInstall: true, Revision: 1}, nil)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, top)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		if strings.HasSuffix(name, ".yaml") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var docs [][]byte
	for _, name := range names {
		for _, doc := range bytes.Split([]byte(files[name]), []byte("\n---")) {
			if len(bytes.TrimSpace(removeComments(doc))) > 0 {
				docs = append(docs, doc)
			}
		}
	}
	return docs, nil
}

func removeComments(doc []byte) []byte {
	var out [][]byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

// clusterScoped are the kinds without a namespace among the install's:
// kustomize's namespace transformer sets one on those it does not know
// (the admission policies), which the API server ignores.
var clusterScoped = map[string]bool{
	"Namespace": true, "CustomResourceDefinition": true, "ClusterRole": true, "ClusterRoleBinding": true,
	"MutatingWebhookConfiguration": true, "ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
}

// generatedName is the ConfigMap kustomize generates with a hash of its
// contents in its name, to roll out the pods that read it; the chart names
// it plainly and puts the hash in their annotation checksum/redis-connection.
var generatedName = regexp.MustCompile(`\bslidegate-redis-connection-[a-z0-9]{10}\b`)

// objects decodes docs into objects by "Kind namespace/name", normalized
// for what differs between the two renderers without changing what the API
// server makes of them: the order of lists whose items are named (env,
// volumes, ports, containers: merged by name), a cluster-scoped object's
// namespace, the generated ConfigMap's name, the managed-by label's value
// and the chart's own annotations (checksum/*, Helm's resource policy).
func objects(t *testing.T, docs [][]byte) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, doc := range docs {
		var obj map[string]any
		if err := yaml.Unmarshal(generatedName.ReplaceAll(doc, []byte("slidegate-redis-connection")), &obj); err != nil {
			t.Fatalf("%v in:\n%s", err, doc)
		}
		u := unstructured.Unstructured{Object: obj}
		if clusterScoped[u.GetKind()] {
			u.SetNamespace("")
		}
		if l := u.GetLabels(); l["app.kubernetes.io/managed-by"] != "" {
			l["app.kubernetes.io/managed-by"] = "(the renderer)"
			u.SetLabels(l)
		}
		dropAnnotations(obj, "metadata")
		dropAnnotations(obj, "spec", "template", "metadata")
		sortNamed(obj)
		key := fmt.Sprintf("%s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
		if _, dup := out[key]; dup {
			t.Fatalf("%s rendered twice", key)
		}
		out[key] = obj
	}
	return out
}

func dropAnnotations(obj map[string]any, path ...string) {
	a, ok, _ := unstructured.NestedStringMap(obj, append(path, "annotations")...)
	if !ok {
		return
	}
	for k := range a {
		if strings.HasPrefix(k, "checksum/") || k == "helm.sh/resource-policy" {
			delete(a, k)
		}
	}
	if len(a) == 0 {
		unstructured.RemoveNestedField(obj, append(path, "annotations")...)
		return
	}
	_ = unstructured.SetNestedStringMap(obj, a, append(path, "annotations")...)
}

func sortNamed(v any) {
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			sortNamed(e)
		}
	case []any:
		for _, e := range v {
			sortNamed(e)
		}
		name := func(e any) (string, bool) {
			m, ok := e.(map[string]any)
			if !ok {
				return "", false
			}
			s, ok := m["name"].(string)
			return s, ok
		}
		for _, e := range v {
			if _, ok := name(e); !ok {
				return
			}
		}
		slices.SortStableFunc(v, func(a, b any) int {
			x, _ := name(a)
			y, _ := name(b)
			return strings.Compare(x, y)
		})
	}
}

// TestChartRendersTheInstall: for each option, the chart renders exactly
// the objects of the kustomize overlay it stands for.
func TestChartRendersTheInstall(t *testing.T) {
	ch := loadChart(t)
	for _, tc := range []struct {
		name, overlay, values string
		// withoutNamespace: the overlay's Namespace object is not the
		// chart's to create (createNamespace is off by default).
		withoutNamespace bool
	}{
		{name: "defaults", overlay: "default", withoutNamespace: true},
		{name: "createNamespace", overlay: "default", values: "createNamespace: true"},
		{name: "rls", overlay: "rls", values: "rls: {enabled: true}", withoutNamespace: true},
		{name: "rls mTLS", overlay: "rls-mtls", values: "rls: {enabled: true, mtls: true}", withoutNamespace: true},
		{name: "istio gateways", overlay: "istio-gateways", values: "rls: {enabled: true}\nistioGateways: {enabled: true}", withoutNamespace: true},
		{name: "envoy gateways", overlay: "envoy-gateways", values: "rls: {enabled: true}\nenvoyGateways: {enabled: true}", withoutNamespace: true},
		{name: "monitoring", overlay: "monitoring", values: "monitoring: {enabled: true}", withoutNamespace: true},
		{name: "cert-manager", overlay: "cert-manager", values: "webhook: {certificates: cert-manager}", withoutNamespace: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := objects(t, render(t, tc.overlay).docs)
			if tc.withoutNamespace {
				delete(want, "Namespace /"+chartNamespace)
			}
			docs, err := renderChart(ch, tc.values)
			if err != nil {
				t.Fatalf("rendering the chart with %q: %v", tc.values, err)
			}
			got := objects(t, docs)
			for key, w := range want {
				g, ok := got[key]
				if !ok {
					t.Errorf("the chart does not render %s (config/%s does)", key, tc.overlay)
					continue
				}
				if d := cmp.Diff(w, g); d != "" {
					t.Errorf("%s differs from config/%s's (-kustomize +chart):\n%s", key, tc.overlay, d)
				}
			}
			for key := range got {
				if _, ok := want[key]; !ok {
					t.Errorf("the chart renders %s, which config/%s does not", key, tc.overlay)
				}
			}
		})
	}
}

// TestChartValues: the values a user sets reach every object that needs
// them, and the schema refuses, with a message, what would otherwise be
// ignored without a word (a misspelt key) or refused only by a running
// manager.
func TestChartValues(t *testing.T) {
	ch := loadChart(t)

	t.Run("version", func(t *testing.T) {
		root, err := testsupport.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		v, err := os.ReadFile(filepath.Join(root, "VERSION"))
		if err != nil {
			t.Fatal(err)
		}
		version := strings.TrimSpace(string(v))
		if ch.Metadata.AppVersion != version || ch.Metadata.Version != strings.TrimPrefix(version, "v") {
			t.Errorf("Chart.yaml: version %s, appVersion %s; want %s and %s (VERSION)",
				ch.Metadata.Version, ch.Metadata.AppVersion, strings.TrimPrefix(version, "v"), version)
		}
	})

	t.Run("image pinned everywhere", func(t *testing.T) {
		const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
		docs, err := renderChart(ch, "rls: {enabled: true}\nimage: {repository: registry.example/slidegate, tag: v9.9.9, digest: "+digest+"}")
		if err != nil {
			t.Fatal(err)
		}
		want := "registry.example/slidegate:v9.9.9@" + digest
		objs := objects(t, docs)
		for _, key := range []string{"Deployment slidegate-system/slidegate-controller-manager", "Deployment slidegate-system/slidegate-rls"} {
			cs, _, _ := unstructured.NestedSlice(objs[key], "spec", "template", "spec", "containers")
			if len(cs) != 1 {
				t.Fatalf("%s: %d containers", key, len(cs))
			}
			c := cs[0].(map[string]any)
			if c["image"] != want {
				t.Errorf("%s: image %v, want %s", key, c["image"], want)
			}
			for _, e := range c["env"].([]any) {
				if e := e.(map[string]any); e["name"] == "SLIDEGATE_SIDECAR_IMAGE" && e["value"] != want {
					t.Errorf("%s: the injected sidecar's image %v, want %s", key, e["value"], want)
				}
			}
		}
	})

	// make dist's chart (hack/package-chart.sh) is a package Helm loads,
	// whose values pin the release's image with nothing set.
	t.Run("release package", func(t *testing.T) {
		root, err := testsupport.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		const ref = "registry.example:5000/sg/slidegate:v9.9.9@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
		out, err := exec.Command(filepath.Join(root, "hack", "package-chart.sh"), ref, t.TempDir()).Output()
		if err != nil {
			t.Fatalf("hack/package-chart.sh: %v", err)
		}
		pkg, err := loader.LoadFile(strings.TrimSpace(string(out)))
		if err != nil {
			t.Fatalf("loading %s: %v", out, err)
		}
		docs, err := renderChart(pkg, "")
		if err != nil {
			t.Fatal(err)
		}
		cs, _, _ := unstructured.NestedSlice(objectOf(t, docs, "Deployment", "slidegate-controller-manager").Object, "spec", "template", "spec", "containers")
		if got := cs[0].(map[string]any)["image"]; got != ref {
			t.Errorf("the packaged chart's manager runs %v, want %s", got, ref)
		}
	})

	t.Run("redis connection", func(t *testing.T) {
		base, err := renderChart(ch, "rls: {enabled: true}")
		if err != nil {
			t.Fatal(err)
		}
		docs, err := renderChart(ch, `rls: {enabled: true}
redis: {mode: sentinel, addrs: "s-0.redis:26379,s-1.redis:26379", masterName: mymaster, tls: true, tlsServerName: redis.internal}`)
		if err != nil {
			t.Fatal(err)
		}
		var cm corev1.ConfigMap
		rendered{docs: docs}.get(t, "ConfigMap", "slidegate-redis-connection", &cm)
		want := map[string]string{
			"SLIDEGATE_REDIS_MODE": "sentinel", "SLIDEGATE_REDIS_ADDRS": "s-0.redis:26379,s-1.redis:26379",
			"SLIDEGATE_REDIS_MASTER_NAME": "mymaster", "SLIDEGATE_REDIS_TLS": "true", "SLIDEGATE_REDIS_TLS_SERVER_NAME": "redis.internal",
		}
		if d := cmp.Diff(want, cm.Data); d != "" {
			t.Errorf("ConfigMap slidegate-redis-connection (-want +got):\n%s", d)
		}
		// Every key is a flag's environment variable in both commands
		// that read it (a misspelt key would be ignored without a word).
		for name, env := range flagEnv() {
			for key := range cm.Data {
				if !env[key] {
					t.Errorf("ConfigMap key %s is no flag's environment variable in the %s", key, name)
				}
			}
		}
		// A new address rolls the manager and the RLS out, as kustomize's
		// new ConfigMap name does.
		for _, d := range []string{"slidegate-controller-manager", "slidegate-rls"} {
			path := []string{"spec", "template", "metadata", "annotations", "checksum/redis-connection"}
			before, _, _ := unstructured.NestedString(objectOf(t, base, "Deployment", d).Object, path...)
			a, _, _ := unstructured.NestedString(objectOf(t, docs, "Deployment", d).Object, path...)
			if a == "" || a == before {
				t.Errorf("Deployment %s: pod annotation checksum/redis-connection %q did not change with the Redis connection", d, a)
			}
		}
	})

	t.Run("shared identity", func(t *testing.T) {
		docs, err := renderChart(ch, "manager: {redisIdentity: shared, redisAdmin: false, trustedProxies: [10.0.0.0/8, 192.168.0.0/16]}")
		if err != nil {
			t.Fatal(err)
		}
		args := managerArgs(t, docs)
		for _, want := range []string{"--redis-identity=shared", "--redis-secret-name=slidegate-redis", "--trusted-proxies=10.0.0.0/8,192.168.0.0/16"} {
			if !slices.Contains(args, want) {
				t.Errorf("manager args %q: no %s", args, want)
			}
		}
		if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--redis-admin-credentials-dir") }) {
			t.Errorf("manager args %q: redisAdmin false, yet the administrative identity is mounted", args)
		}
	})

	t.Run("memory budget", func(t *testing.T) {
		docs, err := renderChart(ch, "manager: {redisMemoryBudget: 256Mi}")
		if err != nil {
			t.Fatal(err)
		}
		args := managerArgs(t, docs)
		if !slices.Contains(args, "--redis-namespace-memory-budget=256Mi") {
			t.Errorf("manager args %q: no --redis-namespace-memory-budget=256Mi", args)
		}
	})

	for _, tc := range []struct{ values, says string }{
		{"manager: {redisMemoryBudget: lots}", "redisMemoryBudget"},
		{"rls: {enable: true}", "enable"},
		{"redis: {mode: standlone}", "mode"},
		{"webhook: {certificates: selfsigned}", "certificates"},
		{"image: {tag: latest}", "tag"},
		{"image: {digest: abc123}", "digest"},
		{"manager: {redisIdentity: per-namespace}", "redisIdentity"},
		{"manager: {replicas: 0}", "replicas"},
		{"manager: {trustedProxies: 10.0.0.0/8}", "trustedProxies"},
		{"redis: {addrs: [a:1]}", "addrs"},
		{"rls: {replicas: \"2\"}", "replicas"},
	} {
		t.Run("refuses "+tc.values, func(t *testing.T) {
			_, err := renderChart(ch, tc.values)
			if err == nil {
				t.Fatalf("values %q rendered; want values.schema.json to refuse them", tc.values)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("values %q refused with %q, which does not name %s", tc.values, err, tc.says)
			}
		})
	}
}

// managerArgs are the manager container's arguments in rendered docs.
func managerArgs(t *testing.T, docs [][]byte) []string {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(objectOf(t, docs, "Deployment", "slidegate-controller-manager").Object, "spec", "template", "spec", "containers")
	var args []string
	for _, a := range cs[0].(map[string]any)["args"].([]any) {
		args = append(args, a.(string))
	}
	return args
}

// TestChartAccepted: the API server accepts what the chart renders, with
// every option it can check here (not the Prometheus Operator's or
// cert-manager's kinds, whose CRDs envtest has not), as a server-side
// dry run.
func TestChartAccepted(t *testing.T) {
	ch := loadChart(t)
	// A namespace of its own: the other tests here create slidegate-system.
	docs, err := renderChartIn(ch, "slidegate-chart", "createNamespace: true\nrls: {enabled: true, mtls: true}\nredis: {mode: cluster, addrs: \"r-0:6379,r-1:6379\"}")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Namespace and CRD first, created for real: what follows needs them.
	for _, kind := range []string{"Namespace", "CustomResourceDefinition", ""} {
		for _, doc := range docs {
			var u unstructured.Unstructured
			if err := yaml.Unmarshal(doc, &u.Object); err != nil {
				t.Fatal(err)
			}
			first := u.GetKind() == "Namespace" || u.GetKind() == "CustomResourceDefinition"
			if (kind == "" && first) || (kind != "" && u.GetKind() != kind) {
				continue
			}
			var opts []client.CreateOption
			if kind == "" {
				opts = append(opts, client.DryRunAll)
			}
			if err := admin.Create(ctx, &u, opts...); err != nil && (!first || !apierrors.IsAlreadyExists(err)) {
				t.Errorf("%s %s: %v", u.GetKind(), u.GetName(), err)
			}
		}
	}
}

// objectOf is the one object of kind and name in docs.
func objectOf(t *testing.T, docs [][]byte, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, doc := range docs {
		var u unstructured.Unstructured
		if err := yaml.Unmarshal(doc, &u.Object); err != nil {
			t.Fatal(err)
		}
		if u.GetKind() == kind && u.GetName() == name {
			return &u
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}
