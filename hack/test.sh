#!/usr/bin/env bash
# `make test`: every check and test, in phases, and a table of what each
# phase took at the end (also when one fails), so that a regression in the
# time of `make test` shows on every run.
#
# Foreground phases run one after another and stop at the first failure.
# Three run in the background, beside them ("beside" in the table):
#   - golangci-lint's build and helm's (the node test installs the chart),
#     at a lower priority, from the start;
#   - the real node's test, which waits most of its time (rollouts, windows,
#     the kubelet; measured: 30% of 2 cores when alone): the checks and the
#     race build run beside it at a lower priority than it (nice), so it
#     keeps the CPU it asks for and the compilers take the rest; then the
#     package tests, at its priority. Both are timing tests that derive their
#     tolerances from what they measure and pass under stress-ng (make
#     test-stress): each is a lighter load for the other than that.
# Order: what the node needs, the node's test, beside it: verify, vet, lint,
# alerts, the race build, the package tests; then the node's end.
#
# Environment: TEST_PACKAGES (Debian's packages, from the Makefile);
# SLIDEGATE_TEST_TIMES=FILE also writes the table to FILE.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
# shellcheck source=hack/goenv.sh
. hack/goenv.sh

T0=$EPOCHREALTIME
TIMES=$(mktemp)
LOGS=$(mktemp -d)
declare -A BG_PID=()
FAILED=
NODE_LOG=$LOGS/node.out

sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a - b }'; }

# cpu_seconds FILE: writes to FILE the CPU time (user + system) of this shell
# and of every process it waited for, from `times` ("0m1.5s 0m0.2s" twice).
# Called last in a phase's subshell, it is the phase's CPU: what a 2-core
# machine spends, where wall time only shows what it waited for. `times`
# runs in this shell, never in a pipe or $(...): a forked shell starts at 0.
cpu_seconds() {
	times >"$1.t"
	awk '{ for (i = 1; i <= NF; i++) { split($i, t, "m"); sub("s", "", t[2]); s += t[1] * 60 + t[2] } }
		END { printf "%.0f", s }' "$1.t" >"$1"
	rm -f "$1.t"
}

# record NAME START RC KIND [SECONDS] [CPU]: one row of the table.
record() {
	local secs=${5:-}
	[ -n "$secs" ] || secs=$(sub "$EPOCHREALTIME" "$2")
	printf '%s|%s|%s|%s|%s|%s\n' "$1" "$(sub "$2" "$T0")" "$secs" "$3" "$4" "${6:--}" >>"$TIMES"
}

# kill_tree PID: a background phase and everything it started.
kill_tree() {
	local child
	for child in $(pgrep -P "$1"); do kill_tree "$child"; done
	kill "$1" 2>/dev/null
}

table() {
	local total
	total=$(sub "$EPOCHREALTIME" "$T0")
	cpu_seconds "$LOGS/cpu.total"
	{
		echo
		echo "make test: phases (SECONDS of wall time; CPU: seconds of CPU, user and system, of the processes the phase ran;"
		echo "'beside' ran in the background beside the phases after it started; the node's CPU includes the upgrade test's)"
		printf '  %-28s %8s %8s %8s  %s\n' PHASE STARTED SECONDS CPU RESULT
		sort -t'|' -k2,2n "$TIMES" | while IFS='|' read -r name start secs rc kind cpu; do
			local result=ok
			[ "$rc" = 0 ] || result="FAILED ($rc)"
			[ "$kind" = fg ] || result="$result, beside"
			printf '  %-28s %8.0f %8.0f %8s  %s\n' "$name" "$start" "$secs" "$cpu" "$result"
		done
		printf '  %-28s %8s %8.0f %8s  %s\n' total "" "$total" "$(cat "$LOGS/cpu.total")" "${FAILED:+FAILED in $FAILED}"
	} | tee -a "${SLIDEGATE_TEST_TIMES:-/dev/null}"
}

finish() {
	local rc=$?
	trap - EXIT
	local pid name
	# A background phase that failed while a foreground one ran was never
	# awaited: its log is shown here, or it would go with $LOGS unread.
	for name in "${!BG_PID[@]}"; do
		if awk -F'|' -v n="$name" '$1 == n && $4 != 0 && $5 == "bg" { f = 1 } END { exit !f }' "$TIMES"; then
			echo "==> $name (failed in the background):" >&2
			cat "$LOGS/$name.log" >&2
		fi
	done
	for pid in "${BG_PID[@]}"; do kill_tree "$pid"; done
	table
	rm -rf "$TIMES" "$LOGS"
	[ -z "$FAILED" ] || rc=1
	exit "$rc"
}
trap finish EXIT
trap 'FAILED=${FAILED:-interrupted}; exit 130' INT TERM

# phase NAME CMD...: a foreground phase; the first failure ends the run. It
# runs in a subshell, whose `times` is then the phase's CPU alone.
phase() {
	local name=$1 start=$EPOCHREALTIME rc cpu
	shift
	echo "==> $name" >&2
	cpu=$(mktemp)
	(
		"$@"
		rc=$?
		cpu_seconds "$cpu"
		exit "$rc"
	)
	rc=$?
	record "$name" "$start" "$rc" fg "" "$(cat "$cpu")"
	rm -f "$cpu"
	if [ "$rc" -ne 0 ]; then
		FAILED=$name
		exit "$rc"
	fi
}

# beside NAME CMD...: a background phase at a lower priority (nice
# BESIDE_NICE, 10 by default); its output is kept and shown when it is
# awaited.
beside() {
	local name=$1
	shift
	echo "==> $name (in the background)" >&2
	(
		start=$EPOCHREALTIME
		if [ "${BESIDE_NICE:-10}" = 0 ]; then
			"$@" # may be a function, which nice cannot run
		else
			nice -n "${BESIDE_NICE:-10}" "$@"
		fi >"$LOGS/$name.log" 2>&1
		rc=$?
		cpu_seconds "$LOGS/$name.cpu"
		record "$name" "$start" "$rc" bg "" "$(cat "$LOGS/$name.cpu")"
		exit "$rc"
	) &
	BG_PID[$name]=$!
}

# await NAME: waits for a background phase and shows its output; its
# failure ends the run.
await() {
	local name=$1 rc
	wait "${BG_PID[$name]}"
	rc=$?
	unset "BG_PID[$name]"
	grep -v '^node-bins: \|^k8s: .*packages compiled' "$LOGS/$name.log" >&2 || true
	if [ "$rc" -ne 0 ]; then
		FAILED=$name
		exit "$rc"
	fi
}

# --- what the tests need ------------------------------------------------------
# Two tools build beside everything from the start, at a lower priority: they
# take the CPU the phases leave (apt's downloads, the module downloads, the
# links, which use one core).
beside "golangci-lint build" hack/tools.sh golangci-lint
# helm, for the node test's chart install.
beside "helm build" hack/tools.sh helm
# shellcheck disable=SC2086 # a list of package names
phase "Debian packages" hack/packages.sh ${TEST_PACKAGES:-redis-server redis-tools}
# The control plane and the node's four in one go build: the packages they
# share compile once (after `make demo`, only the node's four are missing).
phase "k8s: control plane, node" hack/k8s.sh kube-apiserver etcd kubelet kube-proxy kube-scheduler kube-controller-manager
ASSETS=$(hack/envtest.sh)
phase "node binaries" hack/node-bins.sh
IMAGES=$LOGS/node-images
phase "node images" hack/node-images.sh "$IMAGES"
await "helm build"

# --- the real node, beside the checks ------------------------------------------
# The node test waits much of its time (rollouts, windows, the kubelet), so
# the checks and the race build run beside it, at a lower priority than it:
# the node keeps the CPU it asks for, the compilers take the rest.
run_node() {
	SLIDEGATE_NODE_IMAGES=$IMAGES hack/node.sh run -- \
		go test -vet=off -count=1 -v -timeout 25m ./test/node 2>&1 | tee "$NODE_LOG" | hack/test-summary.sh
}
BESIDE_NICE=0 beside "node" run_node
# The phases beside it: nicer than the node.
NICE="nice -n 10"

# --- checks, beside the node ---------------------------------------------------
phase "promtool" hack/tools.sh promtool
# shellcheck disable=SC2086 # NICE is a command and its arguments
phase "verify" $NICE make --no-print-directory verify
# shellcheck disable=SC2086
phase "vet" $NICE go vet ./...
await "golangci-lint build"
# shellcheck disable=SC2086
phase "lint" $NICE make --no-print-directory lint
run_alerts() {
	PROMTOOL=$(hack/tools.sh promtool) $NICE go test -vet=off -count=1 -v ./test/monitoring 2>&1 | hack/test-summary.sh
}
phase "alerts (promtool)" run_alerts
# Compile every package and test for the race detector (no link, no run)
# while the node test runs; the packages phase then only links and runs.
RACE_PACKAGES=$(go list ./... | grep -v -e /test/node -e /test/monitoring)
# shellcheck disable=SC2086 # a command and a list of packages
phase "race build" $NICE env CGO_ENABLED=1 go list -export -test -race -deps $RACE_PACKAGES >/dev/null

# --- tests, beside the node ----------------------------------------------------
# go test's own vet pass is off: the vet phase ran every analyzer already.
# The test binaries are linked without DWARF and symbol table (-s -w): about
# 45 race binaries, whose links took 224 s of CPU, take about 30% less (a
# package's link measured 10.9 s of CPU with them, 7.3 s without); stack
# traces and race reports keep their files and lines (pclntab stays), only a
# debugger would miss them.
run_packages() {
	# shellcheck disable=SC2086 # a list of packages
	KUBEBUILDER_ASSETS=$ASSETS CGO_ENABLED=1 go test -race -vet=off -ldflags='-s -w' -count=1 $RACE_PACKAGES 2>&1 | hack/test-summary.sh
}
phase "packages (race, envtest)" run_packages

# The node test's log names the upgrade test's time: that row is taken out
# of the node's.
await_node() {
	local rc start secs cpu upgrade up_rc rest
	wait "${BG_PID[node]}"
	rc=$?
	unset "BG_PID[node]"
	cat "$LOGS/node.log" >&2
	start=$(sed -n 's/^node|\([0-9.]*\)|.*/\1/p' "$TIMES")
	secs=$(sed -n 's/^node|[0-9.]*|\([0-9.]*\)|.*/\1/p' "$TIMES")
	cpu=$(sed -n 's/^node|.*|\([0-9-]*\)$/\1/p' "$TIMES")
	upgrade=$(sed -n 's/^--- \(PASS\|FAIL\): TestUpgrade (\([0-9.]*\)s)$/\1 \2/p' "$NODE_LOG" | tail -1)
	if [ -n "$upgrade" ] && [ -n "$secs" ]; then
		up_rc=0
		[ "${upgrade% *}" = PASS ] || up_rc=1
		rest=$(sub "$secs" "${upgrade#* }")
		sed -i '/^node|/d' "$TIMES"
		# The rows hold offsets from T0: record takes absolute starts.
		record "node (up, tests, down)" "$(awk -v a="$T0" -v b="$start" 'BEGIN { printf "%.6f", a + b }')" "$rc" bg "$rest" "$cpu"
		# It runs last on the node (before the teardown): its start is about then.
		record "upgrade test (on the node)" "$(awk -v a="$T0" -v b="$start" -v c="$rest" 'BEGIN { printf "%.6f", a + b + c }')" "$up_rc" bg "${upgrade#* }"
	fi
	if [ "$rc" -ne 0 ]; then
		FAILED=node
		exit "$rc"
	fi
}
echo "==> waiting for the node test" >&2
await_node
