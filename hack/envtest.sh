#!/usr/bin/env bash
# Prints the directory to use as KUBEBUILDER_ASSETS: the envtest control plane
# (kube-apiserver and etcd), built from the Go module proxy by hack/k8s.sh the
# first time (about 5 minutes on 2 cores, with progress), cached after.
#
# Why not setup-envtest: it downloads release binaries, and our machines reach
# only the Go module proxy and Debian's packages. Building from source works
# everywhere that `go build` does. bin/envtest is only a link to the cache.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=$("$ROOT/hack/k8s.sh" kube-apiserver etcd)
# kubectl is optional for envtest; link the machine's one if present so that
# envtest-based tools that shell out to it find a matching layout.
if [ ! -e "$DEST/kubectl" ] && command -v kubectl >/dev/null 2>&1; then
	ln -sf "$(command -v kubectl)" "$DEST/kubectl"
fi
mkdir -p "$ROOT/bin"
ln -sfn "$DEST" "$ROOT/bin/envtest"
echo "$DEST"
