# Shared helpers for hack/*.sh (sourced, never run). Sourcing it also reads hack/versions.env.
LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hack/versions.env
. "$LIB_DIR/versions.env"

# The test bed's shared settings, each overridable from the environment: the state directory
# (PKI, data, logs, PID files, images), the tool cache and its bin directory, and the ports the
# scripts must agree on.
bed_defaults() {
  local repo; repo=$(cd "$LIB_DIR/.." && pwd)
  STATE=${SANDBOXRUN_STATE:-$repo/.k8s-local}
  CACHE_ROOT=${SANDBOXRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sandboxrun-operator}
  BIN=$CACHE_ROOT/$(tools_dir_name)/bin
  APISERVER_PORT=${APISERVER_PORT:-16443}
  S3_PORT=${S3_PORT:-19000}
  REGISTRY_PORT=${REGISTRY_PORT:-15000}
  # The real node's name and address (its bridge's; the apiserver advertises it, see real-node.sh).
  REAL_NODE_NAME=${REAL_NODE_NAME:-real-node-0}
  REAL_NODE_IP=${REAL_NODE_IP:-10.244.0.1}
  # The Service ClusterIP range (the apiserver's --service-cluster-ip-range; kube-router, the real
  # node's NetworkPolicy enforcer, must be told it too). Fixed: the apiserver's certificate names
  # its first address, 10.0.0.1 (hack/local-cluster.sh pki).
  SERVICE_CIDR=10.0.0.0/24
  # The object-store emulators (hack/store-emulators.sh): fake-gcs-server and Azurite's blob service.
  GCS_PORT=${GCS_PORT:-19100}
  AZURITE_PORT=${AZURITE_PORT:-19200}
  # gofakes3, the S3 server that lists open multipart uploads (hack/store-emulators.sh).
  GOFAKES3_PORT=${GOFAKES3_PORT:-19300}
}

# The cache directory of the object-store emulators, keyed by their pinned versions. Kept apart from
# tools_dir_name so that bumping an emulator does not rebuild Kubernetes.
emulators_dir_name() {
  echo "emulators-fake-gcs-server-$FAKE_GCS_SERVER_VERSION-azurite-$AZURITE_VERSION"
}

# The cache directory of gofakes3, keyed by its version alone, so adding or bumping it leaves the
# other emulators' cache (and the beds already using it) untouched.
gofakes3_dir_name() {
  echo "gofakes3-$GOFAKES3_VERSION"
}

# The cache directory of the real node's NetworkPolicy enforcer (kube-router), keyed by its version
# alone, like gofakes3's: adding or bumping it leaves the Kubernetes build untouched.
kube_router_dir_name() {
  echo "kube-router-$KUBE_ROUTER_VERSION"
}

# The cache directory of Kueue's manager binary and CRD YAML (hack/kueue.sh), keyed by its version
# alone, like kube-router's.
kueue_dir_name() {
  echo "kueue-$KUEUE_VERSION"
}

# The cache directory of gVisor's runsc and containerd shim (the real node's `gvisor` RuntimeClass),
# keyed by its version alone, like kube-router's.
gvisor_dir_name() {
  echo "gvisor-$GVISOR_VERSION"
}

# The cache directory of agent-sandbox's controller and CRD YAML (the warm-pool bench only).
agent_sandbox_dir_name() {
  echo "agent-sandbox-$AGENT_SANDBOX_VERSION"
}

# The cache directory of the Prometheus Operator's CRDs (for the chart's dry runs), keyed by its
# version alone.
prometheus_crds_dir_name() {
  echo "prometheus-operator-crds-$PROMETHEUS_OPERATOR_VERSION"
}

# The Python client's virtual environment (clients/python, its tests' packages), keyed by the
# content of its one list of packages, so a change of a pin builds a fresh one. Needs bed_defaults.
python_client_venv() {
  local sum
  sum=$(sha256sum "$LIB_DIR/../clients/python/requirements-test.txt" | cut -c1-12)
  echo "$CACHE_ROOT/python-client-$sum"
}

# The cache directory of the Go-built tools, keyed by every pinned version, so a version bump
# builds afresh and an old cache is never half-reused.
tools_dir_name() {
  echo "tools-k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION-containerd-$CONTAINERD_VERSION-cni-$CNI_PLUGINS_VERSION-crane-$CRANE_VERSION-crictl-$CRICTL_VERSION"
}

# Whether a registry HOST[:PORT] is this machine's (loopback): the local bed's registry speaks plain
# HTTP; any other is reached over TLS (hack/release.sh's `helm push`). hack/check.sh tests it.
loopback_registry() {
  local host=${1%:*}
  [[ $host =~ ^127\.[0-9]+\.[0-9]+\.[0-9]+$ || $host == localhost || $host == "[::1]" ]]
}

# The tree under <dir> as a tar on stdout, reproducibly: its entries at the top, sorted, numeric
# root ownership, mtime 0 (the images' layers, hack/images.sh; the release's archives,
# hack/release.sh).
tar_tree() {
  local entries
  entries=$(cd "$1" && LC_ALL=C ls -A)
  # shellcheck disable=SC2086
  tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 --format=gnu -C "$1" -c $entries
}

# The first line of a command's output, read whole: `cmd | head -1` under `set -o pipefail` dies
# of SIGPIPE whenever the producer writes after head has exited (a fresh machine's first
# `make demo` died that way, exit 141, after 16 minutes).
first_line() {
  local out
  out=$("$@")
  printf '%s\n' "${out%%$'\n'*}"
}

# Whether a binary needs no shared library (static or static-pie): ldd lists no `=>` line. ldd's
# exit code cannot tell (it is 0 for a static-pie binary, 1 for a plain static one).
is_static() {
  local out
  out=$(ldd "$1" 2>&1 || true)
  ! grep -q '=>' <<<"$out"
}

# What the real node may change on the host, as text: `make test` compares a snapshot taken before
# `up` with one taken after `down`, so a leak (a sysctl, a bridge, an iptables chain, a mount, a
# cgroup, a runtime directory, a process) fails the suite instead of surviving into the next run.
host_state_snapshot() {
  local s ipt t
  for s in vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops \
           kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward \
           net.ipv4.conf.all.route_localnet; do
    echo "sysctl $s=$(sysctl -n "$s" 2>/dev/null || echo '?')"
  done
  ip -o link show 2>/dev/null | awk -F': ' '{print "link " $2}' | sed 's/@.*//' | sort
  for ipt in iptables ip6tables; do for t in nat filter mangle; do
    { $ipt -t "$t" -S 2>/dev/null || true; } | awk -v p="$ipt $t" '/^-N /{print "chain " p " " $2}'
  done; done | sort
  # kube-router (the real node's NetworkPolicy enforcer) keeps its peers' addresses in ipsets.
  { ipset list -n 2>/dev/null || true; } | sed 's/^/ipset /' | sort
  awk '$2 ~ /kubelet|containerd|netns|k8s-local/ {print "mount " $2}' /proc/self/mounts | sort
  for s in /run/containerd /var/lib/cni /run/netns /sandboxrun-readback; do [ ! -e "$s" ] || echo "path $s"; done
  for s in /sys/fs/cgroup/*/kubepods; do [ ! -d "$s" ] || echo "cgroup $s"; done
  local procs; procs=$(ps -eo comm=)
  { grep -x -E 'kubelet|containerd|kube-proxy|containerd-shim|kube-router' <<<"$procs" || true; } | sed 's/^/process /' | sort
}
