#!/usr/bin/env bash
# Runs a `go build -v ...` (or go install -v) and, instead of its list of
# packages, prints one line every 20 s while it runs: what it builds, for how
# long, how many packages it compiled. Errors are printed in full.
#   hack/progress.sh LABEL TOTAL go build -v ...
# TOTAL is the number of packages to expect ("" when unknown), or "@CMD": a
# command that prints it, run only when the build outlasts its first 20 s
# (a warm build is over before: it costs a warm build nothing).
set -uo pipefail
label=$1 total=$2
shift 2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$SECONDS
"$@" 2>"$log" &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
	# Checked every 0.2 s: a warm build is not kept waiting for the tick.
	for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null && sleep 0.2; done
	kill -0 "$pid" 2>/dev/null || break
	# -v prints one import path per compiled package; "go: downloading"
	# lines are not packages.
	n=$(grep -cv '^go: ' "$log")
	case $total in @*) total=$(eval "${total#@}" 2>/dev/null) || total= ;; esac
	echo "$label: $((SECONDS - start))s, $n${total:+ of about $total} packages compiled" >&2
done
wait "$pid"
rc=$?
if [ $rc -ne 0 ]; then
	# Everything but the package list: the compiler's errors.
	grep -Ev '^[A-Za-z0-9._~-]+(/[A-Za-z0-9._~+-]+)*$' "$log" >&2
fi
exit $rc
