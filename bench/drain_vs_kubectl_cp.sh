#!/usr/bin/env bash
# Drain throughput against its peers, on the local control plane (hack/local-cluster.sh up).
#
#   bench/drain_vs_kubectl_cp.sh [SIZE_GIB...]      default: 1 4
#   SKIP_BUILD=1 bench/drain_vs_kubectl_cp.sh 1     reuse target/release/sandboxrun-operator
#   DATA=text bench/drain_vs_kubectl_cp.sh 1         JSON log lines (about 10:1 for zstd) instead of
#                                                     random bytes; DATA=mix: half of the big files
#                                                     random, half text
#   WIRE=tar bench/drain_vs_kubectl_cp.sh 1          the operator's --drain-wire (default adaptive;
#                                                     zstd, tar)
#   PERF=1 bench/drain_vs_kubectl_cp.sh 1            also profile the whole machine (perf record -a)
#                                                     during our drain: CPU by process, and the
#                                                     operator's and the packer's top symbols
#
# For each size: one namespace, one operator (release build) and one batch SandboxRun whose
# read-back path holds SIZE GiB of mixed data (4 big files per GiB + 4000 small ones; random bytes,
# or with DATA=text log lines that compress the way tool output does). Measured on
# the same pod and the same directory:
#   (a) ours      the operator's drain: sandboxrun_drain_duration_seconds from its /metrics (one
#                 path, every attempt included), and the wall time annotate -> phase Succeeded
#   (b) kubectl cp  kubectl cp <pod>:<dir> <local> -c holder (tar in the "container": under kwok,
#                 the host's tar)
#   (c) raw       kubectl exec <pod> -c holder -- sandboxrun-operator pack <dir> | cat >/dev/null
# and the operator's peak RSS (VmHWM) after its drain. Prints numbers and ratios; asserts nothing.
# Everything it creates (namespace, operator, data, store, copies) is removed at the end.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
eval "$(hack/local-cluster.sh env)"
hack/local-cluster.sh status >/dev/null
SIZES=("${@:-1 4}")
DATA=${DATA:-random}
WIRE=${WIRE:-adaptive}
case "$DATA" in random|text|mix) ;; *) echo "DATA=random|text|mix" >&2; exit 2 ;; esac
case "$WIRE" in adaptive|zstd|tar) ;; *) echo "WIRE=adaptive|zstd|tar" >&2; exit 2 ;; esac
# shellcheck disable=SC2206
SIZES=(${SIZES[*]})
BIN=${BIN:-$REPO/target/release/sandboxrun-operator}
STATE=${SANDBOXRUN_TEST_STATE:-$REPO/.k8s-local}
WORK=$STATE/paths/bench-$$
mkdir -p "$WORK"

# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
release_binary "$BIN"
OP_PID=
NS=
trap stop_namespace_and_operator EXIT
ensure_crd

make_data() {  # make_data <dir> <GiB>
  local dir=$1 gib=$2 i
  mkdir -p "$dir/big" "$dir/small"
  for i in $(seq 1 $((gib * 4))); do
    if [ "$DATA" = text ] || { [ "$DATA" = mix ] && [ $((i % 2)) = 0 ]; }; then
      python3 - "$dir/big/part-$i.bin" $((250 * 1024 * 1024)) "$i" <<'PY'
import sys, random
path, size, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(seed)
words = ["fetch", "parse", "compile", "link", "upload", "retry", "ok", "cache", "miss", "hit"]
chunk = "".join(
    f'{{"ts":"2026-12-01T06:{r.randrange(60):02d}:{r.randrange(60):02d}.{r.randrange(10**6):06d}Z",'
    f'"level":"{r.choice(["info", "debug", "warn"])}","step":{n},"op":"{r.choice(words)}",'
    f'"bytes":{r.randrange(10**7)},"msg":"{" ".join(r.choice(words) for _ in range(6))}"}}\n'
    for n in range(20000)
).encode()
with open(path, "wb") as f:
    written = 0
    while written < size:
        piece = chunk[: size - written]
        f.write(piece)
        written += len(piece)
PY
    else
      head -c $((250 * 1024 * 1024)) /dev/urandom >"$dir/big/part-$i.bin"
    fi
  done
  python3 - "$dir/small" <<'PY'
import os, sys, random
root = sys.argv[1]
r = random.Random(7)
for i in range(4000):
    d = os.path.join(root, f"d{i % 50:02d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:05d}.txt"), "wb") as f:
        f.write(r.randbytes(r.randint(0, 16384)))
PY
}

results=()
for gib in "${SIZES[@]}"; do
  NS=bench-drain-$gib-$$
  data=$WORK/data-$gib
  store=$WORK/store-$gib
  echo "== ${gib} GiB: generating data" >&2
  make_data "$data" "$gib"
  bytes=$(du -sb "$data" | cut -f1)
  files=$(find "$data" -type f | wc -l)
  cat "$data"/big/* >/dev/null  # same page-cache state for every contender

  kubectl create ns "$NS" >/dev/null
  until kubectl get sa default -n "$NS" >/dev/null 2>&1; do sleep 0.2; done
  port=$(free_port)
  "$BIN" run --namespaces "$NS" --store-url "file://$store" --metrics-addr "127.0.0.1:$port" \
    --webhook-addr '' --holder-image sandboxrun-operator:bench --pod-name "operator-$NS" \
    --pack-command "$BIN pack" --max-cap 64Gi --drain-wire "$WIRE" >"$WORK/operator-$gib.log" 2>&1 &
  OP_PID=$!
  kubectl apply -f - >/dev/null <<YAML
apiVersion: sandbox.iterion.io/v1alpha1
kind: SandboxRun
metadata: {name: bench, namespace: $NS}
spec:
  image: registry.example/tool@sha256:0000000000000000000000000000000000000000000000000000000000000000
  command: [sh, -c, work]
  user: "1000:1000"
  readBack:
    compression: none
    drainTimeout: 30m
    paths: [{path: "$data", sizeLimit: "$((gib + 1))Gi"}]
YAML
  until [ "$(kubectl get sbr bench -n "$NS" -o jsonpath='{.status.phase}' 2>/dev/null)" = Running ]; do sleep 0.5; done
  pod=$(kubectl get sbr bench -n "$NS" -o jsonpath='{.status.podName}')

  echo "== ${gib} GiB: kubectl cp" >&2
  t0=$(now); kubectl cp "$NS/$pod:$data" "$WORK/cp-$gib" -c holder >/dev/null 2>&1; t1=$(now)
  cp_s=$(elapsed "$t0" "$t1")
  cp_bytes=$(du -sb "$WORK/cp-$gib" | cut -f1); rm -rf "$WORK/cp-$gib"

  echo "== ${gib} GiB: raw pack over exec" >&2
  t0=$(now); kubectl exec "$pod" -n "$NS" -c holder -- "$BIN" pack "$data" | cat >/dev/null; t1=$(now)
  raw_s=$(elapsed "$t0" "$t1")

  echo "== ${gib} GiB: our drain" >&2
  perf_pid=
  if [ -n "${PERF:-}" ]; then
    perf record -a -g -F 199 -o "$WORK/perf-$gib.data" >/dev/null 2>&1 &
    perf_pid=$!
  fi
  t0=$(now)
  kubectl annotate pod "$pod" -n "$NS" sandbox.iterion.io/test-exit-code=0 >/dev/null
  until [ "$(kubectl get sbr bench -n "$NS" -o jsonpath='{.status.phase}')" = Succeeded ]; do sleep 0.2; done
  t1=$(now)
  if [ -n "$perf_pid" ]; then
    kill -INT "$perf_pid"; wait "$perf_pid" 2>/dev/null || true
    report=${CARGO_TARGET_DIR:-$REPO/target}/bench-results/drain-perf-$gib.txt
    mkdir -p "$(dirname "$report")"
    {
      echo "# CPU by process during our drain (perf record -a)"
      perf report -i "$WORK/perf-$gib.data" --stdio --no-children --sort comm 2>/dev/null | grep -v '^#' | grep -v '^$' | awk 'NR <= 15'
      echo "# top symbols, by process"
      perf report -i "$WORK/perf-$gib.data" --stdio --no-children --sort comm,dso,symbol -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | awk 'NR <= 60'
    } >"$report"
    echo "== perf report: $report" >&2
  fi
  wall_s=$(elapsed "$t0" "$t1")
  drain_s=$(drain_seconds "$port")
  rss_kb=$(peak_rss_kb "$OP_PID")
  wire_bytes=$(curl -s "http://127.0.0.1:$port/metrics" | awk -v w="$WIRE" '$1 == "sandboxrun_drain_wire_bytes_total{wire=\"" w "\"}" {print $2}')
  phase=$(kubectl get sbr bench -n "$NS" -o jsonpath='{.status.readBack[0].phase} {.status.readBack[0].members} {.status.readBack[0].bytes}')

  printf '\n%s GiB of %s data (%s bytes, %s files), wire %s (%s bytes crossed it), drained read-back: %s\n' \
    "$gib" "$DATA" "$bytes" "$files" "$WIRE" "${wire_bytes:-?}" "$phase"
  print_contenders "$bytes" "$drain_s" "annotate->Succeeded" "$wall_s" "$cp_s" "$cp_bytes" "$raw_s"
  printf '  throughput ratio ours/kubectl-cp %s, ours/raw %s; operator peak RSS (VmHWM) %s MiB\n' \
    "$(ratio "$cp_s" "$drain_s")" "$(ratio "$raw_s" "$drain_s")" "$((rss_kb / 1024))"
  results+=("$gib:$rss_kb")
  c="${gib}GiB-$DATA-$WIRE"
  result drain_vs_kubectl_cp "$c" bytes "$bytes" bytes
  result drain_vs_kubectl_cp "$c" phase "$phase" ""
  result drain_vs_kubectl_cp "$c" wire_bytes "${wire_bytes:-0}" bytes
  result drain_vs_kubectl_cp "$c" ours_drain_metric "$drain_s" s
  result drain_vs_kubectl_cp "$c" ours_wall "$wall_s" s
  result drain_vs_kubectl_cp "$c" kubectl_cp "$cp_s" s
  result drain_vs_kubectl_cp "$c" raw_pack "$raw_s" s
  result drain_vs_kubectl_cp "$c" ratio_ours_vs_kubectl_cp "$(ratio "$cp_s" "$drain_s")" ratio
  result drain_vs_kubectl_cp "$c" ratio_ours_vs_raw "$(ratio "$raw_s" "$drain_s")" ratio
  result drain_vs_kubectl_cp "$c" operator_peak_rss "$((rss_kb / 1024))" MiB

  kubectl delete sbr bench -n "$NS" --wait=true --timeout=120s >/dev/null
  kill "$OP_PID"; wait "$OP_PID" 2>/dev/null || true; OP_PID=
  kubectl delete ns "$NS" --wait=false >/dev/null; NS=
  rm -rf "$data" "$store"
done

if [ "${#results[@]}" -ge 2 ]; then
  first=${results[0]#*:}; last=${results[-1]#*:}
  printf '\npeak RSS %s GiB -> %s GiB: %s MiB -> %s MiB (x%s for x%s data)\n' \
    "${results[0]%%:*}" "${results[-1]%%:*}" "$((first / 1024))" "$((last / 1024))" \
    "$(ratio "$last" "$first")" "$(ratio "${results[-1]%%:*}" "${results[0]%%:*}")"
fi
