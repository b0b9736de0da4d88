// Command imagepack packs static binaries into an OCI image without a
// container engine or a registry: `make image` builds slidegate's release
// image with it (hack/image.sh), and the real-node tests their stand-ins for
// the demo app and the sandbox image (hack/node-images.sh).
//
//	go run ./hack/imagepack -tag ghcr.io/slidegate/slidegate:v0.2.0 -o out.tar \
//	    -arch amd64,arm64 -oci dist/images/oci -entrypoint /manager \
//	    /manager=bin/{arch}/manager /sidecar=bin/{arch}/sidecar
//
// The image is an OCI image index with one image per -arch (linux/ARCH),
// each packed from the files with {arch} replaced by its GOARCH: one name
// and one digest for every platform, as a registry serves a multi-platform
// image, so a pinned install runs on amd64 and arm64 nodes alike.
//
// It writes an OCI archive, a tar of an OCI image layout (`ctr images import`
// and `kind load image-archive` take it, and keep the index's digest), and
// with -oci adds the index to an OCI image layout directory (`crane push DIR
// REF`, `skopeo copy --all oci:DIR:TAG`). It prints the reference with the
// index's digest (REF@sha256:...), which is the same for the same binaries:
// every time and owner in the image is fixed.
//
// The layout mirrors the Dockerfile's distroless/static base where the
// binaries care: /etc/passwd and /etc/group with the nonroot user 65532, and a
// world-writable /tmp.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const nonroot = "65532"

func main() {
	var (
		out        = flag.String("o", "", "output: an OCI archive (a tar of an OCI image layout)")
		tag        = flag.String("tag", "", "image reference, with a fixed non-latest tag")
		entrypoint = flag.String("entrypoint", "", "the image's entrypoint (one path)")
		workdir    = flag.String("workdir", "", "the image's working directory (default /)")
		arch       = flag.String("arch", runtime.GOARCH, "the GOARCHes, comma-separated: one image for linux/ARCH each, from the files with {arch} replaced")
		oci        = flag.String("oci", "", "also add the image to the OCI image layout in this directory (created if missing)")
	)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: imagepack -o FILE -tag REF [-oci DIR] [-arch GOARCH,...] [-entrypoint PATH] [-workdir DIR] /path/in/image=local-file...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || *tag == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	pinned, err := run(*out, *tag, runConfig{Entrypoint: *entrypoint, WorkingDir: *workdir}, strings.Split(*arch, ","), *oci, flag.Args())
	if err != nil {
		log.Fatalf("imagepack: %v", err)
	}
	fmt.Println(pinned)
}

// runConfig is how the image's process starts.
type runConfig struct {
	Entrypoint string // one path; empty: the pod's command or args name it
	WorkingDir string // empty: /
}

// run packs an image per arch into one index, writes it, and returns the
// reference pinned by the index's digest (tag@sha256:...).
func run(out, tag string, rc runConfig, arches []string, oci string, files []string) (string, error) {
	ref, err := name.NewTag(tag, name.StrictValidation)
	if err != nil {
		return "", fmt.Errorf("tag %q: %w", tag, err)
	}
	// A moving tag would let the nodes of one cluster run different bits
	// under one name (and the kubelet pull it again on every start).
	if ref.TagStr() == "latest" {
		return "", fmt.Errorf("tag %q: a release image needs a fixed tag, not latest", tag)
	}
	if len(arches) == 0 || slices.Contains(arches, "") || len(slices.Compact(slices.Sorted(slices.Values(arches)))) != len(arches) {
		return "", fmt.Errorf("-arch %q: want distinct GOARCHes, comma-separated", strings.Join(arches, ","))
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range arches {
		img, err := image(arch, rc, files)
		if err != nil {
			return "", fmt.Errorf("linux/%s: %w", arch, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
	}
	if err := writeArchive(out, ref, idx); err != nil {
		return "", err
	}
	if oci != "" {
		if err := addToLayout(oci, ref, idx); err != nil {
			return "", fmt.Errorf("OCI layout %s: %w", oci, err)
		}
	}
	digest, err := idx.Digest()
	if err != nil {
		return "", err
	}
	return ref.String() + "@" + digest.String(), nil
}

// image packs the files, {arch} replaced by arch, into an image of the
// platform linux/arch.
func image(arch string, rc runConfig, files []string) (v1.Image, error) {
	resolved := make([]string, len(files))
	for i, f := range files {
		resolved[i] = strings.ReplaceAll(f, "{arch}", arch)
	}
	layerTar, err := layer(resolved)
	if err != nil {
		return nil, err
	}
	// OCI media types throughout: what an OCI layout and registries expect.
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, l)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	// containerd unpacks only images of its own platform.
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: time.Unix(0, 0)}
	cf.Config = v1.Config{User: nonroot + ":" + nonroot, Env: []string{"PATH=/"}, WorkingDir: rc.WorkingDir}
	if rc.Entrypoint != "" {
		cf.Config.Entrypoint = []string{rc.Entrypoint}
	}
	return mutate.ConfigFile(img, cf)
}

// writeArchive writes idx, named ref, to the file out as an OCI archive: a
// tar of an OCI image layout that holds idx alone. containerd imports it
// (`ctr images import`, which `kind load image-archive` runs) with the
// index's own digest, the one run returns: a `docker save` tarball has no
// manifest, so an importer writes one of its own, with another digest.
// The index names the image twice for containerd: by ref, and by its
// repository and digest (repo@sha256:...). The kubelet finds an image by
// those names only, so without the second, a pod pinned to the digest (make
// dist's install) would be pulled from the registry: ctr's --digests names
// it import-<date>@sha256:..., which no pod asks for.
func writeArchive(out string, ref name.Tag, idx v1.ImageIndex) error {
	dir, err := os.MkdirTemp("", "imagepack-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := addToLayout(dir, ref, idx); err != nil {
		return err
	}
	desc, err := partial.Descriptor(idx)
	if err != nil {
		return err
	}
	desc.Annotations = map[string]string{"io.containerd.image.name": containerdName(ref.Context().Digest(desc.Digest.String()).String())}
	if err := layout.Path(dir).AppendDescriptor(*desc); err != nil {
		return err
	}
	var files []string
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && path != dir {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		return err
	}
	sort.Strings(files)
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, path := range files {
		if err := addFile(tw, dir, path); err != nil {
			_ = f.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// addFile writes the file or directory path, relative to dir, into tw with
// fixed times and owners, so the archive of one image is always the same.
func addFile(tw *tar.Writer, dir, path string) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(dir, path)
	if err != nil {
		return err
	}
	h := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
	if info.IsDir() {
		h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		return tw.WriteHeader(h)
	}
	h.Typeflag, h.Size = tar.TypeReg, info.Size()
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	src, err := os.Open(path)
	if err != nil {
		return err
	}
	defer src.Close()
	_, err = io.Copy(tw, src)
	return err
}

// addToLayout adds idx to the OCI image layout in dir, named by the tag as
// the OCI image spec's ref.name annotation says (and by the whole
// reference, as containerd names the images it imports), in place of what
// the layout held under that tag.
func addToLayout(dir string, ref name.Tag, idx v1.ImageIndex) error {
	p, err := layout.FromPath(dir)
	if err != nil {
		if p, err = layout.Write(dir, empty.Index); err != nil {
			return err
		}
	}
	return p.ReplaceIndex(idx, match.Name(ref.TagStr()),
		layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": ref.TagStr(),
			"io.containerd.image.name":          containerdName(ref.String()),
		}))
}

// containerdName is ref as containerd and the kubelet name it: Docker Hub
// as docker.io, where go-containerregistry writes index.docker.io, so that
// a pod's image redis:7 (docker.io/library/redis:7) finds the import.
func containerdName(ref string) string {
	if rest, ok := strings.CutPrefix(ref, name.DefaultRegistry+"/"); ok {
		return "docker.io/" + rest
	}
	return ref
}

// layer returns one uncompressed tar with the base files and the binaries.
func layer(files []string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dir := func(name string, mode int64) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: epoch})
	}
	file := func(name string, mode int64, body []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), ModTime: epoch}); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	for _, d := range []string{"etc", "tmp"} {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		if err := dir(d, mode); err != nil {
			return nil, err
		}
	}
	if err := file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:"+nonroot+":"+nonroot+":nonroot:/home/nonroot:/sbin/nologin\n")); err != nil {
		return nil, err
	}
	if err := file("etc/group", 0o644, []byte("root:x:0:\nnonroot:x:"+nonroot+":\n")); err != nil {
		return nil, err
	}
	for _, f := range files {
		dst, src, ok := strings.Cut(f, "=")
		if !ok || !strings.HasPrefix(dst, "/") {
			return nil, fmt.Errorf("%q: want /path/in/image=local-file", f)
		}
		body, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		if err := file(strings.TrimPrefix(dst, "/"), 0o755, body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
