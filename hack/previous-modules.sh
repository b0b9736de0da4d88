#!/usr/bin/env bash
# Downloads into the module cache the modules of the release the upgrade
# test starts from (previousCommit in test/node/upgrade_test.go). The test
# builds that release inside the node's network namespace, offline
# (hack/node-image-from.sh, GOPROXY=off), so every module its go.mod names
# must be cached first; this checkout's go.mod moves on (a dependency
# bumped), and on a fresh machine the release's older versions are nowhere.
# Run where the module proxy is reachable: before hack/node.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PREV=$(sed -n 's/^[[:space:]]*previousCommit[[:space:]]*=[[:space:]]*"\([0-9a-f]\{40\}\)".*/\1/p' test/node/upgrade_test.go)
[ -n "$PREV" ] || { echo "previous-modules: no previousCommit in test/node/upgrade_test.go" >&2; exit 1; }
if ! git cat-file -e "$PREV^{commit}" 2>/dev/null; then
	# The test says why and how to fetch it (a shallow clone); nothing to
	# download for a tree we cannot read.
	echo "previous-modules: commit $PREV is not in this clone; the upgrade test will say so" >&2
	exit 0
fi
MODS=$(mktemp -d)
trap 'rm -rf "$MODS"' EXIT
git show "$PREV:go.mod" >"$MODS/go.mod"
git show "$PREV:go.sum" >"$MODS/go.sum"
# No arguments: every module the release's go.mod requires (go 1.17+ lists
# the indirect ones too), with the go.mod files its build list loads.
(cd "$MODS" && GOFLAGS=-mod=mod go mod download)
