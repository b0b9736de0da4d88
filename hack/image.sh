#!/usr/bin/env bash
# make image: slidegate's release image, built without a container engine.
# The manager, the sidecar and the rate limit service, built static for
# linux/ARCH, packed by hack/imagepack into one image (/manager, /sidecar,
# /rls: the sidecar is injected from the manager's own image) tagged
# IMAGE:VERSION, written to DIR (default dist/images):
#   slidegate-VERSION-linux-ARCH.tar   an OCI archive: kind load image-archive,
#                                      ctr -n k8s.io images import --digests
#   oci/                               an OCI image layout: crane push, skopeo copy oci:
#   slidegate-VERSION.ref              IMAGE:VERSION@sha256:... (what make dist pins)
# The same commit (the binaries record it, and whether the tree was clean) and
# the same Go give the same digest: every time and owner in the image is fixed.
#   IMAGE   default ghcr.io/slidegate/slidegate (the manifests' name)
#   ARCH    default the machine's GOARCH
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$ROOT/dist/images}
IMAGE=${IMAGE:-ghcr.io/slidegate/slidegate}
VERSION=$(cat "$ROOT/VERSION")
ARCH=${ARCH:-$(go env GOARCH)}
# shellcheck source=hack/goenv.sh
. "$ROOT/hack/goenv.sh"
mkdir -p "$DIR"
# The layout holds this build only (a blob of an earlier one would stay).
rm -rf "$DIR/oci"
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
cd "$ROOT"
# One go build for the three (shared packages compile once), and the packer
# for this machine.
GOOS=linux GOARCH=$ARCH go build -ldflags="-s -w -X github.com/slidegate/slidegate/internal/version.Version=$VERSION" \
	-o "$BIN/" ./cmd/manager ./cmd/sidecar ./cmd/rls
go build -o "$BIN/imagepack" ./hack/imagepack
tar="$DIR/slidegate-$VERSION-linux-$ARCH.tar"
pinned=$("$BIN/imagepack" -o "$tar" -oci "$DIR/oci" -arch "$ARCH" -tag "$IMAGE:$VERSION" -entrypoint /manager \
	/manager="$BIN/manager" /sidecar="$BIN/sidecar" /rls="$BIN/rls")
echo "$pinned" >"$DIR/slidegate-$VERSION.ref"
echo "image $pinned" >&2
echo "  $tar" >&2
echo "  $DIR/oci (OCI layout)" >&2
