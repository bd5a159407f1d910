#!/usr/bin/env bash
# Build OCI images without Docker and push them to the local registry, reproducibly (a tar layer
# with fixed owners and mtimes, `crane append` onto the empty base, `crane mutate` for the config):
#
#   hack/images.sh base       pause:3.10 (the pod sandbox) and busybox:1.35 (the sample and test
#                             workload: Debian's busybox-static and its applets). local-cluster.sh
#                             up runs this before the real node starts.
#   hack/images.sh operator   sandboxrun-operator:dev, the layout of the Dockerfile (which stays the
#                             production build): a static musl binary at
#                             /usr/local/bin/sandboxrun-operator, user 65532:65532, no shell,
#                             ENTRYPOINT ["sandboxrun-operator"], CMD ["run"]. Prints the pushed
#                             reference with its digest on the last line.
#                             SANDBOXRUN_OPERATOR_TAG=<tag> pushes sandboxrun-operator:<tag>
#                             instead, built in its own directory and pinned in
#                             sandboxrun-operator-<tag>.ref, so a branch's image can be tried
#                             without replacing the :dev one others test against
#                             (tests/it/real_node/bed.rs takes the printed reference as
#                             SANDBOXRUN_TEST_OPERATOR_IMAGE).
#
# Images are pushed to $SANDBOXRUN_TEST_REGISTRY (default 127.0.0.1:15000) and the node pulls them
# as localhost:<port>/<name>. The operator binary is the release build the Dockerfile makes (static
# musl, the size-optimised profile of Cargo.toml) unless SANDBOXRUN_IMAGE_BINARY names one that is
# already built.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
bed_defaults
REG=localhost:$REGISTRY_PORT
W=$STATE/images
CRANE=$BIN/crane
log() { echo "images: $*" >&2; }
die() { log "$*"; exit 1; }

[ -x "$CRANE" ] || die "no crane at $CRANE: run hack/build-tools.sh"
(exec 3<>"/dev/tcp/127.0.0.1/$REGISTRY_PORT") 2>/dev/null || die "no registry on 127.0.0.1:$REGISTRY_PORT: hack/local-cluster.sh up starts it"

layer() {  # layer <dir> <out.tar>: numeric root ownership (unless the tree says otherwise), mtime 0
  tar_tree "$1" >"$2"
}
image() {  # image <name:tag> <layer.tar> <crane mutate args...>: push, print ref@digest
  # The pinned reference goes to $W/<name>.ref, or $W/$REF_NAME.ref when REF_NAME is set.
  local name=${REF_NAME:-${1%%:*}} ref=$REG/$1 tar=$2; shift 2
  # crane logs every blob on stderr: keep it in a file, show it only when a step fails.
  local clog=$W/crane-$name.log
  "$CRANE" append --insecure --oci-empty-base -f "$tar" -t "$ref" >/dev/null 2>"$clog" || { cat "$clog" >&2; die "crane append $ref failed"; }
  # The empty base's config has os/arch "": stamp linux/amd64 so platform matching never trips.
  "$CRANE" mutate --insecure "$ref" --set-platform linux/amd64 "$@" -t "$ref" >/dev/null 2>"$clog" || { cat "$clog" >&2; die "crane mutate $ref failed"; }
  local pinned; pinned="$ref@$("$CRANE" digest --insecure "$ref" 2>"$clog")"
  # Tests and the demo read the pinned reference from here (<name>.ref, e.g. busybox.ref).
  # Written whole, then renamed: a test reading it meanwhile never sees a half-written file.
  echo "$pinned" >"$W/$name.ref.tmp" && mv -f "$W/$name.ref.tmp" "$W/$name.ref"
  echo "$pinned"
}

base() {
  rm -rf "$W/pause" "$W/busybox"; mkdir -p "$W/pause" "$W/busybox/bin" "$W/busybox/tmp" "$W/busybox/etc"
  (cd "$HERE/images/pause" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags='-s -w' -o "$W/pause/pause" .)
  layer "$W/pause" "$W/pause.tar"
  image pause:3.10 "$W/pause.tar" --entrypoint /pause --user 65535:65535

  local bb; bb=$(command -v busybox || true)
  [ -n "$bb" ] || die "no busybox: apt-get install -y busybox-static"
  # A dynamic busybox would need a libc in the image: insist on the static build.
  is_static "$bb" || die "$bb is not static: apt-get install -y busybox-static"
  local B=$W/busybox a
  cp "$bb" "$B/bin/busybox"; chmod 1777 "$B/tmp"
  for a in sh sleep tar cat ls mkdir echo id head sha256sum wc touch rm test true false env ps du \
           stat find chmod cp mv kill printf dd seq sync; do
    ln -s busybox "$B/bin/$a"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$B/etc/passwd"
  printf 'root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n' >"$B/etc/group"
  layer "$B" "$W/busybox.tar"
  image busybox:1.35 "$W/busybox.tar" --cmd /bin/sh --env PATH=/bin
}

operator() {
  local tag=${SANDBOXRUN_OPERATOR_TAG:-dev} suffix=""
  [[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "SANDBOXRUN_OPERATOR_TAG=$tag is not an image tag"
  [ "$tag" = dev ] || suffix=-$tag
  local binary=${SANDBOXRUN_IMAGE_BINARY:-}
  if [ -z "$binary" ]; then
    local target=x86_64-unknown-linux-musl
    local installed; installed=$(rustup target list --installed 2>/dev/null || true)
    grep -qx "$target" <<<"$installed" || rustup target add "$target" >&2
    command -v musl-gcc >/dev/null || die "no musl-gcc (ring and zstd-sys compile C): apt-get install -y musl-tools"
    log "building the static operator binary (cargo --release --target $target)"
    (cd "$REPO" && CC_x86_64_unknown_linux_musl=musl-gcc cargo build --locked --release \
       --target "$target" --bin sandboxrun-operator >&2)
    binary=${CARGO_TARGET_DIR:-$REPO/target}/$target/release/sandboxrun-operator
  fi
  [ -x "$binary" ] || die "no operator binary at $binary"
  # distroless/static has no libc: the binary must not need one.
  is_static "$binary" || die "$binary is not static"
  local O=$W/operator$suffix
  rm -rf "$O"; mkdir -p "$O/usr/local/bin" "$O/etc/ssl/certs" "$O/tmp"
  cp "$binary" "$O/usr/local/bin/sandboxrun-operator"; chmod 0755 "$O/usr/local/bin/sandboxrun-operator"
  # What distroless/static gives the binary: users, a CA bundle for the cloud stores, /tmp.
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$O/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$O/etc/group"
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then cp /etc/ssl/certs/ca-certificates.crt "$O/etc/ssl/certs/"; fi
  chmod 1777 "$O/tmp"
  layer "$O" "$W/operator$suffix.tar"
  # 65532 = distroless "nonroot", as in the Dockerfile's USER.
  REF_NAME=sandboxrun-operator$suffix image "sandboxrun-operator:$tag" "$W/operator$suffix.tar" --entrypoint sandboxrun-operator --cmd run --user 65532:65532 \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
}

mkdir -p "$W"
case "${1:-}" in
  base) base ;;
  operator) operator ;;
  *) echo "usage: $0 base|operator" >&2; exit 2 ;;
esac
