#!/usr/bin/env bash
# make image: slidegate's release image, built without a container engine.
# The manager, the sidecar and the rate limit service, built static for
# linux/ARCH of each of ARCHES, packed by hack/imagepack into one image per
# platform (/manager, /sidecar, /rls: the sidecar is injected from the
# manager's own image) and one OCI image index of them, tagged
# IMAGE:VERSION, written to DIR (default dist/images):
#   slidegate-VERSION.tar       an OCI archive of every platform: kind load image-archive,
#                               ctr -n k8s.io images import --digests
#   oci/                        an OCI image layout: crane push, skopeo copy --all oci:
#   slidegate-VERSION.ref       IMAGE:VERSION@sha256:... of the index (what make dist pins)
# The same commit (the binaries record it, and whether the tree was clean) and
# the same Go give the same digest: every time and owner in the image is fixed.
#   IMAGE   default ghcr.io/slidegate/slidegate (the manifests' name)
#   ARCHES  default the machine's GOARCH; make dist: "amd64 arm64"
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$ROOT/dist/images}
IMAGE=${IMAGE:-ghcr.io/slidegate/slidegate}
VERSION=$(cat "$ROOT/VERSION")
ARCHES=${ARCHES:-$(go env GOARCH)}
# shellcheck source=hack/goenv.sh
. "$ROOT/hack/goenv.sh"
mkdir -p "$DIR"
# The layout holds this build only (a blob of an earlier one would stay).
rm -rf "$DIR/oci"
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
cd "$ROOT"
# One go build per platform for the three (shared packages compile once),
# and the packer for this machine.
for arch in $ARCHES; do
	[ "$arch" = "$(go env GOARCH)" ] || echo "==> linux/$arch (the first build of a platform compiles its dependencies: minutes)" >&2
	GOOS=linux GOARCH=$arch go build -ldflags="-s -w -X github.com/slidegate/slidegate/internal/version.Version=$VERSION" \
		-o "$BIN/$arch/" ./cmd/manager ./cmd/sidecar ./cmd/rls
done
go build -o "$BIN/imagepack" ./hack/imagepack
rm -f "$DIR"/slidegate-"$VERSION"*.tar
tar="$DIR/slidegate-$VERSION.tar"
pinned=$("$BIN/imagepack" -o "$tar" -oci "$DIR/oci" -arch "$(echo "$ARCHES" | tr -s ' ' ,)" -tag "$IMAGE:$VERSION" -entrypoint /manager \
	/manager="$BIN/{arch}/manager" /sidecar="$BIN/{arch}/sidecar" /rls="$BIN/{arch}/rls")
echo "$pinned" >"$DIR/slidegate-$VERSION.ref"
echo "image $pinned (linux: $ARCHES)" >&2
echo "  $tar" >&2
echo "  $DIR/oci (OCI layout)" >&2
