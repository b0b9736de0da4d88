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

package testsupport

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// GatewayAPIModule is the Gateway API release whose CRDs the tests
// install, as its project publishes them in its Go module (the standard
// channel); the go command fetches it from the module proxy, and checks it
// against the checksum database, like any module.
const GatewayAPIModule = "sigs.k8s.io/gateway-api@v1.6.3"

// GatewayAPICRDs are the files of the Gateway API's Gateway, GatewayClass
// and HTTPRoute CRDs, from GatewayAPIModule.
func GatewayAPICRDs() ([]string, error) {
	dir, err := moduleDir(GatewayAPIModule)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, kind := range []string{"gatewayclasses", "gateways", "httproutes"} {
		f := filepath.Join(dir, "config", "crd", "standard", "gateway.networking.k8s.io_"+kind+".yaml")
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("%s: %w", GatewayAPIModule, err)
		}
		out = append(out, f)
	}
	return out, nil
}

// IstioAPIModule is the Istio API release whose CRDs (EnvoyFilter among
// them) the tests install, from the file its Go module publishes.
const IstioAPIModule = "istio.io/api@v1.32.0"

// IstioCRDs is the file of Istio's CRDs, from IstioAPIModule.
func IstioCRDs() (string, error) {
	dir, err := moduleDir(IstioAPIModule)
	if err != nil {
		return "", err
	}
	f := filepath.Join(dir, "kubernetes", "customresourcedefinitions.gen.yaml")
	if _, err := os.Stat(f); err != nil {
		return "", fmt.Errorf("%s: %w", IstioAPIModule, err)
	}
	return f, nil
}

// EnvoyGatewayModule is the Envoy Gateway release whose EnvoyPatchPolicy
// CRD the tests install, from the file its Go module publishes.
const EnvoyGatewayModule = "github.com/envoyproxy/gateway@v1.6.3"

// EnvoyGatewayCRDs is the file of Envoy Gateway's EnvoyPatchPolicy CRD,
// from EnvoyGatewayModule.
func EnvoyGatewayCRDs() (string, error) {
	dir, err := moduleDir(EnvoyGatewayModule)
	if err != nil {
		return "", err
	}
	f := filepath.Join(dir, "charts", "gateway-helm", "crds", "generated", "gateway.envoyproxy.io_envoypatchpolicies.yaml")
	if _, err := os.Stat(f); err != nil {
		return "", fmt.Errorf("%s: %w", EnvoyGatewayModule, err)
	}
	return f, nil
}

// moduleDir downloads a module (go mod download) and returns its
// directory in the module cache; a second call reads the cache.
func moduleDir(module string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", module)
	if root, err := RepoRoot(); err == nil {
		cmd.Dir = root
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &info); jerr == nil && info.Error != "" {
		return "", fmt.Errorf("go mod download %s: %s", module, info.Error)
	}
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w %s", module, err, strings.TrimSpace(stderr.String()))
	}
	if info.Dir == "" {
		return "", fmt.Errorf("go mod download %s: no directory in %q", module, out)
	}
	return info.Dir, nil
}
