#!/usr/bin/env bash
# Renders the plots of docs/performance.md from what hack/bench.sh wrote (machine-readable
# results in target/bench-results/), with gnuplot (Debian's gnuplot-nox):
#   drain-throughput.png    MB/s of our drain, kubectl cp and raw pack-over-exec, every drain case
#                           (kwok node and real node; random and text data; tar and zstd wire)
#   webhook-latency-cdf.png the latency distribution of the webhook and its always-allow peer at
#                           every measured rate (log scale)
#   lifecycle-cdf.png       create -> final phase of every SandboxRun and every Job, per N
#                           (bench/lifecycle_vs_jobs.sh)
#
#   hack/plot.sh [RESULTS_DIR [PLOTS_DIR]]     defaults: target/bench-results docs/plots
# A plot whose data is missing is skipped with a note; exits 1 only when gnuplot is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
IN=${1:-target/bench-results}
OUT=${2:-docs/plots}
command -v gnuplot >/dev/null || { echo "gnuplot is required (apt-get install gnuplot-nox)" >&2; exit 1; }
command -v jq >/dev/null || { echo "jq is required" >&2; exit 1; }
mkdir -p "$OUT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --- drain throughput: one row a case, MB/s of each contender (bytes / seconds).
drains=()
for f in "$IN/drain_vs_kubectl_cp.jsonl" "$IN/drain_real_node.jsonl"; do
  [ -s "$f" ] && drains+=("$f")
done
if [ "${#drains[@]}" -gt 0 ]; then
  jq -rs '
    group_by(.bench + " " + .case)[]
    | (map({(.metric): .value}) | add) as $m
    | select($m.bytes and $m.ours_drain_metric and $m.kubectl_cp and $m.raw_pack)
    | [ ((.[0].bench | sub("drain_vs_kubectl_cp"; "kwok") | sub("drain_real_node"; "real node")) + " " + .[0].case),
        ($m.bytes / $m.ours_drain_metric / 1e6), ($m.bytes / $m.kubectl_cp / 1e6),
        ($m.bytes / $m.raw_pack / 1e6) ]
    | @tsv' "${drains[@]}" >"$tmp/drain.tsv"
  if [ -s "$tmp/drain.tsv" ]; then
    gnuplot <<GP
set terminal pngcairo size 1100,520 noenhanced font ",10"
set output "$OUT/drain-throughput.png"
set title "Drain throughput, same pod and directory (higher is better)"
set ylabel "MB/s"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set xtics rotate by -20 left
set key top left
set grid ytics
set datafile separator "\t"
plot "$tmp/drain.tsv" using 2:xtic(1) title "ours (drain metric)", \
     "" using 3 title "kubectl cp", \
     "" using 4 title "raw pack | cat over exec"
GP
    echo "wrote $OUT/drain-throughput.png ($(wc -l <"$tmp/drain.tsv") cases)" >&2
  fi
else
  echo "no drain results in $IN: drain-throughput.png skipped" >&2
fi

# --- webhook latency CDF: one line an endpoint and rate.
cdf=$IN/webhook_latency_cdf.csv
if [ -s "$cdf" ]; then
  plots=()
  while IFS=, read -r endpoint rate; do
    awk -F, -v e="$endpoint" -v r="$rate" 'NR > 1 && $1 == e && $2 == r { print $4, $3 }' "$cdf" \
      >"$tmp/cdf-${#plots[@]}.dat"
    plots+=("\"$tmp/cdf-${#plots[@]}.dat\" using 1:2 with lines lw 2 title \"$endpoint @ $rate/s\"")
  done < <(awk -F, 'NR > 1 && !seen[$1 "," $2]++ { print $1 "," $2 }' "$cdf")
  joined=$(IFS=,; echo "${plots[*]}")
  gnuplot <<GP
set terminal pngcairo size 900,520 noenhanced font ",10"
set output "$OUT/webhook-latency-cdf.png"
set title "Webhook latency CDF, open loop over TLS on loopback"
set xlabel "latency (ms, log scale)"
set ylabel "fraction of reviews answered"
set logscale x
set yrange [0:1.001]
set grid
set key bottom right
plot $joined
GP
  echo "wrote $OUT/webhook-latency-cdf.png" >&2
else
  echo "no $cdf: webhook-latency-cdf.png skipped" >&2
fi

# --- lifecycle CDF: one line a side and N.
life=$IN/lifecycle_cdf.csv
if [ -s "$life" ]; then
  plots=()
  while IFS=, read -r side n; do
    awk -F, -v s="$side" -v n="$n" 'NR > 1 && $1 == s && $2 == n { print $4, $3 }' "$life" \
      >"$tmp/life-${#plots[@]}.dat"
    plots+=("\"$tmp/life-${#plots[@]}.dat\" using 1:2 with lines lw 2 title \"$side, N = $n\"")
  done < <(awk -F, 'NR > 1 && !seen[$1 "," $2]++ { print $1 "," $2 }' "$life")
  joined=$(IFS=,; echo "${plots[*]}")
  gnuplot <<GP
set terminal pngcairo size 900,520 noenhanced font ",10"
set output "$OUT/lifecycle-cdf.png"
set title "Full lifecycle latency, SandboxRuns vs Jobs, all created at once (kwok node and real node)"
set xlabel "seconds from create to Succeeded / Complete (log scale)"
set ylabel "fraction of the N done"
set logscale x
set yrange [0:1.001]
set grid
set key bottom right
plot $joined
GP
  echo "wrote $OUT/lifecycle-cdf.png" >&2
else
  echo "no $life: lifecycle-cdf.png skipped" >&2
fi
