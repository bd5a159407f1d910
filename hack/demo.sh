#!/usr/bin/env bash
# The main job, end to end on this machine, on a REAL node (kubelet + containerd + runc):
#   1. the local cluster (control plane, kwok node, real node, S3 server, registry);
#   2. the operator image, built without Docker and pushed to the local registry;
#   3. a release of this tree made (hack/release.sh: the chart pinned to that image by digest) and
#      pushed to the local registry, and the operator installed with Helm from it
#      (`helm install oci://…/charts/sandboxrun-operator --version <chart version>`) as a pod
#      (in-cluster config, the chart's ServiceAccount and RBAC, its webhook behind the chart's
#      Service, the S3 store): the path a user takes;
#   4. config/samples/real-node-run.yaml applied in a namespace that enforces Pod Security
#      `restricted`: its real workload container writes a report and exits, the operator drains
#      the read-back path through exec + tar into S3;
#   5. `kubectl get/describe`, then the drained files listed from the store.
# The kwok-only quick path (no container runs; the demo plays the workload) is hack/demo-kwok.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
log() { printf '\n== %s\n' "$*" >&2; }
NS=${DEMO_NAMESPACE:-sandboxrun-demo}
OPERATOR_NS=sandboxrun-system
RELEASE=sandboxrun

log "prerequisites (hack/setup.sh: packages, the musl target, the tools from their Go modules; the first run builds them)"
hack/setup.sh --demo
log "local cluster: control plane, kwok node, real node, S3, registry"
SANDBOXRUN_STORE_EMULATORS=off hack/local-cluster.sh up
eval "$(hack/local-cluster.sh env)"
STATE=$SANDBOXRUN_TEST_STATE

log "building the operator image without Docker (static binary, uid 65532) and pushing it"
ref=$(hack/images.sh operator)
ref=${ref##*$'\n'}
echo "$ref"

VERSION=$(awk '$1 == "version:" { print $2 }' charts/sandboxrun-operator/Chart.yaml)
log "release $VERSION (hack/release.sh --push): the chart pinned to the image's digest, in the local registry"
hack/release.sh "$VERSION" --push --registry "$SANDBOXRUN_TEST_REGISTRY" \
  --image-repository "$SANDBOXRUN_TEST_POD_REGISTRY/sandboxrun-operator" >/dev/null

log "installing the CRDs, all four kinds (server-side apply: Helm never upgrades CRDs)"
crds=$(kubectl apply --server-side --force-conflicts -k crds/ -o name)  # crds/kustomization.yaml lists all four
kubectl wait --for condition=established --timeout=60s $crds

log "the demo namespace $NS, enforcing Pod Security 'restricted' (the chart binds its RBAC there)"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl label namespace "$NS" --overwrite pod-security.kubernetes.io/enforce=restricted \
  pod-security.kubernetes.io/enforce-version=latest >/dev/null

log "installing the operator with Helm (store: S3 at $SANDBOXRUN_TEST_POD_S3_ENDPOINT, webhook on)"
kubectl create namespace "$OPERATOR_NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl create secret generic sandboxrun-store-s3 -n "$OPERATOR_NS" --dry-run=client -o yaml \
  --from-literal=AWS_ACCESS_KEY_ID="$SANDBOXRUN_TEST_S3_ACCESS_KEY" \
  --from-literal=AWS_SECRET_ACCESS_KEY="$SANDBOXRUN_TEST_S3_SECRET_KEY" \
  --from-literal=AWS_REGION=us-east-1 | kubectl apply -f - >/dev/null
# The image comes from the release's chart (pinned by digest): no image values here.
cat >"$STATE/demo-values.yaml" <<YAML
store:
  url: s3://$SANDBOXRUN_TEST_S3_BUCKET/demo
  existingSecret: sandboxrun-store-s3
  options: [endpoint=$SANDBOXRUN_TEST_POD_S3_ENDPOINT, allow_http=true]
readBack:
  drainTimeout: 2m
log:
  format: text
# The demo's operator reconciles and admits only the demo namespace, so it never competes with
# the operators the test suite starts in their own namespaces on the same cluster.
watchNamespaces: [$NS]
webhook:
  namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: $NS}}
nodeSelector: {sandbox.iterion.io/real-node: "true"}
tolerations:
  - {key: sandbox.iterion.io/real-node, operator: Equal, value: "true", effect: NoSchedule}
YAML
helm upgrade --install "$RELEASE" "oci://$SANDBOXRUN_TEST_REGISTRY/charts/sandboxrun-operator" \
  --version "$VERSION" --plain-http -n "$OPERATOR_NS" -f "$STATE/demo-values.yaml" --wait --timeout 5m
echo "installed chart $VERSION from oci://$SANDBOXRUN_TEST_REGISTRY/charts/sandboxrun-operator, image:"
kubectl get deployment -n "$OPERATOR_NS" -o 'jsonpath={.items[0].spec.template.spec.containers[0].image}'
echo
kubectl get pods -n "$OPERATOR_NS" -o wide
# The webhook (both halves) is registered with a failurePolicy of Fail: wait until the caBundles
# are published.
for _ in $(seq 1 120); do
  bundle=$(kubectl get validatingwebhookconfiguration -o 'jsonpath={.items[*].webhooks[*].clientConfig.caBundle}')
  stamps=$(kubectl get mutatingwebhookconfiguration -o 'jsonpath={.items[*].webhooks[*].clientConfig.caBundle}')
  [ -z "$bundle" ] || [ -z "$stamps" ] || break
  sleep 0.5
done

log "config/samples/real-node-run.yaml in $NS (Pod Security 'restricted' enforced)"
kubectl delete sbr demo-report -n "$NS" --ignore-not-found --wait=true >/dev/null
sample=$(sed "s#localhost:15000/#$SANDBOXRUN_TEST_POD_REGISTRY/#" config/samples/real-node-run.yaml)
# The webhook may still be warming up right after install (Service endpoints, caBundle): retry.
for attempt in 1 2 3 4 5 6 7 8 9 10; do
  if kubectl apply -n "$NS" -f - <<<"$sample"; then break; fi
  [ "$attempt" -lt 10 ] || { echo "the SandboxRun was not admitted" >&2; exit 1; }
  sleep 3
done

log "waiting for the run: the workload runs in a real container, exits, and the operator drains it"
# Complete=True means success and Failed=True failure (Job semantics): wait for either, then say which.
for _ in $(seq 1 600); do
  ended=$(kubectl get sbr -n "$NS" demo-report -o 'jsonpath={.status.conditions[?(@.status=="True")].type}')
  case " $ended " in *" Complete "*|*" Failed "*) break ;; esac
  sleep 0.5
done
kubectl get sbr -n "$NS" demo-report
kubectl describe sbr -n "$NS" demo-report
phase=$(kubectl get sbr -n "$NS" demo-report -o 'jsonpath={.status.phase}')
[ "$phase" = Succeeded ] || { echo "the run ended $phase, not Succeeded" >&2; exit 1; }

log "the drained files, read back from the store (S3 at $SANDBOXRUN_TEST_S3_ENDPOINT)"
AWS_ACCESS_KEY_ID=$SANDBOXRUN_TEST_S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$SANDBOXRUN_TEST_S3_SECRET_KEY \
AWS_REGION=us-east-1 AWS_ENDPOINT=$SANDBOXRUN_TEST_S3_ENDPOINT AWS_ALLOW_HTTP=true \
  "$STATE/images/operator/usr/local/bin/sandboxrun-operator" files ls demo-report -n "$NS" \
  --store-url "s3://$SANDBOXRUN_TEST_S3_BUCKET/demo"
printf '\nUninstall: helm uninstall %s -n %s ; stop the cluster: hack/local-cluster.sh down\n' "$RELEASE" "$OPERATOR_NS"
