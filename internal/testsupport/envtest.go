package testsupport

import (
	"fmt"
	"path/filepath"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
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

// StartControlPlane starts an envtest API server with the project's CRDs
// (and moreCRDs: files or directories), for a TestMain, and returns it with a client using scheme (its rest config
// is env.Config). A missing control plane goes through MissingInMain: it
// fails under CI=true. The caller stops env.
func StartControlPlane(scheme *runtime.Scheme, moreCRDs ...string) (*envtest.Environment, client.Client, error) {
	env, err := NewEnvironment()
	if err != nil {
		MissingInMain("envtest control plane", EnvtestUnavailable(err))
	}
	env.CRDDirectoryPaths = append(env.CRDDirectoryPaths, moreCRDs...)
	env.ErrorIfCRDPathMissing = true
	cfg, err := env.Start()
	if err != nil {
		return nil, nil, fmt.Errorf("starting the control plane: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = env.Stop()
		return nil, nil, err
	}
	return env, c, nil
}
