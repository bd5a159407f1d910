#!/usr/bin/env bash
# Drain throughput on the REAL node (exec goes apiserver -> kubelet -> containerd's CRI streaming),
# side by side with its peers on the same pod and the same directory:
#   (a) ours        the operator's drain of one read-back path (`spec.stop`), time from its
#                   sandboxrun_drain_duration_seconds metric
#   (b) kubectl cp  kubectl cp <pod>:<dir> <local> -c workload (busybox tar in the workload)
#   (c) raw         kubectl exec -c holder -- sandboxrun-operator pack /sandboxrun-readback/<dir> | cat >/dev/null
# and the operator's peak RSS. Prints numbers and ratios; asserts nothing.
#
#   bench/drain_real_node.sh [MIB_BIG_FILES] [SMALL_FILES]      default: 256 1000
#   DATA=text bench/drain_real_node.sh                  the big files are JSON log lines (about
#                                                       10:1 for zstd) instead of random bytes;
#                                                       DATA=mix: two of them random, two text
#   WIRE=tar bench/drain_real_node.sh                   the operator's --drain-wire (default
#                                                       adaptive; zstd, tar)
#   OPERATOR_TAG=<tag> bench/drain_real_node.sh         the image hack/images.sh pushed with
#                                                       SANDBOXRUN_OPERATOR_TAG=<tag> (a branch's)
#                                                       instead of :dev, operator and holder
#   FLOOD=150000 bench/drain_real_node.sh               instead of the data: that many symlinks
#                                                       whose paths are 3.9 KiB (15 nested 255-byte
#                                                       directories; issue #25 item 1's stream),
#                                                       under a 1Gi cap; only our drain runs, for
#                                                       its outcome and the operator's peak RSS
#   RUNTIME_CLASS=gvisor bench/drain_real_node.sh      the pod under that RuntimeClass (the bed's
#                                                       gVisor, hack/real-node.sh); the three
#                                                       contenders exec into the same sandbox
#   LINK_MBIT=200 bench/drain_real_node.sh              a link of that rate between the control
#                                                       plane and the node: the kubelet's port is
#                                                       shaped on lo (tc htb, root) while the three
#                                                       contenders run, both ways; every exec
#                                                       stream of the real node crosses it
#
# Needs the local cluster (hack/local-cluster.sh up) and the operator image (hack/images.sh
# operator): the operator runs on this host from the image's static binary (profile `image`),
# the holder of the run pod is the same image. The data is written in the pod by the workload
# (4 random files of MIB_BIG_FILES/4 MiB each + SMALL_FILES files of 0-16 KiB). Everything it
# creates (namespace, operator, store, copies) is removed at the end.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
eval "$(hack/local-cluster.sh env)"
hack/local-cluster.sh status >/dev/null
BIG_MIB=${1:-256}
SMALL=${2:-1000}
DATA=${DATA:-random}
WIRE=${WIRE:-adaptive}
LINK_MBIT=${LINK_MBIT:-}
RUNTIME_CLASS=${RUNTIME_CLASS:-}
RUNTIME_LINE=; [ -z "$RUNTIME_CLASS" ] || RUNTIME_LINE="runtimeClassName: $RUNTIME_CLASS"
FLOOD=${FLOOD:-}
case "$FLOOD" in ''|*[!0-9]*) [ -z "$FLOOD" ] || { echo "FLOOD=<number of symlinks>" >&2; exit 2; } ;; esac
CAP=60Gi; [ -z "$FLOOD" ] || CAP=1Gi
KUBELET_PORT=${REAL_NODE_KUBELET_PORT:-11250}
case "$DATA" in random|text|mix) ;; *) echo "DATA=random|text|mix" >&2; exit 2 ;; esac
case "$WIRE" in adaptive|zstd|tar) ;; *) echo "WIRE=adaptive|zstd|tar" >&2; exit 2 ;; esac
STATE=$SANDBOXRUN_TEST_STATE
SUFFIX=${OPERATOR_TAG:+-$OPERATOR_TAG}
BIN=$STATE/images/operator$SUFFIX/usr/local/bin/sandboxrun-operator
[ -x "$BIN" ] || { echo "no $BIN: run hack/images.sh operator" >&2; exit 1; }
HOLDER=$(sed "s#^[^/]*/#$SANDBOXRUN_TEST_POD_REGISTRY/#" "$STATE/images/sandboxrun-operator$SUFFIX.ref")
BUSYBOX=$(sed "s#^[^/]*/#$SANDBOXRUN_TEST_POD_REGISTRY/#" "$STATE/images/busybox.ref")
WORK=$(mktemp -d)
NS=bench-real-$$
OP_PID=
SHAPED=
# shape: the apiserver <-> kubelet traffic (to or from the kubelet's port, over lo: the node IP is
# local) through one htb class of LINK_MBIT; everything else through an unlimited default class.
shape() {
  tc qdisc add dev lo root handle 1: htb default 20
  SHAPED=1
  tc class add dev lo parent 1: classid 1:10 htb rate "${LINK_MBIT}mbit"
  tc class add dev lo parent 1: classid 1:20 htb rate 100gbit
  tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dport "$KUBELET_PORT" 0xffff flowid 1:10
  tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip sport "$KUBELET_PORT" 0xffff flowid 1:10
}
unshape() {
  if [ -n "$SHAPED" ]; then tc qdisc del dev lo root 2>/dev/null || true; SHAPED=; fi
}
cleanup() {
  unshape
  kubectl delete ns "$NS" --wait=false >/dev/null 2>&1 || true
  if [ -n "$OP_PID" ] && kill -0 "$OP_PID" 2>/dev/null; then kill "$OP_PID"; wait "$OP_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
ensure_crd

kubectl create ns "$NS" >/dev/null
until kubectl get sa default -n "$NS" >/dev/null 2>&1; do sleep 0.2; done
port=$(free_port)
# No webhook stamps the run, and it tolerates the real node's taint (a right of its author's):
# the bench trusts its own run (--unadmitted-references trust), as the tests on the bed do.
"$BIN" run --namespaces "$NS" --store-url "file://$WORK/store" --metrics-addr "127.0.0.1:$port" \
  --webhook-addr '' --unadmitted-references trust --holder-image "$HOLDER" --pod-name "operator-$NS" \
  --max-cap 64Gi --drain-wire "$WIRE" \
  >"$WORK/operator.log" 2>&1 &
OP_PID=$!
kubectl apply -f - >/dev/null <<YAML
apiVersion: sandbox.iterion.io/v1alpha1
kind: SandboxRun
metadata: {name: bench, namespace: $NS}
spec:
  image: $BUSYBOX
  user: "1000:1000"
  $RUNTIME_LINE
  nodeSelector: {sandbox.iterion.io/real-node: "true"}
  tolerations: [{key: sandbox.iterion.io/real-node, operator: Equal, value: "true", effect: NoSchedule}]
  readBack:
    compression: none
    drainTimeout: 30m
    paths: [{path: /data, sizeLimit: $CAP}]
YAML
# FLOOD: the symlinks, then our drain alone; its outcome and the operator's peak RSS.
flood() {
  local pod=$1 t0 t1
  echo "== writing $FLOOD symlinks with 3.9 KiB paths in the pod" >&2
  kubectl exec -n "$NS" "$pod" -c workload -- sh -c "
    set -e; d=/data; i=0
    while [ \$i -lt 15 ]; do d=\$d/\$(printf '%0255d' \$i); i=\$((i + 1)); done
    mkdir -p \$d; cd \$d; i=0
    while [ \$i -lt $FLOOD ]; do ln -s target l\$i; i=\$((i + 1)); done"
  echo "== our drain (spec.stop)" >&2
  t0=$(now)
  kubectl patch sbr bench -n "$NS" --type merge -p '{"spec":{"stop":true}}' >/dev/null
  until [ "$(kubectl get sbr bench -n "$NS" -o jsonpath='{.status.phase}')" = Stopped ]; do sleep 0.5; done
  t1=$(now)
  local rss_kb outcome c="${FLOOD}symlinks-3.9KiB-paths-$WIRE"
  rss_kb=$(peak_rss_kb "$OP_PID")
  outcome=$(kubectl get sbr bench -n "$NS" -o jsonpath='{.status.readBack[0].phase} members={.status.readBack[0].members} dropped={.status.readBack[0].droppedMembers} bytes={.status.readBack[0].bytes}')
  printf '\nreal node: %s symlinks with 3.9 KiB paths, cap 1Gi, wire %s: %s in %ss; operator peak RSS %s MiB\n' \
    "$FLOOD" "$WIRE" "$outcome" "$(elapsed "$t0" "$t1")" "$((rss_kb / 1024))"
  result drain_real_node "$c" outcome "$outcome" ""
  result drain_real_node "$c" ours_wall "$(elapsed "$t0" "$t1")" s
  result drain_real_node "$c" operator_peak_rss "$((rss_kb / 1024))" MiB
}
until [ "$(kubectl get sbr bench -n "$NS" -o jsonpath='{.status.phase}' 2>/dev/null)" = Running ]; do sleep 0.5; done
pod=$(kubectl get sbr bench -n "$NS" -o jsonpath='{.status.podName}')
if [ -n "$FLOOD" ]; then
  flood "$pod"
  exit 0
fi
echo "== writing the data in the pod (${BIG_MIB} MiB of $DATA data in 4 files + ${SMALL} small files)" >&2
random_big="head -c $((BIG_MIB * 1024 * 1024 / 4)) /dev/urandom"
if [ "$DATA" != random ]; then
  # JSON log lines (~110 bytes each), varied enough not to be a run of one line.
  big="awk -v n=$((BIG_MIB * 1024 * 1024 / 4 / 110)) -v s=\$i 'BEGIN { srand(s); for (j = 0; j < n; j++) printf \"{\\\"ts\\\":%d,\\\"level\\\":\\\"info\\\",\\\"step\\\":%d,\\\"bytes\\\":%d,\\\"op\\\":\\\"op-%d\\\",\\\"msg\\\":\\\"processed item %d of the batch\\\"}\\n\", 1764500000 + j, j, int(rand() * 10000000), int(rand() * 40), j }'"
else
  big=$random_big
fi
# mix: the odd files random, the even ones text.
[ "$DATA" != mix ] || big="if [ \$((i % 2)) = 1 ]; then $random_big; else $big; fi"
kubectl exec -n "$NS" "$pod" -c workload -- sh -c "
  set -e; mkdir -p /data/big /data/small
  for i in 1 2 3 4; do { $big; } > /data/big/part-\$i.bin; done
  i=0; while [ \$i -lt $SMALL ]; do d=/data/small/d\$((i % 50)); mkdir -p \$d
    head -c \$(( (i * 7919) % 16384 )) /dev/urandom > \$d/f\$i.txt; i=\$((i + 1)); done"
bytes=$(kubectl exec -n "$NS" "$pod" -c workload -- du -sb /data | cut -f1)

if [ -n "$LINK_MBIT" ]; then
  echo "== shaping the kubelet's port ($KUBELET_PORT) to $LINK_MBIT Mbit/s" >&2
  shape
fi
echo "== kubectl cp" >&2
t0=$(now); kubectl cp "$NS/$pod:/data" "$WORK/cp" -c workload >/dev/null 2>&1; t1=$(now)
cp_s=$(elapsed "$t0" "$t1"); cp_bytes=$(du -sb "$WORK/cp" | cut -f1); rm -rf "$WORK/cp"

echo "== raw pack over exec" >&2
# The same wire the operator asks for (pack --wire zstd compresses in the pod).
wire_args=(); [ "$WIRE" = tar ] || wire_args=(--wire "$WIRE")
t0=$(now); kubectl exec -n "$NS" "$pod" -c holder -- sandboxrun-operator pack /sandboxrun-readback/data "${wire_args[@]}" | cat >/dev/null; t1=$(now)
raw_s=$(elapsed "$t0" "$t1")

echo "== our drain (spec.stop)" >&2
t0=$(now)
kubectl patch sbr bench -n "$NS" --type merge -p '{"spec":{"stop":true}}' >/dev/null
until [ "$(kubectl get sbr bench -n "$NS" -o jsonpath='{.status.phase}')" = Stopped ]; do sleep 0.2; done
t1=$(now)
unshape
wall_s=$(elapsed "$t0" "$t1")
drain_s=$(drain_seconds "$port")
rss_kb=$(peak_rss_kb "$OP_PID")
wire_bytes=$(curl -s "http://127.0.0.1:$port/metrics" | awk -v w="$WIRE" '$1 == "sandboxrun_drain_wire_bytes_total{wire=\"" w "\"}" {print $2}')
outcome=$(kubectl get sbr bench -n "$NS" -o jsonpath='{.status.readBack[0].phase} {.status.readBack[0].members} {.status.readBack[0].bytes}')

printf '\nreal node%s: %s bytes (%s MiB of %s data in 4 files + %s small files), wire %s (%s bytes crossed it), drained read-back: %s\n' \
  "${LINK_MBIT:+ over a $LINK_MBIT Mbit/s link}" "$bytes" "$BIG_MIB" "$DATA" "$SMALL" "$WIRE" "${wire_bytes:-?}" "$outcome"
print_contenders "$bytes" "$drain_s" "stop->Stopped" "$wall_s" "$cp_s" "$cp_bytes" "$raw_s"
printf '  throughput ratio ours/kubectl-cp %s, ours/raw %s; wall stop->Stopped vs kubectl cp %s; operator peak RSS %s MiB\n' \
  "$(ratio "$cp_s" "$drain_s")" "$(ratio "$raw_s" "$drain_s")" "$(ratio "$cp_s" "$wall_s")" "$((rss_kb / 1024))"
c="${BIG_MIB}MiB-$DATA+${SMALL}files-$WIRE${LINK_MBIT:+-${LINK_MBIT}Mbit}"
result drain_real_node "$c" bytes "$bytes" bytes
result drain_real_node "$c" outcome "$outcome" ""
result drain_real_node "$c" wire_bytes "${wire_bytes:-0}" bytes
result drain_real_node "$c" ours_drain_metric "$drain_s" s
result drain_real_node "$c" ours_wall "$wall_s" s
result drain_real_node "$c" kubectl_cp "$cp_s" s
result drain_real_node "$c" raw_pack "$raw_s" s
result drain_real_node "$c" ratio_ours_vs_kubectl_cp "$(ratio "$cp_s" "$drain_s")" ratio
result drain_real_node "$c" ratio_ours_vs_raw "$(ratio "$raw_s" "$drain_s")" ratio
result drain_real_node "$c" operator_peak_rss "$((rss_kb / 1024))" MiB
