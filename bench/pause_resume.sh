#!/usr/bin/env bash
# Pause -> resume on the REAL node (issue #54, docs/performance.md "Pause and resume"): a run with
# `spec.workspace.restore: Latest` writes N MiB of random bytes, is paused (suspend: drained, pod
# gone) and resumed; resume -> the workload's first instruction (the files restored and verified
# before it) beside create -> first instruction of a cold and a warm run of the same image, on the
# same operator, interleaved; and the pause (suspend -> Suspended: drained). What is measured: bench/pause_resume.py.
#
#   bench/pause_resume.sh [SAMPLES] [SIZES]      default: 5 "1,64" (MiB restored)
#   BIN=... bench/pause_resume.sh                another operator binary (default: the image's
#                                                static one, hack/images.sh operator)
#   RUNTIME_CLASS=gvisor bench/pause_resume.sh   every pod under that RuntimeClass
#
# Needs the local cluster up with its real node (hack/local-cluster.sh up) and the operator image
# pushed (hack/images.sh operator). One operator on this host (--warm-pools), one namespace of its
# own; both removed at the end.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
eval "$(hack/local-cluster.sh env)"
hack/local-cluster.sh status >/dev/null
SAMPLES=${1:-5}
SIZES=${2:-1,64}
# Before hack/lib.sh, whose BIN is the tools directory.
OPERATOR_BIN=${BIN:-}
# shellcheck source=hack/lib.sh
. hack/lib.sh
bed_defaults
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
real_node_bench_setup
ensure_crd
NS=bench-pause-$$
WORK=$STATE/paths/bench-pause-$$
mkdir -p "$WORK/store"
OP_PID=
stop_all() {
  cp "$WORK/operator.log" "${TMPDIR:-/tmp}/pause_resume-operator.log" 2>/dev/null || true
  stop_namespace_and_operator
}
trap stop_all EXIT
kubectl create namespace "$NS" >/dev/null
start_pool_operator "$WORK/operator.log"
echo "operator: $OPERATOR_BIN (pid $OP_PID); workload image $IMAGE; sizes $SIZES MiB"
(cd bench && "$PY" pause_resume.py "$NS" "$SAMPLES" "$IMAGE" "$SIZES")
kubectl delete sbrp --all -n "$NS" --wait=false >/dev/null 2>&1 || true
