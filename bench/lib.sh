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
# ensure_crd: the SandboxRun CRD of this checkout, applied as users apply it (a fresh cluster has none)
ensure_crd() {
  kubectl apply --server-side --force-conflicts -f "$REPO/crds/sandboxruns.sandbox.iterion.io.yaml" >/dev/null
  kubectl wait --for condition=established --timeout=60s crd/sandboxruns.sandbox.iterion.io >/dev/null
}
# free_port: a loopback TCP port that was free a moment ago
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# result <bench> <case> <metric> <value> <unit>: one measurement, appended as a JSON line to
# $BENCH_RESULTS when it is set (hack/bench.sh sets it); a value that is not a number is a string.
result() {
  [ -n "${BENCH_RESULTS:-}" ] || return 0
  jq -cn --arg bench "$1" --arg case "$2" --arg metric "$3" --arg value "$4" --arg unit "$5" \
    '{bench: $bench, case: $case, metric: $metric, value: ($value | tonumber? // $value), unit: $unit}' \
    >>"$BENCH_RESULTS"
}
