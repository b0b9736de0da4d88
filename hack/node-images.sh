#!/usr/bin/env bash
# Builds the images the real-node tests import into containerd, without a
# container engine, into DIR (default bin/node-images):
#   ghcr.io/slidegate/slidegate:VERSION   make image's release image (hack/image.sh),
#                                         which the install's manifests name as they are
#   slidegate.test/demo-app:node          the demo app (test/node/demoapp)
#   slidegate.test/pause:node             containerd's sandbox image
#   slidegate.test/kube-network-policies:node   with SLIDEGATE_NODE_KNP_BIN set
# The test stand-ins are packed by hack/imagepack too. Tags are fixed and not
# "latest", so the kubelet never tries to pull them (there is no registry).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$ROOT/bin/node-images}
mkdir -p "$DIR/bin"
cd "$ROOT"
# The release the binaries report, as make build stamps it.
VERSION=$(cat "$ROOT/VERSION" 2>/dev/null || echo devel)
# shellcheck source=hack/goenv.sh
. "$ROOT/hack/goenv.sh"
# The upgrade test builds its previous release offline, inside the node:
# its modules are fetched now, while the module proxy is reachable.
"$ROOT/hack/previous-modules.sh"
# The release image, as `make image` builds it (its own tarball and layout).
# hack/node.sh imports every DIR/*.tar as a user imports an image
# (ctr -n k8s.io images import), this one under make image's file name.
"$ROOT/hack/image.sh" "$DIR/release" >/dev/null
rm -f "$DIR"/slidegate*.tar
cp "$DIR/release/slidegate-$VERSION.tar" "$DIR/"
# One go build for the stand-ins: the flags of hack/goenv.sh, so what make
# build, vet and the linters compiled is reused and only the links are new.
go build -ldflags="-s -w" -o "$DIR/bin/" ./test/node/demoapp ./test/node/pause ./hack/imagepack
"$DIR/bin/imagepack" -o "$DIR/demo-app.tar" -tag slidegate.test/demo-app:node -entrypoint /demoapp \
	/demoapp="$DIR/bin/demoapp" >/dev/null
"$DIR/bin/imagepack" -o "$DIR/pause.tar" -tag slidegate.test/pause:node -entrypoint /pause \
	/pause="$DIR/bin/pause" >/dev/null
# kube-network-policies, when hack/node.sh runs it (SLIDEGATE_NODE_KNP_BIN is
# the binary hack/node-bins.sh built); otherwise no image of it.
rm -f "$DIR/kube-network-policies.tar"
if [ -n "${SLIDEGATE_NODE_KNP_BIN:-}" ]; then
	"$DIR/bin/imagepack" -o "$DIR/kube-network-policies.tar" -tag slidegate.test/kube-network-policies:node \
		-entrypoint /kube-network-policies /kube-network-policies="$SLIDEGATE_NODE_KNP_BIN" >/dev/null
fi
echo "$DIR"
