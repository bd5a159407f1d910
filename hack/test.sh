#!/usr/bin/env bash
# The whole suite, as the README and CI run it:
#   static checks (`make check`: hack/check.sh) → local cluster up (control plane, kwok node,
#   real node, S3, registry) → the operator image → every test → the demo → down.
# A cluster that was already up (e.g. `hack/local-cluster.sh up` by hand) is left running.
# Ends with a per-phase timing summary.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "== $*" >&2; }
PHASES=()
phase_start=0
phase() {  # phase <name>: closes the previous phase's timer and opens one for <name>
  local now; now=$(date +%s)
  if [ -n "${current_phase:-}" ]; then PHASES+=("$(printf '%-44s %5ss' "$current_phase" $(( now - phase_start )))"); fi
  current_phase=${1:-}; phase_start=$now
  if [ -n "$current_phase" ]; then log "$current_phase"; fi
}
suite_start=$(date +%s)
summary() {
  phase ""
  echo "== timing (total $(( $(date +%s) - suite_start ))s)" >&2
  local line
  for line in "${PHASES[@]}"; do echo "   $line" >&2; done
}

phase "prerequisites (hack/setup.sh)"
hack/setup.sh
phase "make check (hack/check.sh: fmt, clippy, generated files, import cycles, Dockerfile lint, fn length)"
hack/check.sh
phase "release checks (the chart bumped since its release, the krew manifest renders)"
hack/chart-released.sh
python3 hack/release_krew.py deploy/krew/sandboxrun.yaml v0.0.0 https://example.invalid/x.tar.gz 0 >/dev/null

# shellcheck source=hack/lib.sh
. hack/lib.sh
started_here=0
phase "local cluster up (control plane, kwok node, real node, S3, registry)"
if ! hack/local-cluster.sh status >/dev/null 2>&1; then
  host_before=$(host_state_snapshot)
  hack/local-cluster.sh up
  started_here=1
fi
emulators_here=0
kueue_here=0
cleanup() {
  local rc=$?
  # Kueue's manager first: a host process of the bed that `down` must not find running.
  if [ "$kueue_here" = 1 ] && [ -z "${SANDBOXRUN_KEEP_CLUSTER:-}" ]; then
    hack/kueue.sh down || true
  fi
  if [ "$started_here" = 1 ] && [ -z "${SANDBOXRUN_KEEP_CLUSTER:-}" ]; then
    phase "local cluster down (host settings restored)"
    hack/local-cluster.sh down
    # down must leave the host as up found it.
    local host_after; host_after=$(host_state_snapshot)
    if [ "$host_before" != "$host_after" ]; then
      echo "== the host changed across up/down (< before, > after):" >&2
      diff <(echo "$host_before") <(echo "$host_after") >&2 || true
      [ "$rc" != 0 ] || rc=1
    else
      echo "== host state after down equals the state before up (sysctls, links, iptables chains, mounts, cgroups, processes)" >&2
    fi
  fi
  if [ "$started_here" = 0 ] && [ "$emulators_here" = 1 ] && [ -z "${SANDBOXRUN_KEEP_CLUSTER:-}" ]; then
    hack/store-emulators.sh down
  fi
  summary
  exit "$rc"
}
trap cleanup EXIT
# The store emulators, when a cluster that was already up lacks them (stopped again at the end).
if ! hack/store-emulators.sh status >/dev/null 2>&1; then
  emulators_here=1
  hack/store-emulators.sh up
fi
eval "$(hack/local-cluster.sh env)"
phase "Kueue (its CRDs and manager, built from its Go module) for the tests that queue runs"
if ! hack/kueue.sh status >/dev/null 2>&1; then
  kueue_here=1
  hack/kueue.sh up
fi

phase "the previous release for the upgrade test (built once from its commit into the tools cache)"
hack/previous-release.sh
phase "operator image without Docker (static binary, pushed to the local registry)"
hack/images.sh operator
phase "the image's binary is linked in link/hot-symbols.txt's order (hack/code-order.sh --check)"
hack/code-order.sh --check "${SANDBOXRUN_IMAGE_BINARY:-${CARGO_TARGET_DIR:-$PWD/target}/x86_64-unknown-linux-musl/release/sandboxrun-operator}"

phase "cargo build (the binary kwok's exec runs as the in-pod packer)"
cargo build --locked --bins

phase "cargo test (unit + integration: kwok node and real node)"
threads="${TEST_THREADS:-4}"
failed=()
# The unit tests (the library's and the binaries'), then the doc tests: every target but the
# integration tests.
cargo test --locked --no-fail-fast --lib --bins -- --test-threads="$threads" ||
  failed+=("unit tests: cargo test --lib --bins")
cargo test --locked --doc || failed+=("doc tests: cargo test --doc")
# The integration tests are ONE binary (tests/it/main.rs), run once per area (its module), one
# area after the other: each area keeps the process of its own and the bed to itself that it had
# when it was a binary of its own (tests/it/main.rs says what depends on that). The areas are
# main.rs's modules; every test must be in exactly one, so none is skipped or run twice.
cargo test --locked --test it --no-run
areas=$(sed -n 's/^mod \([a-z0-9_]*\);$/\1/p' tests/it/main.rs | grep -vx support)
count_tests() { cargo test --quiet --locked --test it -- "$@" --list --format terse | grep -c ': test$' || true; }
all=$(count_tests)
in_areas=0
for area in $areas; do in_areas=$(( in_areas + $(count_tests "$area::") )); done
if [ "$all" != "$in_areas" ]; then
  echo "== tests/it: $all tests, $in_areas in the areas' filters (a test outside an area, or in two)" >&2
  failed+=("integration: the areas do not partition the tests")
fi
# The real node's fault tests stop its kubelet: `make chaos` runs them alone (hack/chaos.sh).
chaos_skip=(--skip real_node::chaos::)
for area in $areas; do
  log "integration area $area"
  skip=(); [ "$area" != real_node ] || skip=("${chaos_skip[@]}")
  cargo test --locked --test it -- "$area::" "${skip[@]}" --test-threads="$threads" ||
    failed+=("integration area $area: cargo test --test it -- $area::")
done
# The real node's flows again, every run under gVisor (issue #52): the RuntimeClass clusters that
# run untrusted code use (hack/real-node.sh builds it; docs/user-guide.md "Runtimes").
log "integration area real_node under gVisor (SANDBOXRUN_TEST_RUNTIME_CLASS=gvisor)"
SANDBOXRUN_TEST_RUNTIME_CLASS=gvisor cargo test --locked --test it -- real_node:: "${chaos_skip[@]}" --test-threads="$threads" ||
  failed+=("integration area real_node under gVisor: SANDBOXRUN_TEST_RUNTIME_CLASS=gvisor cargo test --test it -- real_node::")
# The core flows again on the bed's second real node (issue #52, hack/second-node.sh): a node
# that is not the one the operator's tests grew up on. The other real-node tests look at the
# first node from this host (its containerd socket, its iptables, its RuntimeClass's selector),
# so they stay there.
second_node_flows=(
  basics::a_real_batch_run_keeps_uid_modes_and_bytes_in_a_restricted_namespace
  attempts::a_run_retries_by_exit_code_keeping_every_attempts_files_and_a_fatal_code_fails_at_once
  attempts::a_checkpoint_saves_a_running_sandboxs_files_which_survive_a_forced_deletion
  warm::a_warm_pool_serves_a_run_from_a_ready_pod_and_rolls_out_a_template_change
  warm::each_attempt_of_a_retried_run_takes_a_warm_pool_pod
  drains::over_cap_files_are_dropped_in_the_pod_and_unreadable_is_never_empty
  attempts::a_suspended_run_has_no_pod_and_a_running_one_is_stopped_with_its_files_then_resumed
  basics::a_deleted_or_evicted_pod_is_drained_in_its_grace_window_then_stops_at_once
  attempts::an_evicted_attempt_is_drained_and_retried_without_counting
  egress::a_filtered_runs_first_instruction_is_already_filtered
  basics::a_program_the_workload_drops_on_the_holders_path_is_stored_never_run
  drains::a_file_shrunk_and_a_directory_swapped_mid_drain_are_recorded_never_followed
  session::exec_and_cp_reach_a_live_sandbox_on_a_real_node_and_the_copy_is_drained
)
if [ "${SANDBOXRUN_SECOND_NODE:-on}" != off ]; then
  log "integration: the core real-node flows on the second real node (SANDBOXRUN_TEST_REAL_NODE_VALUE=second)"
  # A renamed test would be left out silently: every name must be one test.
  listed=$(count_tests --exact "${second_node_flows[@]/#/real_node::}")
  [ "$listed" = "${#second_node_flows[@]}" ] ||
    failed+=("second_node_flows in hack/test.sh: ${#second_node_flows[@]} names, $listed tests (a test renamed?)")
  SANDBOXRUN_TEST_REAL_NODE_VALUE=second cargo test --locked --test it -- --exact \
    "${second_node_flows[@]/#/real_node::}" --test-threads="$threads" ||
    failed+=("the core real-node flows on the second node: SANDBOXRUN_TEST_REAL_NODE_VALUE=second cargo test --test it -- real_node::<name>")
fi

# The Python client (clients/python) against the same bed: its unit tests, then real runs on the
# real node through the operator binary built above (started by the tests, in namespaces of
# their own), drained into the bed's S3 server, and the docs' agent loop as written. Any failure,
# and pytest's exit 5 (no test collected), fails the suite.
phase "python client (pytest)"
"$(bed_defaults; python_client_venv)/bin/python3" -m pytest clients/python -q ||
  failed+=("python client: python3 -m pytest clients/python -q (exit $?)")

if [ "${#failed[@]}" -gt 0 ]; then
  echo "== tests: ${#failed[@]} failed:" >&2
  printf '   %s\n' "${failed[@]}" >&2
  exit 1
fi

# The README's main job, end to end on the real node: the demo must end with the sample's files
# listed from the store.
phase "make demo (Helm install + a SandboxRun on the real node)"
demo_log=$(mktemp)
if ! hack/demo.sh >"$demo_log" 2>&1; then
  cat "$demo_log" >&2; echo "demo failed" >&2; exit 1
fi
grep -q 'summary.txt' "$demo_log" || { cat "$demo_log" >&2; echo "demo did not list the drained files" >&2; exit 1; }
tail -n 12 "$demo_log"
