#!/usr/bin/env bash
# Scale-out of active-active replicas (--sharding) on the local control plane's kwok node
# (hack/local-cluster.sh up): lifecycles/min and aggregate drain MB/s with 1, 2 and 4 replicas,
# each replica held to the same drain bandwidth (--max-drain-bytes-per-second), then the peak RSS
# of each replica at N runs with the most replicas against one. What is measured and how:
# bench/scale_replicas.py.
#
#   bench/scale_replicas.sh [REPLICAS...]       default: 1 2 4
#   SKIP_BUILD=1 bench/scale_replicas.sh        reuse target/release/sandboxrun-operator
#   SCALE_BIN=/path/to/sandboxrun-operator      this binary instead (e.g. the image's musl build,
#                                               linked in hack/code-order.sh's order), no build
#   SCALE_LIMIT=20000000                        each replica's --max-drain-bytes-per-second (B/s)
#   SCALE_RUNS=100                              runs per replica in the throughput part (N = this
#                                               x replicas, so every replica drains as much; 0:
#                                               skip it)
#   SCALE_MIB=8                                 MiB each run drains
#   SCALE_RSS_N=10000                           runs of the RSS part (0: skip it); it runs with 1
#                                               replica and with the most replicas of the list,
#                                               without the bandwidth limit, 1 MiB a run
#   SCALE_RSS_ONLY=4                            the RSS part with these replica counts only
#
# Why a bandwidth limit: on this machine (2 CPUs, shared) every replica, the apiserver and kwok
# share the same cores, so adding replicas adds no CPU. In a cluster each replica brings its own
# CPU and pod network; the limit stands for that network, and the aggregate should scale with the
# replicas against it (issue #28: goal >= 3.5x at 4 replicas).
#
# The replicas are processes on this host (release build, chart defaults otherwise: --concurrency
# 16, 8 drains, 32 shards), sharing one Lease group in the runs' namespace, each watching only that
# namespace. Every run drains the same host directory (kwok's exec runs the packer on this host)
# over a plain tar wire (--drain-wire tar: the bytes on the wire are the bytes drained). Everything
# it creates is removed at the end.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
eval "$(hack/local-cluster.sh env)"
hack/local-cluster.sh status >/dev/null
REPLICAS=("${@:-1 2 4}")
# shellcheck disable=SC2206
REPLICAS=(${REPLICAS[*]})
LIMIT=${SCALE_LIMIT:-20000000}
RUNS_EACH=${SCALE_RUNS:-100}
MIB=${SCALE_MIB:-8}
RSS_N=${SCALE_RSS_N:-10000}
SHARDS=32
BIN=${SCALE_BIN:-$REPO/target/release/sandboxrun-operator}
[ -z "${SCALE_BIN:-}" ] || NO_BUILD=1
STATE=${SANDBOXRUN_TEST_STATE:-$REPO/.k8s-local}
WORK=$STATE/paths/bench-scale-$$
mkdir -p "$WORK/big" "$WORK/small"
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
release_binary "$BIN"

PIDS=()
PORTS=()
NS=
stop_replicas() {
  local pid
  for pid in "${PIDS[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then kill "$pid"; fi
  done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=(); PORTS=()
}
# delete_runs: the runs removed while their replicas still run (they hold the drain finalizer);
# polled, not `kubectl delete --wait` (which follows thousands of deletions one by one).
delete_runs() {
  kubectl delete sbr --all -n "$NS" --wait=false >/dev/null 2>&1 || true
  for _ in $(seq 1 600); do
    [ -z "$(kubectl get sbr -n "$NS" -o name 2>/dev/null)" ] && return 0
    sleep 2
  done
  echo "runs of $NS still there after 20 min" >&2
}
finish_namespace() {
  if [ -n "$NS" ]; then
    delete_runs
    stop_replicas
    kubectl delete ns "$NS" --wait=false >/dev/null 2>&1 || true
    NS=
  fi
  rm -rf "$WORK"/store-*
}
cleanup() {
  finish_namespace
  stop_replicas
  rm -rf "$WORK"
}
trap cleanup EXIT
ensure_crd

# The data: MIB MiB of random bytes (4 files) for the throughput part, 1 MiB (16 files of
# 64 KiB) for the RSS part, like bench/lifecycle_vs_jobs.sh.
for j in 1 2 3 4; do dd if=/dev/urandom of="$WORK/big/part-$j.bin" bs=1M count=$((MIB / 4)) status=none; done
for j in $(seq 1 16); do dd if=/dev/urandom of="$WORK/small/f$j" bs=64K count=1 status=none; done
cat "$WORK"/big/* >/dev/null

# start_replicas <R> <part> <limit>: a fresh namespace and R sharded replicas in it, each held to
# <limit> B/s of drains (0: unlimited), once the shards are spread (sandboxrun_shards_owned summed
# over the replicas is every shard, each holding its fair share).
start_replicas() {
  local r=$1 limit=$3 i port total ok
  NS=bench-scale-$2-$r-$$
  kubectl create ns "$NS" >/dev/null
  until kubectl get sa default -n "$NS" >/dev/null 2>&1; do sleep 0.2; done
  for i in $(seq 0 $((r - 1))); do
    port=$(free_port)
    "$BIN" run --namespaces "$NS" --store-url "file://$WORK/store-$r" \
      --metrics-addr "127.0.0.1:$port" --webhook-addr '' --settings-configmap '' \
      --holder-image sandboxrun-operator:bench --pack-command "$BIN pack" --drain-wire tar \
      --sharding --shards "$SHARDS" --lease-name bench-scale --pod-namespace "$NS" \
      --pod-name "replica-$i" --max-drain-bytes-per-second "$limit" \
      >"$WORK/replica-$2-$r-$i.log" 2>&1 &
    PIDS+=($!); PORTS+=("$port")
  done
  for port in "${PORTS[@]}"; do
    until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; do sleep 0.2; done
  done
  for _ in $(seq 1 300); do
    total=0; ok=1
    for port in "${PORTS[@]}"; do
      i=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^sandboxrun_shards_owned / { print $2 }')
      total=$((total + ${i:-0}))
      [ "${i:-0}" -ge $((SHARDS / r)) ] || ok=0
    done
    [ "$total" -eq "$SHARDS" ] && [ "$ok" = 1 ] && return 0
    sleep 1
  done
  echo "the $SHARDS shards were not spread over $r replicas in 5 min" >&2
  tail -5 "$WORK"/replica-"$2"-"$r"-*.log >&2
  exit 1
}
joined() { local IFS=,; echo "$*"; }

# The bed's apiserver and kwok, whose CPU the throughput part reports (read only).
SCALE_APISERVER_PID=$(cat "$STATE/run/kube-apiserver.pid" 2>/dev/null || true)
SCALE_KWOK_PID=$(cat "$STATE/run/kwok.pid" 2>/dev/null || true)
export SCALE_APISERVER_PID SCALE_KWOK_PID
export SCALE_SUMMARY=$WORK/summary.jsonl
: >"$SCALE_SUMMARY"
for r in "${REPLICAS[@]}"; do
  [ "$RUNS_EACH" -gt 0 ] || break
  start_replicas "$r" tp "$LIMIT"
  python3 "$REPO/bench/scale_replicas.py" throughput "$r" $((RUNS_EACH * r)) "$NS" "$WORK/big" \
    "$(joined "${PORTS[@]}")" "$(joined "${PIDS[@]}")" "$LIMIT"
  finish_namespace
done

if [ "$RSS_N" -gt 0 ]; then
  most=1
  for r in "${REPLICAS[@]}"; do [ "$r" -gt "$most" ] && most=$r; done
  for r in ${SCALE_RSS_ONLY:-$(printf '%s\n' 1 "$most" | sort -nu)}; do
    start_replicas "$r" rss 0
    python3 "$REPO/bench/scale_replicas.py" rss "$r" "$RSS_N" "$NS" "$WORK/small" \
      "$(joined "${PORTS[@]}")" "$(joined "${PIDS[@]}")"
    finish_namespace
  done
fi

python3 "$REPO/bench/scale_replicas.py" summary "$SCALE_SUMMARY"
