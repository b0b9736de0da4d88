#!/usr/bin/env bash
# Prints a `require path version` line for every requirement of this
# checkout's go.mod, direct or indirect, block or single line. Appended to a
# wrapper module's go.mod (hack/k8s.sh, hack/node-bins.sh,
# hack/node-image-from.sh), Go's minimal version selection then takes the
# higher of both versions, so what those builds share with slidegate
# compiles once.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
awk '/^require \(/ {b=1; next} b && /^\)/ {b=0; next}
	b && NF >= 2 {print "require " $1 " " $2}
	/^require [^(]/ {print "require " $2 " " $3}' "$ROOT/go.mod"
