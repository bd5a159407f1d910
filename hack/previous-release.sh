#!/usr/bin/env bash
# The previous release, for the upgrade test (issue #42; tests/it/real_node/upgrade.rs
# `helm_upgrade_from_the_previous_release_keeps_the_runs_in_flight`): the newest version in
# charts/RELEASED that is not the chart's current version, as it was released — its chart is the
# recorded chart tree read from git (checked against the tree charts/RELEASED names), its operator
# binary is built from the commit that released it. The binary is built once into the tools cache
# (keyed by version and commit); each call pushes it as the image sandboxrun-operator:<version> to
# the bed's registry (hack/images.sh, the same image layout) and writes what the test reads to
# $STATE/previous-release.env: VERSION, COMMIT, CHART (a packaged .tgz) and IMAGE (pinned).
#
#   hack/previous-release.sh          needs the local cluster up (its registry)
#
# The build shares this checkout's cargo target dir (the dependencies are nearly all the same), so
# a cold cache costs one release build of the old commit; the current build after it recompiles
# only this crate.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
bed_defaults
log() { echo "previous-release: $*" >&2; }
die() { log "$*"; exit 1; }
cd "$REPO"

RECORD=charts/RELEASED
CHART=charts/sandboxrun-operator
current=$(awk '$1 == "version:" { print $2 }' "$CHART/Chart.yaml")
# The newest recorded version other than the current one (lines are appended in release order).
line=$(awk -v cur="$current" '$1 !~ /^#/ && NF >= 3 && $1 != cur { last = $0 } END { print last }' "$RECORD")
[ -n "$line" ] || die "no earlier release with a commit in $RECORD"
read -r VERSION TREE COMMIT <<<"$line"
if ! git cat-file -e "$COMMIT^{commit}" 2>/dev/null; then
  # A shallow clone: ask the remote for that one commit.
  git fetch --quiet --depth=1 origin "$COMMIT" >/dev/null 2>&1 || true
fi
git cat-file -e "$COMMIT^{commit}" 2>/dev/null || die "commit $COMMIT of release $VERSION is not in this clone (a shallow clone? git fetch --unshallow)"
[ "$(git rev-parse "$COMMIT:$CHART")" = "$TREE" ] || die "commit $COMMIT's chart is not the tree $TREE that $VERSION released"

OUT=$CACHE_ROOT/release-$VERSION-${COMMIT:0:12}
if [ ! -x "$OUT/sandboxrun-operator" ]; then
  log "building $VERSION's operator from $COMMIT (once; cached in $OUT)"
  work=$(mktemp -d)
  cleanup() { git worktree remove --force "$work/src" >/dev/null 2>&1 || true; rm -rf "$work"; }
  trap cleanup EXIT
  git worktree add --detach "$work/src" "$COMMIT" >/dev/null 2>&1 || die "git worktree add $COMMIT failed"
  target=x86_64-unknown-linux-musl
  (cd "$work/src" && CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target} CC_x86_64_unknown_linux_musl=musl-gcc \
     cargo build --locked --release --target "$target" --bin sandboxrun-operator >&2)
  mkdir -p "$OUT"
  cp "${CARGO_TARGET_DIR:-$REPO/target}/$target/release/sandboxrun-operator" "$OUT/sandboxrun-operator.tmp"
  mv -f "$OUT/sandboxrun-operator.tmp" "$OUT/sandboxrun-operator"
fi
# Read whole, not piped into `grep -q` (SIGPIPE under pipefail: hack/lib.sh first_line).
built=$("$OUT/sandboxrun-operator" --version 2>&1 || true)
[[ $built == *" $VERSION"* ]] || die "$OUT/sandboxrun-operator is not version $VERSION ($built)"

# The chart as released: its tree from git, packaged by this bed's helm.
pkg=$STATE/previous-release
rm -rf "$pkg"; mkdir -p "$pkg/src"
git archive "$COMMIT" "$CHART" | tar -x -C "$pkg/src"
"$BIN/helm" package "$pkg/src/$CHART" -d "$pkg" >/dev/null
chart_tgz=$pkg/sandboxrun-operator-$VERSION.tgz
[ -s "$chart_tgz" ] || die "helm package made no $chart_tgz"

image=$(SANDBOXRUN_IMAGE_BINARY=$OUT/sandboxrun-operator SANDBOXRUN_OPERATOR_TAG=$VERSION "$HERE/images.sh" operator | tail -n 1)
[[ $image == *@sha256:* ]] || die "images.sh printed no pinned image: $image"
printf 'VERSION=%s\nCOMMIT=%s\nCHART=%s\nIMAGE=%s\n' "$VERSION" "$COMMIT" "$chart_tgz" "$image" >"$STATE/previous-release.env"
log "release $VERSION ($COMMIT): chart $chart_tgz, image $image"
