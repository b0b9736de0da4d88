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

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestPack: the archive carries the reference (what ctr import names the
// image), the OCI layout names it by its tag, both hold the same index with
// one image per platform, each packed from its own arch's files, and packing
// the same files again gives the same digest (make dist pins it; the
// binaries' own bytes are all that may change it). A moving tag is refused.
func TestPack(t *testing.T) {
	dir := t.TempDir()
	arches := []string{"amd64", "arm64"}
	for _, arch := range arches {
		if err := os.MkdirAll(filepath.Join(dir, arch), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, arch, "app"), []byte("#!/bin/false "+arch+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "{arch}", "app")
	const tag = "registry.example/slidegate:v1.2.3"
	pack := func(out, oci string) string {
		t.Helper()
		pinned, err := run(out, tag, runConfig{Entrypoint: "/app"}, arches, oci, []string{"/app=" + bin})
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

	// The archive is an OCI layout holding the index alone.
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
		am.Manifests[0].MediaType != types.OCIImageIndex ||
		am.Manifests[0].Annotations["io.containerd.image.name"] != tag || am.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v1.2.3" ||
		am.Manifests[1].Annotations["io.containerd.image.name"] != byDigest {
		t.Fatalf("archive's index: %+v; want index %s named %s (and v1.2.3), and %s", am.Manifests, digest, tag, byDigest)
	}
	idx, err := ai.ImageIndex(am.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	checkPlatforms(t, idx, arches)

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
		t.Errorf("OCI layout: %+v; want one index %s named v1.2.3", m.Manifests, digest)
	}

	// One platform is an index too: a pinned digest names an index always.
	one, err := run(filepath.Join(dir, "c.tar"), tag, runConfig{Entrypoint: "/app"}, []string{"arm64"}, "", []string{"/app=" + bin})
	if err != nil {
		t.Fatal(err)
	}
	if one == first {
		t.Errorf("linux/arm64 alone has the digest of amd64 and arm64: %s", one)
	}
	for _, bad := range [][]string{{}, {""}, {"arm64", "arm64"}} {
		if _, err := run(filepath.Join(dir, "d.tar"), tag, runConfig{Entrypoint: "/app"}, bad, "", []string{"/app=" + bin}); err == nil {
			t.Errorf("-arch %q: packed, want it refused", strings.Join(bad, ","))
		}
	}
	if _, err := run(filepath.Join(dir, "d.tar"), "registry.example/slidegate:latest", runConfig{Entrypoint: "/app"}, arches, "", []string{"/app=" + bin}); err == nil ||
		!strings.Contains(err.Error(), "not latest") {
		t.Errorf("tag latest: %v, want it refused", err)
	}
}

// checkPlatforms checks that idx holds one image for linux/ARCH of each
// arch, in order, whose config says so and whose /app is that arch's file.
func checkPlatforms(t *testing.T, idx v1.ImageIndex, arches []string) {
	t.Helper()
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != len(arches) {
		t.Fatalf("index: %d images, want %d (%v)", len(im.Manifests), len(arches), arches)
	}
	for i, arch := range arches {
		d := im.Manifests[i]
		if d.Platform == nil || d.Platform.OS != "linux" || d.Platform.Architecture != arch {
			t.Errorf("index's image %d: platform %+v, want linux/%s", i, d.Platform, arch)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != "linux" || cf.Architecture != arch || cf.Config.User != "65532:65532" || strings.Join(cf.Config.Entrypoint, " ") != "/app" {
			t.Errorf("linux/%s config: os %s arch %s user %s entrypoint %v", arch, cf.OS, cf.Architecture, cf.Config.User, cf.Config.Entrypoint)
		}
		if got := fileInImage(t, img, "app"); got != "#!/bin/false "+arch+"\n" {
			t.Errorf("linux/%s: /app is %q, want its own arch's file", arch, got)
		}
	}
}

// fileInImage returns the content of path in img's one layer.
func fileInImage(t *testing.T, img v1.Image, path string) string {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v; want one", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s not in the image: %v", path, err)
		}
		if h.Name == path {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
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

// TestDockerHubName: an image of Docker Hub is named for containerd as the
// kubelet asks for it (docker.io/library/redis:7 for a pod's redis:7), not
// as go-containerregistry writes Docker Hub (index.docker.io); and
// -workdir becomes the image's working directory.
func TestDockerHubName(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "app")
	if err := os.WriteFile(bin, []byte("#!/bin/false\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "a.tar")
	pinned, err := run(out, "docker.io/library/redis:7", runConfig{WorkingDir: "/tmp"}, []string{"amd64"}, "", []string{"/redis-server=" + bin})
	if err != nil {
		t.Fatal(err)
	}
	_, digest, _ := strings.Cut(pinned, "@")
	ai, err := layout.ImageIndexFromPath(untar(t, out))
	if err != nil {
		t.Fatal(err)
	}
	am, err := ai.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range am.Manifests {
		got = append(got, m.Annotations["io.containerd.image.name"])
	}
	if want := []string{"docker.io/library/redis:7", "docker.io/library/redis@" + digest}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("containerd names %q, want %q", got, want)
	}
	idx, err := ai.ImageIndex(am.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.WorkingDir != "/tmp" || len(cf.Config.Entrypoint) != 0 {
		t.Errorf("config: working directory %q, entrypoint %q; want /tmp and none", cf.Config.WorkingDir, cf.Config.Entrypoint)
	}
}
