#!/usr/bin/env bash
# The operator binary's code layout (issue #28, docs/performance.md "Scale-out"): the functions a
# replica executes are linked first, together, so that the code pages it maps are those it runs.
#
# Why: the kernel maps a file-backed executable's code 64 KiB around every page it faults in
# (fault-around). In the default layout the ~3-4 MB of functions a replica runs are spread over the
# whole 12 MB of .text, so nearly every 64 KiB window holds one: a replica through 500 lifecycles
# had 12.3 MiB of its executable resident, counted in its RSS, once per replica. Linked in the
# order of link/hot-symbols.txt (build.rs: rust-lld's --symbol-ordering-file; release builds for
# the musl target only, the image's binary), the same replica maps 8.1 MiB
# (bench/scale_replicas.sh, docs/performance.md "Scale-out").
#
#   hack/code-order.sh              profile a replica on the local cluster and rewrite
#                                   link/hot-symbols.txt (the bed must be up: hack/local-cluster.sh up)
#   hack/code-order.sh --check BIN  fail unless BIN was linked in that order: most of the listed
#                                   functions exist in it and lie together at the start of .text
#   PROFILE_RUNS=20                 runs the profiled replica takes through a lifecycle
#
# The profiles, each one replica under valgrind's callgrind taking PROFILE_RUNS runs on the kwok
# node through create → Running → drain → Succeeded → delete, its metrics scraped: scale-out as in
# production (sharded, the bed's S3 server, the default zstd wire, the admission webhook
# registered for its namespace: every create reviewed, access checks included), and the default
# install's single replica (leader-elected, the embedded file:// store, the plain tar wire). Every
# function either saw run is listed, mangled, the most instructions first.
# Symbol names carry a hash of the crate's build settings, so the list is valid for one toolchain
# and one set of dependency versions; a name that no longer exists is skipped by the linker, and
# --check (a phase of hack/test.sh) fails once too many are gone: then run this again.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
LIST=$REPO/link/hot-symbols.txt
TARGET=x86_64-unknown-linux-musl
# Of the listed functions, the share that must exist in a binary for its layout to count, and lie
# in the first (hot bytes x SLACK) of its .text.
MIN_PRESENT_PERCENT=80
SLACK=1.25

check() {
  local bin=$1
  [ -f "$LIST" ] || { echo "code-order: no $LIST (run hack/code-order.sh)" >&2; exit 1; }
  python3 - "$bin" "$LIST" "$MIN_PRESENT_PERCENT" "$SLACK" <<'PY'
import subprocess, sys
binary, listing, min_percent, slack = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
wanted = {l.strip() for l in open(listing) if l.strip() and not l.startswith("#")}
syms = {}
for line in subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True,
                           text=True, check=True).stdout.splitlines():
    parts = line.split(" ", 3)
    if len(parts) == 4 and parts[2] in "tTwW":
        syms[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
text = next(l.split() for l in subprocess.run(["readelf", "-SW", binary], capture_output=True,
            text=True, check=True).stdout.splitlines() if " .text " in l)
i = text.index(".text")
start, size = int(text[i + 2], 16), int(text[i + 4], 16)
present = [syms[s] for s in wanted if s in syms]
hot = sum(sz for _, sz in present)
end = max((a + sz for a, sz in present), default=start)
share = 100.0 * len(present) / max(len(wanted), 1)
print(f"code-order: {len(present)} of {len(wanted)} listed functions in {binary} ({share:.0f} %), "
      f"{hot} bytes, within the first {end - start} of {size} bytes of .text")
if share < min_percent:
    sys.exit(f"code-order: under {min_percent:.0f} % of link/hot-symbols.txt is in this build "
             "(a new toolchain or new dependency versions): run hack/code-order.sh")
if end - start > hot * slack:
    sys.exit("code-order: the listed functions are spread over .text: the binary was not linked "
             "in their order (build.rs: release, musl target, rust-lld)")
PY
}

if [ "${1:-}" = --check ]; then
  [ -n "${2:-}" ] || { echo "usage: $0 --check BIN" >&2; exit 2; }
  check "$2"
  exit 0
fi
[ "$#" -eq 0 ] || { echo "usage: $0 [--check BIN]" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "code-order: no valgrind (apt-get install -y valgrind)" >&2; exit 1; }
eval "$(hack/local-cluster.sh env)"
hack/local-cluster.sh status >/dev/null
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
RUNS=${PROFILE_RUNS:-20}
CC_x86_64_unknown_linux_musl=musl-gcc cargo build --locked --release --target "$TARGET" \
  --bin sandboxrun-operator >&2
BIN=${CARGO_TARGET_DIR:-$REPO/target}/$TARGET/release/sandboxrun-operator

NS=code-order-$$
VWC=code-order-$$
WORK=$(mktemp -d)
VP=
cleanup() {
  if [ -n "$VP" ] && kill -0 "$VP" 2>/dev/null; then kill -INT "$VP"; wait "$VP" 2>/dev/null || true; fi
  kubectl delete validatingwebhookconfiguration "$VWC" --ignore-not-found >/dev/null 2>&1 || true
  kubectl delete ns "$NS-sharded" "$NS-single" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
ensure_crd
mkdir -p "$WORK/data"
for j in 1 2 3 4; do dd if=/dev/urandom of="$WORK/data/f$j" bs=64K count=1 status=none; done
seq 1 2000 >"$WORK/data/text.txt"

# profile <name> <flag...>: one replica under callgrind with <flag...>, taking RUNS runs through a
# lifecycle in a namespace of its own; its profile in $WORK/<name>.out.
profile() {
  local name=$1 ns=$NS-$1 mport ended
  shift
  kubectl create ns "$ns" >/dev/null
  until kubectl get sa default -n "$ns" >/dev/null 2>&1; do sleep 0.2; done
  mport=$(free_port)
  valgrind --tool=callgrind --demangle=no --callgrind-out-file="$WORK/$name.out" \
    "$BIN" run --namespaces "$ns" --metrics-addr "127.0.0.1:$mport" --settings-configmap '' \
    --holder-image sandboxrun-operator:bench --pack-command "$BIN pack" --pod-namespace "$ns" \
    --pod-name "replica-$name" "$@" >"$WORK/$name.log" 2>&1 &
  VP=$!
  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$mport/readyz" >/dev/null && break; sleep 1; done
  curl -sf "http://127.0.0.1:$mport/readyz" >/dev/null || { tail -20 "$WORK/$name.log" >&2; exit 1; }
  sleep 20  # the Leases taken
  # bench/scale_replicas.py's runs, the store's compression left at the API's default.
  python3 -B -c 'import sys; sys.path.insert(0, sys.argv[1]); from scale_replicas import runs_yaml
print(runs_yaml(int(sys.argv[2]), sys.argv[3], sys.argv[4], "64Mi", compression=None))' \
    "$REPO/bench" "$RUNS" "$ns" "$WORK/data" | kubectl create -f - >/dev/null
  ended=0
  for _ in $(seq 1 900); do
    ended=$(kubectl get sbr -n "$ns" -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' |
      grep -cE '^(Succeeded|Failed)$' || true)
    [ "$ended" -ge "$RUNS" ] && break
    curl -s "http://127.0.0.1:$mport/metrics" >/dev/null || true
    sleep 2
  done
  [ "$ended" -ge "$RUNS" ] || { echo "code-order: $name: $ended of $RUNS runs ended" >&2; tail -20 "$WORK/$name.log" >&2; exit 1; }
  kubectl delete sbr --all -n "$ns" --wait=false >/dev/null
  for _ in $(seq 1 600); do [ -z "$(kubectl get sbr -n "$ns" -o name)" ] && break; sleep 2; done
  kill -INT "$VP"; wait "$VP" 2>/dev/null || true; VP=
  kubectl delete ns "$ns" --wait=false >/dev/null
  echo "code-order: profiled $name ($RUNS lifecycles)" >&2
}

# Scale-out as in production: sharded, an S3 store (the bed's), the zstd wire, and the webhook
# registered for its namespace at its loopback port (Ignore: the replica runs ~50x slower under
# valgrind; the reviews still reach it, access checks included).
wport=$(free_port)
kubectl apply -f - >/dev/null <<YAML
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: $VWC}
webhooks:
- name: validate.sandbox.iterion.io
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Ignore
  timeoutSeconds: 30
  clientConfig: {url: "https://127.0.0.1:$wport/validate-sandboxrun"}
  namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: $NS-sharded}}
  rules:
  - {apiGroups: [sandbox.iterion.io], apiVersions: [v1alpha1], operations: [CREATE, UPDATE], resources: [sandboxruns]}
YAML
s3=endpoint=$SANDBOXRUN_TEST_S3_ENDPOINT,allow_http=true,access_key_id=$SANDBOXRUN_TEST_S3_ACCESS_KEY
s3=$s3,secret_access_key=$SANDBOXRUN_TEST_S3_SECRET_KEY,region=us-east-1
profile sharded --store-url "s3://$SANDBOXRUN_TEST_S3_BUCKET/code-order-$$" --store-option "$s3" \
  --webhook-addr "127.0.0.1:$wport" --webhook-cert-mode self-managed --webhook-hosts 127.0.0.1 \
  --webhook-secret code-order-tls --webhook-config "$VWC" --sharding --shards 32 \
  --lease-name code-order
# The single replica of the default install: leader-elected, the embedded file:// store; the plain
# tar wire (the other wire).
profile single --store-url "file://$WORK/store" --webhook-addr '' --leader-elect \
  --lease-name code-order --drain-wire tar

mkdir -p "$REPO/link"
python3 - "$BIN" "$LIST" "$RUNS" "$WORK/sharded.out" "$WORK/single.out" <<'PY'
import re, subprocess, sys
binary, listing, runs, profiles = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
# Each function's own instructions (callgrind's self cost), summed over the profiles: the hottest
# first, so that what a busy replica runs all the time shares pages and what ran once (start-up)
# comes last.
cost = {}
for profile in profiles:
    names, current, skip = {}, None, False
    for line in open(profile, errors="replace"):
        line = line.rstrip("\n")
        m = re.match(r"^(c?)fn=\((\d+)\)(?: (.+))?$", line)
        if m:
            if m.group(3):
                names[m.group(2)] = m.group(3)
            if not m.group(1):
                current = names.get(m.group(2))
                cost.setdefault(current, 0)
            continue
        if line.startswith("calls="):
            skip = True  # the next cost line is the call's inclusive cost, not the caller's own
            continue
        if current and line and (line[0].isdigit() or line[0] in "+-*"):
            fields = line.split()
            if not skip and len(fields) >= 2 and fields[1].isdigit():
                cost[current] += int(fields[1])
            skip = False
    for name in names.values():
        cost.setdefault(name, 0)
text = set()
for line in subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True,
                           check=True).stdout.splitlines():
    parts = line.split(" ", 2)
    if len(parts) == 3 and parts[1] in "tTwW":
        text.add(parts[2])
hot = sorted(set(cost) & text, key=lambda s: (-cost[s], s))
with open(listing, "w") as f:
    f.write("# The functions a replica runs, hottest first, linked first (build.rs). Generated by\n")
    f.write(f"# hack/code-order.sh from profiles of {runs} lifecycles each; do not edit.\n")
    f.write("\n".join(hot) + "\n")
print(f"code-order: {len(hot)} functions written to {listing}")
PY
