#!/usr/bin/env bash
# Build the local Kubernetes test bed from published Go modules (no Docker, no release downloads):
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, kwok, helm, and the real
# node's kubelet, kube-proxy, containerd (+shim, ctr), CNI plugins, crane, crictl, kube-router
# (its NetworkPolicy enforcer) and gVisor (runsc + its containerd shim), each in a cache directory of its own, plus the Prometheus Operator's
# PrometheusRule/ServiceMonitor CRD YAML from its module (for the chart's server dry runs).
# Output goes to a cache outside the repo, keyed by the pinned versions, so a second run is instant.
#   usage: hack/build-tools.sh            # builds if missing, prints the bin dir on the last line
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
CACHE_ROOT=${SANDBOXRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sandboxrun-operator}
OUT=$CACHE_ROOT/$(tools_dir_name)
BIN=$OUT/bin
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
log() { echo "build-tools: $*" >&2; }
start=$(date +%s)

# ---- `hack/build-tools.sh agent-sandbox`: only kubernetes-sigs/agent-sandbox's controller and
# CRD YAML, for the side-by-side warm-pool bench (bench/warm_start.sh AGENT_SANDBOX=1); never part
# of the bed. Prints its cache directory on the last line.
if [ "${1:-}" = agent-sandbox ]; then
  AS_OUT=$CACHE_ROOT/$(agent_sandbox_dir_name)
  if [ ! -x "$AS_OUT/bin/agent-sandbox-controller" ]; then
    log "building agent-sandbox $AGENT_SANDBOX_VERSION"
    mkdir -p "$AS_OUT/bin" "$AS_OUT/crds"
    GOBIN=$AS_OUT/bin go install -trimpath -ldflags "-s -w" \
      "sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller@$AGENT_SANDBOX_VERSION"
    cp "$(go env GOMODCACHE)/sigs.k8s.io/agent-sandbox@$AGENT_SANDBOX_VERSION"/k8s/crds/*.yaml "$AS_OUT/crds/"
    chmod u+w "$AS_OUT"/crds/*.yaml
  fi
  echo "$AS_OUT"
  exit 0
fi

# ---- the real node's NetworkPolicy enforcer: kube-router (only its firewall controller runs, see
# hack/real-node.sh). Its own cache directory, keyed by its version alone, and built before the
# `.complete` shortcut below, so a bed whose Kubernetes is already cached gains it without a
# rebuild. A plain go install (its go.mod has no replace directive).
KUBE_ROUTER_BIN=$CACHE_ROOT/$(kube_router_dir_name)/bin
if [ ! -x "$KUBE_ROUTER_BIN/kube-router" ]; then
  log "building kube-router $KUBE_ROUTER_VERSION"
  mkdir -p "$KUBE_ROUTER_BIN"
  KR=github.com/cloudnativelabs/kube-router/v2
  GOBIN=$KUBE_ROUTER_BIN go install -trimpath -ldflags "-s -w -X $KR/pkg/version.Version=$KUBE_ROUTER_VERSION" \
    "$KR/cmd/kube-router@$KUBE_ROUTER_VERSION"
fi

# ---- gVisor (the real node's `gvisor` RuntimeClass, hack/real-node.sh): runsc and the containerd
# shim that runs it (gVisor's `shim` command, installed as containerd-shim-runsc-v1), both static
# (CGO_ENABLED=0 above): runsc re-executes itself inside the chroot it builds for the sandbox, where
# no dynamic loader exists ("fork/exec /proc/self/exe: no such file or directory"). Its own cache
# directory, built before the `.complete` shortcut like kube-router.
# The shim is built with ONE constant changed, for hosts whose root lacks CAP_SYS_RESOURCE (this
# bed's, see hack/real-node.sh restrict_oom_score_adj): it sets its own oom_score_adj to -999,
# which such a root may not, and refuses to start ("failed to set OOM Score on shim: permission
# denied"); built here it keeps containerd's score (0). runsc itself is unchanged. Not containerd's
# runc shim driving runsc (Docker's way): a pod is several containers in one sandbox, and the runc
# shim waits for the stdout of `runsc start`, which a started container keeps open until it exits.
GVISOR_BIN=$CACHE_ROOT/$(gvisor_dir_name)/bin
if [ ! -x "$GVISOR_BIN/runsc" ] || [ ! -x "$GVISOR_BIN/containerd-shim-runsc-v1" ]; then
  log "building gVisor $GVISOR_VERSION (runsc, containerd-shim-runsc-v1)"
  rm -rf "$GVISOR_BIN.tmp"; mkdir -p "$GVISOR_BIN.tmp"
  GOBIN=$GVISOR_BIN.tmp go install -trimpath -ldflags "-s -w" "gvisor.dev/gvisor/runsc@$GVISOR_VERSION"
  gv_src=$(go mod download -json "gvisor.dev/gvisor@$GVISOR_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  gv_tmp=$(mktemp -d)
  cp -r "$gv_src" "$gv_tmp/gvisor"; chmod -R u+w "$gv_tmp/gvisor"
  grep -q 'oomScoreMax = -999' "$gv_tmp/gvisor/pkg/shim/v1/manager.go" ||
    { log "gVisor $GVISOR_VERSION: the shim's oomScoreMax line changed; see the comment above"; exit 1; }
  sed -i 's/oomScoreMax = -999/oomScoreMax = 0/' "$gv_tmp/gvisor/pkg/shim/v1/manager.go"
  (cd "$gv_tmp/gvisor" && go build -trimpath -ldflags "-s -w" -o "$GVISOR_BIN.tmp/containerd-shim-runsc-v1" ./shim)
  rm -rf "$gv_tmp" "$GVISOR_BIN"; mv "$GVISOR_BIN.tmp" "$GVISOR_BIN"
fi

# ---- Kueue (hack/kueue.sh runs its manager as a host process against the bed): the manager
# binary and its CRD YAML (config/components/crd/bases of the same module), in a cache directory of
# its own keyed by its version, built before the `.complete` shortcut like kube-router. A plain go
# install (its go.mod has no replace directive).
KUEUE_OUT=$CACHE_ROOT/$(kueue_dir_name)
if [ ! -x "$KUEUE_OUT/bin/kueue" ] || [ ! -s "$KUEUE_OUT/crds/kueue.x-k8s.io_workloads.yaml" ]; then
  log "building kueue $KUEUE_VERSION"
  mkdir -p "$KUEUE_OUT/bin" "$KUEUE_OUT/crds"
  GOBIN=$KUEUE_OUT/bin go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  cp "$(go env GOMODCACHE)/sigs.k8s.io/kueue@$KUEUE_VERSION"/config/components/crd/bases/*.yaml "$KUEUE_OUT/crds/"
  chmod u+w "$KUEUE_OUT"/crds/*.yaml
fi

# ---- the Prometheus Operator's PrometheusRule and ServiceMonitor CRDs, from its Go module (only
# the YAML: nothing is built), so tests/it/chart.rs can server-dry-run the chart's monitoring objects.
PROM_CRDS=$CACHE_ROOT/$(prometheus_crds_dir_name)
if [ ! -s "$PROM_CRDS/monitoring.coreos.com_prometheusrules.yaml" ]; then
  log "fetching the Prometheus Operator CRDs $PROMETHEUS_OPERATOR_VERSION"
  go mod download github.com/prometheus-operator/prometheus-operator@"$PROMETHEUS_OPERATOR_VERSION"
  src="$(go env GOMODCACHE)/github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION/example/prometheus-operator-crd"
  mkdir -p "$PROM_CRDS"
  cp "$src/monitoring.coreos.com_prometheusrules.yaml" "$src/monitoring.coreos.com_servicemonitors.yaml" "$PROM_CRDS/"
fi

if [ -f "$OUT/.complete" ]; then echo "$BIN"; exit 0; fi
WORK=$OUT/src
mkdir -p "$BIN" "$WORK/k8s" "$WORK/etcd"

# ---- k8s.io/kubernetes: its go.mod points every k8s.io/<staging> module at ./staging with v0.0.0,
# so `go install k8s.io/kubernetes/cmd/...@v` fails. A wrapper module replaces each staging module
# with its published v0.Y.Z twin (same source, released from the same tag).
if [ ! -x "$BIN/kube-apiserver" ] || [ ! -x "$BIN/kubectl" ] || [ ! -x "$BIN/kubelet" ]; then
  log "building kubernetes $K8S_VERSION (cold: tens of minutes on 2 cores)"
  STAGING_VERSION=v0.${K8S_VERSION#v1.}
  MINOR=$(cut -d. -f2 <<<"$K8S_VERSION")
  UPSTREAM_MOD=$(cd "$(mktemp -d)" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" \
    | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  STAGING=$(sed -n -e 's#^[[:space:]]*k8s\.io/\([a-z0-9-]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' \
                   -e 's#^[[:space:]]*k8s\.io/\([a-z0-9-]*\)[[:space:]]v0\.0\.0\([[:space:]].*\)\{0,1\}$#\1#p' \
                   "$UPSTREAM_MOD" | sort -u)
  [ "$(wc -w <<<"$STAGING")" -ge 25 ] || { log "could not parse the staging list from $UPSTREAM_MOD"; exit 1; }
  cd "$WORK/k8s"
  rm -f go.mod go.sum
  go mod init local.invalid/k8s-bins >/dev/null 2>&1
  go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  for m in $STAGING; do go mod edit -replace="k8s.io/$m=k8s.io/$m@$STAGING_VERSION"; done
  GODEBUG_DEFAULT=$(sed -n 's/^godebug[[:space:]]\{1,\}default=\(go[0-9.]*\).*/\1/p;T;q' "$UPSTREAM_MOD")
  [ -z "$GODEBUG_DEFAULT" ] || go mod edit -godebug="default=$GODEBUG_DEFAULT"
  CMDS="kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy"
  { echo '//go:build tools'; echo 'package tools'; echo 'import ('
    for c in $CMDS; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done; echo ')'; } > tools.go
  go mod tidy
  LDF="-s -w"; NOW=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LDF+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$MINOR -X $p.gitTreeState=clean -X $p.buildDate=$NOW"
  done
  # shellcheck disable=SC2046
  go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags="$LDF" -o "$BIN/" \
    $(for c in $CMDS; do echo "k8s.io/kubernetes/cmd/$c"; done)
fi

# ---- etcd: server/v3 and etcdctl/v3 carry ../ replaces, so a wrapper module again.
if [ ! -x "$BIN/etcd" ]; then
  log "building etcd $ETCD_VERSION"
  cd "$WORK/etcd"
  rm -f go.mod go.sum
  go mod init local.invalid/etcd-bins >/dev/null 2>&1
  go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION" -require="go.etcd.io/etcd/etcdctl/v3@$ETCD_VERSION"
  printf '//go:build tools\npackage tools\nimport (\n\t_ "go.etcd.io/etcd/server/v3"\n\t_ "go.etcd.io/etcd/etcdctl/v3"\n)\n' > tools.go
  go mod tidy
  go build -trimpath -ldflags="-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3
  go build -trimpath -ldflags="-s -w" -o "$BIN/etcdctl" go.etcd.io/etcd/etcdctl/v3
fi

# ---- kwok: a plain go install works (no replace directives).
if [ ! -x "$BIN/kwok" ]; then
  log "building kwok $KWOK_VERSION"
  GOBIN=$BIN go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
fi
mkdir -p "$OUT/kwok"
cp -f "$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION"/kustomize/crd/bases/*.yaml "$OUT/kwok/" 2>/dev/null || true

# ---- helm: plain go install, version string set the way helm's Makefile sets it.
if [ ! -x "$BIN/helm" ]; then
  log "building helm $HELM_VERSION"
  GOBIN=$BIN go install -ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi

# ---- the real node: containerd v2 and the CNI plugins, crane (images without Docker), crictl
# (debugging and a clean CRI teardown). All are plain `go install`s (no replace directives).
if [ ! -x "$BIN/containerd" ]; then
  log "building containerd $CONTAINERD_VERSION"
  CD=github.com/containerd/containerd/v2
  GOBIN=$BIN go install -trimpath -tags "no_btrfs urfave_cli_no_docs netgo osusergo" \
    -ldflags "-s -w -X $CD/version.Version=$CONTAINERD_VERSION -X $CD/version.Package=github.com/containerd/containerd" \
    "$CD/cmd/containerd@$CONTAINERD_VERSION" "$CD/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
    "$CD/cmd/ctr@$CONTAINERD_VERSION"
fi
if [ ! -x "$BIN/cni/portmap" ]; then
  log "building the CNI plugins $CNI_PLUGINS_VERSION"
  mkdir -p "$BIN/cni"
  CP=github.com/containernetworking/plugins
  GOBIN=$BIN/cni go install -trimpath \
    -ldflags "-s -w -X $CP/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION" \
    "$CP/plugins/main/bridge@$CNI_PLUGINS_VERSION" "$CP/plugins/ipam/host-local@$CNI_PLUGINS_VERSION" \
    "$CP/plugins/main/loopback@$CNI_PLUGINS_VERSION" "$CP/plugins/meta/portmap@$CNI_PLUGINS_VERSION"
fi
if [ ! -x "$BIN/crane" ]; then
  log "building crane $CRANE_VERSION"
  GOBIN=$BIN go install -trimpath -ldflags "-s -w" "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION"
fi
if [ ! -x "$BIN/crictl" ]; then
  log "building crictl $CRICTL_VERSION"
  GOBIN=$BIN go install -trimpath -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
    "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
fi

# Print versions without `| head` (SIGPIPE under pipefail kills the script at random).
"$BIN/kube-apiserver" --version >&2; first_line "$BIN/etcd" --version >&2; "$BIN/kwok" --version >&2
"$BIN/helm" version --short >&2; "$BIN/kubelet" --version >&2; "$BIN/containerd" --version >&2
touch "$OUT/.complete"
log "done in $(( $(date +%s) - start ))s"
echo "$BIN"
