# Sourced by hack/envtest.sh and hack/node-bins.sh.
#
# k8s_wrapper_module DIR VERSION MODULE writes DIR/go.mod: a throwaway module
# that requires k8s.io/kubernetes@vVERSION, so that `go build
# k8s.io/kubernetes/cmd/<name>` works from the Go module proxy. Every staging
# module k8s.io/kubernetes replaces with ./staging/... is published as
# k8s.io/<name> v0.<minor>.<patch>; the wrapper points at those instead. The
# list is read from the downloaded go.mod, not hard-coded.
k8s_wrapper_module() {
	local dir=$1 version=$2 module=$3 gomod
	gomod=$(cd "$dir" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v${version}" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
	[ -f "$gomod" ] || { echo "cannot find go.mod of k8s.io/kubernetes@v${version}" >&2; return 1; }
	{
		echo "module $module"
		echo
		echo "go $(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')"
		echo
		echo "require k8s.io/kubernetes v${version}"
		echo
		grep -E '^[[:space:]]*(replace[[:space:]]+)?k8s\.io/[^ ]+ => \./staging/' "$gomod" |
			sed -E 's/^[[:space:]]*(replace[[:space:]]+)?(k8s\.io\/[^ ]+) => .*/replace \2 => \2 v0.'"${version#1.}"'/'
	} >"$dir/go.mod"
}
