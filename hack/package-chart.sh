#!/usr/bin/env bash
# hack/package-chart.sh IMAGE_REF OUT_DIR: packages charts/slidegate as
# `helm package` does (OUT_DIR/slidegate-<version>.tgz, the chart under
# slidegate/), its values naming IMAGE_REF (repository:tag[@digest]):
# the release's chart pins the image by digest, as its install.yaml does.
# Printed: the package's path. The same inputs give the same bytes.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ref=$1 out=$2
digest=""
if [[ $ref == *@* ]]; then
	digest=${ref##*@} ref=${ref%@*}
fi
tag=${ref##*:} repo=${ref%:*}
if [[ $repo == "$ref" || $tag == */* ]]; then
	echo "package-chart: $1 has no tag" >&2
	exit 1
fi
version=$(sed -n 's/^version: //p' "$ROOT/charts/slidegate/Chart.yaml")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$ROOT/charts/slidegate" "$tmp/slidegate"
# values.yaml's image block: the three keys, each once, at two spaces.
v=$tmp/slidegate/values.yaml
sed -i -e "s|^  repository: .*|  repository: $repo|" -e "s|^  tag: \"\"|  tag: \"$tag\"|" -e "s|^  digest: \"\"|  digest: \"$digest\"|" "$v"
for want in "  repository: $repo" "  tag: \"$tag\"" "  digest: \"$digest\""; do
	if [[ $(grep -cxF "$want" "$v") != 1 ]]; then
		echo "package-chart: values.yaml does not say '$want' once" >&2
		exit 1
	fi
done
mkdir -p "$out"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$tmp" -cf - slidegate |
	gzip -n -9 >"$out/slidegate-$version.tgz"
echo "$out/slidegate-$version.tgz"
