#!/usr/bin/env bash
# The egress proxy's resident memory idle and with N concurrent CONNECT tunnels open
# (docs/performance.md "Egress proxy memory"; target: 1,000 tunnels in <= 128 MiB). Builds
# bench/egress_tunnels.rs (dev profile), starts its proxy, reads VmRSS from /proc; prints, never
# asserts.
#
#   bench/egress_tunnels.sh [N]      # default 1000
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
N=${1:-1000}
cd "$REPO"
nice -n 10 cargo build --example egress_tunnels >&2
BIN=$REPO/target/debug/examples/egress_tunnels
work=$(mktemp -d)
proxy_pid=""
clients_pid=""
cleanup() {
  if [ -n "$clients_pid" ]; then kill "$clients_pid" 2>/dev/null || true; fi
  if [ -n "$proxy_pid" ]; then kill "$proxy_pid" 2>/dev/null || true; fi
  exec 3>&- 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
"$BIN" proxy >"$work/proxy.out" 2>&1 &
proxy_pid=$!
for _ in $(seq 1 100); do
  grep -q '^PORT ' "$work/proxy.out" && break
  sleep 0.1
done
read -r _ port _ uid _ token <"$work/proxy.out"
rss() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
sleep 1
idle=$(rss "$proxy_pid" VmRSS)
mkfifo "$work/hold"
"$BIN" clients "$port" "$uid" "$token" "$N" <"$work/hold" >"$work/clients.out" 2>&1 &
clients_pid=$!
exec 3>"$work/hold"
start=$(date +%s.%N)
for _ in $(seq 1 600); do
  grep -q '^READY' "$work/clients.out" && break
  if ! kill -0 "$clients_pid" 2>/dev/null; then cat "$work/clients.out" >&2; exit 1; fi
  sleep 0.1
done
end=$(date +%s.%N)
grep -q '^READY' "$work/clients.out" || { cat "$work/clients.out" >&2; exit 1; }
sleep 1
held=$(rss "$proxy_pid" VmRSS)
peak=$(rss "$proxy_pid" VmHWM)
printf 'egress proxy (dev profile), %s tunnels opened in %.2f s\n' "$N" "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')"
printf '  RSS idle            %8.1f MiB\n' "$(awk -v k="$idle" 'BEGIN { print k / 1024 }')"
printf '  RSS %5s tunnels   %8.1f MiB\n' "$N" "$(awk -v k="$held" 'BEGIN { print k / 1024 }')"
printf '  peak RSS (VmHWM)    %8.1f MiB   (target <= 128 MiB)\n' "$(awk -v k="$peak" 'BEGIN { print k / 1024 }')"
