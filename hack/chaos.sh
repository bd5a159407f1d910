#!/usr/bin/env bash
# The fault tests (issue #52 item 2, tests/it/real_node/chaos.rs): faults injected into the local
# bed while runs are in flight, each asserting "nothing lost, nothing stuck, status honest": a
# kubelet stopped or restarted (either real node), the apiserver killed, the store down, the
# operator SIGKILLed mid-checkpoint and mid-claim. They stop what every other test needs, so they
# run here, one at a time, alone on the bed, and not in `make test`.
#
#   hack/chaos.sh                 every fault, under runc then under gVisor
#   CHAOS_RUNTIMES=runc hack/chaos.sh
#
# Needs the bed (hack/local-cluster.sh up) and the operator image (hack/images.sh operator), as
# the real-node tests do; brings neither up nor down.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
eval "$(hack/local-cluster.sh env)"
hack/local-cluster.sh status >/dev/null
[ -s "$SANDBOXRUN_TEST_STATE/images/sandboxrun-operator.ref" ] || hack/images.sh operator >/dev/null
cargo build --locked --bins
rc=0
for runtime in ${CHAOS_RUNTIMES:-runc gvisor}; do
  class=; [ "$runtime" = runc ] || class=$runtime
  echo "== chaos under $runtime" >&2
  SANDBOXRUN_TEST_RUNTIME_CLASS=$class cargo test --locked --test it -- real_node::chaos:: --test-threads=1 || rc=1
done
exit "$rc"
