// Command release writes what `make dist` publishes beside the binaries:
// the krew manifest of the kubectl plugin, from the plugin's archives, and
// the release notes, the CHANGELOG's section of the release.
//
//	go run ./hack/release -version v0.2.0 -changelog CHANGELOG.md -out dist \
//	    dist/kubectl-slidegate_v0.2.0_linux_amd64.tar.gz ...
//
// An archive is named kubectl-slidegate_<version>_<os>_<arch>.tar.gz and
// holds kubectl-slidegate and LICENSE; the manifest points at it among the
// release's downloads, with its SHA-256.
package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// downloads is where a release's files are published.
const downloads = "https://github.com/slidegate/slidegate/releases/download/"

func main() {
	var (
		version   = flag.String("version", "", "the release, e.g. v0.2.0")
		changelog = flag.String("changelog", "CHANGELOG.md", "the changelog, with a section '## <version>'")
		out       = flag.String("out", "dist", "directory for slidegate.yaml (krew) and RELEASE_NOTES.md")
	)
	flag.Parse()
	if err := run(*version, *changelog, *out, flag.Args()); err != nil {
		log.Fatalf("release: %v", err)
	}
}

func run(version, changelog, out string, archives []string) error {
	if version == "" || len(archives) == 0 {
		return errors.New("usage: release -version V [-changelog FILE] [-out DIR] ARCHIVE [ARCHIVE]")
	}
	cl, err := os.ReadFile(changelog)
	if err != nil {
		return err
	}
	notes, err := releaseNotes(cl, version)
	if err != nil {
		return err
	}
	manifest, err := krewManifest(version, archives)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "RELEASE_NOTES.md"), notes, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "slidegate.yaml"), manifest, 0o644)
}

// releaseNotes is the changelog's section "## <version>", without its
// heading: a release without one is refused.
func releaseNotes(changelog []byte, version string) ([]byte, error) {
	var b bytes.Buffer
	in := false
	sc := bufio.NewScanner(bytes.NewReader(changelog))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			if in {
				break
			}
			in = strings.TrimSpace(strings.TrimPrefix(line, "## ")) == version
			continue
		}
		if in {
			b.WriteString(line + "\n")
		}
	}
	notes := bytes.TrimSpace(b.Bytes())
	if len(notes) == 0 {
		return nil, fmt.Errorf("the changelog has no notes under '## %s'", version)
	}
	return append(notes, '\n'), nil
}

// archiveName is kubectl-slidegate_<version>_<os>_<arch>.tar.gz.
var archiveName = regexp.MustCompile(`^kubectl-slidegate_(v[^_]+)_(linux|darwin|windows)_(amd64|arm64)\.tar\.gz$`)

// The krew manifest (krew.googlecontainertools.github.com/v1alpha2 Plugin),
// only the fields it uses.
type (
	plugin struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       pluginSpec     `json:"spec"`
	}
	pluginSpec struct {
		Version          string     `json:"version"`
		Homepage         string     `json:"homepage"`
		ShortDescription string     `json:"shortDescription"`
		Description      string     `json:"description"`
		Platforms        []platform `json:"platforms"`
	}
	platform struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		URI    string     `json:"uri"`
		SHA256 string     `json:"sha256"`
		Files  []fileSpec `json:"files"`
		Bin    string     `json:"bin"`
	}
	fileSpec struct {
		From string `json:"from"`
		To   string `json:"to"`
	}
)

// krewManifest is the plugin's krew manifest for the archives of version.
func krewManifest(version string, archives []string) ([]byte, error) {
	p := plugin{
		APIVersion: "krew.googlecontainertools.github.com/v1alpha2",
		Kind:       "Plugin",
		Metadata:   map[string]any{"name": "slidegate"},
		Spec: pluginSpec{
			Version:          version,
			Homepage:         "https://github.com/slidegate/slidegate",
			ShortDescription: "Why a client is rate limited by slidegate",
			Description: "Reads slidegate's exact sliding-window rate limits from the cluster:\n" +
				"`status` lists the RateLimitPolicies with what the controller reported,\n" +
				"`why` shows one client's live window under a RateLimitPolicy (admits,\n" +
				"remaining, the exact retry time) without changing it, and `top` lists\n" +
				"the clients a policy refused most; `convert` turns envoyproxy/ratelimit\n" +
				"configuration into policies. why and top reach the sidecars through a\n" +
				"port-forward and need the ClusterRole slidegate-debugger.\n",
		},
	}
	seen := map[string]bool{}
	for _, a := range archives {
		m := archiveName.FindStringSubmatch(filepath.Base(a))
		if m == nil {
			return nil, fmt.Errorf("%s: not kubectl-slidegate_<version>_<os>_<arch>.tar.gz", a)
		}
		if m[1] != version {
			return nil, fmt.Errorf("%s: of release %s, not %s", a, m[1], version)
		}
		if seen[m[2]+"/"+m[3]] {
			return nil, fmt.Errorf("%s: a second archive for %s/%s", a, m[2], m[3])
		}
		seen[m[2]+"/"+m[3]] = true
		sum, err := sha256File(a)
		if err != nil {
			return nil, err
		}
		var pl platform
		pl.Selector.MatchLabels = map[string]string{"os": m[2], "arch": m[3]}
		pl.URI = downloads + version + "/" + filepath.Base(a)
		pl.SHA256 = sum
		pl.Files = []fileSpec{{From: "kubectl-slidegate", To: "."}, {From: "LICENSE", To: "."}}
		pl.Bin = "kubectl-slidegate"
		p.Spec.Platforms = append(p.Spec.Platforms, pl)
	}
	sort.Slice(p.Spec.Platforms, func(i, j int) bool { return p.Spec.Platforms[i].URI < p.Spec.Platforms[j].URI })
	return yaml.Marshal(p)
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
