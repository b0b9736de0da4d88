#!/usr/bin/env bash
# Builds the images the real-node tests import into containerd, without a
# container engine: static binaries packed by hack/nodeimage into tarballs in
# DIR (default bin/node-images). Tags are fixed and not "latest", so the
# kubelet never tries to pull them (there is no registry here).
#   slidegate.test/slidegate:node   /manager, /sidecar and /rls, like the Dockerfile
#   slidegate.test/demo-app:node    the demo app (test/node/demoapp)
#   slidegate.test/pause:node       containerd's sandbox image
#   slidegate.test/kube-network-policies:node   with SLIDEGATE_NODE_KNP_BIN set
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$ROOT/bin/node-images}
mkdir -p "$DIR/bin"
cd "$ROOT"
# The release the binaries report, as make build stamps it.
VERSION=$(cat "$ROOT/VERSION" 2>/dev/null || echo devel)
# shellcheck source=hack/goenv.sh
. "$ROOT/hack/goenv.sh"
# One go build for all: the flags of hack/goenv.sh, so everything make build,
# vet and the linters compiled is reused and only the links are new.
go build -ldflags="-s -w -X github.com/slidegate/slidegate/internal/version.Version=$VERSION" -o "$DIR/bin/" \
	./cmd/manager ./cmd/sidecar ./cmd/rls ./test/node/demoapp ./test/node/pause ./hack/nodeimage
"$DIR/bin/nodeimage" -o "$DIR/slidegate.tar" -tag slidegate.test/slidegate:node -entrypoint /manager \
	/manager="$DIR/bin/manager" /sidecar="$DIR/bin/sidecar" /rls="$DIR/bin/rls"
"$DIR/bin/nodeimage" -o "$DIR/demo-app.tar" -tag slidegate.test/demo-app:node -entrypoint /demoapp \
	/demoapp="$DIR/bin/demoapp"
"$DIR/bin/nodeimage" -o "$DIR/pause.tar" -tag slidegate.test/pause:node -entrypoint /pause \
	/pause="$DIR/bin/pause"
# kube-network-policies, when hack/node.sh runs it (SLIDEGATE_NODE_KNP_BIN is
# the binary hack/node-bins.sh built); otherwise no image of it.
rm -f "$DIR/kube-network-policies.tar"
if [ -n "${SLIDEGATE_NODE_KNP_BIN:-}" ]; then
	"$DIR/bin/nodeimage" -o "$DIR/kube-network-policies.tar" -tag slidegate.test/kube-network-policies:node \
		-entrypoint /kube-network-policies /kube-network-policies="$SLIDEGATE_NODE_KNP_BIN"
fi
echo "$DIR"
