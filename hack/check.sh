#!/usr/bin/env bash
# `make check`: every static check, no cluster (issue #43). hack/test.sh runs it as its first
# phase; on its own it takes under 5 minutes on a warm machine (a cold cargo build is longer).
#   cargo fmt --check; cargo clippy --all-targets --locked -D warnings; generated files up to date
#   (hack/gen.sh --check: the CRDs, config/rbac, the GitOps fixtures, the chart README's values table, the docs' generated tables); the versions a release names agree (hack/release-versions.py) and the Python wheel builds reproducibly (hack/python-wheel.py --self-test); no import cycles between files or areas, the areas' drawing in docs/architecture.md is the code's (hack/import-cycles.py); the Dockerfile lint;
#   no new Result<_, String> in runtime code (hack/string-errors.py, a ratchet: hack/string-errors.allow);
#   no apiserver write, exec or store write outside act (hack/io-outside-act.py, a ratchet:
#   hack/io-outside-act.allow); no function over 80 lines (hack/fn-length.py, after its self-test).
#   The scanners skip test code item by item (hack/rust_source.py).
# Stops at the first check that fails; ends with each check's time.
set -euo pipefail
cd "$(dirname "$0")/.."
times=()
start=$(date +%s)
step_name=""
step_start=$start
step() {  # step <name>: closes the previous step's timer and opens one for <name>
  local now; now=$(date +%s)
  if [ -n "$step_name" ]; then times+=("$(printf '%-56s %5ss' "$step_name" $(( now - step_start )))"); fi
  step_name=${1:-}; step_start=$now
  if [ -n "$step_name" ]; then echo "== check: $step_name" >&2; fi
}

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy --all-targets --locked -- -D warnings"
cargo clippy --all-targets --locked -- -D warnings
step "generated files are up to date (hack/gen.sh --check)"
python3 hack/chart-readme.py --self-test
hack/gen.sh --check
step "one version everywhere a release names it (hack/release-versions.py)"
python3 hack/release-versions.py --self-test
python3 hack/release-versions.py
python3 hack/python-wheel.py --self-test
# make release pushes the chart over plain HTTP to the local bed's registry only, over TLS to yours.
bash -c '. hack/lib.sh && loopback_registry 127.0.0.1:15000 && loopback_registry localhost:15000 &&
  loopback_registry "[::1]:5000" && ! loopback_registry registry.example.com:5000 &&
  ! loopback_registry 127.example.com && ! loopback_registry ghcr.io' ||
  { echo "check: hack/lib.sh loopback_registry judges a registry wrongly" >&2; exit 1; }
step "no import cycles, between files nor between areas (hack/import-cycles.py src)"
python3 hack/import-cycles.py --self-test
python3 hack/import-cycles.py src
python3 hack/import-cycles.py --check-doc docs/architecture.md src
step "Dockerfile lint (hack/lint-dockerfile.sh)"
hack/lint-dockerfile.sh
step "no new Result<_, String> in runtime code (hack/string-errors.py, a ratchet)"
python3 hack/string-errors.py --self-test
python3 hack/string-errors.py src
step "no write outside act (hack/io-outside-act.py, a ratchet)"
python3 hack/io-outside-act.py --self-test
python3 hack/io-outside-act.py src
step "no function over 80 lines (hack/fn-length.py src)"
python3 hack/fn-length.py --self-test
python3 hack/fn-length.py src
step ""
echo "== check: ok in $(( $(date +%s) - start ))s" >&2
for t in "${times[@]}"; do echo "   $t" >&2; done
