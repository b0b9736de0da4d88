#!/usr/bin/env bash
# Builds the images the real-node tests import into containerd, without a
# container engine: static binaries packed by hack/nodeimage into tarballs in
# DIR (default bin/node-images). Tags are fixed and not "latest", so the
# kubelet never tries to pull them (there is no registry here).
#   slidegate.test/slidegate:node   /manager, /sidecar and /rls, like the Dockerfile
#   slidegate.test/demo-app:node    the demo app (test/node/demoapp)
#   slidegate.test/pause:node       containerd's sandbox image
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$ROOT/bin/node-images}
mkdir -p "$DIR/bin"
cd "$ROOT"
# The release the binaries report, as make build stamps it.
VERSION=$(cat "$ROOT/VERSION" 2>/dev/null || echo devel)
build() { CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X github.com/slidegate/slidegate/internal/version.Version=$VERSION" -o "$DIR/bin/$1" "$2"; }
build manager ./cmd/manager
build sidecar ./cmd/sidecar
build rls ./cmd/rls
build demoapp ./test/node/demoapp
build pause ./test/node/pause
go build -o "$DIR/bin/nodeimage" ./hack/nodeimage
"$DIR/bin/nodeimage" -o "$DIR/slidegate.tar" -tag slidegate.test/slidegate:node -entrypoint /manager \
	/manager="$DIR/bin/manager" /sidecar="$DIR/bin/sidecar" /rls="$DIR/bin/rls"
"$DIR/bin/nodeimage" -o "$DIR/demo-app.tar" -tag slidegate.test/demo-app:node -entrypoint /demoapp \
	/demoapp="$DIR/bin/demoapp"
"$DIR/bin/nodeimage" -o "$DIR/pause.tar" -tag slidegate.test/pause:node -entrypoint /pause \
	/pause="$DIR/bin/pause"
echo "$DIR"
