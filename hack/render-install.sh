#!/usr/bin/env bash
# Prints the complete install (config/default) with the image set to $1.
# kubectl's built-in kustomize has no `edit set image`, so a throwaway overlay
# does the same without changing tracked files.
set -euo pipefail
img=${1:?usage: $0 IMAGE[:TAG]}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "$root/config/.overlay-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
name=${img%:*}
tag=latest
[ "$name" != "$img" ] && tag=${img##*:}
cat >"$tmp/kustomization.yaml" <<YAML
resources:
  - ../default
images:
  - name: ghcr.io/slidegate/slidegate
    newName: $name
    newTag: $tag
YAML
kubectl kustomize "$tmp"
