#!/usr/bin/env bash
# Constant memory on each object-store backend: the operator's peak RSS while draining the same
# SIZE GiB tree (4 random 250 MiB files per GiB + 1000 small ones, no compression) on the kwok node
# into S3 (the bed's s3s-fs), Azure Blob (a private Azurite) and GCS (a private fake-gcs-server),
# side by side, one fresh operator per backend.
#
#   bench/drain_store_backends.sh [SIZE_GIB]             default 1
#   SKIP_BUILD=1 BIN=target/debug/sandboxrun-operator bench/drain_store_backends.sh 1
#
# Prints, per backend, the drain's phase, its time (sandboxrun_drain_duration_seconds) and the
# operator's peak RSS (VmHWM), and each RSS against the S3 figure. Asserts nothing.
# GCS: fake-gcs-server implements neither the XML API PUT nor the XML multipart upload through
# which object_store writes GCS objects, so the GCS drain is expected to end Failed there; its row
# is printed as it comes, and is no measurement of GCS (docs/operations.md, "What is proven").
# Everything it creates (namespaces, operators, data, objects, the private emulators) is removed.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
eval "$(hack/local-cluster.sh env)"
hack/local-cluster.sh status >/dev/null
GIB=${1:-1}
BIN=${BIN:-$REPO/target/release/sandboxrun-operator}
STATE=${SANDBOXRUN_TEST_STATE:-$REPO/.k8s-local}
WORK=$STATE/paths/bs-$$
mkdir -p "$WORK"
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
release_binary "$BIN"

# Private emulators (their own state and ports), so the GiBs they store go away with them.
EMU=(env SANDBOXRUN_STATE="$WORK/emu" GCS_PORT="$(free_port)" AZURITE_PORT="$(free_port)" hack/store-emulators.sh)
OP_PID=
NS=
S3_PREFIX=bs$$
cleanup() {
  if [ -n "$NS" ]; then kubectl delete ns "$NS" --wait=false >/dev/null 2>&1 || true; fi
  if [ -n "$OP_PID" ] && kill -0 "$OP_PID" 2>/dev/null; then kill "$OP_PID"; wait "$OP_PID" 2>/dev/null || true; fi
  "${EMU[@]}" down >/dev/null 2>&1 || true
  # s3s-fs keeps objects as files under <its root>/<bucket>/<key>.
  rm -rf "${STATE:?}/s3/${SANDBOXRUN_TEST_S3_BUCKET:?}/$S3_PREFIX"
  rm -rf "$WORK"
}
trap cleanup EXIT
"${EMU[@]}" up >&2
eval "$("${EMU[@]}" env)"
ensure_crd

data=$WORK/d
echo "== generating ${GIB} GiB" >&2
mkdir -p "$data/big" "$data/small"
for i in $(seq 1 $((GIB * 4))); do head -c $((250 * 1024 * 1024)) /dev/urandom >"$data/big/p$i.bin"; done
for i in $(seq 1 1000); do head -c $(( (i * 37) % 8192 )) /dev/urandom >"$data/small/f$i.txt"; done
bytes=$(du -sb "$data" | cut -f1)

declare -A RSS
for backend in s3 azure gcs; do
  case "$backend" in
    s3) url=s3://$SANDBOXRUN_TEST_S3_BUCKET/$S3_PREFIX
        opts=endpoint=$SANDBOXRUN_TEST_S3_ENDPOINT,allow_http=true,access_key_id=$SANDBOXRUN_TEST_S3_ACCESS_KEY,secret_access_key=$SANDBOXRUN_TEST_S3_SECRET_KEY,region=us-east-1 ;;
    azure) url=az://$SANDBOXRUN_TEST_AZURE_CONTAINER/bench
        opts=account_name=$SANDBOXRUN_TEST_AZURE_ACCOUNT,access_key=$SANDBOXRUN_TEST_AZURE_KEY,endpoint=$SANDBOXRUN_TEST_AZURE_ENDPOINT,allow_http=true ;;
    gcs) url=gs://$SANDBOXRUN_TEST_GCS_BUCKET/bench
        opts=service_account=$SANDBOXRUN_TEST_GCS_SERVICE_ACCOUNT,allow_http=true ;;
  esac
  NS=bench-store-$backend-$$
  kubectl create ns "$NS" >/dev/null
  until kubectl get sa default -n "$NS" >/dev/null 2>&1; do sleep 0.2; done
  port=$(free_port)
  "$BIN" run --namespaces "$NS" --store-url "$url" --store-option "$opts" --metrics-addr "127.0.0.1:$port" \
    --webhook-addr '' --holder-image sandboxrun-operator:bench --pod-name "operator-$NS" \
    --pack-command "$BIN pack" --max-cap 64Gi >"$WORK/operator-$backend.log" 2>&1 &
  OP_PID=$!
  # A GCS drain that cannot write is retried until this timeout: keep it short there.
  timeout=30m; [ "$backend" != gcs ] || timeout=20s
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
    drainTimeout: $timeout
    paths: [{path: "$data", sizeLimit: "$((GIB + 1))Gi"}]
YAML
  until [ "$(kubectl get sbr bench -n "$NS" -o jsonpath='{.status.phase}' 2>/dev/null)" = Running ]; do sleep 0.5; done
  pod=$(kubectl get sbr bench -n "$NS" -o jsonpath='{.status.podName}')
  echo "== ${GIB} GiB into $backend" >&2
  kubectl annotate pod "$pod" -n "$NS" sandbox.iterion.io/test-exit-code=0 >/dev/null
  until phase=$(kubectl get sbr bench -n "$NS" -o jsonpath='{.status.phase}') && \
        case "$phase" in Succeeded|Failed) true ;; *) false ;; esac; do sleep 0.5; done
  drained=$(kubectl get sbr bench -n "$NS" -o jsonpath='{.status.readBack[0].phase}')
  secs=$(curl -s "http://127.0.0.1:$port/metrics" | awk -v p="$drained" \
    '$0 ~ "^sandboxrun_drain_duration_seconds_sum\\{phase=\"" p "\"\\}" { print $2 }')
  rss_kb=$(peak_rss_kb "$OP_PID")
  RSS[$backend]=$rss_kb
  if [ "$drained" = Drained ]; then
    printf '%-6s %-8s %8.2f s  %8s MB/s  peak RSS %4s MiB\n' "$backend" "$drained" "$secs" "$(mbps "$bytes" "$secs")" "$((rss_kb / 1024))"
  else
    printf '%-6s %-8s (%s)  peak RSS %4s MiB\n' "$backend" "$drained" \
      "$(kubectl get sbr bench -n "$NS" -o jsonpath='{.status.readBack[0].message}' | tr '\n' ' ' | cut -c1-200)" "$((rss_kb / 1024))"
  fi
  result drain_store_backends "$backend" phase "$drained" ""
  result drain_store_backends "$backend" drain_metric "${secs:-}" s
  result drain_store_backends "$backend" operator_peak_rss "$((rss_kb / 1024))" MiB
  kubectl delete sbr bench -n "$NS" --wait=true --timeout=120s >/dev/null
  kill "$OP_PID"; wait "$OP_PID" 2>/dev/null || true; OP_PID=
  kubectl delete ns "$NS" --wait=false >/dev/null; NS=
done
awk -v b="$bytes" -v s3="${RSS[s3]}" -v az="${RSS[azure]}" -v gs="${RSS[gcs]}" 'BEGIN {
  printf "\n%d bytes per drain; peak RSS against S3 (%.1f MiB): azure %+.1f MiB, gcs %+.1f MiB\n",
    b, s3 / 1024, (az - s3) / 1024, (gs - s3) / 1024 }'
