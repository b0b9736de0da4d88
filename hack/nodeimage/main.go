// Command nodeimage packs static binaries into an OCI image tarball that
// containerd imports (`ctr images import`), without a container engine or a
// registry. It is how the real-node tests (hack/node.sh, test/node) get
// slidegate's image, the demo app and the sandbox image onto the node.
//
//	go run ./hack/nodeimage -tag slidegate.test/slidegate:node -o out.tar \
//	    -entrypoint /manager /manager=bin/manager /sidecar=bin/sidecar
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
	"log"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

const nonroot = "65532"

func main() {
	var (
		out        = flag.String("o", "", "output tarball")
		tag        = flag.String("tag", "", "image reference, with a fixed non-latest tag")
		entrypoint = flag.String("entrypoint", "", "the image's entrypoint (one path)")
	)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: nodeimage -o FILE -tag REF [-entrypoint PATH] /path/in/image=local-file...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || *tag == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*out, *tag, *entrypoint, flag.Args()); err != nil {
		log.Fatalf("nodeimage: %v", err)
	}
}

func run(out, tag, entrypoint string, files []string) error {
	ref, err := name.NewTag(tag, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("tag %q: %w", tag, err)
	}
	layerTar, err := layer(files)
	if err != nil {
		return err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	// containerd unpacks only images of its own platform.
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: time.Unix(0, 0)}
	cf.Config = v1.Config{User: nonroot + ":" + nonroot, Env: []string{"PATH=/"}}
	if entrypoint != "" {
		cf.Config.Entrypoint = []string{entrypoint}
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(out, ref, img)
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
