#!/usr/bin/env bash
# Parallel drains against parallel kubectl cp, on the local control plane's kwok node
# (hack/local-cluster.sh up): aggregate MB/s of N concurrent drains of MIB MiB each.
#
#   bench/drain_parallel.sh [N] [MIB]          default: 8 256
#   SKIP_BUILD=1 bench/drain_parallel.sh        reuse target/release/sandboxrun-operator
#   WIRE=zstd bench/drain_parallel.sh           the operator's --drain-wire (default tar)
#
# Two shapes, each against the same pods and directories:
#   runs   N SandboxRuns of one path each, finished at once: the drain pool
#          (--max-concurrent-drains N) runs their teardowns side by side
#   paths  one SandboxRun declaring N paths: its paths drain in parallel, bounded by
#          --max-concurrent-path-drains N
# and the peer: N `kubectl cp` of the same directories at once. Each directory holds MIB MiB of
# random bytes (4 files) + 200 small files. Ours is timed from the finish annotation to the last
# run Succeeded (wall, every reconcile and status write included). Prints aggregate MB/s and the
# ratio; asserts nothing. Everything it creates is removed at the end.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
eval "$(hack/local-cluster.sh env)"
hack/local-cluster.sh status >/dev/null
N=${1:-8}
MIB=${2:-256}
WIRE=${WIRE:-tar}
case "$WIRE" in zstd|tar) ;; *) echo "WIRE=zstd|tar" >&2; exit 2 ;; esac
BIN=${BIN:-$REPO/target/release/sandboxrun-operator}
STATE=${SANDBOXRUN_TEST_STATE:-$REPO/.k8s-local}
WORK=$STATE/paths/bench-par-$$
mkdir -p "$WORK"

# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
release_binary "$BIN"
OP_PID=
NS=
trap stop_namespace_and_operator EXIT
ensure_crd

echo "== generating $N directories of $MIB MiB" >&2
for i in $(seq 1 "$N"); do
  d=$WORK/data-$i
  mkdir -p "$d/small"
  for j in 1 2 3 4; do
    dd if=/dev/urandom of="$d/part-$j.bin" bs=1M count=$((MIB / 4)) status=none
  done
  for j in $(seq 1 200); do dd if=/dev/urandom of="$d/small/f$j" bs=1K count=$((j % 16)) status=none; done
  cat "$d"/part-* >/dev/null
done
bytes_each=$(du -sb "$WORK/data-1" | cut -f1)
total=$((bytes_each * N))

start_operator() {  # start_operator <namespace>
  local port
  port=$(free_port)
  "$BIN" run --namespaces "$1" --store-url "file://$WORK/store-$1" --metrics-addr "127.0.0.1:$port" \
    --webhook-addr '' --holder-image sandboxrun-operator:bench --pod-name "operator-$1" \
    --pack-command "$BIN pack" --max-cap 64Gi --drain-wire "$WIRE" \
    --max-concurrent-drains "$N" --max-concurrent-path-drains "$N" >"$WORK/operator-$1.log" 2>&1 &
  OP_PID=$!
}
new_namespace() {
  NS=bench-par-$1-$$
  kubectl create ns "$NS" >/dev/null
  until kubectl get sa default -n "$NS" >/dev/null 2>&1; do sleep 0.2; done
}
sbr() {  # sbr <name> <paths yaml>
  kubectl apply -f - >/dev/null <<YAML
apiVersion: sandbox.iterion.io/v1alpha1
kind: SandboxRun
metadata: {name: $1, namespace: $NS}
spec:
  image: registry.example/tool@sha256:0000000000000000000000000000000000000000000000000000000000000000
  command: [sh, -c, work]
  user: "1000:1000"
  readBack:
    compression: none
    drainTimeout: 30m
    paths: $2
YAML
}
wait_phase() {  # wait_phase <name> <phase>
  until [ "$(kubectl get sbr "$1" -n "$NS" -o jsonpath='{.status.phase}' 2>/dev/null)" = "$2" ]; do sleep 0.2; done
}
parallel_cp() {  # parallel_cp <pod> <dir>...: kubectl cp of every (pod, dir) pair at once; prints seconds
  local t0 t1 pids=() k=0
  t0=$(now)
  while [ "$#" -ge 2 ]; do
    kubectl cp "$NS/$1:$2" "$WORK/cp-$k" -c holder >/dev/null 2>&1 & pids+=($!)
    shift 2; k=$((k + 1))
  done
  for p in "${pids[@]}"; do wait "$p"; done
  t1=$(now)
  rm -rf "$WORK"/cp-*
  elapsed "$t0" "$t1"
}
report() {  # report <shape> <ours s> <kubectl cp s>
  printf '%-6s %d x %s MiB (%s bytes in all): ours %7.2f s %8s MB/s | %d x kubectl cp %7.2f s %8s MB/s | ratio %sx; operator peak RSS %s MiB\n' \
    "$1" "$N" "$MIB" "$total" "$2" "$(mbps "$total" "$2")" "$N" "$3" "$(mbps "$total" "$3")" \
    "$(ratio "$3" "$2")" "$(( $(peak_rss_kb "$OP_PID") / 1024 ))"
  result drain_parallel "$1-${N}x${MIB}MiB-$WIRE" ours_wall "$2" s
  result drain_parallel "$1-${N}x${MIB}MiB-$WIRE" kubectl_cp "$3" s
  result drain_parallel "$1-${N}x${MIB}MiB-$WIRE" bytes "$total" bytes
  result drain_parallel "$1-${N}x${MIB}MiB-$WIRE" ratio_ours_vs_kubectl_cp "$(ratio "$3" "$2")" ratio
  result drain_parallel "$1-${N}x${MIB}MiB-$WIRE" operator_peak_rss "$(( $(peak_rss_kb "$OP_PID") / 1024 ))" MiB
}
finish() {
  kubectl delete ns "$NS" --wait=false >/dev/null
  kill "$OP_PID"; wait "$OP_PID" 2>/dev/null || true; OP_PID=; NS=
}

# --- shape 1: N runs of one path each.
new_namespace runs
start_operator "$NS"
for i in $(seq 1 "$N"); do sbr "r$i" "[{path: \"$WORK/data-$i\", sizeLimit: 4Gi}]"; done
pairs=()
for i in $(seq 1 "$N"); do
  wait_phase "r$i" Running
  pairs+=("$(kubectl get sbr "r$i" -n "$NS" -o jsonpath='{.status.podName}')" "$WORK/data-$i")
done
echo "== runs: $N kubectl cp at once" >&2
cp_s=$(parallel_cp "${pairs[@]}")
echo "== runs: $N drains at once" >&2
t0=$(now)
for i in $(seq 1 "$N"); do
  kubectl annotate pod "${pairs[$(( (i - 1) * 2 ))]}" -n "$NS" sandbox.iterion.io/test-exit-code=0 >/dev/null
done
for i in $(seq 1 "$N"); do wait_phase "r$i" Succeeded; done
t1=$(now)
report runs "$(elapsed "$t0" "$t1")" "$cp_s"
finish

# --- shape 2: one run of N paths.
new_namespace paths
start_operator "$NS"
paths="["
for i in $(seq 1 "$N"); do paths+="{path: \"$WORK/data-$i\", sizeLimit: 4Gi},"; done
sbr multi "${paths%,}]"
wait_phase multi Running
pod=$(kubectl get sbr multi -n "$NS" -o jsonpath='{.status.podName}')
pairs=()
for i in $(seq 1 "$N"); do pairs+=("$pod" "$WORK/data-$i"); done
echo "== paths: $N kubectl cp at once" >&2
cp_s=$(parallel_cp "${pairs[@]}")
echo "== paths: one run, $N paths drained at once" >&2
t0=$(now)
kubectl annotate pod "$pod" -n "$NS" sandbox.iterion.io/test-exit-code=0 >/dev/null
wait_phase multi Succeeded
t1=$(now)
report paths "$(elapsed "$t0" "$t1")" "$cp_s"
finish
