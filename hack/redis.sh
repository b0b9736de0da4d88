#!/usr/bin/env bash
# Installs redis-server and redis-tools (redis-cli, redis-benchmark) from
# Debian's packages when they are missing. Tests start their own servers.
set -euo pipefail
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null && command -v redis-benchmark >/dev/null; then
	exit 0
fi
"$(dirname "$0")/packages.sh" redis-server redis-tools
# A system service started before this script kept it from starting holds
# 6379; tests never use it.
systemctl disable --now redis-server >/dev/null 2>&1 || service redis-server stop >/dev/null 2>&1 || true
