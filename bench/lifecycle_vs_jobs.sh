#!/usr/bin/env bash
# Full lifecycles per minute, SandboxRuns vs batch/v1 Jobs, on the local control plane's kwok node
# (hack/local-cluster.sh up). What is measured and how: bench/lifecycle_vs_jobs.py.
#
#   bench/lifecycle_vs_jobs.sh [N...]          default: 100 1000 (10000 works on kwok too)
#   SKIP_BUILD=1 bench/lifecycle_vs_jobs.sh    reuse target/release/sandboxrun-operator
#   LIFECYCLE_JOBS_UP_TO=1000 bench/lifecycle_vs_jobs.sh 1000 10000
#                                              the Jobs side only up to that N (10,000 Jobs take
#                                              ~50 min on 2 CPUs; the runs' RSS target is at 10,000)
#   NODE=real bench/lifecycle_vs_jobs.sh 10    on the REAL node: real containers (busybox) writing
#                                              1 MiB, the holder is the operator image
#                                              (hack/images.sh operator); Jobs do the same work
#   NODE=real RUNTIME_CLASS=gvisor bench/lifecycle_vs_jobs.sh 10   the same, runs and Jobs under gVisor
#   LIFECYCLE_NETPOL=run                       on kwok, keep the bed's kube-routers running (they
#                                              are paused by default: see below)
#   LIFECYCLE_KEEP_LOGS=<dir>                  keep the operators' logs there
#   LIFECYCLE_OPERATOR_LOG_LEVEL=<filter>      the operators' --log-level
#
# One operator (release build, chart defaults: --concurrency 16, 8 drains) per N, watching only
# the runs' namespace; the Jobs live in a namespace of their own. Everything it creates is
# removed at the end.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
eval "$(hack/local-cluster.sh env)"
hack/local-cluster.sh status >/dev/null
NODE=${NODE:-kwok}
case "$NODE" in kwok|real) ;; *) echo "NODE=kwok|real" >&2; exit 2 ;; esac
if [ "$NODE" = real ]; then SIZES=("${@:-10}"); else SIZES=("${@:-100 1000}"); fi
# shellcheck disable=SC2206
SIZES=(${SIZES[*]})
# OPERATOR_BIN: another operator binary (e.g. the image's static one, .k8s-local/images/operator/…).
BIN=${OPERATOR_BIN:-$REPO/target/release/sandboxrun-operator}
STATE=${SANDBOXRUN_TEST_STATE:-$REPO/.k8s-local}
WORK=$STATE/paths/bench-life-$$
mkdir -p "$WORK/data"
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
NO_BUILD=${OPERATOR_BIN:-} release_binary "$BIN"

PAUSED=()
OP_PID=
NAMESPACES=()
cleanup() {
  for pid in "${PAUSED[@]}"; do kill -CONT "$pid" 2>/dev/null || true; done
  if [ -n "$OP_PID" ] && kill -0 "$OP_PID" 2>/dev/null; then
    # Runs still held by the finalizer would keep their namespace: release them first.
    # (kubectl's own --wait follows 10,000 deletions one by one for minutes after they are done:
    # poll the count instead.)
    for ns in "${NAMESPACES[@]}"; do
      kubectl delete sbr --all -n "$ns" --wait=false >/dev/null 2>&1 || true
      for _ in $(seq 1 300); do
        left=$(kubectl get sbr -n "$ns" -o name 2>/dev/null || true)
        [ -z "$left" ] && break
        sleep 2
      done
    done
    kill "$OP_PID"; wait "$OP_PID" 2>/dev/null || true
  fi
  for ns in "${NAMESPACES[@]}"; do kubectl delete ns "$ns" --wait=false >/dev/null 2>&1 || true; done
  # LIFECYCLE_KEEP_LOGS=<dir>: the operators' logs outlive the run (a reconcile's reason is in
  # each line's span: `--log-level` via LIFECYCLE_OPERATOR_LOG_LEVEL).
  if [ -n "${LIFECYCLE_KEEP_LOGS:-}" ]; then
    mkdir -p "$LIFECYCLE_KEEP_LOGS"
    cp "$WORK"/operator-*.log "$LIFECYCLE_KEEP_LOGS/" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
# On the kwok node the bed's network-policy agents (one kube-router a real node,
# hack/real-node.sh) are paused while the bench runs (SIGSTOP, resumed at exit): each of the N
# fake pods made them rewrite their iptables and ipsets on this same 2-CPU machine, ~13 % of all
# CPU and half the runs' rate (docs/performance.md "The bed's network-policy agents, and a
# reconcile's echoes"). A real cluster's agents run on its nodes, not on the control plane's
# CPUs; the kwok bench measures the control plane (both sides, runs and Jobs, the same).
# LIFECYCLE_NETPOL=run keeps them running. Only a PID the bed recorded that is still a
# kube-router is paused (a stale file's PID may be another process's by now).
if [ "$NODE" = kwok ] && [ "${LIFECYCLE_NETPOL:-pause}" = pause ]; then
  for f in "$STATE"/node*/run/kube-router.pid; do
    [ -s "$f" ] || continue
    pid=$(cat "$f")
    [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = kube-router ] || continue
    kill -STOP "$pid" && PAUSED+=("$pid")
  done
  [ ${#PAUSED[@]} -eq 0 ] || echo "== the bed's kube-router paused for the bench (pids ${PAUSED[*]}; LIFECYCLE_NETPOL=run keeps it)"
fi

ensure_crd

# ~1 MiB a run: 16 files of 64 KiB (the same directory for every run: kwok's exec runs the packer
# on this host).
for i in $(seq 1 16); do dd if=/dev/urandom of="$WORK/data/f$i" bs=64K count=1 status=none; done

HOLDER=sandboxrun-operator:bench
# kwok's exec runs the packer on this host; a real holder has its own.
PACK=(--pack-command "$BIN pack")
export LIFECYCLE_NODE=$NODE
export LIFECYCLE_RUNTIME_CLASS=${RUNTIME_CLASS:-}
if [ "$NODE" = real ]; then
  [ -s "$STATE/images/sandboxrun-operator.ref" ] || { echo "no operator image: hack/images.sh operator" >&2; exit 1; }
  HOLDER=$(sed "s#^[^/]*/#$SANDBOXRUN_TEST_POD_REGISTRY/#" "$STATE/images/sandboxrun-operator.ref")
  LIFECYCLE_WORKLOAD_IMAGE=$(sed "s#^[^/]*/#$SANDBOXRUN_TEST_POD_REGISTRY/#" "$STATE/images/busybox.ref")
  export LIFECYCLE_WORKLOAD_IMAGE
  PACK=()
fi

for n in "${SIZES[@]}"; do
  runs_ns=bench-life-$NODE-runs-$n-$$
  jobs_ns=bench-life-$NODE-jobs-$n-$$
  for ns in "$runs_ns" "$jobs_ns"; do
    kubectl create ns "$ns" >/dev/null
    NAMESPACES+=("$ns")
    until kubectl get sa default -n "$ns" >/dev/null 2>&1; do sleep 0.2; done
  done
  port=$(free_port)
  # The real runs tolerate the real node's taint with no webhook to stamp them: trusted.
  "$BIN" run --namespaces "$runs_ns" --store-url "file://$WORK/store-$n" \
    --metrics-addr "127.0.0.1:$port" --webhook-addr '' --unadmitted-references trust --holder-image "$HOLDER" \
    --pod-name "operator-$runs_ns" "${PACK[@]}" \
    ${LIFECYCLE_OPERATOR_LOG_LEVEL:+--log-level "$LIFECYCLE_OPERATOR_LOG_LEVEL"} >"$WORK/operator-$n.log" 2>&1 &
  OP_PID=$!
  until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; do sleep 0.2; done
  LIFECYCLE_OPERATOR_METRICS=127.0.0.1:$port \
    python3 "$REPO/bench/lifecycle_vs_jobs.py" "$n" "$runs_ns" "$jobs_ns" "$WORK/data" "$OP_PID"
  # The runs are released by this operator (their finalizer); kubectl's own --wait follows the
  # deletions one by one for minutes after they are done: poll the count instead.
  kubectl delete sbr --all -n "$runs_ns" --wait=false >/dev/null
  for _ in $(seq 1 300); do
    [ -z "$(kubectl get sbr -n "$runs_ns" -o name 2>/dev/null || true)" ] && break
    sleep 2
  done
  kill "$OP_PID"; wait "$OP_PID" 2>/dev/null || true; OP_PID=
  kubectl delete ns "$runs_ns" "$jobs_ns" --wait=false >/dev/null
done
