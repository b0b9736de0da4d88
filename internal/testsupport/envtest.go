package testsupport

import (
	"fmt"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// NewEnvironment returns an envtest environment that uses the control plane
// built by hack/envtest.sh and installs slidegate's CRDs. The caller starts
// and stops it (once per package, in TestMain).
func NewEnvironment() (*envtest.Environment, error) {
	assets, err := EnvtestAssets()
	if err != nil {
		return nil, err
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	return &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		// A missing CRD directory is fine for packages that need none; a CRD
		// that fails to install is still an error.
		ErrorIfCRDPathMissing: false,
	}, nil
}

// EnvtestUnavailable formats the reason envtest cannot run for MissingInMain.
func EnvtestUnavailable(err error) error {
	return fmt.Errorf("%w (run hack/envtest.sh, or set KUBEBUILDER_ASSETS)", err)
}
