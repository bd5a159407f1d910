#!/usr/bin/env bash
# The egress proxy's resident memory (docs/performance.md "Egress proxy memory", "Egress proxy
# under a flood"). Builds bench/egress_tunnels.rs (dev profile), starts its proxy on loopback, reads
# VmRSS/VmHWM from /proc; prints, never asserts. Loopback only (127.0.0.1-3).
#
#   bench/egress_tunnels.sh [N]          # N concurrent CONNECT tunnels of one run (default 1000)
#   bench/egress_tunnels.sh flood [N]    # N slow heads + idle tunnels from one run's pod (default
#                                        # 20000) while another run works, with the proxy's
#                                        # default limits, then without limits (the old proxy)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
MODE=tunnels
if [ "${1:-}" = flood ]; then MODE=flood; shift; N=${1:-20000}; else N=${1:-1000}; fi
cd "$REPO"
nice -n 10 cargo build --example egress_tunnels >&2
BIN=$REPO/target/debug/examples/egress_tunnels
# 20,000 connections take as many descriptors in the clients and up to twice that in the proxy.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
work=$(mktemp -d)
proxy_pid=""
clients_pid=""
stop() {
  if [ -n "$clients_pid" ]; then kill "$clients_pid" 2>/dev/null || true; wait "$clients_pid" 2>/dev/null || true; fi
  if [ -n "$proxy_pid" ]; then kill "$proxy_pid" 2>/dev/null || true; wait "$proxy_pid" 2>/dev/null || true; fi
  exec 3>&- 2>/dev/null || true
  clients_pid=""
  proxy_pid=""
}
trap 'stop; rm -rf "$work"' EXIT
rss() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
mib() { awk -v k="$1" 'BEGIN { printf "%8.1f", k / 1024 }'; }

# start_proxy [ENV=VALUE…]: sets port uid token uid2 token2 idle
start_proxy() {
  rm -f "$work/proxy.out"
  env "$@" "$BIN" proxy >"$work/proxy.out" 2>&1 &
  proxy_pid=$!
  for _ in $(seq 1 100); do
    grep -q '^PORT ' "$work/proxy.out" && break
    sleep 0.1
  done
  read -r _ port _ uid _ token _ uid2 _ token2 <"$work/proxy.out"
  sleep 1
  idle=$(rss "$proxy_pid" VmRSS)
}

# run_clients ARGS…: starts the clients, waits for READY (at most 10 min)
run_clients() {
  rm -f "$work/hold" "$work/clients.out"
  mkfifo "$work/hold"
  "$BIN" "$@" <"$work/hold" >"$work/clients.out" 2>&1 &
  clients_pid=$!
  exec 3>"$work/hold"
  start=$(date +%s.%N)
  for _ in $(seq 1 6000); do
    grep -q '^READY' "$work/clients.out" && break
    if ! kill -0 "$clients_pid" 2>/dev/null; then cat "$work/clients.out" >&2; exit 1; fi
    sleep 0.1
  done
  end=$(date +%s.%N)
  grep -q '^READY' "$work/clients.out" || { cat "$work/clients.out" >&2; exit 1; }
  sleep 1
}

if [ "$MODE" = tunnels ]; then
  start_proxy EGRESS_BENCH_MAX_PER_RUN="$N"
  run_clients clients "$port" "$uid" "$token" "$N"
  held=$(rss "$proxy_pid" VmRSS)
  peak=$(rss "$proxy_pid" VmHWM)
  printf 'egress proxy (dev profile), %s tunnels opened in %.2f s\n' "$N" "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')"
  printf '  RSS idle            %s MiB\n' "$(mib "$idle")"
  printf '  RSS %5s tunnels   %s MiB\n' "$N" "$(mib "$held")"
  printf '  peak RSS (VmHWM)    %s MiB   (target <= 128 MiB)\n' "$(mib "$peak")"
  exit 0
fi

for limits in default unlimited; do
  if [ "$limits" = default ]; then start_proxy; else start_proxy EGRESS_BENCH_UNLIMITED=1; fi
  run_clients flood "$port" "$uid" "$token" "$uid2" "$token2" "$N"
  held=$(rss "$proxy_pid" VmRSS)
  peak=$(rss "$proxy_pid" VmHWM)
  printf 'egress proxy (dev profile), limits %s: %s\n' "$limits" "$(grep '^FLOOD' "$work/clients.out")"
  printf '  RSS idle %s MiB, held %s MiB, peak (VmHWM) %s MiB\n' "$(mib "$idle")" "$(mib "$held")" "$(mib "$peak")"
  stop
done
