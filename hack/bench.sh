#!/usr/bin/env bash
# Every benchmark, each printed as a ratio against a peer run side by side (docs/performance.md):
#   the webhook vs an always-allow peer, the drain vs kubectl cp and raw exec on the kwok node
#   (1 GiB) and on the real node (256 MiB + 1000 small files), and the drain's peak memory into
#   S3, Azure and GCS side by side (1 GiB, kwok node). Needs the local cluster for the
#   drains (`hack/local-cluster.sh up`) and the operator image for the real node
#   (`hack/images.sh operator`). Asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== webhook latency (cargo bench --bench webhook_latency)" >&2
cargo bench --bench webhook_latency -- --rate 200 --seconds 20
echo "== drain on the kwok node (bench/drain_vs_kubectl_cp.sh 1)" >&2
bench/drain_vs_kubectl_cp.sh 1
echo "== drain memory per store backend (bench/drain_store_backends.sh 1)" >&2
bench/drain_store_backends.sh 1
echo "== drain on the real node (bench/drain_real_node.sh)" >&2
bench/drain_real_node.sh
