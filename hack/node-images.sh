#!/usr/bin/env bash
# Builds the images the real-node tests import into containerd, without a
# container engine, into DIR (default bin/node-images):
#   ghcr.io/slidegate/slidegate:VERSION   make image's release image (hack/image.sh),
#                                         which the install's manifests name as they are
#   slidegate.test/demo-app:node          the demo app (test/node/demoapp)
#   slidegate.test/pause:node             containerd's sandbox image
#   docker.io/library/redis:7             stand-ins for the public images docs/quickstart.md
#   registry.k8s.io/e2e-test-images/agnhost:TAG   names (the node reaches no registry): this
#                                         machine's redis-server, and the demo app
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
# The quickstart's images under the names it uses, so that the node test runs
# its commands as written (TestNode/Quickstart). Redis is Debian's
# redis-server and redis-cli with the shared libraries they load (the image
# has no libc of its own), working in /tmp as the nonroot user; the real
# redis:7 works in /data. The demo app answers as agnhost netexec does.
"$ROOT/hack/redis.sh"
redis_files=()
for b in redis-server redis-cli; do
	p=$(command -v "$b")
	redis_files+=("/$b=$p")
	for lib in $(ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
		redis_files+=("$lib=$lib")
	done
done
mapfile -t redis_files < <(printf '%s\n' "${redis_files[@]}" | sort -u)
"$DIR/bin/imagepack" -o "$DIR/redis.tar" -tag docker.io/library/redis:7 -workdir /tmp "${redis_files[@]}" >/dev/null
agnhost=$(grep -o 'registry.k8s.io/e2e-test-images/agnhost:[^ "]*' config/samples/demo_app.yaml)
"$DIR/bin/imagepack" -o "$DIR/agnhost.tar" -tag "$agnhost" -entrypoint /demoapp /demoapp="$DIR/bin/demoapp" >/dev/null
# kube-network-policies, when hack/node.sh runs it (SLIDEGATE_NODE_KNP_BIN is
# the binary hack/node-bins.sh built); otherwise no image of it.
rm -f "$DIR/kube-network-policies.tar"
if [ -n "${SLIDEGATE_NODE_KNP_BIN:-}" ]; then
	"$DIR/bin/imagepack" -o "$DIR/kube-network-policies.tar" -tag slidegate.test/kube-network-policies:node \
		-entrypoint /kube-network-policies /kube-network-policies="$SLIDEGATE_NODE_KNP_BIN" >/dev/null
fi
echo "$DIR"
