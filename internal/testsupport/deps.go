package testsupport

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// InCI reports whether the tests run under CI (CI=true), where a missing
// dependency must fail the run instead of skipping.
func InCI() bool { return os.Getenv("CI") == "true" }

// Missing stops the test because a dependency is not available: a skip on a
// developer's machine, a fatal error under CI=true.
func Missing(tb testing.TB, what string, err error) {
	tb.Helper()
	msg := fmt.Sprintf("%s is not available: %v (install it with `make test-deps`)", what, err)
	if InCI() {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
}

// MissingInMain is Missing for TestMain, which has no testing.TB: it exits 1
// under CI=true and 0 (the package is skipped) otherwise.
func MissingInMain(what string, err error) {
	msg := fmt.Sprintf("%s is not available: %v (install it with `make test-deps`)", what, err)
	if InCI() {
		fmt.Fprintln(os.Stderr, "FAIL:", msg)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "SKIP:", msg)
	os.Exit(0)
}

// RedisServerPath finds the redis-server binary.
func RedisServerPath() (string, error) { return lookBinary("redis-server") }

// RedisCLIPath finds the redis-cli binary.
func RedisCLIPath() (string, error) { return lookBinary("redis-cli") }

func lookBinary(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found in PATH (hack/redis.sh installs it)", name)
	}
	return p, nil
}

// EnvtestAssets returns the directory holding kube-apiserver and etcd:
// $KUBEBUILDER_ASSETS if set, otherwise bin/envtest of the repository.
func EnvtestAssets() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, "bin", "envtest")
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%s missing in %s (hack/envtest.sh builds it): %w", b, dir, err)
		}
	}
	return dir, nil
}

// RepoRoot walks up from the working directory to the directory of go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// RedisInMain is, for a TestMain, the check that redis-server and
// redis-cli are installed (MissingInMain when one is not).
func RedisInMain() {
	if _, err := RedisServerPath(); err != nil {
		MissingInMain("redis-server", err)
	}
	if _, err := RedisCLIPath(); err != nil {
		MissingInMain("redis-cli", err)
	}
}
