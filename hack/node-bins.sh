#!/usr/bin/env bash
# Prints a directory with the binaries of a real single-node cluster, built or
# installed as needed: kubelet, kube-proxy, kube-scheduler,
# kube-controller-manager (hack/k8s.sh, beside the envtest control plane),
# CoreDNS (from the Go module proxy), the CNI plugins (Debian's
# containernetworking-plugins: cni/ links to /usr/lib/cni), and SIG
# Network's kube-network-policies when SLIDEGATE_NODE_NETWORK_POLICY=enforced.
#
# Cached by version outside the checkout; cold on 2 cores, after the envtest
# control plane: the four Kubernetes binaries ~4 min (523 s of CPU in a cold
# make test), CoreDNS seconds (below).
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}   # equal to hack/k8s.sh's: one control plane, one node
COREDNS_VERSION=${COREDNS_VERSION:-1.14.7}
KNP_VERSION=${KNP_VERSION:-0.8.0}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE_ROOT=${SLIDEGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slidegate}
DEST="$CACHE_ROOT/node/k8s-${K8S_VERSION}_coredns-${COREDNS_VERSION}-node"
# shellcheck source=hack/goenv.sh
. "$ROOT/hack/goenv.sh"

log() { echo "node-bins: $*" >&2; }

build_module() { # module version target=package...
	local mod=$1 version=$2 work spec out pkg
	shift 2
	work=$(mktemp -d)
	# shellcheck disable=SC2064 # expand now: work is local
	trap "rm -rf '$work'" RETURN
	printf 'module slidegate.dev/node-wrapper\n\ngo 1.26\n\nrequire %s v%s\n' "$mod" "$version" >"$work/go.mod"
	for spec in "$@"; do
		out=$DEST/${spec%%=*} pkg=${spec#*=}
		[ -x "$out" ] && continue
		log "building ${out#"$DEST"/} ($pkg v$version, first time only)"
		mkdir -p "$(dirname "$out")"
		(cd "$work" && GOFLAGS="$GOFLAGS -mod=mod" go build -ldflags "-s -w" -o "$out.tmp" "$pkg")
		mv "$out.tmp" "$out"
	done
}

# build_coredns builds CoreDNS with only the plugins of hack/node.sh's
# Corefile (bind, errors, cache, kubernetes), as CoreDNS allows (its
# core/dnsserver example: import the plugins, set dnsserver.Directives in
# their order of core/dnsserver/zdirectives.go), and at this checkout's
# dependency versions (the higher of both, as hack/k8s.sh), so that
# client-go and the API types compile once for all: every plugin at its own
# versions cost a cold make test 412 s of CPU, this one 568 packages of
# which 90 are not the control plane's or slidegate's.
build_coredns() {
	local out=$DEST/coredns work
	[ -x "$out" ] && return 0
	log "building coredns (github.com/coredns/coredns v$COREDNS_VERSION, the node's plugins only, first time only)"
	work=$(mktemp -d)
	# shellcheck disable=SC2064 # expand now: work is local
	trap "rm -rf '$work'" RETURN
	{
		printf 'module slidegate.dev/node-coredns\n\ngo 1.26\n\nrequire github.com/coredns/coredns v%s\n' "$COREDNS_VERSION"
		"$ROOT/hack/requires.sh"
	} >"$work/go.mod"
	cat >"$work/main.go" <<'GO'
// Command coredns is CoreDNS with the plugins of the node's Corefile only.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

// The plugins' order is CoreDNS's (core/dnsserver/zdirectives.go).
func init() { dnsserver.Directives = []string{"bind", "errors", "cache", "kubernetes"} }

func main() { coremain.Run() }
GO
	(cd "$work" && GOFLAGS="$GOFLAGS -mod=mod" go build -ldflags "-s -w" -o "$out.tmp" .)
	mv "$out.tmp" "$out"
}

mkdir -p "$DEST"
k8s=$("$ROOT/hack/k8s.sh" kubelet kube-proxy kube-scheduler kube-controller-manager)
for name in kubelet kube-proxy kube-scheduler kube-controller-manager; do
	ln -sfn "$k8s/$name" "$DEST/$name"
done
"$ROOT/hack/packages.sh" containernetworking-plugins
ln -sfn /usr/lib/cni "$DEST/cni"
build_coredns
# A NetworkPolicy implementation, only when asked for (hack/node.sh,
# SLIDEGATE_NODE_NETWORK_POLICY=enforced): ~6 min cold.
if [ "${SLIDEGATE_NODE_NETWORK_POLICY:-}" = enforced ]; then
	build_module sigs.k8s.io/kube-network-policies "$KNP_VERSION" kube-network-policies=sigs.k8s.io/kube-network-policies/cmd
fi
echo "$DEST"
