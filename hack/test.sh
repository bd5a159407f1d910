#!/usr/bin/env bash
# The whole test suite, as the README and CI run it:
#   static checks (fmt, clippy, generated files) → local control plane up → every test → down.
# A cluster that was already up (e.g. `hack/local-cluster.sh up` by hand) is left running.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "== $*" >&2; }

log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --locked -- -D warnings
log "generated files are up to date"
hack/gen.sh --check

started_here=0
if ! hack/local-cluster.sh status >/dev/null 2>&1; then
  log "bringing the local control plane up"
  hack/local-cluster.sh up
  started_here=1
fi
cleanup() { if [ "$started_here" = 1 ] && [ -z "${SANDBOXRUN_KEEP_CLUSTER:-}" ]; then hack/local-cluster.sh down; fi; }
trap cleanup EXIT
eval "$(hack/local-cluster.sh env)"

log "cargo test (unit + integration on the local control plane)"
# The binary must exist before the tests run: kwok's exec runs `sandboxrun-operator pack` from it.
cargo build --locked --bins
cargo test --locked --no-fail-fast -- --test-threads="${TEST_THREADS:-4}"

# The README's other command, end to end: the demo must end with the sample's files listed from
# the store. Its output is kept in the state directory's logs; its operator is stopped by `down`.
log "make demo (the README's main job)"
demo_log=$(mktemp)
if ! hack/demo.sh >"$demo_log" 2>&1; then
  cat "$demo_log" >&2; echo "demo failed" >&2; exit 1
fi
grep -q 'summary.txt' "$demo_log" || { cat "$demo_log" >&2; echo "demo did not list the drained files" >&2; exit 1; }
tail -n 8 "$demo_log"
if [ -f "${SANDBOXRUN_TEST_STATE:-.k8s-local}/run/operator.pid" ]; then
  kill "$(cat "${SANDBOXRUN_TEST_STATE:-.k8s-local}/run/operator.pid")" 2>/dev/null || true
fi
