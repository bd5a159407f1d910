#!/usr/bin/env bash
# A versioned release into dist/<version>/, reproducibly (issue #42; docs/operations.md
# "Releases"), and optionally pushed to an OCI registry:
#
#   hack/release.sh VERSION [--registry HOST:PORT] [--push] [--record] [--base-url URL]
#                           [--image-repository R]
#   make release VERSION=x.y.z [REGISTRY=HOST:PORT] [PUSH=1]
#
# VERSION must be the binary's (Cargo.toml), the chart's `version` and `appVersion`, the Python
# client's (clients/python/pyproject.toml) already (bumped in a commit) and the newest section of
# CHANGELOG.md (hack/release-versions.py). It produces:
#   image/                                 the operator image as an OCI image layout (linux/amd64
#                                          only: no arm64 C toolchain reaches this machine)
#   sandboxrun-operator-VERSION.tgz        the chart, image pinned by digest (image.repository =
#                                          --image-repository, default <registry>/sandboxrun-operator)
#   sandboxrun-operator-linux-amd64.tar.gz the kubectl plugin (the operator binary, run as
#                                          kubectl-sandboxrun) + .sha256
#   sandboxrun.yaml                        the krew manifest pointing at that tarball under --base-url
#   sandboxrun-VERSION-py3-none-any.whl    the Python client (clients/python), hack/python-wheel.py
#   crds/                                  the CRDs
#   CHANGELOG.md                           this version's entry
#   SHA256SUMS                             of every file above
# With --record, charts/RELEASED gains the chart tree this version packaged and its commit: from then on
# hack/chart-released.sh (in `make test`) fails on a chart changed without a version bump.
# The image is pushed to the registry (it must be running: the local bed's by default); with
# --push the chart goes there too (`helm push … oci://<registry>/charts`), so that
# `helm install oci://<registry>/charts/sandboxrun-operator --version VERSION` installs it.
# Archives carry no timestamps or owners: the same commit and binary give the same bytes.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
bed_defaults
log() { echo "release: $*" >&2; }
die() { log "$*"; exit 1; }
usage() { sed -n '2,8p' "$0" >&2; exit 2; }

[ $# -ge 1 ] || usage
VERSION=$1; shift
REGISTRY=${SANDBOXRUN_TEST_REGISTRY:-127.0.0.1:$REGISTRY_PORT}
PUSH=0
RECORD=0
BASE_URL=https://github.com/iterion/sandboxrun-operator/releases/download
IMAGE_REPOSITORY=""
while [ $# -gt 0 ]; do
  case $1 in
    --registry) REGISTRY=$2; shift 2 ;;
    --push) PUSH=1; shift ;;
    --record) RECORD=1; shift ;;
    --base-url) BASE_URL=$2; shift 2 ;;
    --image-repository) IMAGE_REPOSITORY=$2; shift 2 ;;
    *) usage ;;
  esac
done
[[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || die "VERSION $VERSION is not x.y.z[-pre]"
CHART=$REPO/charts/sandboxrun-operator
# Every version the release names is VERSION: the binary's (Cargo.toml, which it reports and
# publishes), the chart's version and appVersion, the CHANGELOG's newest section, the image the chart
# defaults to and the krew manifest's (hack/release-versions.py; `make check` runs it on the tree).
python3 "$HERE/release-versions.py" --version "$VERSION" "$REPO" >&2 ||
  die "the tree is not version $VERSION: bump Cargo.toml, Cargo.lock, Chart.yaml, clients/python/pyproject.toml and CHANGELOG.md together in a commit first"
CRANE=$BIN/crane HELM=$BIN/helm
for tool in "$CRANE" "$HELM"; do [ -x "$tool" ] || die "no $tool: run hack/build-tools.sh"; done
IMAGE_REPOSITORY=${IMAGE_REPOSITORY:-${REGISTRY/127.0.0.1/localhost}/sandboxrun-operator}

DIST=$REPO/dist/$VERSION
rm -rf "$DIST"; mkdir -p "$DIST/crds"
tarball() {  # tarball <dir> <out.tar.gz>: lib.sh's tar_tree, gzipped without a timestamp
  tar_tree "$1" | gzip -9n >"$2"
}

log "image (the static musl build the Dockerfile makes)"
pinned=$(SANDBOXRUN_OPERATOR_TAG=$VERSION "$HERE/images.sh" operator | tail -n 1)
digest=${pinned##*@}
[[ $digest == sha256:* ]] || die "images.sh printed no digest: $pinned"
source_ref="127.0.0.1:$REGISTRY_PORT/sandboxrun-operator:$VERSION"
# Plain HTTP (and no certificate check) for the local bed's registry only: any other registry is
# pushed to over TLS, its certificate checked (crane reaches a loopback source over HTTP itself).
insecure=()
plain_http=()
if loopback_registry "$REGISTRY"; then insecure=(--insecure); plain_http=(--plain-http); fi
if [ "$REGISTRY" != "127.0.0.1:$REGISTRY_PORT" ]; then
  "$CRANE" copy "${insecure[@]}" "$source_ref" "$REGISTRY/sandboxrun-operator:$VERSION" >/dev/null 2>&1 ||
    die "crane copy to $REGISTRY failed"
fi
"$CRANE" pull "${insecure[@]}" --format=oci "$REGISTRY/sandboxrun-operator:$VERSION" "$DIST/image" 2>/dev/null ||
  die "crane pull of the image failed"

log "kubectl plugin tarball"
binary=${SANDBOXRUN_IMAGE_BINARY:-${CARGO_TARGET_DIR:-$REPO/target}/x86_64-unknown-linux-musl/release/sandboxrun-operator}
[ -x "$binary" ] || die "no release binary at $binary"
plugin=$(mktemp -d); trap 'rm -rf "$plugin" "${chart_dir:-}"' EXIT
cp "$binary" "$plugin/sandboxrun-operator"; chmod 0755 "$plugin/sandboxrun-operator"
cp "$REPO/README.md" "$plugin/README.md"
tarball "$plugin" "$DIST/sandboxrun-operator-linux-amd64.tar.gz"
plugin_sha=$(sha256sum "$DIST/sandboxrun-operator-linux-amd64.tar.gz" | cut -d' ' -f1)
echo "$plugin_sha  sandboxrun-operator-linux-amd64.tar.gz" >"$DIST/sandboxrun-operator-linux-amd64.tar.gz.sha256"

log "Python client wheel (clients/python)"
python3 "$HERE/python-wheel.py" "$REPO/clients/python" "$DIST" >/dev/null

log "krew manifest (linux/amd64)"
python3 "$HERE/release_krew.py" "$REPO/deploy/krew/sandboxrun.yaml" "v$VERSION" \
  "$BASE_URL/v$VERSION/sandboxrun-operator-linux-amd64.tar.gz" "$plugin_sha" >"$DIST/sandboxrun.yaml"

log "chart $VERSION, image $IMAGE_REPOSITORY@$digest"
chart_dir=$(mktemp -d)
cp -r "$CHART" "$chart_dir/sandboxrun-operator"
python3 - "$chart_dir/sandboxrun-operator/values.yaml" "$IMAGE_REPOSITORY" "$digest" <<'PY'
import re, sys
path, repository, digest = sys.argv[1:4]
text = open(path).read()
# The top-level `image:` block's repository and digest (the first of each after it).
head, sep, rest = text.partition("\nimage:\n")
if not sep:
    sys.exit("values.yaml has no top-level image block")
rest = re.sub(r"(?m)^  repository: .*$", f"  repository: {repository}", rest, count=1)
rest = re.sub(r'(?m)^  digest: .*$', f'  digest: "{digest}"', rest, count=1)
open(path, "w").write(head + sep + rest)
PY
"$HELM" package "$chart_dir/sandboxrun-operator" --version "$VERSION" --app-version "$VERSION" \
  -d "$chart_dir/out" >/dev/null
# helm stamps the archive's entries with the packaging time: repacked without times.
mkdir -p "$chart_dir/unpacked"
tar -xzmf "$chart_dir/out/sandboxrun-operator-$VERSION.tgz" -C "$chart_dir/unpacked"
tarball "$chart_dir/unpacked" "$DIST/sandboxrun-operator-$VERSION.tgz"

log "CRDs, changelog, checksums"
cp "$REPO"/crds/*.sandbox.iterion.io.yaml "$DIST/crds/"
awk -v v="## $VERSION" 'index($0, v) == 1 { on = 1; print; next } on && /^## / { exit } on { print }' \
  "$REPO/CHANGELOG.md" >"$DIST/CHANGELOG.md"
(cd "$DIST" && find . -type f ! -name SHA256SUMS ! -path './image/*' -printf '%P\n' | LC_ALL=C sort |
  xargs sha256sum >SHA256SUMS)

if [ "$PUSH" = 1 ]; then
  log "helm push oci://$REGISTRY/charts"
  "$HELM" push "$DIST/sandboxrun-operator-$VERSION.tgz" "oci://$REGISTRY/charts" "${plain_http[@]}" >&2
fi
if [ "$RECORD" = 1 ]; then
  # charts/RELEASED: the chart tree this version packaged (hack/chart-released.sh checks it) and
  # the commit whose binary it shipped (hack/previous-release.sh rebuilds it for the upgrade test).
  tree=$(git -C "$REPO" rev-parse "HEAD:charts/sandboxrun-operator")
  commit=$(git -C "$REPO" rev-parse HEAD)
  [ -z "$(git -C "$REPO" status --porcelain -- charts/sandboxrun-operator)" ] ||
    die "--record: charts/sandboxrun-operator has uncommitted changes"
  grep -v "^$VERSION " "$REPO/charts/RELEASED" 2>/dev/null >"$REPO/charts/RELEASED.tmp" || true
  echo "$VERSION $tree $commit" >>"$REPO/charts/RELEASED.tmp"
  mv "$REPO/charts/RELEASED.tmp" "$REPO/charts/RELEASED"
  log "recorded chart $VERSION = tree $tree in charts/RELEASED: commit it"
fi
log "dist/$VERSION ready; image $IMAGE_REPOSITORY@$digest"
echo "$DIST"
