#!/usr/bin/env bash
# A REAL Kubernetes node beside kwok's fake one: containerd (CRI) + runc + bridge CNI + kubelet +
# kube-proxy, joined to the control plane of hack/local-cluster.sh (its CA signs the node's certs).
# hack/local-cluster.sh calls this; run it by hand only to debug the node.
#
#   hack/real-node.sh up       preflight, bridge, PKI, configs; start containerd, kubelet,
#                              kube-proxy, kube-router (NetworkPolicy) and the pod-facing forwards;
#                              wait until the node is Ready and NetworkPolicy is enforced
#   hack/real-node.sh down     remove every pod sandbox (CNI DEL), stop what `up` started (by PID),
#                              then restore every host setting it changed (sysctls, iptables chains,
#                              ipsets, the bridge, mounts, /run/containerd, /var/lib/cni, cgroups)
#   hack/real-node.sh status   exit 0 when the node is Ready
#   hack/real-node.sh kubelet-stop / kubelet-start
#                              a fault for `make chaos`: the kubelet stopped (containers keep
#                              running), then started again and the node Ready
#
# The node is tainted sandbox.iterion.io/real-node=true:NoSchedule and labelled
# sandbox.iterion.io/real-node=true: only pods that ask for it land here (kwok keeps the scale
# tests). Pods reach the apiserver through the `kubernetes` Service (the apiserver advertises the
# node IP, a forward on the node IP leads to its loopback port) and the S3 server at
# http://$NODE_IP:$S3_PORT (another forward). Images come from the local registry, which the node
# pulls as localhost:$REGISTRY_PORT over plain HTTP.
#
# NetworkPolicy is ENFORCED on this node: bridge CNI does not enforce it, so kube-router runs beside
# kube-proxy with only its network policy controller on (iptables + ipset; docs/user-guide.md
# "Egress: what is enforced, and by whom"). A pod no policy selects is not filtered.
#
# Needs root, runc, iptables, ipset, conntrack and socat (Debian packages; .ci/run installs them).
# Every pitfall this machine showed is written next to the line that handles it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
bed_defaults
NODE_NAME=$REAL_NODE_NAME
BRIDGE=${REAL_NODE_BRIDGE:-sbr-br0}              # our own bridge; its address is the node IP
POD_SUBNET=${REAL_NODE_POD_SUBNET:-10.244.0.0/24}
NODE_IP=$REAL_NODE_IP              # kubelet refuses a loopback node IP
KUBELET_PORT=${REAL_NODE_KUBELET_PORT:-11250}     # 10250 is kwok's
KUBELET_HEALTHZ_PORT=${REAL_NODE_KUBELET_HEALTHZ_PORT:-11248}
KUBE_PROXY_HEALTHZ_PORT=${REAL_NODE_PROXY_HEALTHZ_PORT:-11256}
KUBE_PROXY_METRICS_PORT=${REAL_NODE_PROXY_METRICS_PORT:-11249}
KUBE_ROUTER_HEALTH_PORT=${REAL_NODE_KUBE_ROUTER_HEALTH_PORT:-11257}
# In a cache directory of its own (hack/build-tools.sh builds it; hack/lib.sh kube_router_dir_name).
KUBE_ROUTER=$CACHE_ROOT/$(kube_router_dir_name)/bin/kube-router
TAINT=sandbox.iterion.io/real-node
REG=localhost:$REGISTRY_PORT
# hack/second-node.sh runs this script again, inside a network namespace of its own, for the
# second real node: its directory, the value of its $TAINT label and taint (tests that do not ask
# for it stay on the first node), and the cgroup its pods live under (two kubelets on one host must
# not share /kubepods).
N=${REAL_NODE_DIR:-$STATE/node}
LABEL_VALUE=${REAL_NODE_LABEL_VALUE:-true}
CGROUP_ROOT=${REAL_NODE_CGROUP_ROOT:-}
# Every real node carries it: the `gvisor` RuntimeClass selects it, and a run that may land on
# either node (tests/it/real_node/two_nodes.rs) selects it and tolerates $TAINT whatever its value.
FLEET_LABEL=sandbox.iterion.io/real-fleet
P=$N/pki; R=$N/run; LOGS=$N/logs; C=$N/containerd
CA=$STATE/pki/ca.crt; CAKEY=$STATE/pki/ca.key; KUBECONFIG_ADMIN=$STATE/kubeconfig
CTR_SOCK=$C/containerd.sock
LAST_LOGS=${TMPDIR:-/tmp}/sandboxrun-real-node-logs-last
RUNC=${RUNC:-$(command -v runc || echo /usr/sbin/runc)}
# gVisor (issue #52, docs/user-guide.md "Runtimes"): the `gvisor` RuntimeClass (handler `runsc`)
# runs a pod in gVisor's user-space kernel, as clusters that run untrusted code do, through
# gVisor's own containerd shim (containerd-shim-runsc-v1), as gVisor's docs set it up. Both are
# built by hack/build-tools.sh (hack/versions.env GVISOR_VERSION; the shim's one bed-only change is
# explained there).
GVISOR_BIN=$CACHE_ROOT/$(gvisor_dir_name)/bin
# sysctls kubelet rewrites on start (setupKernelTunables; it has no "warn only" mode) and the ones
# bridge CNI turns on: recorded on the first `up`, restored by `down`.
SYSCTLS="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward net.ipv4.conf.all.route_localnet"

log() { echo "real-node: $*" >&2; }
die() { log "$*"; exit 1; }
kc() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
crictl() { "$BIN/crictl" --runtime-endpoint "unix://$CTR_SOCK" --image-endpoint "unix://$CTR_SOCK" --timeout 30s "$@"; }
is_running() { [ -f "$R/$1.pid" ] && kill -0 "$(cat "$R/$1.pid")" 2>/dev/null; }
start() {
  local name=$1; shift
  if is_running "$name"; then return 0; fi
  # The daemon gets no descriptor of ours but its stdio: one it inherited would outlive us, e.g.
  # the lock of a `flock` the caller runs under (make chaos restarts the kubelet from a test run
  # under the bed's lock, and that kubelet held the lock for its whole life).
  (
    for fd in /proc/$BASHPID/fd/*; do
      fd=${fd##*/}
      [ "$fd" -le 2 ] || eval "exec $fd>&-" 2>/dev/null || true
    done
    exec nohup "$@" >"$LOGS/$name.log" 2>&1 </dev/null
  ) &
  echo $! >"$R/$name.pid"
}
stop() {  # stop <name>: SIGTERM, wait up to 20 s, then SIGKILL -- only the PID we recorded
  is_running "$1" || { rm -f "$R/$1.pid"; return 0; }
  local pid; pid=$(cat "$R/$1.pid"); kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 80); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null || true; rm -f "$R/$1.pid"
}
wait_for() {
  local what=$1 secs=$2; shift 2; local deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || { log "timed out waiting for $what (logs: $LOGS)"; return 1; }
    sleep 0.5
  done
}
node_ready() {
  [ "$(kc get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
has_cap() {  # has_cap <bit>: is that capability in our effective set?
  local eff; eff=$(awk '/^CapEff:/{print $2}' /proc/self/status)
  (( (16#$eff >> $1) & 1 ))
}

# Everything the node needs from the host, checked before anything changes: fail loudly, never skip.
preflight() {
  [ "$(id -u)" = 0 ] || die "the real node needs root (kubelet, containerd, runc, bridge, iptables)"
  local b missing=""
  for b in kubelet kube-proxy containerd containerd-shim-runc-v2 crictl cni/bridge cni/host-local cni/loopback cni/portmap; do
    [ -x "$BIN/$b" ] || missing="$missing $b"
  done
  for b in "$KUBE_ROUTER" "$GVISOR_BIN/runsc" "$GVISOR_BIN/containerd-shim-runsc-v1"; do
    [ -x "$b" ] || missing="$missing $b"
  done
  [ -z "$missing" ] || die "missing$missing in $BIN: run hack/build-tools.sh"
  for b in "$RUNC" iptables ip6tables ipset conntrack socat ip curl; do
    command -v "$b" >/dev/null 2>&1 || missing="$missing $b"
  done
  [ -z "$missing" ] || die "missing$missing: run hack/setup.sh (it installs every prerequisite of the test bed)"
  [ -f "$CAKEY" ] || die "no control plane at $STATE (hack/local-cluster.sh up starts it, then this)"
  [ -d /sys/fs/cgroup ] || die "no /sys/fs/cgroup: kubelet cannot run here"
  # A unix socket path is at most 107 bytes; containerd appends .ttrpc to its socket.
  [ "${#CTR_SOCK}" -le 100 ] || die "state path too long for containerd's socket ($CTR_SOCK): set SANDBOXRUN_STATE to a shorter directory"
  if ip link show "$BRIDGE" >/dev/null 2>&1 && [ ! -f "$N/bridge.ours" ]; then
    # Another node of this script (another checkout) is using it, or an earlier run was killed
    # before its `down` (a killed session leaves host state behind).
    if (exec 3<>"/dev/tcp/$NODE_IP/$KUBELET_PORT") 2>/dev/null; then
      die "a kubelet already serves $NODE_IP:$KUBELET_PORT on bridge $BRIDGE (another checkout's node?): stop it with its hack/local-cluster.sh down, or set REAL_NODE_BRIDGE, REAL_NODE_POD_SUBNET, REAL_NODE_IP and the REAL_NODE_*_PORT variables"
    fi
    log "adopting bridge $BRIDGE left behind by an earlier run that was killed before its down"
    mkdir -p "$N"; touch "$N/bridge.ours"
  fi
  local port
  for port in "$KUBELET_PORT" "$KUBELET_HEALTHZ_PORT" "$KUBE_PROXY_HEALTHZ_PORT" "$KUBE_PROXY_METRICS_PORT" "$KUBE_ROUTER_HEALTH_PORT"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then die "port $port is taken (set the REAL_NODE_*_PORT variables)"; fi
  done
}

save_host_state() {  # first `up` only: what `down` must restore or leave alone
  [ -f "$N/sysctl.orig" ] && return 0
  local ipt t
  for ipt in iptables ip6tables; do for t in nat filter mangle; do   # chains that pre-existed
    { $ipt -t $t -S 2>/dev/null || true; } | awk -v p="$ipt $t" '/^-N /{print p" "$2}'
  done; done >"$N/iptables.before"
  [ ! -d /run/containerd ] || touch "$N/run-containerd.existed"   # another containerd's shim dir
  [ ! -d /var/lib/cni ] || touch "$N/var-lib-cni.existed"
  [ ! -d /run/netns ] || touch "$N/run-netns.existed"   # bridge CNI puts the pods' netns here
  { ipset list -n 2>/dev/null || true; } >"$N/ipset.before"   # kube-router's sets are the others
  local s
  for s in $SYSCTLS; do echo "$s=$(sysctl -n "$s")"; done >"$N/sysctl.orig"   # written last: the marker
}

pki() {
  [ -f "$P/kubelet-client.crt" ] && return 0
  mkdir -p "$P"
  sign() {  # sign <name> <subject> <extensions>: a key + cert signed by the cluster CA
    openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$P/$1.key" -out "$P/$1.csr" 2>/dev/null
    openssl x509 -req -in "$P/$1.csr" -CA "$CA" -CAkey "$CAKEY" -CAcreateserial -CAserial "$P/ca.srl" \
      -days 365 -out "$P/$1.crt" -extfile <(printf '%b' "$3") 2>/dev/null
  }
  # The Node authorizer recognises a kubelet by exactly this CN/O.
  sign kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME" 'extendedKeyUsage=clientAuth'
  # The apiserver verifies this one (--kubelet-certificate-authority) when it proxies exec and logs.
  sign kubelet-serving "/O=system:nodes/CN=system:node:$NODE_NAME" \
    "subjectAltName=IP:$NODE_IP,IP:127.0.0.1,DNS:$NODE_NAME\nextendedKeyUsage=serverAuth"
  # The bootstrap RBAC binds user system:kube-proxy to system:node-proxier.
  sign kube-proxy "/CN=system:kube-proxy" 'extendedKeyUsage=clientAuth'
  kubeconfig_for kube-proxy >"$N/kube-proxy.kubeconfig"
  kubeconfig_for kubelet-client >"$N/kubelet.kubeconfig"
}

kubeconfig_for() {  # kubeconfig_for <cert name>
  cat <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://127.0.0.1:$APISERVER_PORT", certificate-authority: "$CA"}}]
users: [{name: $1, user: {client-certificate: "$P/$1.crt", client-key: "$P/$1.key"}}]
contexts: [{name: local, context: {cluster: local, user: $1}}]
current-context: local
KC
}

network() {
  # Our own bridge, created up front: its address is the node IP kubelet binds to (it refuses
  # 127.0.0.1, and this kernel has no dummy interfaces), and bridge CNI reuses it as the gateway.
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    touch "$N/bridge.ours"
    ip addr add "$NODE_IP/${POD_SUBNET#*/}" dev "$BRIDGE"
  fi
  ip link set "$BRIDGE" up
  mkdir -p "$N/cni/net.d" "$N/cni/ipam"
  cat >"$N/cni/net.d/10-sandboxrun.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "sandboxrun-$BRIDGE",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$N/cni/ipam",
              "ranges": [[{"subnet": "$POD_SUBNET", "gateway": "$NODE_IP"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
}

containerd_config() {
  # Root here lacks CAP_SYS_RESOURCE (bit 24): runc cannot lower oom_score_adj (kubelet asks -998
  # for sandboxes) and every sandbox dies with "can't get final child's PID from pipe: EOF".
  # restrict_oom_score_adj clamps the value to containerd's own instead.
  local restrict_oom=false; has_cap 24 || restrict_oom=true
  mkdir -p "$C/root" "$C/state" "$C/certs.d/$REG" "$C/runc" "$C/runsc-state"
  runsc_config >"$C/runsc.toml"
  cat >"$C/certs.d/$REG/hosts.toml" <<TOML
server = "http://$REG"
[host."http://$REG"]
  capabilities = ["pull", "resolve"]
TOML
  cat >"$C/config.toml" <<TOML
version = 4
root = "$C/root"
state = "$C/state"
imports = []            # never read /etc/containerd/conf.d
[plugins.'io.containerd.server.v1.grpc']
  address = "$CTR_SOCK"
[plugins.'io.containerd.server.v1.ttrpc']
  address = "$CTR_SOCK.ttrpc"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "${REAL_NODE_SNAPSHOTTER:-overlayfs}"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$REG/pause:3.10"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$C/certs.d"
[plugins.'io.containerd.transfer.v1.local']
  config_path = "$C/certs.d"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = $restrict_oom
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$RUNC"
        Root = "$C/runc"
        SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      runtime_path = "$GVISOR_BIN/containerd-shim-runsc-v1"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$C/runsc.toml"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$BIN/cni"]
    conf_dir = "$N/cni/net.d"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
TOML
}

# gVisor's shim configuration (the `runsc` handler): runsc, its state, and runsc's flags.
# - platform ptrace: no KVM in a nested VM (systrap, the default, needs seccomp features a nested
#   kernel may lack; ptrace works everywhere the bed runs).
# - network sandbox: gVisor's own network stack inside the pod's network namespace, the isolating
#   default (the bridge CNI's veth and kube-router's rules apply to its packets as to runc's).
# - REAL_NODE_RUNSC_DEBUG=1: runsc's debug logs, one file per command, under the node's logs.
runsc_config() {
  cat <<TOML
binary_name = "$GVISOR_BIN/runsc"
root = "$C/runsc-state"
[runsc_config]
  platform = "ptrace"
  network = "sandbox"
TOML
  if [ -n "${REAL_NODE_RUNSC_DEBUG:-}" ]; then
    mkdir -p "$LOGS/runsc"
    printf '  debug = "true"\n  debug-log = "%s/runsc/"\n' "$LOGS"
  fi
}

kubelet_config() {
  mkdir -p "$N/kubelet" "$N/pod-logs"
  # kubelet refuses a cgroup root that does not exist; cgroup v1's cpuset starts a new group with
  # no CPU and no memory node, so it gets its parent's.
  if [ -n "$CGROUP_ROOT" ]; then
    local h
    for h in /sys/fs/cgroup/*/; do mkdir -p "$h${CGROUP_ROOT#/}"; done
    if [ -f /sys/fs/cgroup/cpuset/cpuset.cpus ]; then
      cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset$CGROUP_ROOT/cpuset.cpus"
      cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset$CGROUP_ROOT/cpuset.mems"
    fi
  fi
  # No cluster DNS here: pods get this resolv.conf (and a harmless MissingClusterDNS warning).
  printf 'nameserver 127.0.0.1\noptions ndots:1\n' >"$N/resolv.conf"
  cat >"$N/kubelet-config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false              # this host may be cgroup v1; kubelet >= 1.35 refuses it unless told
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CTR_SOCK
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $P/kubelet-serving.crt
tlsPrivateKeyFile: $P/kubelet-serving.key
rotateCertificates: false
serverTLSBootstrap: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true, cacheTTL: 30s}
  x509: {clientCAFile: $CA}
authorization:
  mode: Webhook
  webhook: {cacheAuthorizedTTL: 30s, cacheUnauthorizedTTL: 5s}
resolvConf: $N/resolv.conf
clusterDomain: cluster.local
podLogsDir: $N/pod-logs
failSwapOn: false
maxPods: 60
serializeImagePulls: false
nodeStatusReportFrequency: 10s
registerWithTaints: [{key: $TAINT, value: "$LABEL_VALUE", effect: NoSchedule}]
cgroupRoot: "${CGROUP_ROOT:-/}"
evictionHard: {memory.available: 200Mi, nodefs.available: 2%, imagefs.available: 2%, nodefs.inodesFree: 2%}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
YAML
}

kube_proxy_config() {
  # iptables mode; nothing that rewrites host-wide conntrack sysctls, NodePorts only on our bridge.
  cat >"$N/kube-proxy-config.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $N/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_SUBNET
healthzBindAddress: 127.0.0.1:$KUBE_PROXY_HEALTHZ_PORT
metricsBindAddress: 127.0.0.1:$KUBE_PROXY_METRICS_PORT
nodePortAddresses: ["$NODE_IP/32"]
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
YAML
}

up() {
  preflight
  mkdir -p "$N" "$R" "$LOGS"
  save_host_state; pki; network; containerd_config; kubelet_config; kube_proxy_config
  local t0; t0=$(date +%s)
  # containerd's shims put their sockets in /run/containerd/s (compiled in, not configurable).
  start containerd "$BIN/containerd" --config "$C/config.toml" --log-level warn
  wait_for containerd 60 crictl info
  start_kubelet
  start kube-proxy "$BIN/kube-proxy" --config "$N/kube-proxy-config.yaml" --v=1
  # NetworkPolicy: bridge CNI ignores it, so kube-router's network policy controller enforces it,
  # as a host process like kube-proxy (its DaemonSet would need the CNI it replaces to start).
  # - Only the firewall: --run-router would speak BGP and rewrite routes, --run-service-proxy
  #   would replace kube-proxy with IPVS; --enable-cni=false leaves CNI to the bridge plugin.
  # - It filters pods by rules in filter INPUT/FORWARD/OUTPUT (chains KUBE-ROUTER-*, KUBE-POD-FW-*,
  #   KUBE-NWPLCY-*; `down` removes every KUBE- chain that was not there before) and ipsets of
  #   peers (`down` destroys those that were not there before). Pod-to-pod traffic on our bridge is
  #   seen by iptables because the bridge is br_netfilter'd (net.bridge.bridge-nf-call-iptables=1).
  # - A pod's egress to THIS host (the node IP, the host's own addresses) goes through INPUT and is
  #   filtered too, except: the Service range (--service-cluster-ip-range) and NodePorts on a local
  #   address (--service-node-port-range, 30000-32767) are let through before any policy.
  # - Its health server binds ":port" (every address; there is no flag for the address); metrics off.
  # - It learns the node IP from the Node object, so it starts after kubelet registered the node
  #   (it exits when the Node does not exist yet). It looks the Node up by $NODE_NAME, then by this
  #   host's hostname, and only then by --hostname-override: NODE_NAME is set so that a host whose
  #   hostname is another node's name cannot make it enforce that node's pods here.
  # - The admin kubeconfig: it lists/watches pods, namespaces, NetworkPolicies and nodes.
  # - Not kube-network-policies: it needs the nftables `queue` expression, which this kernel lacks.
  wait_for "node $NODE_NAME registered" 120 kc get node "$NODE_NAME"
  # The runtimes as users name them: `gvisor` runs on nodes that have runsc (this one: its label).
  kc apply -f - >/dev/null <<YAML
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: gvisor}
handler: runsc
scheduling:
  nodeSelector: {$FLEET_LABEL: "true"}
YAML
  start kube-router env NODE_NAME="$NODE_NAME" "$KUBE_ROUTER" --kubeconfig "$KUBECONFIG_ADMIN" --hostname-override "$NODE_NAME" \
    --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
    --enable-ipv4=true --enable-ipv6=false --service-cluster-ip-range "$SERVICE_CIDR" \
    --health-port "$KUBE_ROUTER_HEALTH_PORT" --metrics-port 0 --v=1
  # Pods reach the apiserver's and the S3 server's loopback ports through the node IP.
  start forward-apiserver socat "TCP-LISTEN:$APISERVER_PORT,bind=$NODE_IP,fork,reuseaddr" "TCP:127.0.0.1:$APISERVER_PORT"
  start forward-s3 socat "TCP-LISTEN:$S3_PORT,bind=$NODE_IP,fork,reuseaddr" "TCP:127.0.0.1:$S3_PORT"
  wait_for "node $NODE_NAME Ready" 180 node_ready
  wait_for kube-proxy 60 bash -c "exec 3<>/dev/tcp/127.0.0.1/$KUBE_PROXY_HEALTHZ_PORT"
  # Healthy once its controller has synced; its top-level chain is there once its first full sync
  # ran (before that, a policy would not be enforced yet).
  wait_for kube-router 120 curl -fsS "http://127.0.0.1:$KUBE_ROUTER_HEALTH_PORT/healthz"
  wait_for "kube-router's chains" 60 iptables -t filter -S KUBE-ROUTER-FORWARD
  log "node $NODE_NAME Ready in $(( $(date +%s) - t0 ))s (containerd, kubelet, kube-proxy, kube-router; taint $TAINT=$LABEL_VALUE:NoSchedule)"
}

ipt_chain_gone() {  # ipt_chain_gone <iptables|ip6tables> <table> <chain>: drop every jump to it, then it
  local ipt=$1 t=$2 c=$3 from froms n nums rules
  # Jumps are deleted by chain and rule number, the last first so the numbers stay valid. Replaying
  # a rule's words from `-S` (`-D` + the rule) fails on any jump with a comment: kube-router's and
  # kube-proxy's carry quoted spaces ("kube-router netpol - …"), which word splitting breaks
  # ("Bad argument"), so the jump stayed and the chain could not be deleted.
  rules=$($ipt -t "$t" -S 2>/dev/null || true)
  froms=$(awk -v c="$c" '$1 == "-A" { for (i = 3; i < NF; i++) if (($i == "-j" || $i == "-g") && $(i+1) == c) { print $2; break } }' <<<"$rules" | sort -u)
  for from in $froms; do
    nums=$({ $ipt -t "$t" -L "$from" --line-numbers -n 2>/dev/null || true; } | awk -v c="$c" '$2 == c {print $1}' | sort -rn)
    for n in $nums; do $ipt -t "$t" -D "$from" "$n" 2>/dev/null || true; done
  done
  $ipt -t "$t" -F "$c" 2>/dev/null || true; $ipt -t "$t" -X "$c" 2>/dev/null || true
}

down() {
  [ -d "$N" ] || return 0
  # 1. Pods first, while kubelet and containerd still run, so CNI DEL removes veths, IPs and chains.
  if [ -x "$BIN/kubectl" ] && [ -f "$KUBECONFIG_ADMIN" ] && kc get node "$NODE_NAME" >/dev/null 2>&1; then
    kc delete pods -A --field-selector "spec.nodeName=$NODE_NAME" --grace-period=1 --wait=false >/dev/null 2>&1 || true
  fi
  stop forward-apiserver; stop forward-s3
  # kube-router first: it would re-add its chains while we remove them (step 3 removes them).
  stop kube-router
  stop kube-proxy
  "$BIN/kube-proxy" --cleanup --v=0 >/dev/null 2>&1 || true
  stop kubelet
  if is_running containerd; then
    local pods; pods=$(crictl pods -q 2>/dev/null || true)
    # shellcheck disable=SC2086
    [ -z "$pods" ] || crictl stopp $pods >/dev/null 2>&1 || true
    crictl rmp -a -f >/dev/null 2>&1 || true
  fi
  stop containerd
  # If a CRI call failed: shims started from OUR binary, then anything left in kubelet's cgroups
  # (only this node's pods live there), each killed by PID.
  local pid f
  for pid in $(pgrep -f -- "containerd-shim-runc-v2 .*-address $CTR_SOCK" || true); do kill -9 "$pid" 2>/dev/null || true; done
  for pid in $(pgrep -f -- "containerd-shim-runsc-v1 .*-address $CTR_SOCK" || true); do kill -9 "$pid" 2>/dev/null || true; done
  # gVisor sandboxes a failed CRI call left (their sentry and gofer processes), by runsc itself.
  local cid
  if [ -x "$GVISOR_BIN/runsc" ] && [ -d "$C/runsc-state/k8s.io" ]; then
    for cid in $("$GVISOR_BIN/runsc" --root "$C/runsc-state/k8s.io" list --quiet 2>/dev/null || true); do
      "$GVISOR_BIN/runsc" --root "$C/runsc-state/k8s.io" delete --force "$cid" >/dev/null 2>&1 || true
    done
  fi
  for f in $(find "/sys/fs/cgroup/pids$CGROUP_ROOT/kubepods" "/sys/fs/cgroup$CGROUP_ROOT/kubepods" -name cgroup.procs 2>/dev/null || true); do
    while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done <"$f"
  done
  if [ -x "$BIN/kubectl" ] && [ -f "$KUBECONFIG_ADMIN" ]; then kc delete node "$NODE_NAME" --wait=false >/dev/null 2>&1 || true; fi
  # 2. Mounts under our state (projected-token tmpfs, overlay rootfs, netns bind mounts), deepest first.
  local m
  while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(awk -v n="$N/" 'index($2, n) == 1 {print $2}' /proc/self/mounts | sort -r)
  # 3. Network: our bridge, CNI's result cache, and the KUBE-/CNI- chains that did not exist before.
  if [ -f "$N/bridge.ours" ]; then ip link del "$BRIDGE" 2>/dev/null || true; fi
  rm -rf /var/lib/cni/results/sandboxrun-"$BRIDGE"-* 2>/dev/null || true
  if [ ! -f "$N/var-lib-cni.existed" ]; then rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null || true; fi
  local ipt t c chains
  for ipt in iptables ip6tables; do for t in nat filter mangle; do
    chains=$($ipt -t $t -S 2>/dev/null | awk '/^-N (KUBE-|CNI-)/{print $2}' || true)
    for c in $chains; do
      grep -qx "$ipt $t $c" "$N/iptables.before" 2>/dev/null || ipt_chain_gone "$ipt" "$t" "$c"
    done
  done; done
  # kube-router's ipsets (KUBE-SRC-*, KUBE-DST-*) that were not there before, once no rule refers
  # to them (a set in use cannot be destroyed).
  local set sets
  sets=$(ipset list -n 2>/dev/null || true)
  for set in $sets; do
    case $set in KUBE-SRC-*|KUBE-DST-*) ;; *) continue ;; esac
    grep -qxF -- "$set" "$N/ipset.before" 2>/dev/null || ipset destroy "$set" 2>/dev/null || true
  done
  # 4. cgroups kubelet created (the pods are gone, so rmdir leaf-first succeeds).
  local h
  for h in /sys/fs/cgroup/*/; do
    if [ -d "$h$CGROUP_ROOT/kubepods" ]; then find "$h$CGROUP_ROOT/kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null || true; fi
    [ -z "$CGROUP_ROOT" ] || rmdir "$h$CGROUP_ROOT" 2>/dev/null || true
  done
  # 5. Kernel settings kubelet (and bridge CNI's ip_forward) changed.
  if [ -f "$N/sysctl.orig" ]; then
    local k v
    while IFS== read -r k v; do sysctl -q -w "$k=$v" >/dev/null 2>&1 || true; done <"$N/sysctl.orig"
  fi
  if [ ! -f "$N/run-containerd.existed" ]; then rm -rf /run/containerd/s; rmdir /run/containerd 2>/dev/null || true; fi
  # `ip netns add` (the second node's namespace, hack/second-node.sh) leaves /run/netns bind-mounted
  # on itself: the directory we made goes only once that mount does, and only when it is empty.
  if [ ! -f "$N/run-netns.existed" ] && [ -d /run/netns ] && [ -z "$(ls -A /run/netns)" ]; then
    if mountpoint -q /run/netns; then umount /run/netns 2>/dev/null || true; fi
    rmdir /run/netns 2>/dev/null || true
  fi
  # The node's logs outlive the state directory, for a post-mortem of a failed run.
  if [ -d "$LOGS" ]; then mkdir -p "$LAST_LOGS" && cp -f "$LOGS"/*.log "$LAST_LOGS/" 2>/dev/null || true; fi
  rm -rf "$N"
  log "down: processes stopped, host settings restored"
}

start_kubelet() {
  start kubelet "$BIN/kubelet" --config "$N/kubelet-config.yaml" --kubeconfig "$N/kubelet.kubeconfig" \
    --root-dir "$N/kubelet" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" \
    --node-labels "$TAINT=$LABEL_VALUE,$FLEET_LABEL=true" --v=1
}

# The faults `make chaos` injects (tests/it/real_node/chaos.rs): the kubelet stopped (its pods'
# containers keep running; exec, logs and status updates stop), then started again.
kubelet_stop() { stop kubelet; log "kubelet stopped"; }
kubelet_start() {
  start_kubelet
  wait_for "node $NODE_NAME Ready" 180 node_ready
  log "kubelet started; node $NODE_NAME Ready"
}

status() {
  node_ready || { log "node $NODE_NAME is not Ready"; return 1; }
  log "ok: node $NODE_NAME Ready"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  kubelet-stop) kubelet_stop ;;
  kubelet-start) kubelet_start ;;
  *) echo "usage: $0 up|down|status|kubelet-stop|kubelet-start" >&2; exit 2 ;;
esac
