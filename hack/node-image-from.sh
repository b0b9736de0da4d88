#!/usr/bin/env bash
# Builds the slidegate image of another source tree (an earlier release,
# extracted with `git archive`) for the real-node upgrade test, as
# hack/node-images.sh builds this checkout's: its cmd/manager, cmd/sidecar and
# cmd/rls built statically from SRC, packed by this checkout's hack/imagepack
# into OUT.tar under TAG (fixed, not "latest": there is no registry).
#   hack/node-image-from.sh SRC TAG OUT.tar
# It builds offline (GOPROXY=off): the test runs it inside the node's network
# namespace, which has no route out, so every module SRC needs must already be
# in the module cache (hack/previous-modules.sh fetched the release's own).
#
# The release's code, this checkout's dependency versions: SRC's go.mod also
# requires every module at this checkout's version and Go's minimal version
# selection takes the higher of the two, as hack/k8s.sh does for Kubernetes.
# Built with the release's own versions, nothing compiled for this checkout
# was reused (a bump of golang.org/x/sys recompiles everything above it): a
# cold make test spent 356 s in this build. What the upgrade test exercises
# is the release's code (its config, keys, script and flags), which this
# does not change. SLIDEGATE_PREVIOUS_ALIGN=0: the release's own versions.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ $# -eq 3 ] || { echo "usage: $0 SRC TAG OUT.tar" >&2; exit 2; }
SRC=$(cd "$1" && pwd) TAG=$2 OUT=$3
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
# The flags of hack/goenv.sh, so that what both trees share compiles once.
export GOPROXY=off GOFLAGS="-mod=readonly -trimpath" CGO_ENABLED=0
# The release the binaries report, if that tree has the version package.
VERSION=${TAG##*:}
if [ "${SLIDEGATE_PREVIOUS_ALIGN:-1}" != 0 ]; then
	# go.sum: both trees' hashes (the module cache holds both).
	"$ROOT/hack/requires.sh" >>"$SRC/go.mod"
	cat "$ROOT/go.sum" >>"$SRC/go.sum"
	export GOFLAGS="-mod=mod -trimpath"
fi
# One go build for the three: packages they share compile once.
(cd "$SRC" && go build -ldflags="-s -w -X github.com/slidegate/slidegate/internal/version.Version=$VERSION" \
	-o "$BIN/" ./cmd/manager ./cmd/sidecar ./cmd/rls)
(cd "$ROOT" && go build -o "$BIN/imagepack" ./hack/imagepack)
"$BIN/imagepack" -o "$OUT" -tag "$TAG" -entrypoint /manager \
	/manager="$BIN/manager" /sidecar="$BIN/sidecar" /rls="$BIN/rls" >/dev/null
