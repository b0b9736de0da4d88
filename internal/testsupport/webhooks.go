package testsupport

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"
)

// RenderedWebhooks renders config/webhook with kubectl's kustomize: the
// webhook configuration of a real install, namespaceSelector included, for
// envtest's WebhookInstallOptions (which does not run kustomize itself).
func RenderedWebhooks() ([]*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	out, err := exec.Command("kubectl", "kustomize", filepath.Join(root, "config", "webhook")).Output()
	if err != nil {
		return nil, fmt.Errorf("kubectl kustomize config/webhook: %w", err)
	}
	var hooks []*admissionregistrationv1.MutatingWebhookConfiguration
	for _, doc := range strings.Split(string(out), "\n---\n") {
		if !strings.Contains(doc, "kind: MutatingWebhookConfiguration") {
			continue
		}
		var h admissionregistrationv1.MutatingWebhookConfiguration
		if err := yaml.UnmarshalStrict([]byte(doc), &h); err != nil {
			return nil, err
		}
		hooks = append(hooks, &h)
	}
	if len(hooks) != 1 {
		return nil, fmt.Errorf("config/webhook rendered %d MutatingWebhookConfigurations, want 1", len(hooks))
	}
	return hooks, nil
}
