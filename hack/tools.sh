#!/usr/bin/env bash
# Installs a pinned build tool and links it into bin/. Usage: hack/tools.sh NAME
#
# Tools are built with `go install` from the Go module proxy into a cache
# outside the checkout, keyed by version, so a fresh clone (CI) links the
# cached build instead of compiling again (golangci-lint takes ~3 min cold).
set -euo pipefail

CONTROLLER_TOOLS_VERSION=v0.23.0   # also pinned as a `tool` in go.mod
GOLANGCI_LINT_VERSION=v2.15.0
# promtool checks and unit-tests the alert rules (make test-alerts). Its cold
# build (download + compile, go1.26.8, 2 cores shared with other builds) took
# 15 min wall clock, 9.5 min CPU; with Go's build cache warm, seconds.
PROMETHEUS_VERSION=v0.316.0

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE_ROOT=${SLIDEGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slidegate}

install() { # name version package
	local name=$1 version=$2 pkg=$3 dir
	dir="$CACHE_ROOT/tools/$name-$version"
	if [ ! -x "$dir/$name" ]; then
		echo "tools: installing $name $version" >&2
		GOBIN="$dir" GOFLAGS= go install "$pkg@$version" >&2
	fi
	mkdir -p "$ROOT/bin"
	ln -sfn "$dir/$name" "$ROOT/bin/$name"
	echo "$ROOT/bin/$name"
}

case "${1:-}" in
controller-gen) install controller-gen "$CONTROLLER_TOOLS_VERSION" sigs.k8s.io/controller-tools/cmd/controller-gen ;;
golangci-lint) install golangci-lint "$GOLANGCI_LINT_VERSION" github.com/golangci/golangci-lint/v2/cmd/golangci-lint ;;
promtool) install promtool "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/promtool ;;
*) echo "usage: $0 controller-gen|golangci-lint|promtool" >&2; exit 2 ;;
esac
