#!/usr/bin/env bash
# Brings up a real single-node Kubernetes cluster on this machine, runs a
# command against it, and tears everything down again:
#
#   hack/node.sh run -- go test ./test/node      (what `make test-node` does)
#   hack/node.sh run -- bash                     (a shell on the node)
#
# The node is etcd + kube-apiserver (hack/envtest.sh), kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy (nftables mode), CoreDNS
# (hack/node-bins.sh), containerd + runc and the CNI bridge plugin (Debian's
# packages). Every daemon runs in a private network and mount namespace
# held by one process: pod, Service and node addresses exist only in there,
# and nothing is sent anywhere else. The command runs in the same network
# namespace, with KUBECONFIG set to a cluster-admin kubeconfig and
# SLIDEGATE_NODE_* variables describing the node (see `env` below).
#
# Why each setting: ../shared/NODE.md (each one was a real failure first).
# Teardown runs on every exit path (trap EXIT): daemons, shims, containers and
# the namespace holder are stopped by PID, their cgroups removed, and the state
# directory deleted. Nothing is left behind, so runs can follow each other.
#
# Images: every *.tar in $SLIDEGATE_NODE_IMAGES (image archives; by default
# hack/node-images.sh builds them from this checkout, make image's among them)
# is imported into containerd before the kubelet starts, as `kind load
# image-archive` does (ctr images import --digests; make image's archive names
# the image by its digest too, so an install pinned to it finds it); the sandbox ("pause")
# image is slidegate.test/pause:node from that directory. The test gets the
# directory as SLIDEGATE_NODE_IMAGES.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
NODE_NAME=slidegate-node
NODE_IP=10.200.0.1            # on lo inside the namespace only
POD_CIDR=10.244.0.0/24
POD_GATEWAY=10.244.0.1
SERVICE_CIDR=10.96.0.0/24
KUBERNETES_SERVICE_IP=10.96.0.1
PAUSE_IMAGE=slidegate.test/pause:node
# The kubelet re-reads projected ConfigMaps on each pod sync; its default
# period is 1m (plus jitter). 10s keeps the tests short; a cluster's own
# setting is reported by `kubectl get --raw /api/v1/nodes/NODE/proxy/configz`.
SYNC_FREQUENCY=${SLIDEGATE_NODE_SYNC_FREQUENCY:-10s}

log() { echo "node: $(date +%T) $*" >&2; }
die() { log "FAILED: $*"; exit 1; }

need_packages() {
	"$ROOT/hack/packages.sh" containerd runc nftables iptables conntrack openssl util-linux iproute2 curl
	# A system containerd the package may have started; the node never uses it.
	service containerd stop >/dev/null 2>&1 || true
}

# ns CMD... runs CMD inside the node's namespaces.
ns() { nsenter -t "$HOLDER" -n -m -- "$@"; }

# bg NAME CMD... starts a daemon inside the namespaces, logging to $STATE/log.
bg() {
	local name=$1
	shift
	# nsenter itself, not the function ns: $! is then the daemon (nsenter
	# execs it), which the teardown stops by that PID.
	nsenter -t "$HOLDER" -n -m -- "$@" >"$STATE/log/$name.log" 2>&1 &
	PIDS+=("$!")
	disown "$!" # the teardown kills it: no job report
	echo "$!" >"$STATE/pid/$name"
}

wait_for() { # seconds description command...
	local deadline=$((SECONDS + $1)) what=$2
	shift 2
	until "$@" >/dev/null 2>&1; do
		[ $SECONDS -lt $deadline ] || die "$what not ready after ${deadline}s; logs in $STATE/log (kept: SLIDEGATE_NODE_KEEP_LOGS)"
		sleep 0.3
	done
}

# --- teardown ---------------------------------------------------------------

# Every PID that belongs to this node: in the holder's mount namespace
# (daemons, shims), in its network namespace (what the command started, such
# as a test's redis-server), or in one of the node's cgroups (containers).
node_pids() {
	local mntns netns p
	mntns=$(readlink "/proc/$HOLDER/ns/mnt" 2>/dev/null) || true
	netns=$(readlink "/proc/$HOLDER/ns/net" 2>/dev/null) || true
	for p in /proc/[0-9]*; do
		p=${p#/proc/}
		[ "$p" = $$ ] && continue
		if [ -n "$mntns" ] && [ "$(readlink "/proc/$p/ns/mnt" 2>/dev/null)" = "$mntns" ]; then echo "$p"; fi
		if [ -n "$netns" ] && [ "$(readlink "/proc/$p/ns/net" 2>/dev/null)" = "$netns" ]; then echo "$p"; fi
	done
	[ -n "${CGROUP_ROOT:-}" ] && find /sys/fs/cgroup/*/"$CGROUP_ROOT" -name cgroup.procs -exec cat {} + 2>/dev/null
	return 0
}

teardown() {
	local rc=$? pids p i
	trap - EXIT INT TERM
	set +e
	log "tearing down"
	if [ -n "${HOLDER:-}" ]; then
		# Nothing of the node needs to shut down cleanly (its state is
		# deleted next): TERM the daemons, then KILL every process of the
		# node until none is left, so nothing restarts what is stopped.
		for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
		for i in $(seq 1 30); do
			pids=$(node_pids | sort -u)
			[ -z "$pids" ] && break
			# shellcheck disable=SC2086
			kill -KILL $pids 2>/dev/null
			sleep 0.2
		done
		kill -KILL "$HOLDER" 2>/dev/null
	fi
	if [ -n "${CGROUP_ROOT:-}" ]; then
		for d in /sys/fs/cgroup/*/"$CGROUP_ROOT"; do
			[ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
		done
		left=$(ls -d /sys/fs/cgroup/*/"$CGROUP_ROOT" 2>/dev/null)
		[ -n "$left" ] && log "cgroups left behind: $left"
	fi
	for d in "${CREATED_DIRS[@]}"; do rmdir "$d" 2>/dev/null; done
	if [ -n "${STATE:-}" ] && [ -d "$STATE" ]; then
		if [ $rc -ne 0 ] || [ -n "${SLIDEGATE_NODE_KEEP_LOGS:-}" ]; then
			mkdir -p "${SLIDEGATE_NODE_LOG_DIR:-/tmp/slidegate-node-logs}"
			cp -r "$STATE/hardcoded/var/log/pods" "$STATE/log/pods" 2>/dev/null
			cp -r "$STATE/log" "${SLIDEGATE_NODE_LOG_DIR:-/tmp/slidegate-node-logs}/$(basename "$STATE")" 2>/dev/null &&
				log "daemon logs kept in ${SLIDEGATE_NODE_LOG_DIR:-/tmp/slidegate-node-logs}/$(basename "$STATE")"
		fi
		rm -rf "$STATE"
	fi
	log "down (exit $rc)"
	exit $rc
}

# --- certificates -----------------------------------------------------------

cert() { # name subject [sans]
	local name=$1 subj=$2 sans=${3:-} ext
	ext=$STATE/pki/$name.ext
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=digitalSignature,keyEncipherment"
		if [ -n "$sans" ]; then
			echo "extendedKeyUsage=serverAuth,clientAuth"
			echo "subjectAltName=$sans"
		else
			echo "extendedKeyUsage=clientAuth"
		fi
	} >"$ext"
	openssl req -new -newkey rsa:2048 -nodes -keyout "$STATE/pki/$name.key" -subj "$subj" \
		-out "$STATE/pki/$name.csr" 2>/dev/null
	openssl x509 -req -in "$STATE/pki/$name.csr" -CA "$STATE/pki/ca.crt" -CAkey "$STATE/pki/ca.key" \
		-CAcreateserial -days 2 -extfile "$ext" -out "$STATE/pki/$name.crt" 2>/dev/null
}

kubeconfig() { # file cert-name
	cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: node
  cluster:
    server: https://$NODE_IP:6443
    certificate-authority: $STATE/pki/ca.crt
users:
- name: user
  user:
    client-certificate: $STATE/pki/$2.crt
    client-key: $STATE/pki/$2.key
contexts:
- name: node
  context: {cluster: node, user: user}
current-context: node
EOF
}

make_pki() {
	mkdir -p "$STATE/pki"
	openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=slidegate-node-ca" \
		-keyout "$STATE/pki/ca.key" -out "$STATE/pki/ca.crt" 2>/dev/null
	cert apiserver "/CN=kube-apiserver" \
		"IP:$NODE_IP,IP:$KUBERNETES_SERVICE_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	cert admin "/O=system:masters/CN=slidegate-node-admin"
	cert kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
	cert node "/O=system:nodes/CN=system:node:$NODE_NAME"
	openssl genrsa -out "$STATE/pki/sa.key" 2048 2>/dev/null
	openssl rsa -in "$STATE/pki/sa.key" -pubout -out "$STATE/pki/sa.pub" 2>/dev/null
	kubeconfig "$STATE/admin.kubeconfig" admin
	kubeconfig "$STATE/node.kubeconfig" node
}

# --- namespaces, cgroups, mounts -------------------------------------------

make_namespace() {
	unshare --net --mount --propagation private --fork sleep infinity &
	local unshare_pid=$!
	PIDS+=("$unshare_pid")
	disown "$unshare_pid" # its end at teardown is expected, not news
	# unshare forks: the holder is its child, the process inside the namespaces.
	for _ in $(seq 1 50); do
		HOLDER=$(pgrep -P "$unshare_pid" sleep || true)
		[ -n "$HOLDER" ] && break
		sleep 0.1
	done
	[ -n "$HOLDER" ] || die "namespace holder did not start"
	ns ip link set lo up
	ns ip addr add "$NODE_IP/32" dev lo
	ns ip link add cni0 type bridge
	ns ip addr add "$POD_GATEWAY/24" dev cni0
	ns ip link set cni0 up
	# No default route in here: Service traffic from the node needs a route
	# before kube-proxy's DNAT rewrites it.
	ns ip route add "$SERVICE_CIDR" dev cni0
	ns sysctl -qw net.ipv4.ip_forward=1

	# The kubelet writes these global sysctls; give it private files instead.
	local f v
	mkdir -p "$STATE/sysctl"
	for f in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1; do
		v=${f#*=} f=${f%=*}
		echo "$v" >"$STATE/sysctl/${f//\//_}"
		ns mount --bind "$STATE/sysctl/${f//\//_}" "/proc/sys/$f"
	done
	# Paths that containerd (its shims, pod network namespaces), the CNI
	# plugins and the kubelet (device plugins, pod logs) hard-code.
	for f in /run/containerd /run/netns /var/lib/cni /var/lib/kubelet /var/log/containers /var/log/pods; do
		mkdir -p "$STATE/hardcoded$f"
		# A mount point the machine lacks is created for the run and removed
		# by the teardown.
		[ -d "$f" ] || { mkdir -p "$f" && CREATED_DIRS+=("$f"); }
		ns mount --bind "$STATE/hardcoded$f" "$f"
	done
	# The kubelet wants mount propagation under its root directory.
	ns mount --bind "$STATE" "$STATE"
	ns mount --make-rshared "$STATE"
}

make_cgroups() {
	local d parent
	CGROUP_ROOT=slidegate-node-$$
	for d in /sys/fs/cgroup/*/; do
		[ -f "$d/cgroup.procs" ] || continue
		mkdir -p "$d$CGROUP_ROOT"
		# A v1 cpuset starts empty; it must inherit its parent's CPUs and nodes.
		if [ -f "$d/cpuset.cpus" ]; then
			parent=$d
			cat "$parent/cpuset.cpus" >"$d$CGROUP_ROOT/cpuset.cpus"
			cat "$parent/cpuset.mems" >"$d$CGROUP_ROOT/cpuset.mems"
		fi
	done
}

# --- daemons ----------------------------------------------------------------

start_control_plane() {
	bg etcd "$ENVTEST/etcd" --data-dir "$STATE/etcd" \
		--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
		--listen-peer-urls http://127.0.0.1:2380 --unsafe-no-fsync
	bg kube-apiserver "$ENVTEST/kube-apiserver" \
		--etcd-servers=http://127.0.0.1:2379 \
		--advertise-address="$NODE_IP" --bind-address=0.0.0.0 --secure-port=6443 \
		--service-cluster-ip-range="$SERVICE_CIDR" \
		--tls-cert-file="$STATE/pki/apiserver.crt" --tls-private-key-file="$STATE/pki/apiserver.key" \
		--client-ca-file="$STATE/pki/ca.crt" \
		--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
		--service-account-key-file="$STATE/pki/sa.pub" \
		--service-account-signing-key-file="$STATE/pki/sa.key" \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--kubelet-client-certificate="$STATE/pki/kubelet-client.crt" \
		--kubelet-client-key="$STATE/pki/kubelet-client.key" \
		--kubelet-preferred-address-types=InternalIP
	wait_for 120 kube-apiserver ns kubectl --kubeconfig "$STATE/admin.kubeconfig" get --raw /readyz
	bg kube-controller-manager "$NODE_BIN/kube-controller-manager" \
		--kubeconfig="$STATE/admin.kubeconfig" --leader-elect=false \
		--bind-address=127.0.0.1 --secure-port=10257 \
		--service-account-private-key-file="$STATE/pki/sa.key" \
		--root-ca-file="$STATE/pki/ca.crt" --use-service-account-credentials=true \
		--service-cluster-ip-range="$SERVICE_CIDR" --allocate-node-cidrs=false
	bg kube-scheduler "$NODE_BIN/kube-scheduler" \
		--kubeconfig="$STATE/admin.kubeconfig" --leader-elect=false \
		--bind-address=127.0.0.1 --secure-port=10259
}

start_containerd() {
	mkdir -p "$STATE/containerd" "$STATE/cni/net.d"
	cat >"$STATE/containerd/config.toml" <<EOF
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
[grpc]
  address = "$STATE/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # runc cannot set oom_score_adj in this VM (no CAP_SYS_RESOURCE).
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$NODE_BIN/cni"
    conf_dir = "$STATE/cni/net.d"
EOF
	cat >"$STATE/cni/net.d/10-slidegate-node.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "slidegate-node",
  "plugins": [{
    "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "dataDir": "$STATE/cni/ipam",
             "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GATEWAY"}]],
             "routes": [{"dst": "0.0.0.0/0"}]}
  }, {
    "type": "portmap", "capabilities": {"portMappings": true}, "snat": true
  }]
}
EOF
	bg containerd containerd --config "$STATE/containerd/config.toml"
	wait_for 60 containerd ns ctr --address "$STATE/containerd/containerd.sock" version
	local img
	for img in "$IMAGES"/*.tar; do
		ns ctr --address "$STATE/containerd/containerd.sock" -n k8s.io images import --digests "$img" >/dev/null ||
			die "importing $img"
	done
	# The listing is read whole first: with pipefail, `ctr | grep -q` fails
	# whenever grep exits on its match before ctr has written the rest (ctr
	# then dies of SIGPIPE), which happened once in CI.
	local images
	images=$(ns ctr --address "$STATE/containerd/containerd.sock" -n k8s.io images ls -q)
	grep -qx "$PAUSE_IMAGE" <<<"$images" ||
		die "no $PAUSE_IMAGE among the images in $IMAGES"
}

start_node() {
	mkdir -p "$STATE/kubelet"
	cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This VM's host is cgroup v1, which kubelet >= 1.35 refuses by default.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
containerRuntimeEndpoint: unix://$STATE/containerd/containerd.sock
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization: {mode: Webhook}
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
resolvConf: ""
podLogsDirectory: /var/log/pods
syncFrequency: $SYNC_FREQUENCY
failSwapOn: false
# The machine's disk is shared with other work: only evict when truly full,
# and never collect the imported images (there is no registry to pull from).
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
	bg kubelet "$NODE_BIN/kubelet" --config="$STATE/kubelet.yaml" \
		--kubeconfig="$STATE/node.kubeconfig" --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" \
		--root-dir="$STATE/kubelet" --cert-dir="$STATE/kubelet/pki"
	cat >"$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/admin.kubeconfig}
hostnameOverride: $NODE_NAME
mode: ${SLIDEGATE_NODE_PROXY_MODE:-nftables}
clusterCIDR: $POD_CIDR
# Leave the machine-wide nf_conntrack_max alone.
conntrack: {maxPerCore: 0}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
EOF
	bg kube-proxy "$NODE_BIN/kube-proxy" --config="$STATE/kube-proxy.yaml"
	cat >"$STATE/Corefile" <<EOF
.:53 {
    bind $NODE_IP
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $STATE/admin.kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
EOF
	bg coredns "$NODE_BIN/coredns" -conf "$STATE/Corefile"
	wait_for 120 "node $NODE_NAME" ns kubectl --kubeconfig "$STATE/admin.kubeconfig" wait --for=condition=Ready \
		--timeout=2s "node/$NODE_NAME"
}

# The bridge CNI plugin enforces no NetworkPolicy. With
# SLIDEGATE_NODE_NETWORK_POLICY=enforced, SIG Network's kube-network-policies
# (nftables + NFQUEUE, a privileged hostNetwork pod: hack/node-netpol.yaml)
# does, and the tests are told so through the same variable.
start_network_policy() {
	# kube-network-policies sends new connections to user space with
	# nftables' queue expression, which needs a kernel with CONFIG_NFT_QUEUE
	# (this VM's kernel has CONFIG_NETFILTER_XT_TARGET_NFQUEUE only: the
	# controller then fails every sync with "netlink receive: no such file
	# or directory" and enforces nothing).
	ns nft add table inet slidegate-probe &&
		ns nft add chain inet slidegate-probe c '{ type filter hook postrouting priority 0; }' || die "nftables does not work on the node"
	local ok=0
	ns nft add rule inet slidegate-probe c queue num 1 bypass 2>/dev/null && ok=1
	ns nft delete table inet slidegate-probe
	[ $ok = 1 ] || die "SLIDEGATE_NODE_NETWORK_POLICY=enforced: this kernel has no nftables queue expression (CONFIG_NFT_QUEUE), which kube-network-policies needs"
	ns kubectl --kubeconfig "$STATE/admin.kubeconfig" apply -f "$ROOT/hack/node-netpol.yaml" >/dev/null
	wait_for 120 "kube-network-policies" ns kubectl --kubeconfig "$STATE/admin.kubeconfig" -n kube-system \
		rollout status daemonset/kube-network-policies --timeout=2s
}

# --- main -------------------------------------------------------------------

usage() { echo "usage: $0 run -- COMMAND [ARGS...]" >&2; exit 2; }

[ "${1:-}" = run ] || usage
shift
[ "${1:-}" = -- ] && shift
[ $# -gt 0 ] || usage
[ "$(id -u)" = 0 ] || die "needs root (unshare, nsenter, mounts, cgroups)"

need_packages
ENVTEST=$("$ROOT/hack/envtest.sh")
NODE_BIN=$("$ROOT/hack/node-bins.sh")
NETWORK_POLICY=${SLIDEGATE_NODE_NETWORK_POLICY:-}
if [ "$NETWORK_POLICY" = enforced ]; then
	export SLIDEGATE_NODE_KNP_BIN=$NODE_BIN/kube-network-policies
fi
IMAGES=${SLIDEGATE_NODE_IMAGES:-$("$ROOT/hack/node-images.sh")}

PIDS=()
CREATED_DIRS=()
HOLDER=
STATE=$(mktemp -d /tmp/sgnode.XXXXXX)   # short: unix socket paths are limited to 108 bytes
mkdir -p "$STATE/log" "$STATE/pid"
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
start=$SECONDS
log "starting in $STATE"
make_pki
make_namespace
make_cgroups
start_control_plane
start_containerd
start_node
if [ "$NETWORK_POLICY" = enforced ]; then
	start_network_policy
fi
log "up in $((SECONDS - start))s; running: $*"

export KUBECONFIG=$STATE/admin.kubeconfig
export SLIDEGATE_NODE_NAME=$NODE_NAME SLIDEGATE_NODE_IP=$NODE_IP SLIDEGATE_NODE_STATE=$STATE
export SLIDEGATE_NODE_SYNC_FREQUENCY=$SYNC_FREQUENCY
export SLIDEGATE_NODE_NETWORK_POLICY=$NETWORK_POLICY
export SLIDEGATE_NODE_IMAGES=$IMAGES
set +e
# Only the network namespace: the command sees the node's addresses, and the
# machine's own files (the checkout, Go's caches) rather than the node's mounts.
nsenter -t "$HOLDER" -n -- "$@"
rc=$?
set -e
exit $rc
