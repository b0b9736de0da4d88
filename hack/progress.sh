#!/usr/bin/env bash
# Runs a `go build -v ...` (or go install -v) and, instead of its list of
# packages, prints one line every 20 s while it runs: what it builds, for how
# long, how many packages it compiled. Errors are printed in full.
#   hack/progress.sh LABEL TOTAL go build -v ...
# TOTAL is the number of packages to expect ("" when unknown).
set -uo pipefail
label=$1 total=$2
shift 2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$SECONDS
"$@" 2>"$log" &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
	for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null && sleep 1; done
	kill -0 "$pid" 2>/dev/null || break
	# -v prints one import path per compiled package; "go: downloading"
	# lines are not packages.
	n=$(grep -cv '^go: ' "$log")
	echo "$label: $((SECONDS - start))s, $n${total:+ of about $total} packages compiled" >&2
done
wait "$pid"
rc=$?
if [ $rc -ne 0 ]; then
	# Everything but the package list: the compiler's errors.
	grep -Ev '^[A-Za-z0-9._~-]+(/[A-Za-z0-9._~+-]+)*$' "$log" >&2
fi
exit $rc
