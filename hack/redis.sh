#!/usr/bin/env bash
# Installs redis-server and redis-tools (redis-cli, redis-benchmark) from
# Debian's packages when they are missing. Tests start their own servers.
set -euo pipefail
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null && command -v redis-benchmark >/dev/null; then
	exit 0
fi
SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo
echo "redis: installing redis-server and redis-tools from Debian" >&2
$SUDO apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends redis-server redis-tools >&2
# The package starts a system service; tests never use it, and it holds 6379.
$SUDO systemctl disable --now redis-server >/dev/null 2>&1 || $SUDO service redis-server stop >/dev/null 2>&1 || true
