#!/usr/bin/env bash
# Installs the Debian packages named on the command line that are missing,
# with one `apt-get update` for all of them (and none when nothing is
# missing). Usage: hack/packages.sh PACKAGE...
#
# Services the packages ship (redis-server, containerd) are not started:
# the tests start their own processes, and a system redis-server would hold
# port 6379. policy-rc.d is Debian's switch for that, removed on exit.
set -euo pipefail
missing=()
for p in "$@"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -gt 0 ] || exit 0
SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo
echo "packages: installing ${missing[*]} from Debian" >&2
out=$(mktemp)
cleanup=(rm -f "$out")
if [ ! -e /usr/sbin/policy-rc.d ]; then
	printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
	$SUDO chmod +x /usr/sbin/policy-rc.d
	cleanup+=(/usr/sbin/policy-rc.d)
fi
trap '$SUDO "${cleanup[@]}"' EXIT
# dpkg's unpacking is shown only when the install fails.
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$out" 2>&1; then
	cat "$out" >&2
	echo "packages: installing ${missing[*]} failed" >&2
	exit 1
fi
