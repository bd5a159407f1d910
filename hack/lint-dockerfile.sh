#!/usr/bin/env bash
# Basic checks of the Dockerfile where hadolint is not available (no Docker engine here either).
# Each check guards something the cluster relies on:
#   - every FROM names a tag or digest, never :latest (reproducible builds);
#   - the final stage runs as a numeric non-root USER (the chart sets runAsNonRoot);
#   - the binary lands at /usr/local/bin/sandboxrun-operator (the pod builder runs
#     `/usr/local/bin/sandboxrun-operator holder` and the drain execs its `pack` by that absolute
#     path: `run --holder-binary`'s default, never a PATH lookup);
#   - ENTRYPOINT/CMD are exec form (signals reach the process: SIGTERM starts the graceful stop);
#   - the build is for the static musl target (distroless/static has no libc);
#   - .dockerignore keeps target/ and .k8s-local/ out of the build context.
set -euo pipefail
cd "$(dirname "$0")/.."
f=${1:-Dockerfile}
rc=0
fail() { echo "lint-dockerfile: $f: $*" >&2; rc=1; }

while read -r _ image _; do
  case "$image" in
    *:latest|*:latest@*) fail "FROM $image uses :latest" ;;
    *@sha256:*|*:*) ;;
    *) fail "FROM $image has no tag or digest" ;;
  esac
done < <(grep -E '^FROM ' "$f")
last_stage=$(awk '/^FROM /{n=NR} END{print n}' "$f")
user=$(awk -v s="$last_stage" 'NR>s && /^USER /{u=$2} END{print u}' "$f")
[ -n "$user" ] || fail "the final stage sets no USER"
case "${user%%:*}" in ''|root|0) fail "the final stage runs as root ($user)";; *[!0-9]*) fail "USER $user is not numeric (runAsNonRoot needs a number)";; esac
grep -Eq '^COPY --from=[a-z]+ \S+ /usr/local/bin/sandboxrun-operator$' "$f" || fail "the binary is not copied to /usr/local/bin/sandboxrun-operator"
grep -Eq '^ENTRYPOINT \["sandboxrun-operator"\]$' "$f" || fail 'ENTRYPOINT is not ["sandboxrun-operator"] (exec form)'
grep -Eq '^CMD \["run"\]$' "$f" || fail 'CMD is not ["run"]'
grep -q 'x86_64-unknown-linux-musl' "$f" || fail "not built for x86_64-unknown-linux-musl"
if [ -f .dockerignore ]; then
  grep -Eq '^/?target/?$' .dockerignore || fail ".dockerignore does not exclude target/"
  grep -Eq '^/?\.k8s-local/?$' .dockerignore || fail ".dockerignore does not exclude .k8s-local/"
else
  fail "no .dockerignore"
fi
[ "$rc" = 0 ] && echo "lint-dockerfile: $f ok"
exit $rc
