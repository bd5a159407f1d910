#!/usr/bin/env bash
# Everything a fresh Debian/Ubuntu machine needs before `make demo` or `make test`, in one place:
# the Debian packages (the ONE list of them, below), the Rust target and components, the tools
# built from their Go modules (hack/build-tools.sh), s3s-fs and the store emulators. `make demo`,
# `make test` and .ci/run call it; a second run only checks (a few seconds).
#
#   hack/setup.sh            install what is missing (as root, with apt), one line per step
#   hack/setup.sh --demo     the same, less what only the tests use (the GCS/Azure/gofakes3
#                            store emulators: hack/test.sh installs them on its first run)
#   hack/setup.sh --check    install nothing: list what is missing, exit 2 if anything is
#
# Not root, or no apt: it prints every missing prerequisite at once, with the command that
# installs it, and exits 2.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
bed_defaults
S3S_BIN=$CACHE_ROOT/s3s-fs-$S3S_FS_VERSION/bin/s3s-fs
check_only=0 demo_only=0
case "${1:-}" in
  --check) check_only=1 ;;
  --demo) demo_only=1 ;;
  "") ;;
  *) echo "usage: $0 [--check|--demo]" >&2; exit 2 ;;
esac

# <command it provides>:<Debian package>. A package is skipped when its command already exists
# (e.g. npm from a Node.js installed another way). What each is for:
#   openssl (test bed PKI), docker-registry (the local OCI registry), curl, npm (Azurite),
#   make, runc iptables conntrack socat ip ipset (the real node; ipset for kube-router),
#   busybox (static: the workload image), musl-gcc (the static operator image),
#   lua5.4 (the Argo CD health script's test), python3 (the Python client, clients/python: its
#   own packages go into a virtual environment, below, from clients/python/requirements-test.txt).
PACKAGES="openssl:openssl docker-registry:docker-registry curl:curl npm:npm make:make runc:runc
iptables:iptables conntrack:conntrack socat:socat ip:iproute2 ipset:ipset busybox:busybox-static
musl-gcc:musl-tools lua5.4:lua5.4 python3:python3"

t_all=$(date +%s)
step() {  # step <what> <command...>: runs it, prints one line with its time
  local what=$1 t0 rc=0
  shift
  t0=$(date +%s)
  "$@" || rc=$?
  printf 'setup: %-52s %s (%ss)\n' "$what" "$([ "$rc" = 0 ] && echo ok || echo FAILED)" $(( $(date +%s) - t0 )) >&2
  return "$rc"
}

missing_packages() {
  local pair pkgs=""
  for pair in $PACKAGES; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || pkgs="$pkgs ${pair#*:}"
  done
  # The Python client's tests run in a virtual environment (python_client_venv): python3 with venv.
  if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    pkgs="$pkgs python3-venv"
  fi
  # A dynamic busybox (Debian's `busybox`) cannot go into an image without a libc.
  if command -v busybox >/dev/null 2>&1 && ! is_static "$(command -v busybox)"; then
    pkgs="$pkgs busybox-static"
  fi
  echo "$pkgs"
}

# Everything missing that this script cannot install itself, one line each with its remedy.
missing_toolchains() {
  command -v go >/dev/null 2>&1 || echo "Go >= 1.25 (the test bed is built from Go modules): https://go.dev/doc/install"
  command -v cargo >/dev/null 2>&1 || echo "a stable Rust toolchain: rustup (https://rustup.rs)"
  command -v rustup >/dev/null 2>&1 || echo "rustup (for the musl target and rustfmt/clippy): https://rustup.rs"
}

pkgs=$(missing_packages)
toolchains=$(missing_toolchains)
can_install=0
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && can_install=1
if [ -n "$toolchains" ] || { [ -n "$pkgs" ] && { [ "$check_only" = 1 ] || [ "$can_install" = 0 ]; }; }; then
  echo "setup: missing prerequisites:" >&2
  [ -z "$pkgs" ] || echo "  Debian packages:$pkgs -> sudo apt-get install -y$pkgs" >&2
  [ -z "$toolchains" ] || sed 's/^/  /' <<<"$toolchains" >&2
  [ "$(id -u)" = 0 ] || echo "  (the local cluster runs a real kubelet: run as root)" >&2
  exit 2
fi

install_packages() {
  apt-get update -qq
  # policy-rc.d: never start the Debian services (docker-registry) the packages ship.
  local own_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; own_policy=1
  fi
  local rc=0
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null || rc=$?
  if [ -n "$own_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
  return "$rc"
}
if [ -n "$pkgs" ]; then step "Debian packages:$pkgs" install_packages; fi

rust_parts() {
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
  grep -qx x86_64-unknown-linux-musl <<<"$(rustup target list --installed)" ||
    rustup target add x86_64-unknown-linux-musl >/dev/null
}
step "rust: rustfmt, clippy, the musl target" rust_parts
[ "$check_only" = 1 ] && { echo "setup: nothing missing that --check looks at" >&2; exit 0; }

step "tools from their Go modules (cold: ~25 min on 2 cores)" bash -c "'$HERE/build-tools.sh' >/dev/null"
install_s3s() {
  [ -x "$S3S_BIN" ] && return 0
  cargo install s3s-fs --version "$S3S_FS_VERSION" --features binary --locked \
    --root "$CACHE_ROOT/s3s-fs-$S3S_FS_VERSION" >/dev/null 2>&1
}
step "s3s-fs $S3S_FS_VERSION (the S3 server)" install_s3s
# The Python client's packages (kubernetes, boto3, zstandard, pytest, mcp: clients/python/requirements-test.txt,
# pinned) in a virtual environment of the cache, never in the machine's own Python.
PY_VENV=$(python_client_venv)
install_python_client() {
  [ -x "$PY_VENV/bin/python3" ] && "$PY_VENV/bin/python3" -c 'import kubernetes, boto3, zstandard, pytest, mcp, google.cloud.storage, azure.storage.blob' 2>/dev/null && return 0
  rm -rf "$PY_VENV"
  python3 -m venv "$PY_VENV" &&
    "$PY_VENV/bin/python3" -m pip install --quiet --disable-pip-version-check \
      -r "$HERE/../clients/python/requirements-test.txt" >/dev/null
}
if [ "$demo_only" = 1 ]; then
  printf 'setup: %-52s %s\n' "python client's packages (clients/python)" "deferred (only make test uses them)" >&2
else
  step "python client's packages (a venv: kubernetes, boto3, …)" install_python_client
fi
if [ "$demo_only" = 1 ]; then
  printf 'setup: %-52s %s\n' "store emulators (fake-gcs-server, gofakes3, Azurite)" \
    "deferred (the demo stores in S3 only; make test installs them)" >&2
else
  step "store emulators (fake-gcs-server, gofakes3, Azurite)" bash -c "'$HERE/store-emulators.sh' install >/dev/null"
fi
echo "setup: ready in $(( $(date +%s) - t_all ))s" >&2
