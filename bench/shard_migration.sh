#!/usr/bin/env bash
# A replica's memory when a cluster moves to sharding (issue #28 item 2, docs/performance.md
# "Scale-out"): N ended SandboxRuns without a shard label (made by an unsharded operator, status
# and finalizer written) and one sharded replica starting against them. Every replica watches the
# unlabelled runs to label the ones of its shards, so this backlog is held by every replica at
# once; the peer is the same replica started again once every run is labelled (its steady state).
# Reported: each start's peak anonymous memory (RssAnon, sampled every 0.5 s over its first
# MIGRATION_SECONDS) and VmHWM, and the ratio of the two starts.
#
#   bench/shard_migration.sh [N]                 default N = 1500, on the local cluster's kwok node
#   SKIP_BUILD=1                                 reuse target/release/sandboxrun-operator
#   MIGRATION_BIN=/path/to/sandboxrun-operator   measure that binary instead (e.g. an older build,
#                                                to compare before and after a change)
#   MIGRATION_SECONDS=90                         how long each start is sampled
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
eval "$(hack/local-cluster.sh env)"
hack/local-cluster.sh status >/dev/null
N=${1:-1500}
SECONDS_EACH=${MIGRATION_SECONDS:-90}
BIN=${MIGRATION_BIN:-$REPO/target/release/sandboxrun-operator}
STATE=${SANDBOXRUN_TEST_STATE:-$REPO/.k8s-local}
WORK=$STATE/paths/bench-migration-$$
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
if [ -n "${MIGRATION_BIN:-}" ]; then NO_BUILD=1; fi
release_binary "$BIN"
mkdir -p "$WORK/data"
echo "one small file" >"$WORK/data/f"
NS=bench-migration-$$
P=
# start_operator sharded|plain: one replica watching $NS
start_operator() {
  local extra=()
  if [ "$1" = sharded ]; then
    extra=(--sharding --shards 32 --lease-name bench-migration --pod-namespace "$NS" --pod-name r0)
  fi
  start_replica "$BIN" "$NS" "$WORK/store" "$WORK/operator.log" "${extra[@]}"
}
cleanup() {
  stop_replica
  if kubectl get ns "$NS" >/dev/null 2>&1; then
    start_operator plain
    kubectl delete sbr --all -n "$NS" --wait=false >/dev/null 2>&1 || true
    for _ in $(seq 1 300); do
      [ -z "$(kubectl get sbr -n "$NS" -o name 2>/dev/null)" ] && break
      sleep 2
    done
    stop_replica
    kubectl delete ns "$NS" --wait=false >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
ensure_crd
kubectl create ns "$NS" >/dev/null
until kubectl get sa default -n "$NS" >/dev/null 2>&1; do sleep 0.2; done

echo "== $N runs ended by an unsharded operator (no shard label)"
# The runs of bench/scale_replicas.py (its runs_yaml), each draining one small file.
python3 -B -c 'import sys; sys.path.insert(0, sys.argv[1]); from scale_replicas import runs_yaml
print(runs_yaml(int(sys.argv[2]), sys.argv[3], sys.argv[4], "1Mi"))' \
  "$REPO/bench" "$N" "$NS" "$WORK/data" | kubectl apply -f - >/dev/null
start_operator plain
succeeded() {
  kubectl get sbr -n "$NS" -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c Succeeded || true
}
until [ "$(succeeded)" -ge "$N" ]; do sleep 5; done
stop_replica

# sample_start <case>: starts the sharded replica, samples it, prints and records its peaks;
# PEAK is its peak RssAnon in kB
PEAK=0
sample_start() {
  local anon hwm labelled
  PEAK=0
  kubectl delete lease --all -n "$NS" >/dev/null 2>&1 || true
  start_operator sharded
  for _ in $(seq 1 $((SECONDS_EACH * 2))); do
    anon=$(awk '/^RssAnon:/ { print $2 }' "/proc/$P/status")
    [ "$anon" -gt "$PEAK" ] && PEAK=$anon
    sleep 0.5
  done
  hwm=$(peak_rss_kb "$P")
  labelled=$(kubectl get sbr -n "$NS" -l sandbox.iterion.io/shard -o name | wc -l)
  stop_replica
  printf '  %-28s peak RssAnon %4d MiB   VmHWM %4d MiB   (%d of %d runs labelled after %d s)\n' \
    "$1" $((PEAK / 1024)) $((hwm / 1024)) "$labelled" "$N" "$SECONDS_EACH"
  result shard_migration "$1" peak_rss_anon $((PEAK / 1024)) MiB
  result shard_migration "$1" vmhwm $((hwm / 1024)) MiB
}
echo "== one sharded replica, $SECONDS_EACH s each ($BIN)"
sample_start "every run unlabelled"
migrating=$PEAK
sample_start "every run labelled (peer)"
steady=$PEAK
echo "== the migration's peak anonymous memory is $(ratio "$migrating" "$steady")x the labelled start's"
result shard_migration summary migration_over_steady "$(ratio "$migrating" "$steady")" ratio
