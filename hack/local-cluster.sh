#!/usr/bin/env bash
# A real local Kubernetes control plane on loopback, without Docker:
#   etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok (one fake node whose
#   `exec` runs the command as a local process: the scale tests) + one REAL node (kubelet +
#   containerd + runc + bridge CNI + kube-proxy, hack/real-node.sh: the truth tests) + a second
#   real node in a network namespace of its own (hack/second-node.sh: the tests of more than one
#   node; SANDBOXRUN_SECOND_NODE=off leaves it out) + an S3 server
#   (s3s-fs) + a GCS and an Azure Blob emulator (hack/store-emulators.sh) + an OCI registry
#   (docker-registry) holding images built without Docker.
#
#   hack/local-cluster.sh up       start everything (idempotent), wait until both nodes are Ready
#   hack/local-cluster.sh down     stop exactly what `up` started (by PID), restore the host
#                                  settings the real node changed, and remove the state
#   hack/local-cluster.sh env      print `export KUBECONFIG=… PATH=…` (+ the test settings)
#   hack/local-cluster.sh status   exit 0 only when the apiserver answers and both nodes are Ready
#   hack/local-cluster.sh apiserver-restart   kill the apiserver and start it again (make chaos)
#
# State (PKI, data, logs, PID files) lives in one directory: $SANDBOXRUN_STATE (default
# <repo>/.k8s-local). Tools come from hack/build-tools.sh (cached outside the repo).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
bed_defaults
S3S_BIN=$CACHE_ROOT/s3s-fs-$S3S_FS_VERSION/bin/s3s-fs
ETCD_PORT=${ETCD_PORT:-23790}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-23800}
KWOK_PORT=${KWOK_PORT:-10250}
S3_ACCESS_KEY=sandboxrun-test
S3_SECRET_KEY=sandboxrun-test-secret
S3_BUCKET=sandboxrun-test
# The apiserver advertises the real node's address (REAL_NODE_IP), so the `kubernetes` Service has
# an endpoint pods can reach (hack/real-node.sh forwards it to the loopback port).
export SANDBOXRUN_STATE=$STATE SANDBOXRUN_CACHE=$CACHE_ROOT APISERVER_PORT S3_PORT REGISTRY_PORT REAL_NODE_IP REAL_NODE_NAME \
  GCS_PORT AZURITE_PORT
P=$STATE/pki; R=$STATE/run; LOGS=$STATE/logs; K=$STATE/kubeconfig
NODE=kwok-node-0

log() { echo "local-cluster: $*" >&2; }
kc() { "$BIN/kubectl" --kubeconfig "$K" "$@"; }

# Start a process in the background, record its PID under $R/<name>.pid, log to $LOGS/<name>.log.
start() {
  local name=$1; shift
  if is_running "$name"; then return 0; fi
  nohup "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$R/$name.pid"
}
is_running() { [ -f "$R/$1.pid" ] && kill -0 "$(cat "$R/$1.pid")" 2>/dev/null; }
wait_for() {  # wait_for <what> <seconds> <command...>
  local what=$1 secs=$2; shift 2
  local deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then log "timed out waiting for $what (logs: $LOGS)"; return 1; fi
    sleep 0.5
  done
}

# Idempotent file by file: an existing state directory gets the files it lacks (the front-proxy CA
# and client came later) and keeps every one it has.
pki() {
  mkdir -p "$P"
  sign() {  # sign <name> <subject> <extensions> [<ca>]: <name>.crt/.key signed by <ca> (default ca)
    local ca=${4:-ca}
    [ -f "$P/$1.crt" ] && return 0
    openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$P/$1.key" -out "$P/$1.csr" 2>/dev/null
    openssl x509 -req -in "$P/$1.csr" -CA "$P/$ca.crt" -CAkey "$P/$ca.key" -CAcreateserial -days 3650 \
      -out "$P/$1.crt.tmp" -extfile <(printf '%b' "$3") 2>/dev/null
    mv "$P/$1.crt.tmp" "$P/$1.crt"
  }
  self_signed() {  # self_signed <name> <subject>: a CA of its own
    [ -f "$P/$1.crt" ] && return 0
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "$2" \
      -keyout "$P/$1.key" -out "$P/$1.crt.tmp" 2>/dev/null
    mv "$P/$1.crt.tmp" "$P/$1.crt"
  }
  self_signed ca /CN=sandboxrun-local-ca
  sign apiserver /CN=kube-apiserver \
    'subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth'
  sign admin '/O=system:masters/CN=admin' 'extendedKeyUsage=clientAuth'
  sign apiserver-kubelet-client '/O=system:masters/CN=kube-apiserver-kubelet-client' 'extendedKeyUsage=clientAuth'
  sign kwok '/CN=kwok' 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth'
  if [ ! -f "$P/sa.pub" ]; then
    openssl genrsa -out "$P/sa.key" 2048 2>/dev/null
    openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
  fi
  # The aggregation layer: the apiserver proxies an aggregated API's requests (an APIService, e.g.
  # the operator's external metrics) with this client certificate, signed by a CA of its own that
  # the aggregated server trusts for its X-Remote-* headers alone.
  self_signed front-proxy-ca /CN=sandboxrun-local-front-proxy-ca
  sign front-proxy-client /CN=front-proxy-client 'extendedKeyUsage=clientAuth' front-proxy-ca
}

kubeconfig() {
  cat >"$K" <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://127.0.0.1:$APISERVER_PORT", certificate-authority: "$P/ca.crt"}}]
users: [{name: admin, user: {client-certificate: "$P/admin.crt", client-key: "$P/admin.key"}}]
contexts: [{name: local, context: {cluster: local, user: admin}}]
current-context: local
KC
}

# kwok configuration: the stock node/pod Stages plus ours (sandboxrun-stages.yaml).
kwok_config() {
  local stages=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage
  {
    # pod-complete ends pods owned by a Job (bench/lifecycle_vs_jobs.sh's peer); no test makes Jobs.
    for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease pod/fast/pod-ready pod/fast/pod-complete; do
      echo '---'; cat "$stages/$f.yaml"
    done
    echo '---'; cat "$HERE/kwok/sandboxrun-stages.yaml"
    # The same workload exit keyed by an annotation a run may set through spec.podAnnotations
    # (sandbox.iterion.io/ keys are reserved there): the lifecycle benchmark's runs end on their own.
    echo '---'
    awk '/^---/ { exit } { print }' "$HERE/kwok/sandboxrun-stages.yaml" |
      sed -e 's#sandbox.iterion.io/test-exit-code#bench.sandboxrun.test/exit-code#g' \
          -e 's#name: sandboxrun-workload-exit#name: bench-workload-exit#'
  } >"$STATE/kwok-stages.yaml"
}

exec_path() { echo "${SANDBOXRUN_EXEC_PATH:-${CARGO_TARGET_DIR:-$REPO/target}/debug}"; }

# The ClusterExec that serves every exec as a local process. PATH puts the project's freshly built
# binary first (for the tests' own scripts); the operator execs the packer by absolute path (the
# tests pass their binary as --holder-binary), so `pack <path>` in the holder is the code under test.
cluster_exec() {
  cat <<YAML
apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterExec
metadata:
  name: run-locally
spec:
  execs:
  - local:
      workDir: $STATE/exec
      envs:
      - {name: PATH, value: "$(exec_path):/usr/local/bin:/usr/bin:/bin"}
      - {name: IN_KWOK_EXEC, value: "1"}
YAML
}

node_ready() {
  [ "$(kc get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

preflight() {
  local missing=""
  command -v openssl >/dev/null || missing="$missing openssl"
  command -v docker-registry >/dev/null || missing="$missing docker-registry"
  command -v curl >/dev/null || missing="$missing curl"
  command -v npm >/dev/null || missing="$missing npm"
  [ -z "$missing" ] || { log "missing$missing: run hack/setup.sh (it installs every prerequisite of the test bed)"; exit 1; }
}

# The kwok node has no mounts: a holder's read-back path `/sandboxrun-readback/<declared path>`
# (src/inpod/holder.rs HOLDER_READBACK_ROOT) is served on this host by a link to `/`, so the
# packer exec'd there reads the directory a test declared. Created by up, removed by down.
KWOK_READBACK_LINK=/sandboxrun-readback
kwok_readback_link() {
  if [ -L "$KWOK_READBACK_LINK" ] && [ "$(readlink "$KWOK_READBACK_LINK")" = / ]; then return 0; fi
  [ ! -e "$KWOK_READBACK_LINK" ] || { log "$KWOK_READBACK_LINK exists and is not ours (a link to /): remove it"; exit 1; }
  ln -s / "$KWOK_READBACK_LINK"
}
kwok_readback_unlink() {
  if [ -L "$KWOK_READBACK_LINK" ] && [ "$(readlink "$KWOK_READBACK_LINK")" = / ]; then rm -f "$KWOK_READBACK_LINK"; fi
}

# The apiserver (its own function: `apiserver-restart` starts it again with the same flags).
start_apiserver() {
  start kube-apiserver "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --advertise-address="$REAL_NODE_IP" --secure-port="$APISERVER_PORT" --cert-dir="$P" \
    --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" \
    --kubelet-client-certificate="$P/apiserver-kubelet-client.crt" --kubelet-client-key="$P/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$P/ca.crt" \
    --service-account-issuer="https://127.0.0.1:$APISERVER_PORT" --service-account-key-file="$P/sa.pub" \
    --service-account-signing-key-file="$P/sa.key" --service-cluster-ip-range="$SERVICE_CIDR" \
    --authorization-mode=Node,RBAC --allow-privileged=true \
    --enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultStorageClass,ResourceQuota,PodSecurity,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --requestheader-client-ca-file="$P/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$P/front-proxy-client.crt" --proxy-client-key-file="$P/front-proxy-client.key" \
    --enable-aggregator-routing=true
  wait_for "kube-apiserver" 120 kc get --raw /readyz
}

# Kills the apiserver (ours, by its PID file) and starts it again: the chaos tests' "apiserver
# restarted mid-drain" (tests/it/real_node/chaos.rs). Every client reconnects on its own.
apiserver_restart() {
  is_running kube-apiserver || { log "kube-apiserver is not running"; return 1; }
  local pid; pid=$(cat "$R/kube-apiserver.pid")
  # A crash (SIGKILL), not a graceful stop: a graceful one keeps serving the exec streams it
  # proxies until they end, so a drain would finish before the fault.
  kill -9 "$pid"
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  mv "$LOGS/kube-apiserver.log" "$LOGS/kube-apiserver.$(date +%s).log"
  pki  # a state directory made before a file was added gets it (the front-proxy's)
  start_apiserver
  log "kube-apiserver restarted"
}

up() {
  preflight
  kwok_readback_link
  if [ ! -f "$BIN/../.complete" ]; then
    log "building the tools (cached in $CACHE_ROOT)"
    "$HERE/build-tools.sh" >/dev/null
  fi
  if [ ! -x "$S3S_BIN" ]; then
    log "installing s3s-fs $S3S_FS_VERSION (cached in $CACHE_ROOT)"
    cargo install s3s-fs --version "$S3S_FS_VERSION" --features binary --locked \
      --root "$CACHE_ROOT/s3s-fs-$S3S_FS_VERSION" >&2
  fi
  mkdir -p "$R" "$LOGS" "$STATE/exec" "$STATE/s3/$S3_BUCKET" "$STATE/registry"
  pki; kubeconfig; kwok_config
  local t0; t0=$(date +%s)

  start etcd "$BIN/etcd" --name default --data-dir "$R/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync --listen-metrics-urls ""
  start_apiserver
  start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$K" --leader-elect=false \
    --bind-address=127.0.0.1 --secure-port=0 --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
    --use-service-account-credentials=true --controllers='*,-nodeipam'
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$K" --leader-elect=false --bind-address=127.0.0.1 --secure-port=0

  # kwok serves exec from Exec/ClusterExec CRDs so tests can give one pod its own exec (e.g. a
  # hostile `pack`) without restarting kwok.
  kc apply -f "$BIN/../kwok/kwok.x-k8s.io_execs.yaml" -f "$BIN/../kwok/kwok.x-k8s.io_clusterexecs.yaml" >/dev/null
  kc wait --for condition=established --timeout=60s crd/execs.kwok.x-k8s.io crd/clusterexecs.kwok.x-k8s.io >/dev/null
  cluster_exec | kc apply -f - >/dev/null
  # kwok resolves an exec'd command on ITS OWN PATH (Go's exec.Command looks it up before the
  # ClusterExec env applies), so the project's binary directory goes first here too.
  start kwok env PATH="$(exec_path):$PATH" "$BIN/kwok" --kubeconfig="$K" --config="$STATE/kwok-stages.yaml" \
    --enable-crds=Exec,ClusterExec \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-ip=127.0.0.1 --node-port="$KWOK_PORT" --server-address="127.0.0.1:$KWOK_PORT" \
    --tls-cert-file="$P/kwok.crt" --tls-private-key-file="$P/kwok.key" \
    --node-lease-duration-seconds=40
  kc apply -f - >/dev/null <<NODE
apiVersion: v1
kind: Node
metadata:
  name: $NODE
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {kubernetes.io/hostname: $NODE, kubernetes.io/os: linux, kubernetes.io/arch: amd64, type: kwok}
NODE
  wait_for "node $NODE Ready" 120 node_ready
  # Pods need a ServiceAccount in each namespace; wait for the default one so tests need not.
  wait_for "default ServiceAccount" 60 kc get serviceaccount default -n default

  start s3 "$S3S_BIN" --host 127.0.0.1 --port "$S3_PORT" \
    --access-key "$S3_ACCESS_KEY" --secret-key "$S3_SECRET_KEY" "$STATE/s3"
  wait_for "s3 server" 30 bash -c "exec 3<>/dev/tcp/127.0.0.1/$S3_PORT"
  emulators_up
  printf 'version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:%s\n' \
    "$STATE/registry" "$REGISTRY_PORT" >"$STATE/registry.yml"
  start registry docker-registry serve "$STATE/registry.yml"
  wait_for "registry" 30 bash -c "exec 3<>/dev/tcp/127.0.0.1/$REGISTRY_PORT"

  # The real node pulls its pod-sandbox image from the registry, so the base images go first.
  "$HERE/images.sh" base >/dev/null
  "$HERE/real-node.sh" up
  second_node_up
  log "up in $(( $(date +%s) - t0 ))s; eval \"\$($0 env)\" to use it"
}

down() {
  local name
  # The real nodes first, the second before the first (it runs inside its network namespace and
  # restores nothing the first one changed): each drains its pods through the apiserver.
  "$HERE/second-node.sh" down
  "$HERE/real-node.sh" down
  "$HERE/store-emulators.sh" down
  # Reverse order: clients before the servers they talk to (`operator` is the one hack/demo.sh
  # starts, if any).
  for name in operator registry s3 kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
    if is_running "$name"; then
      local pid; pid=$(cat "$R/$name.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$STATE"
  kwok_readback_unlink
}

env_() {
  echo "export KUBECONFIG=$K"
  echo "export PATH=$BIN:\$PATH"
  echo "export SANDBOXRUN_TEST_STATE=$STATE"
  echo "export SANDBOXRUN_TEST_S3_ENDPOINT=http://127.0.0.1:$S3_PORT"
  echo "export SANDBOXRUN_TEST_S3_BUCKET=$S3_BUCKET"
  echo "export SANDBOXRUN_TEST_S3_ACCESS_KEY=$S3_ACCESS_KEY"
  echo "export SANDBOXRUN_TEST_S3_SECRET_KEY=$S3_SECRET_KEY"
  echo "export SANDBOXRUN_TEST_REGISTRY=127.0.0.1:$REGISTRY_PORT"
  # The real node: pods pull from the registry as localhost:<port> and reach S3 via the node IP.
  echo "export SANDBOXRUN_TEST_REAL_NODE=$REAL_NODE_NAME"
  echo "export SANDBOXRUN_TEST_SECOND_NODE=${SECOND_NODE_NAME:-real-node-1}"
  echo "export SANDBOXRUN_TEST_NODE_IP=$REAL_NODE_IP"
  echo "export SANDBOXRUN_TEST_POD_REGISTRY=localhost:$REGISTRY_PORT"
  echo "export SANDBOXRUN_TEST_POD_S3_ENDPOINT=http://$REAL_NODE_IP:$S3_PORT"
  echo "export SANDBOXRUN_TEST_APISERVER_PORT=$APISERVER_PORT"
  # gVisor's runsc (the `gvisor` RuntimeClass): a sandbox's processes are invisible from the host's
  # /proc; `runsc ps` lists them (tests/it/real_node/containers.rs).
  echo "export SANDBOXRUN_TEST_RUNSC=$CACHE_ROOT/$(gvisor_dir_name)/bin/runsc"
  # The GCS and Azure emulators (gs:// and az:// stores).
  "$HERE/store-emulators.sh" env
}

status() {
  [ -f "$K" ] || { log "not up (no $K)"; return 1; }
  kc get --raw /readyz >/dev/null 2>&1 || { log "apiserver does not answer"; return 1; }
  node_ready || { log "node $NODE is not Ready"; return 1; }
  "$HERE/real-node.sh" status >/dev/null 2>&1 || { log "real node $REAL_NODE_NAME is not Ready"; return 1; }
  if second_node_wanted; then
    "$HERE/second-node.sh" status >/dev/null 2>&1 || { log "the second real node is not Ready"; return 1; }
  fi
  disk_pressure_warning
  log "ok: apiserver answers, nodes $NODE (kwok) and $REAL_NODE_NAME (real) Ready"
}

# A real node whose kubelet sees its disk nearly full taints itself `disk-pressure` and schedules
# no pod (its Ready stays True): the bed shares its disk with cargo's target directories. Said,
# not failed: the bed is up, and `status` answers whether it is up (hack/test.sh starts one if not).
disk_pressure_warning() {
  local tainted
  tainted=$(kc get nodes -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.spec.taints[*].key}{"\n"}{end}' \
    | awk '/node.kubernetes.io\/disk-pressure/ { print $1 }')
  [ -z "$tainted" ] && return 0
  log "WARNING: node(s) $(echo "$tainted" | tr '\n' ' ')have disk pressure: no pod schedules there; $(df -h "$STATE" | awk 'NR == 2 { print $4 " free on " $6 }') (free space, e.g. cargo target directories; the taint lifts ~5 min later)"
}

# The second real node (hack/second-node.sh), unless SANDBOXRUN_SECOND_NODE=off: the tests of
# more than one node (tests/it/real_node/two_nodes.rs, make chaos) need it.
second_node_wanted() { [ "${SANDBOXRUN_SECOND_NODE:-on}" != off ]; }
second_node_up() {
  if ! second_node_wanted; then log "second real node: not started (SANDBOXRUN_SECOND_NODE=off)"; return 0; fi
  "$HERE/second-node.sh" up
}

# The GCS/Azure/gofakes3 emulators, unless SANDBOXRUN_STORE_EMULATORS=off (the demo: it stores in
# S3 only, and a cold machine would build them for nothing; hack/test.sh starts them when missing).
emulators_up() {
  if [ "${SANDBOXRUN_STORE_EMULATORS:-on}" = off ]; then
    log "store emulators: not started (SANDBOXRUN_STORE_EMULATORS=off)"
    return 0
  fi
  "$HERE/store-emulators.sh" up
}

case "${1:-}" in
  # A bed brought up before the emulators existed gets them on the next `up` (idempotent).
  # A bed brought up before the second node existed gets it on the next `up` (idempotent).
  up) if status >/dev/null 2>&1; then log "already up"; kwok_readback_link; emulators_up
      elif [ -f "$K" ] && kc get --raw /readyz >/dev/null 2>&1 && "$HERE/real-node.sh" status >/dev/null 2>&1; then
        log "up but for the second real node"; second_node_up
      else up; fi ;;
  down) down ;;
  env) env_ ;;
  status) status ;;
  apiserver-restart) apiserver_restart ;;
  *) echo "usage: $0 up|down|env|status|apiserver-restart" >&2; exit 2 ;;
esac
