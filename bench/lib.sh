# Shared helpers of the drain benchmarks (sourced by bench/drain_*.sh, never run).
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { print b - a }'; }
mbps() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.1f", b / s / 1e6 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
# drain_seconds <metrics port>: the operator's own time for its successful drains
drain_seconds() {
  curl -s "http://127.0.0.1:$1/metrics" | awk '/^sandboxrun_drain_duration_seconds_sum\{phase="Drained"\}/ { print $2 }'
}
# peak_rss_kb <pid>: the process's peak resident set (VmHWM)
peak_rss_kb() { awk '/VmHWM/ { print $2 }' "/proc/$1/status"; }
# print_contenders <bytes> <ours s> <wall label> <wall s> <kubectl cp s> <copied bytes> <raw s>
print_contenders() {
  printf '  (a) ours, drain metric   %8.2f s  %8s MB/s   (wall %s %.2f s)\n' "$2" "$(mbps "$1" "$2")" "$3" "$4"
  printf '  (b) kubectl cp           %8.2f s  %8s MB/s   (copied %s bytes)\n' "$5" "$(mbps "$1" "$5")" "$6"
  printf '  (c) raw pack | cat       %8.2f s  %8s MB/s\n' "$7" "$(mbps "$1" "$7")"
}
# ensure_crd: every CRD of this checkout (all four kinds), applied as users apply them (a fresh
# cluster has none)
ensure_crd() {
  crds=$(kubectl apply --server-side --force-conflicts -k "$REPO/crds/" -o name)  # crds/kustomization.yaml lists all four
  kubectl wait --for condition=established --timeout=60s $crds >/dev/null
}
# free_port: a loopback TCP port that was free a moment ago
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# start_replica <bin> <namespace> <store dir> <log> [flag...]: one operator on this host watching
# <namespace>, draining into file://<store dir> (kwok's exec runs `<bin> pack` as the in-pod
# packer), with the extra flags (e.g. --sharding …); its PID in P. stop_replica ends it.
start_replica() {
  local bin=$1 ns=$2 store=$3 log=$4 port
  shift 4
  port=$(free_port)
  "$bin" run --namespaces "$ns" --store-url "file://$store" --metrics-addr "127.0.0.1:$port" \
    --webhook-addr '' --settings-configmap '' --holder-image sandboxrun-operator:bench \
    --pack-command "$bin pack" --drain-wire tar "$@" >>"$log" 2>&1 &
  P=$!
}
stop_replica() {
  if [ -n "${P:-}" ] && kill -0 "$P" 2>/dev/null; then kill "$P"; wait "$P" 2>/dev/null || true; fi
  P=
}
# result <bench> <case> <metric> <value> <unit>: one measurement, appended as a JSON line to
# $BENCH_RESULTS when it is set (hack/bench.sh sets it); a value that is not a number is a string.
result() {
  [ -n "${BENCH_RESULTS:-}" ] || return 0
  jq -cn --arg bench "$1" --arg case "$2" --arg metric "$3" --arg value "$4" --arg unit "$5" \
    '{bench: $bench, case: $case, metric: $metric, value: ($value | tonumber? // $value), unit: $unit}' \
    >>"$BENCH_RESULTS"
}
# release_binary <path>: builds the release binaries (`cargo build --release --bins`) unless
# SKIP_BUILD=1 (reuse target/release as it is) or NO_BUILD is set (the caller was given a binary),
# then insists that <path> is there.
release_binary() {
  if [ -z "${SKIP_BUILD:-}" ] && [ -z "${NO_BUILD:-}" ]; then
    echo "building the release binary" >&2
    cargo build --release --bins >&2
  fi
  [ -x "$1" ] || { echo "no $1 (cargo build --release --bins)" >&2; exit 1; }
}
# stop_namespace_and_operator: the EXIT trap of a one-namespace drain benchmark: its runs deleted
# while its operator ($OP_PID) still runs (it holds their drain finalizer), the namespace ($NS), the
# operator, the work directory ($WORK).
stop_namespace_and_operator() {
  if [ -n "${NS:-}" ]; then
    kubectl delete sbr --all -n "$NS" --wait=true --timeout=300s >/dev/null 2>&1 || true
    kubectl delete ns "$NS" --wait=false >/dev/null 2>&1 || true
  fi
  if [ -n "${OP_PID:-}" ] && kill -0 "$OP_PID" 2>/dev/null; then kill "$OP_PID"; wait "$OP_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
# real_node_bench_setup: what the real-node benchmarks of the operator (bench/warm_start.sh,
# bench/pause_resume.sh) run with: OPERATOR_BIN (the image's static binary unless the caller set
# it from $BIN before sourcing hack/lib.sh, whose BIN is the tools directory), HOLDER
# and IMAGE (the operator's and busybox's images as pods pull them), PY (the Python client's
# venv). Needs hack/lib.sh sourced and bed_defaults run.
real_node_bench_setup() {
  OPERATOR_BIN=${OPERATOR_BIN:-$REPO/target/x86_64-unknown-linux-musl/release/sandboxrun-operator}
  [ -x "$OPERATOR_BIN" ] || { echo "no $OPERATOR_BIN (hack/images.sh operator builds it)" >&2; exit 1; }
  STATE=${SANDBOXRUN_TEST_STATE:-$REPO/.k8s-local}
  [ -s "$STATE/images/sandboxrun-operator.ref" ] || { echo "no operator image: hack/images.sh operator" >&2; exit 1; }
  HOLDER=$(sed "s#^[^/]*/#$SANDBOXRUN_TEST_POD_REGISTRY/#" "$STATE/images/sandboxrun-operator.ref")
  IMAGE=$(sed "s#^[^/]*/#$SANDBOXRUN_TEST_POD_REGISTRY/#" "$STATE/images/busybox.ref")
  PY=$(python_client_venv)/bin/python
  [ -x "$PY" ] || { echo "no Python client venv ($PY): make test builds it" >&2; exit 1; }
}
# start_pool_operator <log> [flag...]: one operator on this host with warm pools, watching and
# placing pods in $NS, storing into file://$WORK/store, the image's holder; its PID in OP_PID.
start_pool_operator() {
  local log=$1 port
  shift
  port=$(free_port)
  "$OPERATOR_BIN" run --namespaces "$NS" --store-url "file://$WORK/store" --metrics-addr "127.0.0.1:$port" \
    --webhook-addr '' --settings-configmap '' --holder-image "$HOLDER" \
    --holder-binary /usr/local/bin/sandboxrun-operator --warm-pools --pod-namespace "$NS" \
    --unadmitted-references trust "$@" >"$log" 2>&1 &
  OP_PID=$!
}
