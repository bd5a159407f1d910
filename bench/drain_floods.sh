#!/usr/bin/env bash
# The operator's peak memory with every path slot draining a worst-case flood at once (issue #38
# item 5, docs/performance.md "Drain memory"): N runs (default 8, the chart's
# maxConcurrentPathDrains) of one path each on the local control plane's kwok node, their packer a
# stand-in that emits the flood the in-process bench measured worst — FILES empty files with 4 KiB
# names (bench/drain_memory.rs `emit flood`), drained with the largest cap (16 GiB: the largest
# metadata allowance) — through the real exec stream, parser, sanitizer, meters, re-emitter and
# multipart upload of one operator process (--max-concurrent-path-drains N). Prints the operator's
# VmHWM beside the chart's memory limit; asserts nothing.
#
#   bench/drain_floods.sh [N] [FILES]          default: 8 200000
#   SKIP_BUILD=1 BIN=target/debug/sandboxrun-operator bench/drain_floods.sh   another binary
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
eval "$(hack/local-cluster.sh env)"
hack/local-cluster.sh status >/dev/null
N=${1:-8}
FILES=${2:-200000}
BIN=${BIN:-$REPO/target/release/sandboxrun-operator}
STATE=${SANDBOXRUN_TEST_STATE:-$REPO/.k8s-local}
WORK=$STATE/paths/bench-floods-$$
mkdir -p "$WORK"
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
release_binary "$BIN"
nice -n 10 cargo build --example drain_memory >&2
EMIT=$REPO/target/debug/examples/drain_memory
OP_PID=
NS=
trap stop_namespace_and_operator EXIT
ensure_crd

# The packer stand-in: whatever it is asked (path, --budget, --wire), it sends the flood.
cat >"$WORK/flood-pack.sh" <<SH
#!/bin/sh
exec "$EMIT" emit flood "$FILES"
SH
chmod +x "$WORK/flood-pack.sh"

NS=bench-floods-$$
kubectl create ns "$NS" >/dev/null
until kubectl get sa default -n "$NS" >/dev/null 2>&1; do sleep 0.2; done
port=$(free_port)
"$BIN" run --namespaces "$NS" --store-url "file://$WORK/store" --metrics-addr "127.0.0.1:$port" \
  --webhook-addr '' --holder-image sandboxrun-operator:bench --pod-name "operator-floods-$$" \
  --pack-command "$WORK/flood-pack.sh" --max-cap 16Gi \
  --max-concurrent-drains "$N" --max-concurrent-path-drains "$N" --max-path-drains-per-run 4 \
  >"$WORK/operator.log" 2>&1 &
OP_PID=$!
for i in $(seq 1 "$N"); do
  mkdir -p "$WORK/data-$i"
  kubectl apply -f - >/dev/null <<YAML
apiVersion: sandbox.iterion.io/v1alpha1
kind: SandboxRun
metadata: {name: f$i, namespace: $NS}
spec:
  image: registry.example/tool@sha256:0000000000000000000000000000000000000000000000000000000000000000
  command: [sh, -c, work]
  user: "1000:1000"
  readBack:
    compression: none
    drainTimeout: 60m
    paths: [{path: "$WORK/data-$i", sizeLimit: 16Gi}]
YAML
done
pods=()
for i in $(seq 1 "$N"); do
  until [ "$(kubectl get sbr "f$i" -n "$NS" -o jsonpath='{.status.phase}' 2>/dev/null)" = Running ]; do sleep 0.2; done
  pods+=("$(kubectl get sbr "f$i" -n "$NS" -o jsonpath='{.status.podName}')")
done
before=$(peak_rss_kb "$OP_PID")
echo "== $N floods of $FILES files with 4 KiB names at once (operator VmHWM before: $((before / 1024)) MiB)" >&2
t0=$(now)
for p in "${pods[@]}"; do
  kubectl annotate pod "$p" -n "$NS" sandbox.iterion.io/test-exit-code=0 >/dev/null
done
for i in $(seq 1 "$N"); do
  until phase=$(kubectl get sbr "f$i" -n "$NS" -o jsonpath='{.status.phase}' 2>/dev/null) && { [ "$phase" = Succeeded ] || [ "$phase" = Failed ]; }; do
    sleep 1
  done
done
t1=$(now)
peak=$(peak_rss_kb "$OP_PID")
states=$(kubectl get sbr -n "$NS" -o jsonpath='{range .items[*]}{.metadata.name}={.status.readBack[0].phase}({.status.readBack[0].droppedMembers} dropped) {end}')
# The chart's memory limit: drainMemory.baselineMi + maxConcurrentPathDrains × drainMemory.perPathDrainMi.
limit=$(awk '/^drainMemory:/ {d=1; next} d && /^[^ ]/ {d=0} d && /baselineMi:/ {b=$2} d && /perPathDrainMi:/ {p=$2}
  /^maxConcurrentPathDrains:/ {n=$2} END {printf "%d MiB (%d + %d x %d)", b + n * p, b, n, p}' charts/sandboxrun-operator/values.yaml)
printf 'floods: %d x %d files with 4 KiB names, cap 16Gi, in %.1f s: operator peak RSS %d MiB (before %d MiB); the chart'"'"'s memory limit %s\n  %s\n' \
  "$N" "$FILES" "$(elapsed "$t0" "$t1")" "$((peak / 1024))" "$((before / 1024))" "$limit" "$states"
result drain_floods "${N}x${FILES}" operator_peak_rss "$((peak / 1024))" MiB
result drain_floods "${N}x${FILES}" wall "$(elapsed "$t0" "$t1")" s
