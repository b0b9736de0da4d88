package kubectlplugin

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestConvert: `kubectl slidegate convert` writes a policy for each rate
// limit of an envoyproxy/ratelimit file that maps, in the namespace of -n,
// and the API server (the real CRD's validation) accepts every one as it
// is written; from stdin too. Without -f it is a usage error.
func TestConvert(t *testing.T) {
	root, err := testsupport.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "internal", "rlsconvert", "testdata", "config.yaml")
	code, out, errOut := run("convert", "-f", file, "-n", "converted")
	if code != 0 || !strings.Contains(errOut, "5 policies; 4 rate limits not converted") {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	mustCreate(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "converted"}})
	created := 0
	for _, doc := range bytes.Split([]byte(out), []byte("\n---\n")) {
		var p v1alpha1.RateLimitPolicy
		if err := yaml.UnmarshalStrict(doc, &p); err != nil || p.Kind == "" {
			continue // the comments above the first policy
		}
		if p.Namespace != "converted" {
			t.Errorf("policy %s in namespace %q, want converted", p.Name, p.Namespace)
		}
		if err := admin.Create(context.Background(), &p); err != nil {
			t.Errorf("the API server refuses converted policy %s: %v", p.Name, err)
		}
		created++
	}
	if created != 5 {
		t.Errorf("%d policies created, want 5:\n%s", created, out)
	}

	in, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	code, fromStdin, errOut := runIn(string(in), "convert", "-f", "-", "-n", "converted")
	if code != 0 || fromStdin != out {
		t.Errorf("from stdin: exit %d, %s; output differs from the file's: %v", code, errOut, fromStdin != out)
	}
	if code, _, errOut := run("convert"); code != 2 || !strings.Contains(errOut, "give the configuration files with -f") {
		t.Errorf("without -f: exit %d, %s", code, errOut)
	}
	if code, _, errOut := runIn("domain: x\nbogus: 1\n", "convert", "-f", "-"); code != 1 || !strings.Contains(errOut, "unknown field") {
		t.Errorf("a bad file: exit %d, %s", code, errOut)
	}
}
