#!/usr/bin/env bash
# Fails when charts/sandboxrun-operator changed since its version was released without a version
# bump (issue #42): charts/RELEASED records, per released version, the git tree of the chart
# directory that release packaged (hack/release.sh --record writes it). A chart whose Chart.yaml
# version is one of those must be that tree exactly; a version never released passes (the next
# release records it).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
RECORD=charts/RELEASED
CHART=charts/sandboxrun-operator
version=$(awk '$1 == "version:" { print $2 }' "$CHART/Chart.yaml")
[ -f "$RECORD" ] || { echo "chart-released: no $RECORD" >&2; exit 1; }
released=$(awk -v v="$version" '$1 == v { print $2 }' "$RECORD")
if [ -z "$released" ]; then
  echo "chart-released: chart $version is not released yet" >&2
  exit 0
fi
# The tree of the chart as it is in the work tree (staged or not), without touching the index.
index=$(mktemp); trap 'rm -f "$index"' EXIT
GIT_INDEX_FILE=$index git read-tree HEAD
GIT_INDEX_FILE=$index git add -A -- "$CHART"
now=$(GIT_INDEX_FILE=$index git write-tree --prefix="$CHART/")
if [ "$now" != "$released" ]; then
  echo "chart-released: $CHART changed since chart $version was released (tree $released, now $now):" >&2
  echo "  bump version (and appVersion) in $CHART/Chart.yaml and add a CHANGELOG.md entry" >&2
  exit 1
fi
echo "chart-released: chart $version is the released tree" >&2
