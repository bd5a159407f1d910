#!/usr/bin/env bash
# An idle sharded replica's memory floor (issue #28, docs/performance.md "Scale-out"): what each
# replica costs before it caches a single run, split into the executable's file-backed pages
# (shared by the replicas of a host, but counted in each one's RSS and VmHWM) and its own
# anonymous memory. One replica per binary, 32 shards owned, no run, sampled after FLOOR_SECONDS
# from /proc/<pid>/smaps_rollup; the binary's size and .text beside it.
#
#   bench/replica_floor.sh                  target/release/sandboxrun-operator (built unless SKIP_BUILD=1)
#   bench/replica_floor.sh OLD NEW          two builds side by side (e.g. two profiles), no build
#   FLOOR_SECONDS=25                        how long each replica idles before it is read
# On the local cluster (hack/local-cluster.sh up). Prints, never asserts.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
eval "$(hack/local-cluster.sh env)"
hack/local-cluster.sh status >/dev/null
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
SECONDS_EACH=${FLOOR_SECONDS:-25}
if [ "$#" -eq 0 ]; then
  set -- "$REPO/target/release/sandboxrun-operator"
  release_binary "$1"
fi
NS=bench-floor-$$
WORK=$(mktemp -d)
P=
cleanup() {
  stop_replica
  kubectl delete ns "$NS" --wait=false >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
kubectl create ns "$NS" >/dev/null
# kb <field>: one field of the replica's smaps_rollup, in kB
kb() { awk -v f="$1:" '$1 == f { print $2 }' "/proc/$P/smaps_rollup"; }
i=0
for bin in "$@"; do
  [ -x "$bin" ] || { echo "no executable $bin" >&2; exit 2; }
  i=$((i + 1))
  start_replica "$bin" "$NS" "$WORK/store-$i" "$WORK/operator.log" \
    --sharding --shards 32 --lease-name "bench-floor-$i" --pod-namespace "$NS" --pod-name "r$i"
  sleep "$SECONDS_EACH"
  kill -0 "$P" 2>/dev/null || { echo "the replica of $bin exited; its log:" >&2; cat "$WORK/operator.log" >&2; exit 1; }
  rss=$(kb Rss); file=$(kb Pss_File); anon=$(kb Anonymous)
  text=$(size -A "$bin" | awk '$1 == ".text" { print $2 }')
  printf '%s: binary %s bytes, .text %s bytes; idle replica RSS %s kB = file-backed %s kB + anonymous %s kB\n' \
    "$bin" "$(stat -c %s "$bin")" "$text" "$rss" "$file" "$anon"
  result replica_floor "bin$i" rss_kb "$rss" kB
  result replica_floor "bin$i" file_backed_kb "$file" kB
  result replica_floor "bin$i" anonymous_kb "$anon" kB
  result replica_floor "bin$i" text_bytes "$text" bytes
  stop_replica
done
