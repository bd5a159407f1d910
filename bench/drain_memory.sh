#!/usr/bin/env bash
# Operator-side peak memory of the drain against streams written to make it hold as much as
# possible (docs/performance.md, "Drain memory"). Builds bench/drain_memory.rs (dev profile) and
# runs each case under /usr/bin/time -v; prints, never asserts.
#
#   bench/drain_memory.sh [FILES] [FLOOD]  # FILES (default 1,000,000) empty files with 4 KiB names;
#                                          # FLOOD (default 150,000) symlinks, directories, dropped
#                                          # placeholders and rejected long names, cap 1 GiB (issue #25)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
FILES=${1:-1000000}
FLOOD=${2:-150000}
cd "$REPO"
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
nice -n 10 cargo build --example drain_memory >&2
BIN=$REPO/target/debug/examples/drain_memory
run() {
  local label=$1
  shift
  local log
  log=$(mktemp)
  /usr/bin/time -v "$BIN" "$@" >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; return 1; }
  printf '== %s\n' "$label"
  grep -E '^(drained|refused|VmRSS)' "$log"
  grep -E 'Maximum resident set size|Elapsed \(wall clock\)' "$log" | sed 's/^[[:space:]]*/  /'
  result drain_memory "$label" peak_rss "$(awk -F': ' '/Maximum resident set size/ { print $2 }' "$log")" KiB
  result drain_memory "$label" wall "$(awk -F'): ' '/Elapsed \(wall clock\)/ {
    n = split($2, t, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + t[i]; print s }' "$log")" s
  result drain_memory "$label" outcome "$(grep -m1 -E '^(drained|refused)' "$log")" ""
  rm -f "$log"
}
run "a 2 GiB GNU long name (cap 16 GiB)" long-name
run "$FILES empty files with 4 KiB names, cap 1 MiB" flood "$FILES" 1048576
run "$FILES empty files with 4 KiB names, cap 16 GiB (the largest metadata allowance)" flood "$FILES" 17179869184
run "$FLOOD symlinks with 3.9 KiB names, cap 1 GiB" symlinks "$FLOOD" 1073741824
run "$FLOOD directories with 4 KiB names, cap 1 GiB" dirs "$FLOOD" 1073741824
run "$FILES placeholders dropped in the pod with 4 KiB names, cap 1 GiB" dropped "$FILES" 1073741824
run "$FLOOD files with 8 KiB names (rejected), cap 1 GiB" rejected "$FLOOD" 1073741824
