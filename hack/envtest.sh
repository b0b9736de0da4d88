#!/usr/bin/env bash
# Builds the envtest control plane (kube-apiserver, etcd) from the Go module
# proxy and prints the directory to use as KUBEBUILDER_ASSETS.
#
# Why not setup-envtest: it downloads release binaries, and our machines reach
# only the Go module proxy and Debian's packages. Building from source works
# everywhere that `go build` does.
#
# The binaries (~200 MB) are cached outside the checkout, by version, so that a
# fresh clone (which is how CI runs) reuses them; bin/envtest is only a link.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}   # minor must equal the k8s.io/* library minor in go.mod
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE_ROOT=${SLIDEGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slidegate}
DEST="$CACHE_ROOT/envtest/k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}"

# shellcheck source=hack/k8s-wrapper.sh
. "$ROOT/hack/k8s-wrapper.sh"

log() { echo "envtest: $*" >&2; }

build_apiserver() {
	local work
	work=$(mktemp -d)
	trap 'rm -rf "$work"' RETURN
	k8s_wrapper_module "$work" "$K8S_VERSION" slidegate.dev/envtest-apiserver
	log "building kube-apiserver v${K8S_VERSION} (about 10 minutes on 2 cores the first time)"
	(cd "$work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -o "$DEST/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
	mv "$DEST/kube-apiserver.tmp" "$DEST/kube-apiserver"
}

build_etcd() {
	local work
	work=$(mktemp -d)
	trap 'rm -rf "$work"' RETURN
	printf 'module slidegate.dev/envtest-etcd\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 v%s\n' "$ETCD_VERSION" >"$work/go.mod"
	log "building etcd v${ETCD_VERSION}"
	(cd "$work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -o "$DEST/etcd.tmp" go.etcd.io/etcd/server/v3)
	mv "$DEST/etcd.tmp" "$DEST/etcd"
}

mkdir -p "$DEST"
[ -x "$DEST/etcd" ] || build_etcd
[ -x "$DEST/kube-apiserver" ] || build_apiserver
# kubectl is optional for envtest; link the machine's one if present so that
# envtest-based tools that shell out to it find a matching layout.
if [ ! -e "$DEST/kubectl" ] && command -v kubectl >/dev/null 2>&1; then
	ln -sf "$(command -v kubectl)" "$DEST/kubectl"
fi

mkdir -p "$ROOT/bin"
ln -sfn "$DEST" "$ROOT/bin/envtest"
echo "$DEST"
