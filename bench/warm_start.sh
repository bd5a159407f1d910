#!/usr/bin/env bash
# Warm pools on the REAL node (docs/performance.md "Warm pools"): create -> the workload's first
# instruction for a run that takes a warm pool's pod, a cold run of the same template shape and a
# bare pod of the same image and command, side by side (interleaved), p50 and p99; then a burst of
# runs on a pool of ready pods (warm starts per second). What is measured: bench/warm_start.py.
#
#   bench/warm_start.sh [SAMPLES] [POOL]        default: 50 5
#   BIN=... bench/warm_start.sh                  another operator binary (default: the image's
#                                                static one, hack/images.sh operator)
#   NETWORK=1 bench/warm_start.sh                the templates restrict egress (an allowlist of
#                                                192.0.2.0/24): pool pods and cold runs pass the
#                                                egress gate (probing the real node's kubelet
#                                                port), warm runs apply their own policy first
#   RUNTIME_CLASS=gvisor bench/warm_start.sh    every pod (pool, cold, bare, agent-sandbox's) under
#                                                that RuntimeClass (the bed's gVisor)
#   AGENT_SANDBOX=1 bench/warm_start.sh          then the same on kubernetes-sigs/agent-sandbox
#                                                (its controller built from its Go module into
#                                                the tools cache: hack/build-tools.sh agent-sandbox;
#                                                its CRDs applied, its controller on this host)
#
# Needs the local cluster up with its real node (hack/local-cluster.sh up) and the operator image
# pushed (hack/images.sh operator). One operator on this host (--warm-pools), one namespace of its
# own; both removed at the end.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
eval "$(hack/local-cluster.sh env)"
hack/local-cluster.sh status >/dev/null
SAMPLES=${1:-50}
POOL=${2:-5}
# Before hack/lib.sh, whose BIN is the tools directory.
OPERATOR_BIN=${BIN:-}
# shellcheck source=hack/lib.sh
. hack/lib.sh
bed_defaults
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
real_node_bench_setup
crds=$(kubectl apply --server-side --force-conflicts -k crds/ -o name)  # crds/kustomization.yaml lists all four
kubectl wait --for condition=established --timeout=60s $crds >/dev/null
NS=bench-warm-$$
WORK=$STATE/paths/bench-warm-$$
mkdir -p "$WORK/store"
OP_PID=
AS_PID=
stop_all() {
  # The logs outlive the run, for a failed sample's story.
  cp "$WORK/operator.log" "${TMPDIR:-/tmp}/warm_start-operator.log" 2>/dev/null || true
  cp "$WORK/agent-sandbox.log" "${TMPDIR:-/tmp}/warm_start-agent-sandbox.log" 2>/dev/null || true
  if [ -n "$AS_PID" ] && kill -0 "$AS_PID" 2>/dev/null; then kill "$AS_PID"; wait "$AS_PID" 2>/dev/null || true; fi
  stop_namespace_and_operator
}
trap stop_all EXIT
kubectl create namespace "$NS" >/dev/null
FILTER=()
if [ -n "${NETWORK:-}" ]; then
  kubelet=$(kubectl get node "$SANDBOXRUN_TEST_REAL_NODE" -o jsonpath='{.status.daemonEndpoints.kubeletEndpoint.Port}')
  FILTER=(--egress-gate-probe "node:$kubelet")
  export BENCH_NETWORK='{"mode": "allowlist", "rules": ["192.0.2.0/24"]}'
  echo "templates restrict egress: $BENCH_NETWORK; the gate probes node:$kubelet"
fi
start_pool_operator "$WORK/operator.log" "${FILTER[@]}"
echo "operator: $OPERATOR_BIN (pid $OP_PID); workload image $IMAGE; pool of $POOL"
PEER=()
if [ -n "${AGENT_SANDBOX:-}" ]; then
  AS_DIR=$(hack/build-tools.sh agent-sandbox | tail -n 1)
  kubectl apply --server-side --force-conflicts -f "$AS_DIR/crds/" >/dev/null
  kubectl wait --for condition=established --timeout=60s -f "$AS_DIR/crds/" >/dev/null
  "$AS_DIR/bin/agent-sandbox-controller" --kubeconfig "$KUBECONFIG" --extensions --leader-elect=false \
    --metrics-bind-address "127.0.0.1:$(free_port)" --health-probe-bind-address "127.0.0.1:$(free_port)" \
    >"$WORK/agent-sandbox.log" 2>&1 &
  AS_PID=$!
  echo "agent-sandbox: $AS_DIR/bin/agent-sandbox-controller (pid $AS_PID)"
  PEER=(agent-sandbox)
fi
"$PY" bench/warm_start.py "$NS" "$SAMPLES" "$IMAGE" "$POOL" "${PEER[@]}"
kubectl delete sbrp --all -n "$NS" --wait=false >/dev/null 2>&1 || true
