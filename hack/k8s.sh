#!/usr/bin/env bash
# Builds Kubernetes binaries from the Go module proxy and prints the directory
# that holds them. Usage: hack/k8s.sh NAME...
#
#   kube-apiserver etcd                  the envtest control plane (hack/envtest.sh)
#   kubelet kube-proxy kube-scheduler kube-controller-manager   the real node (hack/node-bins.sh)
#
# Why from source: setup-envtest and release downloads need addresses these
# machines cannot reach; the Go module proxy is reachable.
#
# How it stays cheap (measured on 2 cores: the README's "Two commands"):
#   - one wrapper module for every binary and one `go build` for all that are
#     missing, so a package compiles once and links run beside compiles;
#     etcd is the release Kubernetes pins (its go.mod), in the same module;
#   - the wrapper requires this checkout's own dependency versions too (MVS
#     takes the higher of the two), and builds with the flags of
#     hack/goenv.sh, so k8s.io/api, client-go, apiserver, grpc... compile once
#     for kube-apiserver and for slidegate's own binaries, linters and vet;
#   - no DWARF or symbol table (-s -w): nobody debugs these binaries here;
#   - cached by version outside the checkout: fresh clones (CI) reuse them.
# It prints progress every 20 s while it builds (stderr), so a first run is
# never minutes of silence.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2} # minor must equal the k8s.io/* library minor in go.mod
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE_ROOT=${SLIDEGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slidegate}
DEST="$CACHE_ROOT/k8s/v${K8S_VERSION}"
# shellcheck source=hack/goenv.sh
. "$ROOT/hack/goenv.sh"

log() { echo "k8s: $*" >&2; }

pkg_of() {
	case $1 in
	etcd) echo go.etcd.io/etcd/server/v3 ;;
	kube-apiserver | kubelet | kube-proxy | kube-scheduler | kube-controller-manager) echo "k8s.io/kubernetes/cmd/$1" ;;
	*) echo "hack/k8s.sh: unknown binary $1" >&2; return 2 ;;
	esac
}

# wrapper_module DIR writes DIR/go.mod: a throwaway module that requires
# k8s.io/kubernetes@vK8S_VERSION, so that `go build k8s.io/kubernetes/cmd/<name>`
# works from the Go module proxy. Every staging module k8s.io/kubernetes
# replaces with ./staging/... is published as k8s.io/<name> v0.<minor>.<patch>;
# the wrapper points at those instead (the list is read from the downloaded
# go.mod, not hard-coded). Then this checkout's requirements, so that the
# modules both use resolve to one version (SLIDEGATE_K8S_ALIGN=0: not).
wrapper_module() {
	local dir=$1 gomod
	gomod=$(cd "$dir" && printf 'module slidegate.dev/k8s\n' >go.mod &&
		go mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
	[ -f "$gomod" ] || { log "cannot find go.mod of k8s.io/kubernetes@v${K8S_VERSION}"; return 1; }
	{
		echo "module slidegate.dev/k8s"
		echo
		echo "go $(sed -n 's/^go //p' "$ROOT/go.mod")"
		echo
		echo "require k8s.io/kubernetes v${K8S_VERSION}"
		grep -E '^[[:space:]]*(replace[[:space:]]+)?k8s\.io/[^ ]+ => \./staging/' "$gomod" |
			sed -E 's/^[[:space:]]*(replace[[:space:]]+)?(k8s\.io\/[^ ]+) => .*/replace \2 => \2 v0.'"${K8S_VERSION#1.}"'/'
		if [ "${SLIDEGATE_K8S_ALIGN:-1}" != 0 ]; then
			"$ROOT/hack/requires.sh"
		fi
	} >"$dir/go.mod"
}

# build NAME... builds the named binaries that DEST lacks in one go build.
build() {
	local missing=() pkgs=() name work total start
	for name in "$@"; do
		pkg_of "$name" >/dev/null
		[ -x "$DEST/$name" ] || missing+=("$name")
	done
	[ ${#missing[@]} -gt 0 ] || return 0
	for name in "${missing[@]}"; do pkgs+=("$(pkg_of "$name")"); done
	work=$(mktemp -d)
	# shellcheck disable=SC2064 # expand now: work is local
	trap "rm -rf '$work'" EXIT
	mkdir -p "$work/out" "$DEST"
	log "building ${missing[*]} v${K8S_VERSION} from the Go module proxy, first time only: downloading its modules, then about 5 min for kube-apiserver and etcd and about 5 min more for the node's four on 2 cores (measured cold, 2026-12-07)"
	wrapper_module "$work"
	total=$(cd "$work" && GOFLAGS="$GOFLAGS -mod=mod" go list -deps "${pkgs[@]}" | wc -l)
	start=$SECONDS
	if ! (cd "$work" && GOFLAGS="$GOFLAGS -mod=mod" "$ROOT/hack/progress.sh" "k8s: building ${missing[*]}" "$total" \
		go build -v -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=v${K8S_VERSION}" \
		-o "$work/out/" "${pkgs[@]}"); then
		log "building ${missing[*]} failed; SLIDEGATE_K8S_ALIGN=0 builds with Kubernetes' own dependency versions"
		return 1
	fi
	for name in "${missing[@]}"; do
		# go build names a main package by its path's last element that is
		# not a major version: etcd's (go.etcd.io/etcd/server/v3) is server.
		if [ "$name" = etcd ]; then mv "$work/out/server" "$DEST/etcd"; else mv "$work/out/$name" "$DEST/$name"; fi
	done
	log "built ${missing[*]} in $((SECONDS - start))s"
}

[ $# -gt 0 ] || { echo "usage: $0 kube-apiserver|etcd|kubelet|kube-proxy|kube-scheduler|kube-controller-manager..." >&2; exit 2; }
build "$@"
echo "$DEST"
