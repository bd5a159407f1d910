#!/usr/bin/env bash
# A SECOND real node (issue #52 item 2): hack/real-node.sh run again inside a network namespace of
# its own, with its own containerd, kubelet, kube-proxy and kube-router, its own bridge and pod
# subnet, its own cgroup root and state directory. hack/local-cluster.sh calls this after the
# first node; run it by hand only to debug the node.
#
#   hack/second-node.sh up       the namespace, its link to this host, the forwards, then the node
#   hack/second-node.sh down     the node's own `down` (inside the namespace), then the forwards,
#                                the link and the namespace (its iptables and ipsets go with it)
#   hack/second-node.sh status | kubelet-stop | kubelet-start    as hack/real-node.sh's, for it
#
# Its Node is $SECOND_NODE_NAME, labelled and tainted sandbox.iterion.io/real-node=second: the
# tests that ask for `true` stay on the first node, and a run that may land on either selects
# sandbox.iterion.io/real-fleet=true (both nodes carry it) and tolerates both values.
#
# How it reaches the rest of the bed: a veth pair ($LINK_NET: this host .1, the namespace .2); this
# host routes the node's pod subnet to the namespace; inside, 127.0.0.1:<port> of the apiserver,
# the registry and S3 are forwarded to this host's end of the link, where a forward leads to the
# loopback port (those three listen on 127.0.0.1 only). The apiserver reaches the kubelet (exec,
# logs) at the node IP through the route.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
bed_defaults
NODE_NAME=${SECOND_NODE_NAME:-real-node-1}
NS=${SECOND_NODE_NETNS:-sbr-node1}
LINK_NET=${SECOND_NODE_LINK_NET:-10.250.1}    # a /30: .1 on this host, .2 in the namespace
HOST_END=$LINK_NET.1; NS_END=$LINK_NET.2
VETH_HOST=${NS}h; VETH_NS=${NS}c
POD_SUBNET=${SECOND_NODE_POD_SUBNET:-10.244.1.0/24}
NODE_IP=${SECOND_NODE_IP:-10.244.1.1}
D=$STATE/second-node; R=$D/run; LOGS=$D/logs

log() { echo "second-node: $*" >&2; }
in_ns() { nsenter --net="/run/netns/$NS" "$@"; }
is_running() { [ -f "$R/$1.pid" ] && kill -0 "$(cat "$R/$1.pid")" 2>/dev/null; }
start() {  # start <name> <command…>: a daemon with no descriptor of ours but its stdio
  local name=$1; shift
  if is_running "$name"; then return 0; fi
  (
    for fd in /proc/$BASHPID/fd/*; do
      fd=${fd##*/}
      [ "$fd" -le 2 ] || eval "exec $fd>&-" 2>/dev/null || true
    done
    exec nohup "$@" >"$LOGS/$name.log" 2>&1 </dev/null
  ) &
  echo $! >"$R/$name.pid"
}
stop() {
  is_running "$1" || { rm -f "$R/$1.pid"; return 0; }
  local pid; pid=$(cat "$R/$1.pid"); kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null || true; rm -f "$R/$1.pid"
}

# hack/real-node.sh as the second node, inside the namespace.
node() {
  in_ns env REAL_NODE_NAME="$NODE_NAME" REAL_NODE_IP="$NODE_IP" REAL_NODE_POD_SUBNET="$POD_SUBNET" \
    REAL_NODE_BRIDGE=sbr-br1 REAL_NODE_DIR="$STATE/node1" REAL_NODE_LABEL_VALUE=second \
    REAL_NODE_CGROUP_ROOT=/sbr-node1 "$HERE/real-node.sh" "$@"
}

link() {
  [ -e "/run/netns/$NS" ] || { ip netns add "$NS"; touch "$D/netns.ours"; }
  if ! ip link show "$VETH_HOST" >/dev/null 2>&1; then
    ip link add "$VETH_HOST" type veth peer name "$VETH_NS"
    ip link set "$VETH_NS" netns "$NS"
    ip addr add "$HOST_END/30" dev "$VETH_HOST"
    in_ns ip addr add "$NS_END/30" dev "$VETH_NS"
  fi
  ip link set "$VETH_HOST" up
  in_ns ip link set lo up
  in_ns ip link set "$VETH_NS" up
  in_ns ip route replace default via "$HOST_END"
  in_ns sysctl -q -w net.ipv4.ip_forward=1
  ip route replace "$POD_SUBNET" via "$NS_END"
}

forwards() {
  local port
  for port in "$APISERVER_PORT" "$REGISTRY_PORT" "$S3_PORT"; do
    start "host-$port" socat "TCP-LISTEN:$port,bind=$HOST_END,fork,reuseaddr" "TCP:127.0.0.1:$port"
    start "ns-$port" nsenter --net="/run/netns/$NS" socat "TCP-LISTEN:$port,bind=127.0.0.1,fork,reuseaddr" "TCP:$HOST_END:$port"
  done
  local deadline=$(( $(date +%s) + 30 ))
  until in_ns bash -c "exec 3<>/dev/tcp/127.0.0.1/$APISERVER_PORT" 2>/dev/null; do
    [ "$(date +%s)" -lt "$deadline" ] || { log "the apiserver forward does not answer (logs: $LOGS)"; return 1; }
    sleep 0.25
  done
}

up() {
  [ "$(id -u)" = 0 ] || { log "needs root"; exit 1; }
  mkdir -p "$D" "$R" "$LOGS"
  link
  forwards
  node up
  log "node $NODE_NAME up in network namespace $NS (node IP $NODE_IP, pods $POD_SUBNET)"
}

down() {
  [ -d "$D" ] || return 0
  if [ -e "/run/netns/$NS" ]; then node down || true; fi
  local name
  for name in $(cd "$R" 2>/dev/null && ls -- *.pid 2>/dev/null || true); do stop "${name%.pid}"; done
  ip route del "$POD_SUBNET" 2>/dev/null || true
  ip link del "$VETH_HOST" 2>/dev/null || true
  if [ -f "$D/netns.ours" ]; then ip netns del "$NS" 2>/dev/null || true; fi
  rm -rf "$D"
  log "down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status|kubelet-stop|kubelet-start) node "$1" ;;
  *) echo "usage: $0 up|down|status|kubelet-stop|kubelet-start" >&2; exit 2 ;;
esac
