package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestReleaseNotes: the section of the release, without its heading or the
// next release's; a release the changelog does not describe is refused.
func TestReleaseNotes(t *testing.T) {
	cl := []byte("# Changelog\n\nintro\n\n## v0.3.0\n\n- three\n\n## v0.2.0\n\n### Install\n- two\n\n## v0.1.0\n\nfirst\n")
	for _, tc := range []struct{ version, want, wantErr string }{
		{version: "v0.3.0", want: "- three\n"},
		{version: "v0.2.0", want: "### Install\n- two\n"},
		{version: "v0.1.0", want: "first\n"},
		{version: "v0.2", wantErr: "no notes under '## v0.2'"},
		{version: "v9.9.9", wantErr: "no notes under"},
	} {
		got, err := releaseNotes(cl, tc.version)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: %q, %v; want error %q", tc.version, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.version, got, err, tc.want)
		}
	}
	// The repository's own changelog describes the release in VERSION.
	version, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	own, err := os.ReadFile("../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := releaseNotes(own, strings.TrimSpace(string(version))); err != nil {
		t.Errorf("CHANGELOG.md: %v", err)
	}
}

// TestKrewManifest: one platform per archive, each with its download URL,
// the archive's SHA-256 and the files krew installs; archives of another
// release, of an unknown name or twice for a platform are refused.
func TestKrewManifest(t *testing.T) {
	dir := t.TempDir()
	archive := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	linux := archive("kubectl-slidegate_v0.2.0_linux_amd64.tar.gz", "linux")
	darwin := archive("kubectl-slidegate_v0.2.0_darwin_arm64.tar.gz", "darwin")
	out, err := krewManifest("v0.2.0", []string{linux, darwin})
	if err != nil {
		t.Fatal(err)
	}
	var p plugin
	if err := yaml.UnmarshalStrict(out, &p); err != nil {
		t.Fatal(err)
	}
	if p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || p.Kind != "Plugin" || p.Metadata["name"] != "slidegate" || p.Spec.Version != "v0.2.0" {
		t.Errorf("header: %s %s %v %s", p.APIVersion, p.Kind, p.Metadata, p.Spec.Version)
	}
	if n := len(p.Spec.ShortDescription); n == 0 || n > 50 {
		t.Errorf("shortDescription of %d characters, want 1-50 (krew's index)", n)
	}
	if len(p.Spec.Platforms) != 2 {
		t.Fatalf("%d platforms, want 2", len(p.Spec.Platforms))
	}
	for i, want := range []struct{ os, arch, body string }{{"darwin", "arm64", "darwin"}, {"linux", "amd64", "linux"}} {
		pl := p.Spec.Platforms[i]
		sum := sha256.Sum256([]byte(want.body))
		name := "kubectl-slidegate_v0.2.0_" + want.os + "_" + want.arch + ".tar.gz"
		if pl.Selector.MatchLabels["os"] != want.os || pl.Selector.MatchLabels["arch"] != want.arch ||
			pl.URI != downloads+"v0.2.0/"+name || pl.SHA256 != hex.EncodeToString(sum[:]) || pl.Bin != "kubectl-slidegate" || len(pl.Files) != 2 {
			t.Errorf("platform %d: %+v; want %s/%s at %s with its SHA-256", i, pl, want.os, want.arch, name)
		}
	}
	for _, bad := range [][]string{
		{archive("kubectl-slidegate_v0.1.0_linux_amd64.tar.gz", "old")},
		{archive("slidegate_linux_amd64.tar.gz", "x")},
		{linux, linux},
	} {
		if _, err := krewManifest("v0.2.0", bad); err == nil {
			t.Errorf("%v: accepted", bad)
		}
	}
}
