#!/usr/bin/env bash
# Every benchmark in bench/, each printed as a ratio against a peer run side by side
# (docs/performance.md), and each number also written machine-readable:
#   target/bench-results/<bench>.jsonl   one JSON object a measurement
#                                        {"bench","case","metric","value","unit"}
#   target/bench-results/results.json    {"started","finished","commit","benchmarks":
#                                        [{"name","status","seconds","log","results":[…]}]}
#   target/bench-results/<bench>.log     what the benchmark printed
#
#   hack/bench.sh                        every benchmark, in the order below
#   hack/bench.sh webhook_latency drain_memory    only these (make bench BENCH="…")
#
# The benchmarks: the webhook vs an always-allow peer (webhook_latency); doctor --strict offline
# on 50 manifests against its ~1 s budget (doctor_offline); the drain's peak memory
# against hostile streams, in-process (drain_memory); the drain vs kubectl cp and raw exec on the
# kwok node (drain_vs_kubectl_cp, 1 GiB), 8 drains at once vs 8 kubectl cp at once (drain_parallel,
# 8 x 256 MiB) and on the real node (drain_real_node, 256 MiB + 1000
# small files); the drain's peak memory into S3, Azure and GCS side by side (drain_store_backends,
# 1 GiB); full lifecycles of N SandboxRuns vs N Jobs on the kwok node (lifecycle_vs_jobs, N = 100
# and 1000); 1, 2 and 4 sharded replicas each held to the same drain bandwidth, and their peak RSS
# at 10,000 runs (scale_replicas); a sharded replica starting against 1,500 unlabelled runs (the
# move to sharding) vs against the same runs labelled (shard_migration); an idle replica's memory
# floor, executable pages and anonymous apart (replica_floor). The drains and lifecycles need the local cluster
# (`hack/local-cluster.sh up`) and drain_real_node the operator image (`hack/images.sh operator`).
# Asserts nothing; a benchmark that fails is recorded as failed, the others still run, and the
# exit status is 1.
# Sizes: WEBHOOK_ARGS, DOCTOR_ARGS, DRAIN_MEMORY_FILES, DRAIN_GIB, PARALLEL_N, PARALLEL_MIB,
# REAL_NODE_MIB, REAL_NODE_SMALL, LIFECYCLE_N, SCALE_REPLICAS, MIGRATION_N (and bench/scale_replicas.sh's
# SCALE_*). At the end, hack/plot.sh renders the plots (docs/plots/) when gnuplot is here.
set -euo pipefail
cd "$(dirname "$0")/.."
ALL=(webhook_latency doctor_offline drain_memory drain_vs_kubectl_cp drain_parallel drain_real_node drain_store_backends lifecycle_vs_jobs scale_replicas shard_migration replica_floor)
OUT=${BENCH_OUT:-target/bench-results}

command_of() {  # the command line of one benchmark
  case "$1" in
    webhook_latency) echo "nice -n 10 cargo bench --bench webhook_latency -- ${WEBHOOK_ARGS:---rate 200,1000 --seconds 20}" ;;
    doctor_offline) echo "nice -n 10 cargo bench --bench doctor_offline -- ${DOCTOR_ARGS:---manifests 50 --rounds 20}" ;;
    drain_memory) echo "bench/drain_memory.sh ${DRAIN_MEMORY_FILES:-1000000}" ;;
    drain_vs_kubectl_cp) echo "bench/drain_vs_kubectl_cp.sh ${DRAIN_GIB:-1}" ;;
    lifecycle_vs_jobs) echo "bench/lifecycle_vs_jobs.sh ${LIFECYCLE_N:-100 1000}" ;;
    scale_replicas) echo "bench/scale_replicas.sh ${SCALE_REPLICAS:-1 2 4}" ;;
    shard_migration) echo "bench/shard_migration.sh ${MIGRATION_N:-1500}" ;;
    replica_floor) echo "bench/replica_floor.sh" ;;
    drain_parallel) echo "bench/drain_parallel.sh ${PARALLEL_N:-8} ${PARALLEL_MIB:-256}" ;;
    drain_real_node) echo "bench/drain_real_node.sh ${REAL_NODE_MIB:-256} ${REAL_NODE_SMALL:-1000}" ;;
    drain_store_backends) echo "bench/drain_store_backends.sh ${DRAIN_GIB:-1}" ;;
    *) return 1 ;;
  esac
}

if [ "$#" -gt 0 ]; then names=("$@"); else names=("${ALL[@]}"); fi
for n in "${names[@]}"; do
  command_of "$n" >/dev/null || { echo "unknown benchmark $n (one of: ${ALL[*]})" >&2; exit 2; }
done

mkdir -p "$OUT"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
summary=$OUT/summary.jsonl
: >"$summary"
failed=0
for n in "${names[@]}"; do
  cmd=$(command_of "$n")
  log=$OUT/$n.log
  export BENCH_RESULTS=$OUT/$n.jsonl
  : >"$BENCH_RESULTS"
  echo "== $n ($cmd)" >&2
  t0=$(date +%s)
  # The benchmark's output goes to the terminal and to its log (tee reads all of it; pipefail
  # gives the benchmark's own status).
  if bash -c "$cmd" 2>&1 | tee "$log"; then status=ok; else status=failed; failed=1; fi
  t1=$(date +%s)
  jq -cn --arg name "$n" --arg status "$status" --arg cmd "$cmd" --arg log "$log" \
    --argjson seconds "$((t1 - t0))" --slurpfile results "$BENCH_RESULTS" \
    '{name: $name, status: $status, command: $cmd, seconds: $seconds, log: $log, results: $results}' \
    >>"$summary"
  echo "== $n: $status in $((t1 - t0)) s, $(wc -l <"$BENCH_RESULTS") measurements in $BENCH_RESULTS" >&2
done
jq -s --arg started "$started" --arg finished "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  --arg commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  '{started: $started, finished: $finished, commit: $commit, benchmarks: .}' "$summary" \
  >"$OUT/results.json"
rm -f "$summary"
echo "wrote $OUT/results.json" >&2
if command -v gnuplot >/dev/null; then
  hack/plot.sh "$OUT" "${PLOTS_OUT:-docs/plots}" || failed=1
else
  echo "gnuplot not found (apt-get install gnuplot-nox): plots not rendered" >&2
fi
exit "$failed"
