package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// TestPack: the archive carries the reference (what ctr import names the image),
// the OCI layout names it by its tag, both hold the same image, and packing
// the same files again gives the same digest (make dist pins it; the
// binaries' own bytes are all that may change it). A moving tag is refused.
func TestPack(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "app")
	if err := os.WriteFile(bin, []byte("#!/bin/false\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	const tag = "registry.example/slidegate:v1.2.3"
	pack := func(out, oci string) string {
		t.Helper()
		pinned, err := run(out, tag, "/app", "arm64", oci, []string{"/app=" + bin})
		if err != nil {
			t.Fatal(err)
		}
		return pinned
	}
	first := pack(filepath.Join(dir, "a.tar"), filepath.Join(dir, "oci"))
	second := pack(filepath.Join(dir, "b.tar"), "")
	if first != second || !strings.HasPrefix(first, tag+"@sha256:") {
		t.Fatalf("packed twice: %s and %s; want the same %s@sha256:...", first, second, tag)
	}
	_, digest, _ := strings.Cut(first, "@")
	if a, b := readFile(t, filepath.Join(dir, "a.tar")), readFile(t, filepath.Join(dir, "b.tar")); !bytes.Equal(a, b) {
		t.Errorf("the two archives of the same image differ (%d and %d bytes)", len(a), len(b))
	}

	// The archive is an OCI layout holding the image alone.
	archive := untar(t, filepath.Join(dir, "a.tar"))
	ai, err := layout.ImageIndexFromPath(archive)
	if err != nil {
		t.Fatalf("the archive is no OCI layout: %v", err)
	}
	am, err := ai.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	// Named twice for containerd: by the tag, and by the digest (what a
	// pod pinned to it asks the kubelet for).
	byDigest := "registry.example/slidegate@" + digest
	if len(am.Manifests) != 2 || am.Manifests[0].Digest.String() != digest || am.Manifests[1].Digest.String() != digest ||
		am.Manifests[0].Annotations["io.containerd.image.name"] != tag || am.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v1.2.3" ||
		am.Manifests[1].Annotations["io.containerd.image.name"] != byDigest {
		t.Fatalf("archive's index: %+v; want image %s named %s (and v1.2.3), and %s", am.Manifests, digest, tag, byDigest)
	}
	img, err := ai.Image(am.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "arm64" || cf.Config.User != "65532:65532" || strings.Join(cf.Config.Entrypoint, " ") != "/app" {
		t.Errorf("config: os %s arch %s user %s entrypoint %v", cf.OS, cf.Architecture, cf.Config.User, cf.Config.Entrypoint)
	}

	p, err := layout.FromPath(filepath.Join(dir, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	index, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Digest.String() != digest ||
		m.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v1.2.3" {
		t.Errorf("OCI layout: %+v; want one image %s named v1.2.3", m.Manifests, digest)
	}

	if _, err := run(filepath.Join(dir, "c.tar"), "registry.example/slidegate:latest", "/app", "arm64", "", []string{"/app=" + bin}); err == nil ||
		!strings.Contains(err.Error(), "not latest") {
		t.Errorf("tag latest: %v, want it refused", err)
	}
}

// untar extracts the archive into a new directory, checking that every
// entry has the fixed time and owner.
func untar(t *testing.T, archive string) string {
	t.Helper()
	b := readFile(t, archive)
	dir := t.TempDir()
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.ModTime.Unix() != 0 || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: time %v, owner %d:%d; want fixed", h.Name, h.ModTime, h.Uid, h.Gid)
		}
		path := filepath.Join(dir, filepath.FromSlash(h.Name))
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(path, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
