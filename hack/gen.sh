#!/usr/bin/env bash
# Regenerates every generated artefact from the code: the CRD in crds/ and its copy in the chart.
#   hack/gen.sh           write them
#   hack/gen.sh --check   fail (exit 1) when the committed files differ from the code
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
cargo run --quiet --locked --bin sandboxrun-operator -- crd >"$tmp"
targets="crds/sandboxruns.sandbox.iterion.io.yaml charts/sandboxrun-operator/crds/sandboxruns.sandbox.iterion.io.yaml"
if [ "${1:-}" = "--check" ]; then
  rc=0
  for t in $targets; do
    if ! diff -u "$t" "$tmp" >/dev/null 2>&1; then
      echo "$t is out of date with src/api.rs: run \`make crds\` and commit it" >&2; rc=1
    fi
  done
  exit $rc
fi
for t in $targets; do mkdir -p "$(dirname "$t")"; cp "$tmp" "$t"; done
echo "wrote: $targets"
