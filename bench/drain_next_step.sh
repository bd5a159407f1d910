#!/usr/bin/env bash
# Drain end -> next step on the local control plane's kwok node (hack/local-cluster.sh up): N runs
# whose first attempt fails and is retried after a 1 s backoff; what is measured and how:
# bench/drain_next_step.py.
#
#   bench/drain_next_step.sh [N]                 default 50
#   OPERATOR_BIN=target/debug/sandboxrun-operator bench/drain_next_step.sh 50
#                                                another operator binary (no release build)
#
# One operator (chart defaults) watching only the runs' namespace; everything is removed at the end.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
eval "$(hack/local-cluster.sh env)"
hack/local-cluster.sh status >/dev/null
N=${1:-50}
BACKOFF=1
BIN=${OPERATOR_BIN:-$REPO/target/release/sandboxrun-operator}
STATE=${SANDBOXRUN_TEST_STATE:-$REPO/.k8s-local}
WORK=$STATE/paths/bench-next-$$
mkdir -p "$WORK/data"
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
NO_BUILD=${OPERATOR_BIN:-} release_binary "$BIN"
NS=bench-next-$$
OP_PID=
trap stop_namespace_and_operator EXIT
ensure_crd
for i in $(seq 1 16); do dd if=/dev/urandom of="$WORK/data/f$i" bs=64K count=1 status=none; done
kubectl create ns "$NS" >/dev/null
until kubectl get sa default -n "$NS" >/dev/null 2>&1; do sleep 0.2; done
port=$(free_port)
"$BIN" run --namespaces "$NS" --store-url "file://$WORK/store" --metrics-addr "127.0.0.1:$port" \
  --webhook-addr '' --unadmitted-references trust --holder-image sandboxrun-operator:bench \
  --pod-name "operator-$NS" --pack-command "$BIN pack" >"$WORK/operator.log" 2>&1 &
OP_PID=$!
until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; do sleep 0.2; done
python3 "$REPO/bench/drain_next_step.py" "$N" "$NS" "$WORK/data" "$BACKOFF"
# KEEP_LOG=<file>: the operator's log, kept there.
if [ -n "${KEEP_LOG:-}" ]; then cp "$WORK/operator.log" "$KEEP_LOG"; fi
