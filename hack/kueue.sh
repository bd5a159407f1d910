#!/usr/bin/env bash
# Kueue on the local test bed: installs Kueue's CRDs into the running local cluster and runs Kueue's
# manager (built from its Go module by hack/build-tools.sh, pinned as KUEUE_VERSION in
# hack/versions.env) as a host process against it. Its PID file, log, config and serving
# certificate live in the bed's state directory (the one `hack/local-cluster.sh env` names:
# $SANDBOXRUN_STATE), next to the cluster's own processes.
#   usage: hack/kueue.sh up       # idempotent: installs the CRDs, starts the manager if not running
#          hack/kueue.sh down     # stops only the manager this script started (its PID file)
#          hack/kueue.sh status   # exit 0 when the manager is running and the CRDs are established
#          hack/kueue.sh env      # the variables a test needs (KUBECONFIG is the bed's)
#
# Webhooks: the manager runs out of the cluster, so the apiserver could only reach its webhooks by
# URL on 127.0.0.1. We install NO webhook configurations instead, and turn Kueue's internal cert
# management off (it would write a Secret and patch webhook configurations that do not exist). The
# manager still starts its webhook server (controller-runtime needs a certificate for it), so a
# self-signed certificate is generated into the state directory and the server listens on a
# loopback port nobody calls. Why not register the webhooks by URL: the bed's apiserver would then
# depend on a host process for every Workload/ClusterQueue write, and a stopped manager would block
# writes (failurePolicy Fail) — the operator must work whether or not Kueue runs. The price: nothing
# defaults or validates the Kueue objects on the way in, so whoever creates them (the operator's
# Workloads, the tests' queues) writes them fully defaulted.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
bed_defaults
KUEUE_OUT=$CACHE_ROOT/$(kueue_dir_name)
K=$STATE/kubeconfig; R=$STATE/run; LOGS=$STATE/logs; KQ=$STATE/kueue
KUBECTL=$BIN/kubectl
# Loopback ports of the manager's own servers (none is reached from the cluster).
KUEUE_WEBHOOK_PORT=${KUEUE_WEBHOOK_PORT:-19443}
KUEUE_METRICS_PORT=${KUEUE_METRICS_PORT:-19480}
KUEUE_HEALTH_PORT=${KUEUE_HEALTH_PORT:-19481}
# waitForPodsReady's timeout (Kueue's default is 5m; the bed's tests want it short).
KUEUE_PODS_READY_TIMEOUT=${KUEUE_PODS_READY_TIMEOUT:-60s}
METRICS_CERTS=/etc/kueue/metrics/certs
log() { echo "kueue: $*" >&2; }
kc() { "$KUBECTL" --kubeconfig "$K" "$@"; }
is_running() { [ -f "$R/kueue.pid" ] && kill -0 "$(cat "$R/kueue.pid")" 2>/dev/null; }

write_config() {
  mkdir -p "$KQ/certs"
  if [ ! -s "$KQ/certs/tls.crt" ]; then
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=kueue-webhook.local" \
      -addext "subjectAltName=IP:127.0.0.1" \
      -keyout "$KQ/certs/tls.key" -out "$KQ/certs/tls.crt" 2>/dev/null
  fi
  # With internal cert management off, v0.17's manager reads its metrics server's certificate from
  # a fixed path (cmd/kueue/main.go: /etc/kueue/metrics/certs), no flag: give it the same one.
  if [ ! -s "$METRICS_CERTS/tls.crt" ]; then
    mkdir -p "$METRICS_CERTS" && cp "$KQ/certs/tls.crt" "$KQ/certs/tls.key" "$METRICS_CERTS/"
  fi
  cat >"$KQ/config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
manageJobsWithoutQueueName: false
internalCertManagement:
  enable: false
leaderElection:
  leaderElect: false
health:
  healthProbeBindAddress: 127.0.0.1:$KUEUE_HEALTH_PORT
metrics:
  bindAddress: 127.0.0.1:$KUEUE_METRICS_PORT
webhook:
  host: 127.0.0.1
  port: $KUEUE_WEBHOOK_PORT
  certDir: $KQ/certs
integrations:
  frameworks: []
# As production runs Kueue for batch (its recommended setting): an admitted Workload that is not
# PodsReady=True within the timeout is evicted (PodsReadyTimeout) and requeued after a back-off.
# Short here so the bed's tests see it (docs/contract.md "A queued run's Workload says when its
# pod is ready"); the operator writes PodsReady as Kueue's own integrations do.
waitForPodsReady:
  timeout: $KUEUE_PODS_READY_TIMEOUT
  blockAdmission: false
  requeuingStrategy:
    timestamp: Eviction
    backoffBaseSeconds: 2
    backoffMaxSeconds: 20
EOF
}

install_crds() {
  [ -s "$KUEUE_OUT/crds/kueue.x-k8s.io_workloads.yaml" ] || "$HERE/build-tools.sh" >/dev/null
  # Server-side apply: the CRDs are too large for the last-applied annotation.
  kc apply --server-side --force-conflicts -f "$KUEUE_OUT/crds/" >/dev/null
  kc wait --for=condition=Established --timeout=60s -f "$KUEUE_OUT/crds/" >/dev/null
  kc get namespace kueue-system >/dev/null 2>&1 || kc create namespace kueue-system >/dev/null
}

healthy() { curl -fsS "http://127.0.0.1:$KUEUE_HEALTH_PORT/readyz" >/dev/null 2>&1; }

up() {
  [ -s "$K" ] || { log "no local cluster at $STATE (hack/local-cluster.sh up)"; exit 1; }
  install_crds
  if is_running; then log "running (pid $(cat "$R/kueue.pid"))"; return 0; fi
  write_config
  mkdir -p "$R" "$LOGS"
  # VisibilityOnDemand off: its API server reads a certificate from a fixed /visibility path and
  # would need an APIService registration; the bed does not use it.
  nohup "$KUEUE_OUT/bin/kueue" --config "$KQ/config.yaml" --kubeconfig "$K" \
    --feature-gates=VisibilityOnDemand=false \
    >"$LOGS/kueue.log" 2>&1 </dev/null &
  echo $! >"$R/kueue.pid"
  for _ in $(seq 1 120); do
    if healthy; then log "up (pid $(cat "$R/kueue.pid"), log $LOGS/kueue.log)"; return 0; fi
    is_running || break
    sleep 0.5
  done
  log "the manager did not become ready; last lines of $LOGS/kueue.log:"; tail -20 "$LOGS/kueue.log" >&2
  exit 1
}

down() {
  if [ -f "$R/kueue.pid" ]; then
    local pid; pid=$(cat "$R/kueue.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$R/kueue.pid"
  fi
  log "down"
}

status() {
  is_running || { log "not running"; exit 1; }
  kc get crd workloads.kueue.x-k8s.io >/dev/null 2>&1 || { log "CRDs not installed"; exit 1; }
  healthy || { log "running but not ready"; exit 1; }
  log "running (pid $(cat "$R/kueue.pid"))"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  env) echo "export KUBECONFIG=$K"; echo "export SANDBOXRUN_TEST_KUEUE=1" ;;
  *) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
