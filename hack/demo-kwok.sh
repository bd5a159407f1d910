#!/usr/bin/env bash
# The main job, end to end on this machine: bring up the local control plane, run the operator
# with the embedded file:// store, apply a sample SandboxRun, let it finish, and show where its
# files went (`kubectl get`, `kubectl describe`, `sandboxrun-operator files ls`).
#
# kwok plays the node: no container really runs, and kwok serves `exec` by running the command on
# this host. So the demo plays the workload too — it writes the run's files into the host directory
# that stands for the container path — and the drain then reads them through the real exec API.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
log() { printf '\n== %s\n' "$*" >&2; }

log "local control plane (first run builds the tools from Go modules: tens of minutes)"
hack/local-cluster.sh up
eval "$(hack/local-cluster.sh env)"
STATE=$SANDBOXRUN_TEST_STATE

log "building the operator"
cargo build --locked --bins
BIN=${CARGO_TARGET_DIR:-$REPO/target}/debug/sandboxrun-operator

log "installing the CRDs (all four kinds)"
crds=$(kubectl apply --server-side --force-conflicts -k crds/ -o name)  # crds/kustomization.yaml lists all four
kubectl wait --for condition=established --timeout=60s $crds

STORE=$STATE/demo-store
mkdir -p "$STORE"
if [ -f "$STATE/run/operator.pid" ] && kill -0 "$(cat "$STATE/run/operator.pid")" 2>/dev/null; then
  log "operator already running (pid $(cat "$STATE/run/operator.pid"))"
else
  log "starting the operator (store: file://$STORE, log: $STATE/logs/operator.log)"
  nohup "$BIN" run --store-url "file://$STORE" --webhook-addr '' --metrics-addr 127.0.0.1:18080 \
    --holder-image sandboxrun-operator:dev --holder-binary "$BIN" --namespaces default \
    >"$STATE/logs/operator.log" 2>&1 </dev/null &
  echo $! >"$STATE/run/operator.pid"
fi

OUT=$STATE/demo-paths/report-$(date +%s)
mkdir -p "$OUT"
kubectl delete sbr demo-report --ignore-not-found --wait=true >/dev/null
log "applying config/samples/batch-run.yaml (readBack path -> $OUT)"
sed "s#/work/out#$OUT#" config/samples/batch-run.yaml | sed 's#^  name: batch-report#  name: demo-report#' | kubectl apply -f -
kubectl wait --for=jsonpath='{.status.phase}'=Running sbr/demo-report --timeout=120s

log "the workload writes its report (simulated: kwok runs no container)"
mkdir -p "$OUT/charts"
printf 'build ok\ntests: 42 passed\n' >"$OUT/summary.txt"
printf '{"passed":42,"failed":0}\n' >"$OUT/results.json"
head -c 200000 /dev/urandom >"$OUT/charts/coverage.bin"
POD=$(kubectl get sbr demo-report -o jsonpath='{.status.podName}')
kubectl annotate pod "$POD" sandbox.iterion.io/test-exit-code=0 --overwrite >/dev/null

log "waiting for the run to complete (drain at teardown)"
kubectl wait --for=condition=Complete sbr/demo-report --timeout=180s
kubectl get sbr demo-report
kubectl describe sbr demo-report

log "the drained files, read back from the store"
"$BIN" files ls demo-report -n default --store-url "file://$STORE"
printf '\nStop the operator with: kill %s ; stop the cluster with: hack/local-cluster.sh down\n' "$(cat "$STATE/run/operator.pid")"
