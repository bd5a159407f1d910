#!/usr/bin/env bash
# Renders the plots of docs/performance.md from what hack/bench.sh wrote (machine-readable
# results in target/bench-results/), with gnuplot (Debian's gnuplot-nox):
#   drain-throughput.png    MB/s of our drain, kubectl cp and raw pack-over-exec, every drain case
#                           (kwok node and real node; random and text data; tar and zstd wire)
#   webhook-latency-cdf.png the latency distribution of the webhook and its always-allow peer at
#                           every measured rate (log scale)
#   lifecycle-cdf.png       create -> final phase of every SandboxRun and every Job, per N
#                           (bench/lifecycle_vs_jobs.sh)
#   scale-out.png           aggregate drain MB/s and lifecycles/min of 1, 2, 4 sharded replicas
#                           as multiples of one replica's (bench/scale_replicas.sh)
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

# cdf_plot <csv> <png> <title> <xlabel> <ylabel> <line label format>: one line a (column 1,
# column 2) pair of a `name,group,quantile,value` CSV, value on a log x axis; the label format is a
# printf format of the two columns.
cdf_plot() {
  local csv=$1 png=$2 title=$3 xlabel=$4 ylabel=$5 label=$6 plots=() a b joined
  if [ ! -s "$csv" ]; then
    echo "no $csv: $(basename "$png") skipped" >&2
    return 0
  fi
  while IFS=, read -r a b; do
    awk -F, -v a="$a" -v b="$b" 'NR > 1 && $1 == a && $2 == b { print $4, $3 }' "$csv" \
      >"$tmp/cdf-${#plots[@]}.dat"
    # shellcheck disable=SC2059  # the label format is this script's own
    plots+=("\"$tmp/cdf-${#plots[@]}.dat\" using 1:2 with lines lw 2 title \"$(printf "$label" "$a" "$b")\"")
  done < <(awk -F, 'NR > 1 && !seen[$1 "," $2]++ { print $1 "," $2 }' "$csv")
  joined=$(IFS=,; echo "${plots[*]}")
  gnuplot <<GP
set terminal pngcairo size 900,520 noenhanced font ",10"
set output "$png"
set title "$title"
set xlabel "$xlabel"
set ylabel "$ylabel"
set logscale x
set yrange [0:1.001]
set grid
set key bottom right
plot $joined
GP
  echo "wrote $png" >&2
}

cdf_plot "$IN/webhook_latency_cdf.csv" "$OUT/webhook-latency-cdf.png" \
  "Webhook latency CDF, open loop over TLS on loopback" "latency (ms, log scale)" \
  "fraction of reviews answered" "%s @ %s/s"
cdf_plot "$IN/lifecycle_cdf.csv" "$OUT/lifecycle-cdf.png" \
  "Full lifecycle latency, SandboxRuns vs Jobs, all created at once (kwok node and real node)" \
  "seconds from create to Succeeded / Complete (log scale)" "fraction of the N done" "%s, N = %s"

# --- scale-out: aggregate drain MB/s and lifecycles/min of R sharded replicas, each held to the
# same drain bandwidth, as a multiple of one replica's, against the ideal (bench/scale_replicas.sh).
if [ -s "$IN/scale_replicas.jsonl" ]; then
  jq -rs '
    map(select(.case | startswith("R=")))
    | group_by(.case)[]
    | (map({(.metric): .value}) | add) as $m
    | select($m.ratio_drain_mbps_vs_one and $m.ratio_lifecycles_vs_one)
    | [(.[0].case | ltrimstr("R=") | tonumber), $m.ratio_drain_mbps_vs_one,
       $m.ratio_lifecycles_vs_one, $m.aggregate_drain_mbps]
    | @tsv' "$IN/scale_replicas.jsonl" | sort -n >"$tmp/scale.tsv"
  if [ -s "$tmp/scale.tsv" ]; then
    gnuplot <<GP
set terminal pngcairo size 800,520 noenhanced font ",10"
set output "$OUT/scale-out.png"
set title "Scale-out: R replicas, each held to the same drain bandwidth (kwok node)"
set xlabel "replicas"
set ylabel "multiple of one replica"
set xtics 1
set grid
set key top left
set datafile separator "\t"
plot "$tmp/scale.tsv" using 1:2 with linespoints lw 2 pt 7 title "aggregate drain MB/s", \
     "" using 1:3 with linespoints lw 2 pt 5 title "lifecycles/min", \
     "" using 1:2:(sprintf("%.0f MB/s", \$4)) with labels offset 0,1 notitle, \
     x with lines dt 2 lc rgb "gray" title "ideal (R x one replica)"
GP
    echo "wrote $OUT/scale-out.png" >&2
  fi
else
  echo "no scale_replicas results in $IN: scale-out.png skipped" >&2
fi
