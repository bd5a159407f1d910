#!/usr/bin/env bash
# The in-pod packer's peak memory with many over-budget files (issue #25 item 1; docs/performance.md
# "Drain memory"): FILES sparse 1 MiB files (no disk blocks) in DIRS directories, packed with
# `pack --budget 1 --wire zstd` (every file dropped: a placeholder each) under /usr/bin/time -v,
# against the holder's 128Mi limit. Prints, never asserts.
#
#   bench/pack_memory.sh [FILES] [DIRS]   # default 1,000,000 files in 1,000 directories
#   TREE=/some/dir bench/pack_memory.sh   # pack an existing tree instead (kept afterwards)
#   BIN=<binary> bench/pack_memory.sh     # another binary, e.g. the image's (default: a debug build)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
FILES=${1:-1000000}
DIRS=${2:-1000}
cd "$REPO"
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
if [ -z "${BIN:-}" ]; then
  nice -n 10 cargo build --bin sandboxrun-operator >&2
  BIN=$REPO/target/debug/sandboxrun-operator
fi
if [ -n "${TREE:-}" ]; then
  FILES=$(find "$TREE" -type f | wc -l)
  DIRS=$(find "$TREE" -mindepth 1 -type d | wc -l)
else
  TREE=$(mktemp -d)
  trap 'rm -rf "$TREE"' EXIT
  python3 - "$TREE" "$FILES" "$DIRS" <<'PY'
import os, sys
root, files, dirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
per = -(-files // dirs)
for i in range(files):
    d = os.path.join(root, f"d{i // per:05}")
    if i % per == 0:
        os.mkdir(d)
    with open(os.path.join(d, f"f{i:08}"), "wb") as f:
        f.truncate(1 << 20)
PY
fi
log=$(mktemp)
/usr/bin/time -v "$BIN" pack "$TREE" --budget 1 --wire zstd 2>"$log" | wc -c >"$log.bytes"
label="$FILES over-budget files in $DIRS directories"
printf '== %s\n' "$label"
printf '  wire bytes: %s\n' "$(cat "$log.bytes")"
grep -E 'Maximum resident set size|Elapsed \(wall clock\)|Exit status' "$log" | sed 's/^[[:space:]]*/  /'
result pack_memory "$label" peak_rss "$(awk -F': ' '/Maximum resident set size/ { print $2 }' "$log")" KiB
rm -f "$log" "$log.bytes"
