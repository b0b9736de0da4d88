#!/usr/bin/env bash
# Passes `go test` output through and prints a closing summary line:
# "N passed, N failed" counts packages (ok / FAIL / no test files).
# Exits non-zero when any package failed, so a pipe keeps the failure.
set -uo pipefail
ok=0 fail=0 none=0
while IFS= read -r line; do
	printf '%s\n' "$line"
	case "$line" in
	ok[[:space:]]*) ok=$((ok + 1)) ;;
	FAIL[[:space:]]*) fail=$((fail + 1)) ;;
	*"[no test files]"*) none=$((none + 1)) ;;
	esac
done
echo "($none packages have no test files)"
echo "packages: $ok passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$ok" -gt 0 ]
