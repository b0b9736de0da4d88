#!/usr/bin/env bash
# Builds the binaries of a real single-node cluster from the Go module proxy
# and prints the directory that holds them: kubelet, kube-proxy,
# kube-scheduler, kube-controller-manager (the same wrapper-module build as
# hack/envtest.sh's kube-apiserver), the CNI plugins and CoreDNS, and SIG
# Network's kube-network-policies when SLIDEGATE_NODE_NETWORK_POLICY=enforced.
#
# Cached by version outside the checkout, like the envtest binaries: the first
# build takes about 12 minutes on 2 cores (kubelet ~6, controller-manager ~4),
# later runs and fresh clones reuse it.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}   # equal to hack/envtest.sh's: one control plane, one node
CNI_VERSION=${CNI_VERSION:-1.9.1}
COREDNS_VERSION=${COREDNS_VERSION:-1.14.7}
KNP_VERSION=${KNP_VERSION:-0.8.0}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE_ROOT=${SLIDEGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slidegate}
DEST="$CACHE_ROOT/node/k8s-${K8S_VERSION}_cni-${CNI_VERSION}_coredns-${COREDNS_VERSION}"
# shellcheck source=hack/k8s-wrapper.sh
. "$ROOT/hack/k8s-wrapper.sh"

log() { echo "node-bins: $*" >&2; }

build_k8s() { # names...
	local work
	work=$(mktemp -d)
	trap 'rm -rf "$work"' RETURN
	k8s_wrapper_module "$work" "$K8S_VERSION" slidegate.dev/node-k8s
	for name in "$@"; do
		[ -x "$DEST/$name" ] && continue
		log "building $name v${K8S_VERSION} (kubelet ~6 min, kube-controller-manager ~4 min cold)"
		# Without the version stamp the node reports v0.0.0-master.
		(cd "$work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath \
			-ldflags "-X k8s.io/component-base/version.gitVersion=v${K8S_VERSION}" \
			-o "$DEST/$name.tmp" "k8s.io/kubernetes/cmd/$name")
		mv "$DEST/$name.tmp" "$DEST/$name"
	done
}

build_module() { # module version target=package...
	local mod=$1 version=$2 work spec out pkg
	shift 2
	work=$(mktemp -d)
	trap 'rm -rf "$work"' RETURN
	printf 'module slidegate.dev/node-wrapper\n\ngo 1.26\n\nrequire %s v%s\n' "$mod" "$version" >"$work/go.mod"
	for spec in "$@"; do
		out=$DEST/${spec%%=*} pkg=${spec#*=}
		[ -x "$out" ] && continue
		log "building ${out#"$DEST"/} ($pkg v$version)"
		mkdir -p "$(dirname "$out")"
		(cd "$work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -o "$out.tmp" "$pkg")
		mv "$out.tmp" "$out"
	done
}

mkdir -p "$DEST"
build_k8s kubelet kube-proxy kube-scheduler kube-controller-manager
cni=github.com/containernetworking/plugins
build_module "$cni" "$CNI_VERSION" cni/bridge="$cni/plugins/main/bridge" \
	cni/loopback="$cni/plugins/main/loopback" cni/host-local="$cni/plugins/ipam/host-local" \
	cni/portmap="$cni/plugins/meta/portmap"
build_module github.com/coredns/coredns "$COREDNS_VERSION" coredns=github.com/coredns/coredns
# A NetworkPolicy implementation, only when asked for (hack/node.sh,
# SLIDEGATE_NODE_NETWORK_POLICY=enforced): ~6 min cold.
if [ "${SLIDEGATE_NODE_NETWORK_POLICY:-}" = enforced ]; then
	build_module sigs.k8s.io/kube-network-policies "$KNP_VERSION" kube-network-policies=sigs.k8s.io/kube-network-policies/cmd
fi
echo "$DEST"
