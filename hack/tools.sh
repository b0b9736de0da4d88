#!/usr/bin/env bash
# Installs a pinned tool, links it into bin/ and prints its path.
# Usage: hack/tools.sh golangci-lint|promtool|helm
#
# Tools live in a cache outside the checkout, keyed by version, so a fresh
# clone (CI) links the cached one instead of building it again.
#   golangci-lint  built with `go install` (no package or module ships it
#                  prebuilt): ~1 min on 2 cores when the build cache has the
#                  Kubernetes builds, ~3 min alone.
#   promtool       taken from Debian's prometheus package (seconds): building
#                  it took 15 min cold. hack/tools.sh promtool-source builds
#                  PROMETHEUS_VERSION instead (Prometheus 3's rule semantics).
#   helm           a `tool` in go.mod (the version the chart test renders
#                  with), built once with the project's own dependencies, so
#                  that only its ~350 packages of its own compile (~1.5 min
#                  of CPU cold); the node test installs the chart with it.
# controller-gen is a `tool` in go.mod: `go tool controller-gen` builds it
# with the project's own dependencies and caches it (Go's build cache).
set -euo pipefail

GOLANGCI_LINT_VERSION=v2.15.0
PROMETHEUS_VERSION=v0.316.0

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE_ROOT=${SLIDEGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slidegate}

link() { # name dir
	mkdir -p "$ROOT/bin"
	ln -sfn "$2/$1" "$ROOT/bin/$1"
	echo "$ROOT/bin/$1"
}

install() { # name version package
	local name=$1 version=$2 pkg=$3 dir
	dir="$CACHE_ROOT/tools/$name-$version"
	if [ ! -x "$dir/$name" ]; then
		echo "tools: building $name $version (go install, first time only)" >&2
		# shellcheck source=hack/goenv.sh
		. "$ROOT/hack/goenv.sh"
		GOBIN="$dir" go install "$pkg@$version" >&2
	fi
	link "$name" "$dir"
}

# debian_promtool extracts promtool from Debian's prometheus package, without
# installing the package (its service, its web assets): apt-get download and
# dpkg-deb -x, as any user.
debian_promtool() {
	local version dir work
	version=$(apt-cache policy prometheus 2>/dev/null | sed -n 's/^ *Candidate: //p')
	if [ -z "$version" ] || [ "$version" = "(none)" ]; then
		echo "tools: updating Debian's package lists (no candidate for prometheus)" >&2
		SUDO=
		[ "$(id -u)" = 0 ] || SUDO=sudo
		$SUDO apt-get update -qq >&2
		version=$(apt-cache policy prometheus | sed -n 's/^ *Candidate: //p')
	fi
	if [ -z "$version" ] || [ "$version" = "(none)" ]; then
		echo "tools: Debian has no prometheus package here; try: hack/tools.sh promtool-source" >&2
		return 1
	fi
	dir="$CACHE_ROOT/tools/promtool-deb-${version//[:~+]/_}"
	if [ ! -x "$dir/promtool" ]; then
		echo "tools: extracting promtool from Debian's prometheus $version" >&2
		work=$(mktemp -d)
		# shellcheck disable=SC2064 # expand now
		trap "rm -rf '$work'" RETURN
		# _apt cannot write into a root-owned temporary directory.
		chmod 755 "$work"
		# Quiet when it works; again, with its messages, when it does not.
		(
			cd "$work" || exit 1
			apt-get download -q "prometheus=$version" >/dev/null 2>&1 || apt-get download "prometheus=$version" >&2
		)
		dpkg-deb -x "$work"/prometheus_*.deb "$work/x"
		mkdir -p "$dir"
		cp "$work/x/usr/bin/promtool" "$dir/promtool.tmp"
		mv "$dir/promtool.tmp" "$dir/promtool"
	fi
	link promtool "$dir"
}

# go_tool NAME PACKAGE: a `tool` of go.mod, built into the cache by its
# module's version.
go_tool() {
	local name=$1 pkg=$2 version dir
	version=$(cd "$ROOT" && go list -m -f '{{.Version}}' "${pkg%/cmd/*}")
	dir="$CACHE_ROOT/tools/$name-$version"
	if [ ! -x "$dir/$name" ]; then
		echo "tools: building $name $version (go build of go.mod's tool, first time only)" >&2
		# shellcheck source=hack/goenv.sh
		. "$ROOT/hack/goenv.sh"
		mkdir -p "$dir"
		(cd "$ROOT" && go build -ldflags="-s -w" -o "$dir/$name.tmp" "$pkg") >&2
		mv "$dir/$name.tmp" "$dir/$name"
	fi
	link "$name" "$dir"
}

case "${1:-}" in
golangci-lint) install golangci-lint "$GOLANGCI_LINT_VERSION" github.com/golangci/golangci-lint/v2/cmd/golangci-lint ;;
promtool) debian_promtool ;;
promtool-source) install promtool "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/promtool ;;
helm) go_tool helm helm.sh/helm/v4/cmd/helm ;;
*) echo "usage: $0 golangci-lint|promtool|promtool-source|helm" >&2; exit 2 ;;
esac
