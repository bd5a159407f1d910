# Shared helpers for hack/*.sh (sourced, never run). Needs hack/versions.env sourced first.

# The cache directory of the Go-built tools, keyed by every pinned version, so a version bump
# builds afresh and an old cache is never half-reused.
tools_dir_name() {
  echo "tools-k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION-containerd-$CONTAINERD_VERSION-cni-$CNI_PLUGINS_VERSION-crane-$CRANE_VERSION-crictl-$CRICTL_VERSION"
}

# The first line of a command's output, read whole: `cmd | head -1` under `set -o pipefail` dies
# of SIGPIPE whenever the producer writes after head has exited (a fresh machine's first
# `make demo` died that way, exit 141, after 16 minutes).
first_line() {
  local out
  out=$("$@")
  printf '%s\n' "${out%%$'\n'*}"
}

# Whether a binary needs no shared library (static or static-pie): ldd lists no `=>` line. ldd's
# exit code cannot tell (it is 0 for a static-pie binary, 1 for a plain static one).
is_static() {
  local out
  out=$(ldd "$1" 2>&1 || true)
  ! grep -q '=>' <<<"$out"
}
