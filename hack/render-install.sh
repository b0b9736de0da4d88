#!/usr/bin/env bash
# Prints the complete install (config/default) with the image set to $1:
# IMAGE[:TAG][@sha256:DIGEST] (no tag: the release in VERSION). With a
# digest, the manager and the sidecar it injects run IMAGE:TAG@DIGEST, pinned
# (make dist pins make image's digest).
# kubectl's built-in kustomize has no `edit set image`, so a throwaway overlay
# does the same without changing tracked files.
set -euo pipefail
img=${1:?usage: $0 IMAGE[:TAG][@sha256:DIGEST]}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "$root/config/.overlay-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
digest=
if [[ $img == *@* ]]; then
	digest=${img#*@} img=${img%%@*}
fi
# A tag is what follows the last ':' unless that ':' is a registry port.
name=$img tag=$(cat "$root/VERSION")
if [[ ${img##*/} == *:* ]]; then
	name=${img%:*} tag=${img##*:}
fi
cat >"$tmp/kustomization.yaml" <<YAML
resources:
  - ../default
images:
  - name: ghcr.io/slidegate/slidegate
    newName: $name
    newTag: $tag${digest:+
    digest: $digest}
# The injected sidecar runs the manager's image: copy it again after the
# image change (config/default's own copy ran before it).
replacements:
  - source:
      kind: Deployment
      name: slidegate-controller-manager
      fieldPath: spec.template.spec.containers.[name=manager].image
    targets:
      - select:
          kind: Deployment
          name: slidegate-controller-manager
        fieldPaths:
          - spec.template.spec.containers.[name=manager].env.[name=SLIDEGATE_SIDECAR_IMAGE].value
YAML
kubectl kustomize "$tmp"
