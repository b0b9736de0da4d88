#!/usr/bin/env bash
# make dist: the release set of VERSION in DIR (default dist/), after make
# image has written DIR/images:
#   install.yaml                                 config/default, the image pinned by tag and digest
#   slidegate-VERSION.tgz                        the Helm chart (VERSION without v), its values
#                                                pinning the image the same way
#   kubectl-slidegate_VERSION_OS_ARCH.tar.gz     the plugin (kubectl-slidegate, LICENSE) for
#                                                linux and darwin, amd64 and arm64
#   slidegate.yaml                               its krew manifest (hack/release)
#   RELEASE_NOTES.md                             CHANGELOG.md's section of VERSION
#   checksums.txt                                SHA-256 of every file above and the image archive
# Archives are the same for the same commit and Go: fixed times and owners.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$ROOT/dist}
VERSION=$(cat "$ROOT/VERSION")
# shellcheck source=hack/goenv.sh
. "$ROOT/hack/goenv.sh"
cd "$ROOT"
ref=$(cat "$DIR/images/slidegate-$VERSION.ref")
hack/render-install.sh "$ref" >"$DIR/install.yaml"
chart=$(hack/package-chart.sh "$ref" "$DIR")
rm -f "$DIR"/kubectl-slidegate_*.tar.gz
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp LICENSE "$tmp/"
for platform in linux/amd64 linux/arm64 darwin/amd64 darwin/arm64; do
	os=${platform%/*} arch=${platform#*/}
	echo "==> kubectl-slidegate for $os/$arch (the first build of a platform compiles its dependencies: minutes)" >&2
	GOOS=$os GOARCH=$arch go build -ldflags "-s -w -X github.com/slidegate/slidegate/internal/version.Version=$VERSION" \
		-o "$tmp/kubectl-slidegate" ./cmd/kubectl-slidegate
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$tmp" -cf - kubectl-slidegate LICENSE |
		gzip -n -9 >"$DIR/kubectl-slidegate_${VERSION}_${os}_${arch}.tar.gz"
done
go run ./hack/release -version "$VERSION" -changelog CHANGELOG.md -out "$DIR" "$DIR"/kubectl-slidegate_*.tar.gz
(cd "$DIR" && sha256sum install.yaml "${chart##*/}" slidegate.yaml RELEASE_NOTES.md kubectl-slidegate_*.tar.gz \
	images/slidegate-"$VERSION".tar >checksums.txt)
echo "dist: slidegate $VERSION, image $ref" >&2
(cd "$DIR" && ls -1 install.yaml "${chart##*/}" slidegate.yaml RELEASE_NOTES.md checksums.txt kubectl-slidegate_*.tar.gz) | sed 's/^/  /' >&2
echo "apply with: kubectl apply --server-side -f $DIR/install.yaml" >&2
echo "or: helm install slidegate $chart -n slidegate-system" >&2
