//! The install artefacts on the real control plane: the Helm chart (its CRD copy, `helm lint`,
//! `helm template` accepted by the apiserver, a real `helm install`) and the kustomize tree.
//!
//! The release this installs registers a ValidatingWebhookConfiguration with no running webhook
//! behind it (kwok plays the node, the operator image is never pulled). So that no other test's
//! SandboxRuns are sent to it, its namespaceSelector selects only this test's namespace (where no
//! SandboxRun is created) and its failurePolicy is Ignore.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use serde_json::json;

use crate::support::*;

const CHART: &str = "charts/sandboxrun-operator";
const CRD_FILES: [&str; 4] = [
    "clustersandboxruntemplates.sandbox.iterion.io.yaml",
    "sandboxrunpools.sandbox.iterion.io.yaml",
    "sandboxruns.sandbox.iterion.io.yaml",
    "sandboxruntemplates.sandbox.iterion.io.yaml",
];

/// Applies `manifests` with `kubectl apply --dry-run=server` and asserts every object passed.
fn server_dry_run(manifests: &str) -> String {
    let out = run_ok(
        kubectl(&["apply", "--dry-run=server", "-f", "-"]),
        Some(manifests.as_bytes()),
    );
    assert!(
        out.contains("(server dry run)"),
        "nothing was applied:\n{out}"
    );
    out
}

#[test]
fn the_chart_crd_is_a_byte_identical_copy_of_the_generated_one() {
    for file in CRD_FILES {
        let top = std::fs::read(repo().join("crds").join(file)).expect("crds/ CRD");
        let chart = std::fs::read(repo().join(CHART).join("crds").join(file))
            .expect("the chart's crds/ CRD");
        assert!(
            top == chart,
            "{CHART}/crds/{file} differs from crds/{file}: run `make crds` (hack/gen.sh) and commit both"
        );
    }
    // Only the CRDs in the chart's crds/: Helm would install anything else there, never upgrade it.
    let mut entries: Vec<String> = std::fs::read_dir(repo().join(CHART).join("crds"))
        .expect("read the chart's crds/")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    entries.sort();
    assert_eq!(entries, CRD_FILES.map(String::from));
}

#[test]
fn helm_lint_passes_strict_for_the_default_and_the_optional_shapes() {
    run_ok(helm(&["lint", "--strict", CHART]), None);
    run_ok(
        helm(&[
            "lint",
            "--strict",
            CHART,
            "--set",
            "replicas=2",
            "--set",
            "store.url=s3://sandboxruns/prod",
            "--set",
            "store.existingSecret=sandboxrun-store-s3",
            "--set",
            "webhook.certManager.enabled=true",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "watchNamespaces={team-a,team-b}",
        ]),
        None,
    );
}

#[test]
fn the_chart_refuses_a_file_store_with_several_replicas_and_unknown_values() {
    let out = run(helm(&["template", "t", CHART, "--set", "replicas=2"]), None);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("single-replica"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(
        helm(&[
            "template",
            "t",
            CHART,
            "--set",
            "webhook.failurePolicy=Sometimes",
        ]),
        None,
    );
    assert!(!out.status.success(), "the schema must refuse it");
}

#[test]
fn the_chart_renders_what_the_operator_expects() {
    let text = run_ok(helm(&["template", "demo", CHART, "-n", "sbr-sys"]), None);
    // The webhook configuration's name is what the operator patches (--webhook-config).
    assert!(text.contains("--webhook-config=demo-sandboxrun-operator\n"));
    assert!(text.contains("kind: ValidatingWebhookConfiguration\nmetadata:"));
    assert!(text.contains("  name: demo-sandboxrun-operator\n"));
    assert!(text.contains("--webhook-hosts=demo-sandboxrun-operator-webhook.sbr-sys.svc,"));
    assert!(text.contains("--webhook-secret=demo-sandboxrun-operator-webhook-tls\n"));
    assert!(text.contains("failurePolicy: Fail\n"));
    assert!(text.contains("readOnlyRootFilesystem: true"));
    assert!(text.contains("type: RuntimeDefault"));
    assert!(text.contains("--image-pull-timeout=5m\n"));
    // The operator publishes its settings for `doctor --context` in a ConfigMap only it writes.
    assert!(text.contains("- --settings-configmap=demo-sandboxrun-operator-settings\n"));
    assert!(text.contains(
        "resources: [configmaps]\n    resourceNames: [demo-sandboxrun-operator-settings]\n    verbs: [patch]\n"
    ));
    // Deleting a run keeps its stored files unless told otherwise (readBack.retention).
    assert!(text.contains("- --default-retention=Retain\n"));
    let deleting = run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "readBack.retention=Delete",
        ]),
        None,
    );
    assert!(deleting.contains("- --default-retention=Delete\n"));
    let out = run(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "readBack.retention=Sometimes",
        ]),
        None,
    );
    assert!(
        !out.status.success(),
        "readBack.retention=Sometimes rendered"
    );
    assert!(!text.contains("--leader-elect"), "one replica: no election");
    assert!(!text.contains("- --sharding\n"), "one replica: no shards");
    // The holder's resources: today's defaults, and no CPU limit unless one is set.
    assert!(text.contains("- --holder-cpu-request=10m\n"));
    assert!(text.contains("- --holder-memory-request=16Mi\n"));
    assert!(text.contains("- --holder-memory-limit=128Mi\n"));
    assert!(
        !text.contains("--holder-cpu-limit"),
        "no CPU limit by default"
    );
    let limited = run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "holderResources.limits.cpu=500m",
            "--set",
            "holderResources.requests.memory=32Mi",
        ]),
        None,
    );
    assert!(limited.contains("- --holder-cpu-limit=500m\n"));
    assert!(limited.contains("- --holder-memory-request=32Mi\n"));
    // The strict schema refuses what is not a quantity, and keys it does not know.
    for bad in [
        "holderResources.limits.cpu=lots",
        "holderResources.requests.gpu=1",
    ] {
        let out = run(helm(&["template", "demo", CHART, "--set", bad]), None);
        assert!(!out.status.success(), "--set {bad} rendered");
    }
    let ha = run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "replicas=2",
            "--set",
            "store.url=s3://b/p",
        ]),
        None,
    );
    // Several replicas run active-active by default (sharding, docs/operations.md "Scaling"), with
    // the shard Leases' Role; sharding.enabled=false (or leaderElection.enabled) elects a leader.
    assert!(ha.contains("- --sharding\n") && ha.contains("- --shards=32\n"));
    assert!(!ha.contains("--leader-elect\n"), "sharded: no election");
    assert!(ha.contains("kind: Role\n") && ha.contains("verbs: [list, create, update, delete]"));
    let elected = run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "replicas=2",
            "--set",
            "store.url=s3://b/p",
            "--set",
            "sharding.enabled=false",
        ]),
        None,
    );
    assert!(elected.contains("--leader-elect\n") && !elected.contains("- --sharding\n"));
    assert!(elected.contains("resources: [leases]"));
    let files = run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "webhook.certManager.enabled=true",
        ]),
        None,
    );
    assert!(files.contains("--webhook-cert-mode=files\n"));
    assert!(
        files.contains("cert-manager.io/inject-ca-from: default/demo-sandboxrun-operator-webhook")
    );
    // No certificate Secret rights in cert-manager mode: the only Secret rule left is the admission
    // stamps' key (get on its one name, create: docs/contract.md "A run uses only its author's
    // rights").
    assert!(
        !files.contains("-webhook-certs"),
        "cert-manager mode needs no certificate Secret rights"
    );
    let secret_rules = files.matches("resources: [secrets]").count();
    assert_eq!(secret_rules, 2, "only the admission key's get and create");
    assert!(files.contains("resourceNames: [demo-sandboxrun-operator-admission-key]"));

    // The webhook never judges the operator's own requests (its finalizer release must not depend
    // on the webhook being up): the ServiceAccount the Deployment runs as, whatever it is named.
    assert_eq!(
        webhook_skips(&yaml_docs(&text)),
        "system:serviceaccount:sbr-sys:demo-sandboxrun-operator"
    );
    for (set, account) in [
        (
            "serviceAccount.name=runner",
            "system:serviceaccount:sbr-sys:runner",
        ),
        ("fullnameOverride=sbr", "system:serviceaccount:sbr-sys:sbr"),
    ] {
        let text = run_ok(
            helm(&["template", "demo", CHART, "-n", "sbr-sys", "--set", set]),
            None,
        );
        assert_eq!(webhook_skips(&yaml_docs(&text)), account, "--set {set}");
    }
}

/// The rules of the operator's own ClusterRole (not the egress proxy's) in a `helm template` of
/// release `demo`.
fn manager_rules_of(text: &str) -> String {
    text.split("\n---")
        .find(|d| {
            d.contains("kind: ClusterRole\n")
                && d.contains("  name: demo-sandboxrun-operator-manager\n")
        })
        .unwrap_or_default()
        .to_string()
}

#[test]
fn the_image_preflight_is_a_chart_value_that_brings_its_secret_rule() {
    let secrets_rule = "resources: [secrets]\n    verbs: [get]";
    let off = run_ok(helm(&["template", "demo", CHART]), None);
    assert!(!off.contains("--preflight-images"), "off by default");
    assert!(
        !manager_rules_of(&off).contains(secrets_rule),
        "no cluster-wide Secret reads by default"
    );
    let on = run_ok(
        helm(&["template", "demo", CHART, "--set", "preflightImages=true"]),
        None,
    );
    assert!(on.contains("            - --preflight-images\n"));
    assert!(
        manager_rules_of(&on).contains(secrets_rule),
        "the pre-flight reads the runs' imagePullSecrets: {}",
        manager_rules_of(&on)
    );
    let out = run(
        helm(&["template", "demo", CHART, "--set", "preflightImages=maybe"]),
        None,
    );
    assert!(!out.status.success(), "preflightImages=maybe rendered");
}

/// Issue #54 (docs/contract.md "A warm run's env from Secrets and ConfigMaps"): a claim reads the
/// Secrets and ConfigMaps a run's env names only with `warmPools.envSources`, off by default (no
/// cluster-wide Secret read by default); on, one `get` rule on both, no list or watch.
#[test]
fn warm_env_sources_are_a_chart_value_that_brings_its_secret_and_configmap_rule() {
    let rule = "resources: [secrets, configmaps]\n    verbs: [get]";
    let off = run_ok(helm(&["template", "demo", CHART]), None);
    assert!(!manager_rules_of(&off).contains(rule), "off by default");
    let on = run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "warmPools.envSources=true",
        ]),
        None,
    );
    assert!(
        manager_rules_of(&on).contains(rule),
        "{}",
        manager_rules_of(&on)
    );
    let no_pools = run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "warmPools.envSources=true",
            "--set",
            "warmPools.enabled=false",
        ]),
        None,
    );
    assert!(
        !manager_rules_of(&no_pools).contains(rule),
        "only with warm pools"
    );
}

/// Issue #29 item 1 (docs/contract.md "A store per namespace"): `tenantStores` renders
/// `--tenant-store-endpoints` and grants `get` on configmaps and secrets only when enabled with
/// endpoints; off (the default) neither the flag nor the rules.
#[test]
fn tenant_stores_are_a_chart_value_that_brings_its_configmap_and_secret_rules() {
    let configmaps_rule = "resources: [configmaps]\n    verbs: [get]";
    let secrets_rule = "resources: [secrets]\n    verbs: [get]";
    let off = run_ok(helm(&["template", "demo", CHART]), None);
    assert!(!off.contains("--tenant-store-endpoints"), "off by default");
    assert!(!manager_rules_of(&off).contains(configmaps_rule));
    assert!(!manager_rules_of(&off).contains(secrets_rule));
    let on = run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "tenantStores.enabled=true",
            "--set",
            "tenantStores.endpoints={*.amazonaws.com,http://minio.storage:9000}",
        ]),
        None,
    );
    assert!(
        on.contains(
            "            - --tenant-store-endpoints=*.amazonaws.com,http://minio.storage:9000\n"
        ),
        "{on}"
    );
    let rules = manager_rules_of(&on);
    assert!(rules.contains(configmaps_rule), "{rules}");
    assert!(rules.contains(secrets_rule), "{rules}");
    let out = run(
        helm(&["template", "demo", CHART, "--set", "tenantStores.bogus=1"]),
        None,
    );
    assert!(
        !out.status.success(),
        "an unknown tenantStores key rendered"
    );
}

/// Issue #39 (docs/user-guide.md "Sandboxes for agents: warm pools"): `warmPools.enabled` (on by
/// default) tells the operator `--warm-pools` and brings the pool rules and the one pod patch a
/// claim makes; off, neither.
#[test]
fn warm_pools_are_a_chart_value_that_brings_the_pool_rules_and_the_claims_pod_patch() {
    let patch_pods = "resources: [pods]\n    verbs: [patch]";
    let pools = "resources: [sandboxrunpools]\n    verbs: [get, list, watch]";
    let on = run_ok(helm(&["template", "demo", CHART]), None);
    assert!(on.contains("            - --warm-pools\n"), "on by default");
    let rules = manager_rules_of(&on);
    assert!(
        rules.contains(patch_pods) && rules.contains(pools),
        "{rules}"
    );
    assert!(rules.contains("resources: [sandboxrunpools/status]\n    verbs: [patch]"));
    // The claim writes the run's start to the parked launcher's stdin.
    let attach = "resources: [pods/attach]\n    verbs: [create, get]";
    assert!(rules.contains(attach), "{rules}");
    let off = run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "warmPools.enabled=false",
        ]),
        None,
    );
    assert!(!off.contains("- --warm-pools"));
    let rules = manager_rules_of(&off);
    assert!(
        !rules.contains(patch_pods)
            && !rules.contains("sandboxrunpools")
            && !rules.contains("pods/attach"),
        "{rules}"
    );
}

/// Issue #54 item 4 (docs/user-guide.md "Scaling a pool with a HorizontalPodAutoscaler"):
/// `externalMetrics.enabled` tells the operator `--external-metrics` and renders the APIService
/// pointed at the webhook's Service, the RoleBinding that reads the apiserver's requestheader CA
/// in kube-system, and a role that watches the pools and writes that one APIService's caBundle
/// (self-managed certificates; cert-manager's cainjector injects it otherwise); off by default,
/// none of it; without the webhook the chart refuses it.
#[test]
fn external_metrics_are_a_chart_value_that_brings_the_api_service_and_its_rules() {
    let off = run_ok(helm(&["template", "demo", CHART]), None);
    assert!(!off.contains("--external-metrics") && !off.contains("APIService"));
    let set = [
        "template",
        "demo",
        CHART,
        "-n",
        "sbr",
        "--set",
        "externalMetrics.enabled=true",
    ];
    let on = run_ok(helm(&set), None);
    assert!(on.contains("            - --external-metrics\n"), "{on}");
    let docs = yaml_docs(&on);
    let service = only(&docs, "APIService");
    assert_eq!(
        service["metadata"]["name"],
        "v1beta1.external.metrics.k8s.io"
    );
    assert_eq!(
        service["spec"]["service"]["name"],
        "demo-sandboxrun-operator-webhook"
    );
    assert_eq!(service["spec"]["service"]["namespace"], "sbr");
    let reader = docs
        .iter()
        .find(|d| d["kind"] == "RoleBinding" && d["metadata"]["namespace"] == "kube-system")
        .expect("a RoleBinding in kube-system");
    assert_eq!(
        reader["roleRef"]["name"],
        "extension-apiserver-authentication-reader"
    );
    assert!(on.contains("resources: [apiservices]\n    resourceNames: [v1beta1.external.metrics.k8s.io]\n    verbs: [get, update]"));
    let mut cert_manager = set.to_vec();
    cert_manager.extend(["--set", "webhook.certManager.enabled=true"]);
    let injected = run_ok(helm(&cert_manager), None);
    assert!(!injected.contains("resources: [apiservices]"));
    let service = only(&yaml_docs(&injected), "APIService").clone();
    assert_eq!(
        service["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "sbr/demo-sandboxrun-operator-webhook"
    );
    let mut no_webhook = set.to_vec();
    no_webhook.extend(["--set", "webhook.enabled=false"]);
    let refused = run(helm(&no_webhook), None);
    assert!(!refused.status.success());
}

/// Issue #41 (docs/user-guide.md "Queueing with Kueue"): `kueue.enabled` tells the operator
/// `--kueue` and brings exactly the rights it uses — Workloads read, watched and created, their
/// status patched, WorkloadPriorityClasses read by name from a cluster role of their own (the
/// manager role is bound per namespace with watchNamespaces); none of it by default.
#[test]
fn kueue_is_a_chart_value_that_brings_its_workload_rules() {
    let workloads = "resources: [workloads]\n    verbs: [get, list, watch, create]";
    let status = "resources: [workloads/status]\n    verbs: [patch]";
    let off = run_ok(helm(&["template", "demo", CHART]), None);
    assert!(!off.contains("- --kueue"), "off by default");
    assert!(
        !off.contains("kueue.x-k8s.io"),
        "no Kueue rights by default"
    );
    let on = run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "kueue.enabled=true",
            "--set",
            "watchNamespaces={team-a}",
        ]),
        None,
    );
    assert!(on.contains("            - --kueue\n"), "{on}");
    let rules = manager_rules_of(&on);
    assert!(rules.contains(workloads), "{rules}");
    assert!(rules.contains(status), "{rules}");
    assert!(!rules.contains("workloadpriorityclasses"), "{rules}");
    assert!(
        on.contains("  name: demo-sandboxrun-operator-kueue-priorities")
            && on.contains("resources: [workloadpriorityclasses, resourceflavors]\n    verbs: [get]")
            && on.contains("kind: ClusterRoleBinding\nmetadata:\n  name: demo-sandboxrun-operator-kueue-priorities"),
        "{on}"
    );
    let out = run(
        helm(&["template", "demo", CHART, "--set", "kueue.bogus=1"]),
        None,
    );
    assert!(!out.status.success(), "an unknown kueue key rendered");
}

/// Issue #29 item 1 ("offer the chart option to restrict it to labelled Secrets"): RBAC cannot
/// select Secrets by label, so `tenantStores.secretNames` narrows the operator's `get` on
/// secrets to those names (resourceNames) and tells the operator the same names
/// (`--tenant-store-secret-names`); with an image check on, which reads imagePullSecrets of any
/// name, the rule cannot be narrowed and is not.
#[test]
fn tenant_store_secret_names_narrow_the_operators_secret_rule_to_those_names() {
    let narrowed = "resources: [secrets]\n    verbs: [get]\n    resourceNames: [\"store-creds\",\"team-store\"]";
    let base = [
        "template",
        "demo",
        CHART,
        "--set",
        "tenantStores.enabled=true",
        "--set",
        "tenantStores.endpoints={http://minio.storage:9000}",
        "--set",
        "tenantStores.secretNames={store-creds,team-store}",
    ];
    let on = run_ok(helm(&base), None);
    assert!(
        on.contains("            - --tenant-store-secret-names=store-creds,team-store\n"),
        "{on}"
    );
    let rules = manager_rules_of(&on);
    assert!(rules.contains(narrowed), "{rules}");
    let mut with_preflight = base.to_vec();
    with_preflight.extend(["--set", "preflightImages=true"]);
    let wide = manager_rules_of(&run_ok(helm(&with_preflight), None));
    assert!(
        wide.contains("resources: [secrets]\n    verbs: [get]"),
        "{wide}"
    );
    assert!(!wide.contains("resourceNames:"), "{wide}");
    let mut bad = base.to_vec();
    bad.extend(["--set", "tenantStores.secretNames={Not_A_Name}"]);
    assert!(
        !run(helm(&bad), None).status.success(),
        "a bad name rendered"
    );
}

/// The run policy (`runPolicy.*`) becomes the operator's `--allowed-*` flags: a list as its
/// comma-joined names, `[]` as an empty value (nothing allowed), null (the default) as no flag.
#[test]
fn the_run_policy_values_become_the_operators_flags() {
    let off = run_ok(helm(&["template", "demo", CHART]), None);
    assert!(!off.contains("--allowed-"), "no restriction by default");
    let dir = tempfile::tempdir().expect("tempdir");
    let values = dir.path().join("policy.yaml");
    std::fs::write(
        &values,
        "runPolicy:\n  runtimeClasses: [gvisor, kata]\n  priorityClasses: [batch-low]\n  tolerationKeys: []\n",
    )
    .expect("write values");
    let on = run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "-f",
            &values.display().to_string(),
        ]),
        None,
    );
    let docs = yaml_docs(&on);
    let args: Vec<String> = operator_deployment(&docs)["spec"]["template"]["spec"]["containers"][0]
        ["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str().map(str::to_string))
        .filter(|a| a.starts_with("--allowed-"))
        .collect();
    assert_eq!(
        args,
        [
            "--allowed-runtime-classes=gvisor,kata",
            "--allowed-priority-classes=batch-low",
            "--allowed-toleration-keys=",
        ]
    );
    let out = run(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "runPolicy.runtimeClasses=gvisor",
        ]),
        None,
    );
    assert!(
        !out.status.success(),
        "a string where a list belongs rendered"
    );
}

/// Issue #29 item 2: `runPolicy.namespacePolicies` becomes a ConfigMap the operator's own parser
/// reads back as written, mounted where `--namespace-policies` points, with a checksum that rolls
/// the pods when the list changes and `get namespaces` granted only then.
#[test]
fn the_namespace_policies_value_becomes_the_file_the_operator_reads() {
    let grants_namespaces = |docs: &[serde_yaml::Value]| {
        docs.iter()
            .filter(|d| d["kind"].as_str() == Some("ClusterRole"))
            .flat_map(|d| d["rules"].as_sequence().cloned().unwrap_or_default())
            .any(|r| {
                r["resources"]
                    .as_sequence()
                    .is_some_and(|v| v.iter().any(|x| x.as_str() == Some("namespaces")))
            })
    };
    let off = yaml_docs(&run_ok(helm(&["template", "demo", CHART]), None));
    assert!(
        !grants_namespaces(&off),
        "no get namespaces without policies"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let values = dir.path().join("policies.yaml");
    std::fs::write(
        &values,
        "runPolicy:\n  defaultRuntimeClass: gvisor\n  namespacePolicies:\n  - name: free-tier\n    namespaceSelector: {matchLabels: {tier: free}}\n    images: [\"registry.corp.example/**\"]\n    maxSizeLimit: 1Gi\n    secrets: false\n",
    )
    .expect("write values");
    let docs = yaml_docs(&run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "-f",
            &values.display().to_string(),
        ]),
        None,
    ));
    assert!(grants_namespaces(&docs));
    let config = docs
        .iter()
        .find(|d| {
            d["kind"].as_str() == Some("ConfigMap")
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-namespace-policies"))
        })
        .expect("the policies' ConfigMap");
    let text = config["data"]["namespace-policies.yaml"]
        .as_str()
        .expect("the file");
    let read = sandboxrun_operator::policy::namespace_policy::load(text).expect("it parses");
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].policy.name, "free-tier");
    assert!(!read[0].policy.secrets);
    assert_eq!(read[0].policy.max_size_limit.as_deref(), Some("1Gi"));
    let pod = &operator_deployment(&docs)["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(
        args.contains(&"--namespace-policies=/etc/sandboxrun/policies/namespace-policies.yaml"),
        "{args:?}"
    );
    assert!(args.contains(&"--default-runtime-class=gvisor"), "{args:?}");
    let mounted = container["volumeMounts"]
        .as_sequence()
        .expect("mounts")
        .iter()
        .any(|m| m["mountPath"].as_str() == Some("/etc/sandboxrun/policies"));
    assert!(mounted);
    assert!(
        pod["metadata"]["annotations"]["checksum/namespace-policies"]
            .as_str()
            .is_some()
    );
}

/// Issue #27: the webhook is tied to `watchNamespaces`. By default (`refuse`) it sees every
/// namespace and the operator refuses runs outside the watched ones (`--webhook-refuse-unwatched`);
/// with `ignore` its namespaceSelector is narrowed to them instead; without `watchNamespaces`,
/// neither.
#[test]
fn the_webhook_is_tied_to_the_watched_namespaces() {
    let render = |sets: &[&str]| {
        let mut args = vec!["template", "demo", CHART];
        for s in sets {
            args.extend_from_slice(&["--set", s]);
        }
        let docs = yaml_docs(&run_ok(helm(&args), None));
        let flags: Vec<String> = operator_deployment(&docs)["spec"]["template"]["spec"]
            ["containers"][0]["args"]
            .as_sequence()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect();
        let selector = serde_json::to_value(
            &only(&docs, "ValidatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"],
        )
        .expect("selector");
        (flags, selector)
    };
    let refuse_flag = "--webhook-refuse-unwatched".to_string();
    let narrowed = |selector: &serde_json::Value| {
        selector["matchExpressions"]
            .as_array()
            .expect("expressions")
            .iter()
            .any(|e| e["operator"] == "In" && e["values"] == serde_json::json!(["a", "b"]))
    };
    let (flags, selector) = render(&[]);
    assert!(!flags.contains(&refuse_flag) && !narrowed(&selector));
    let (flags, selector) = render(&["watchNamespaces={a,b}"]);
    assert!(flags.contains(&refuse_flag), "{flags:?}");
    assert!(!narrowed(&selector), "{selector}");
    let (flags, selector) = render(&[
        "watchNamespaces={a,b}",
        "webhook.unwatchedNamespaces=ignore",
    ]);
    assert!(!flags.contains(&refuse_flag), "{flags:?}");
    assert!(narrowed(&selector), "{selector}");
}

/// The documents of a multi-document YAML stream.
fn yaml_docs(text: &str) -> Vec<serde_yaml::Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("rendered YAML parses"))
        .filter(|v: &serde_yaml::Value| !v.is_null())
        .collect()
}

/// The one object of `kind` among `docs`.
fn only<'a>(docs: &'a [serde_yaml::Value], kind: &str) -> &'a serde_yaml::Value {
    let found: Vec<&serde_yaml::Value> = docs
        .iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect();
    assert_eq!(found.len(), 1, "one {kind} expected");
    found[0]
}

/// The operator's Deployment (component `controller`; the egress proxy has its own).
fn operator_deployment(docs: &[serde_yaml::Value]) -> &serde_yaml::Value {
    let found: Vec<&serde_yaml::Value> = docs
        .iter()
        .filter(|d| {
            d["kind"].as_str() == Some("Deployment")
                && d["metadata"]["labels"]["app.kubernetes.io/component"].as_str()
                    == Some("controller")
        })
        .collect();
    assert_eq!(found.len(), 1, "one operator Deployment expected");
    found[0]
}

/// The egress proxy (docs/contract.md "ADR-006 network rules: validated and enforced"): its
/// Deployment, Service and PDB, the Secret both sides read, its read-only RBAC, and the operator
/// told where it is; off, none of it and no proxy flags.
#[test]
fn the_chart_deploys_the_egress_proxy_and_points_the_operator_at_it() {
    let text = run_ok(helm(&["template", "demo", CHART, "-n", "sbr-sys"]), None);
    let docs = yaml_docs(&text);
    let named = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| {
                d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name)
            })
            .unwrap_or_else(|| panic!("{kind} {name} rendered"))
            .clone()
    };
    let proxy = named("Deployment", "demo-sandboxrun-operator-egress-proxy");
    let spec = &proxy["spec"]["template"]["spec"];
    let args: Vec<&str> = spec["containers"][0]["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert_eq!(args[0], "egress-proxy");
    assert!(args.contains(&"--listen=0.0.0.0:3128"), "{args:?}");
    // The egress gate's canary: served by the proxy, on its Service, admitted from run pods by
    // the proxy's own policy, and told to the operator (docs/contract.md "A filtered run never
    // has an unfiltered instant").
    assert!(args.contains(&"--canary-listen=0.0.0.0:3129"), "{args:?}");
    assert!(args.contains(&"--token-secret-file=/etc/sandboxrun/egress/token-secret"));
    assert_eq!(proxy["spec"]["replicas"].as_u64(), Some(2));
    assert_eq!(
        spec["serviceAccountName"].as_str(),
        Some("demo-sandboxrun-operator-egress-proxy")
    );
    let svc = named("Service", "demo-sandboxrun-operator-egress-proxy");
    assert_eq!(svc["spec"]["ports"][0]["port"].as_u64(), Some(3128));
    assert_eq!(svc["spec"]["ports"][1]["port"].as_u64(), Some(3129));
    assert_eq!(
        svc["spec"]["ports"][1]["targetPort"].as_str(),
        Some("canary")
    );
    let pdb = named(
        "PodDisruptionBudget",
        "demo-sandboxrun-operator-egress-proxy",
    );
    assert_eq!(pdb["spec"]["minAvailable"].as_u64(), Some(1));
    named("Secret", "demo-sandboxrun-operator-egress-token");
    let role = named("ClusterRole", "demo-sandboxrun-operator-egress-proxy");
    assert_eq!(
        serde_yaml::to_string(&role["rules"]).expect("rules"),
        "- apiGroups:\n  - sandbox.iterion.io\n  resources:\n  - sandboxruns\n  verbs:\n  - list\n  - watch\n- apiGroups:\n  - ''\n  resources:\n  - pods\n  verbs:\n  - list\n  - watch\n"
    );
    // Its bounds (docs/operations.md "Egress proxy"), and only run pods reach its port.
    for want in [
        "--head-timeout=10s",
        "--idle-timeout=5m",
        "--max-connections=4096",
        "--max-per-run=512",
        "--max-per-namespace=1024",
        "--max-pending-per-source=256",
        "--accept-backlog=1024",
    ] {
        assert!(args.contains(&want), "{want} in {args:?}");
    }
    let np = named("NetworkPolicy", "demo-sandboxrun-operator-egress-proxy");
    assert_eq!(np["spec"]["policyTypes"][0].as_str(), Some("Ingress"));
    let from = &np["spec"]["ingress"][0]["from"][0];
    assert_eq!(
        np["spec"]["ingress"][0]["ports"][0]["port"].as_u64(),
        Some(3128)
    );
    assert_eq!(
        np["spec"]["ingress"][0]["ports"][1]["port"].as_u64(),
        Some(3129)
    );
    assert_eq!(
        from["podSelector"]["matchLabels"]["app.kubernetes.io/managed-by"].as_str(),
        Some("sandboxrun-operator")
    );
    assert_eq!(
        from["podSelector"]["matchExpressions"][0]["key"].as_str(),
        Some("sandbox.iterion.io/run-uid")
    );
    // A warm pool's pods are let in from their creation, so a claim's new run-uid label never
    // waits on the NetworkPolicy enforcer (a claimed run's first connection was refused once under
    // gVisor, issue #52); the proxy's token still decides what a connection may do.
    let pool_peer = &np["spec"]["ingress"][0]["from"][1];
    assert_eq!(
        pool_peer["podSelector"]["matchLabels"]["app.kubernetes.io/managed-by"].as_str(),
        Some("sandboxrun-operator")
    );
    assert_eq!(
        pool_peer["podSelector"]["matchExpressions"][0]["key"].as_str(),
        Some("sandbox.iterion.io/pool-pod")
    );
    // The operator: told where the proxy is and which pods it runs in; may apply policies.
    let op = operator_deployment(&docs);
    let op_args: Vec<&str> = op["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    for want in [
        "--network-policy=enforced",
        "--dns-namespace=kube-system",
        "--dns-selector=k8s-app=kube-dns",
        "--egress-proxy-url=http://demo-sandboxrun-operator-egress-proxy.sbr-sys.svc:3128",
        "--egress-proxy-namespace=sbr-sys",
        "--egress-proxy-selector=app.kubernetes.io/component=egress-proxy,app.kubernetes.io/instance=demo,app.kubernetes.io/name=sandboxrun-operator",
        "--egress-token-secret-file=/etc/sandboxrun/egress/token-secret",
        "--egress-gate-anchor=true",
        "--egress-proxy-canary-port=3129",
    ] {
        assert!(op_args.contains(&want), "{want} in {op_args:?}");
    }
    let proxy_labels = &proxy["spec"]["template"]["metadata"]["labels"];
    for pair in [
        "app.kubernetes.io/component=egress-proxy",
        "app.kubernetes.io/instance=demo",
        "app.kubernetes.io/name=sandboxrun-operator",
    ] {
        let (k, v) = pair.split_once('=').expect("pair");
        assert_eq!(
            proxy_labels[k].as_str(),
            Some(v),
            "the selector matches the proxy pods"
        );
    }
    assert!(text.contains("resources: [networkpolicies]") || text.contains("- networkpolicies"));
    // A denylist run's policy is narrow unless the platform says otherwise (issue #38).
    assert!(
        !op_args.contains(&"--egress-denylist-wide"),
        "narrow by default: {op_args:?}"
    );
    let wide = run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "runNetworkPolicy.denylistWide=true",
        ]),
        None,
    );
    assert!(wide.contains("- --egress-denylist-wide\n"), "{wide}");

    // Off: no proxy objects and no proxy flags (host rules then unenforced, said in the Event).
    let off = run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "egressProxy.enabled=false",
            "--set",
            "runNetworkPolicy.enforcement=unenforced-warn",
        ]),
        None,
    );
    assert!(
        !off.contains("egress-proxy"),
        "no proxy objects when disabled"
    );
    assert!(off.contains("- --network-policy=unenforced-warn\n"));

    // Placed by its own values, not the operator's (the real-node test puts both on the real node).
    assert!(spec["nodeSelector"].is_null() && spec["tolerations"].is_null());
    let placed = run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "egressProxy.nodeSelector.pool=sandbox",
            "--set",
            "egressProxy.tolerations[0].key=pool,egressProxy.tolerations[0].operator=Exists",
        ]),
        None,
    );
    let placed_docs = yaml_docs(&placed);
    let placed_proxy = placed_docs
        .iter()
        .find(|d| {
            d["kind"].as_str() == Some("Deployment")
                && d["metadata"]["name"].as_str() == Some("demo-sandboxrun-operator-egress-proxy")
        })
        .expect("proxy Deployment");
    let placed_spec = &placed_proxy["spec"]["template"]["spec"];
    assert_eq!(
        placed_spec["nodeSelector"]["pool"].as_str(),
        Some("sandbox")
    );
    assert_eq!(placed_spec["tolerations"][0]["key"].as_str(), Some("pool"));
    assert!(
        operator_deployment(&placed_docs)["spec"]["template"]["spec"]["nodeSelector"].is_null(),
        "the operator keeps its own placement"
    );
    let bad = run(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "runNetworkPolicy.enforcement=maybe",
        ]),
        None,
    );
    assert!(
        !bad.status.success(),
        "the schema refuses an unknown enforcement"
    );
}

/// Checks that the rendered webhook is skipped for exactly one user, the ServiceAccount the
/// operator's Deployment runs as, and nowhere else; returns that user name.
fn webhook_skips(docs: &[serde_yaml::Value]) -> String {
    let deployment = operator_deployment(docs);
    let namespace = deployment["metadata"]["namespace"]
        .as_str()
        .expect("the Deployment's namespace");
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("the Deployment's serviceAccountName");
    let user = format!("system:serviceaccount:{namespace}:{account}");
    let webhooks = only(docs, "ValidatingWebhookConfiguration")["webhooks"]
        .as_sequence()
        .expect("webhooks");
    assert_eq!(webhooks.len(), 1);
    let hook = &webhooks[0];
    let conditions = hook["matchConditions"]
        .as_sequence()
        .expect("matchConditions");
    assert_eq!(conditions.len(), 1, "{conditions:?}");
    assert_eq!(conditions[0]["name"].as_str(), Some("not-the-operator"));
    assert_eq!(
        conditions[0]["expression"].as_str(),
        Some(format!("request.userInfo.username != '{user}'").as_str())
    );
    // Status writes (the subresource) never reach the webhook at all.
    let resources: Vec<&str> = hook["rules"]
        .as_sequence()
        .expect("rules")
        .iter()
        .flat_map(|r| r["resources"].as_sequence().into_iter().flatten())
        .filter_map(|r| r.as_str())
        .collect();
    assert_eq!(resources, ["sandboxruns"]);
    user
}

#[test]
fn the_kustomize_webhook_skips_the_operators_own_service_account() {
    // `kubectl kustomize` renders offline; the CEL expression is not rewritten by kustomize, so
    // it must name the ServiceAccount as config/default renders it.
    let built = run_ok(kubectl(&["kustomize", "config/default"]), None);
    assert_eq!(
        webhook_skips(&yaml_docs(&built)),
        "system:serviceaccount:sandboxrun-system:sandboxrun-operator-controller"
    );
}

#[tokio::test]
async fn helm_template_is_accepted_by_the_apiserver() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "chart-tpl").await;
    let release = format!("tpl{:06x}", rand_u32() & 0xffffff);
    // `--skip-tests`: the `helm test` hooks are not the install, and their pod needs its
    // ServiceAccount to exist first (the_helm_test_hook_and_its_run_are_accepted_by_the_apiserver).
    let manifests = run_ok(
        helm(&[
            "template",
            &release,
            CHART,
            "--namespace",
            &ns.name,
            "--skip-tests",
        ]),
        None,
    );
    let out = server_dry_run(&manifests);
    for kind in [
        "deployment.apps/",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/",
        "clusterrole.rbac.authorization.k8s.io/",
        "service/",
        "serviceaccount/",
    ] {
        assert!(out.contains(kind), "no {kind} in:\n{out}");
    }
    // The `helm template … | kubectl apply` of the README, in the default namespace.
    server_dry_run(&run_ok(
        helm(&["template", "t", CHART, "--skip-tests"]),
        None,
    ));
}

#[tokio::test]
async fn helm_install_creates_the_operator_its_webhook_and_keeps_the_crd() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "chart").await;
    let release = format!("sbr{:06x}", rand_u32() & 0xffffff);
    let fullname = format!("{release}-sandboxrun-operator");
    let selector = format!(
        "webhook.namespaceSelector.matchLabels.sandboxrun-test={}",
        ns.name
    );
    run_ok(
        helm(&[
            "install",
            &release,
            CHART,
            "--namespace",
            &ns.name,
            "--set",
            &selector,
            "--set",
            "webhook.failurePolicy=Ignore",
            "--set",
            "image.repository=sandboxrun-operator",
            "--set",
            "image.tag=test",
            "--timeout",
            "60s",
        ]),
        None,
    );
    let uninstall = Uninstall {
        release: release.clone(),
        namespace: ns.name.clone(),
    };

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let deployment = deployments
        .get(&fullname)
        .await
        .unwrap_or_else(|e| panic!("deployment {fullname}: {e}"));
    let pod_spec = deployment
        .spec
        .and_then(|s| s.template.spec)
        .expect("pod template");
    let container = &pod_spec.containers[0];
    assert_eq!(container.image.as_deref(), Some("sandboxrun-operator:test"));
    let args = container.args.clone().unwrap_or_default();
    assert!(
        args.contains(&format!("--webhook-config={fullname}")),
        "{args:?}"
    );

    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let vwc = vwcs
        .get(&fullname)
        .await
        .unwrap_or_else(|e| panic!("ValidatingWebhookConfiguration {fullname}: {e}"));
    let hook = &vwc.webhooks.expect("webhooks")[0];
    assert_eq!(hook.failure_policy.as_deref(), Some("Ignore"));
    assert_eq!(hook.side_effects, "None");
    assert_eq!(hook.timeout_seconds, Some(5));
    // The apiserver compiled and kept the CEL that spares the operator's own requests.
    let conditions = hook.match_conditions.clone().unwrap_or_default();
    assert_eq!(
        conditions
            .iter()
            .map(|c| c.expression.as_str())
            .collect::<Vec<_>>(),
        [format!(
            "request.userInfo.username != 'system:serviceaccount:{}:{fullname}'",
            ns.name
        )]
    );
    let service = hook.client_config.service.as_ref().expect("service ref");
    assert_eq!(service.namespace, ns.name);
    assert_eq!(service.path.as_deref(), Some("/validate-sandboxrun"));

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.get("sandboxruns.sandbox.iterion.io")
        .await
        .expect("the CRD is installed");

    drop(uninstall);
    // Cluster-scoped objects of the release go with it (the namespace goes with TestNamespace).
    eventually(
        "the release's ValidatingWebhookConfiguration to be removed",
        Duration::from_secs(30),
        || {
            let vwcs = vwcs.clone();
            let name = fullname.clone();
            async move {
                vwcs.get_opt(&name)
                    .await
                    .ok()
                    .flatten()
                    .is_none()
                    .then_some(())
            }
        },
    )
    .await;
    // helm never deletes what is in crds/: runs in other namespaces keep their CRD.
    crds.get("sandboxruns.sandbox.iterion.io")
        .await
        .expect("the CRD survives uninstall");
}

/// `helm uninstall` on drop, so a failed assertion does not leave cluster-scoped objects behind.
struct Uninstall {
    release: String,
    namespace: String,
}

impl Drop for Uninstall {
    fn drop(&mut self) {
        let out = run(
            helm(&[
                "uninstall",
                &self.release,
                "--namespace",
                &self.namespace,
                "--wait",
                "--timeout",
                "60s",
            ]),
            None,
        );
        if !out.status.success() {
            eprintln!(
                "helm uninstall {} failed: {}",
                self.release,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[tokio::test]
async fn kustomize_default_builds_and_is_accepted_by_the_apiserver() {
    let client = client().await;
    ensure_crd(&client).await;
    let built = run_ok(kubectl(&["kustomize", "config/default"]), None);
    for want in [
        "name: sandboxrun-system",
        "name: sandboxrun-operator-controller",
        "kind: ValidatingWebhookConfiguration",
        "name: sandboxruns.sandbox.iterion.io",
        // The Service the operator's certificate names (--webhook-hosts) and the VWC it patches.
        "--webhook-hosts=sandboxrun-operator-webhook.sandboxrun-system.svc,",
        "--webhook-config=sandboxrun-operator-webhook\n",
    ] {
        assert!(built.contains(want), "kustomize output lacks {want:?}");
    }
    // A server dry run cannot create sandboxrun-system for the namespaced objects that follow it,
    // and creating it for real on a shared control plane is not this test's business: an overlay
    // on config/default moves everything into this test's (existing) namespace instead.
    let ns = TestNamespace::new(&client, "kustomize").await;
    let overlay = tempfile::tempdir().expect("tempdir");
    let base = repo().join("config/default");
    write_overlay(overlay.path(), &base, &ns.name);
    let manifests = run_ok(
        kubectl(&["kustomize", &overlay.path().display().to_string()]),
        None,
    );
    let out = server_dry_run(&manifests);
    assert!(
        out.contains("deployment.apps/sandboxrun-operator-controller"),
        "{out}"
    );
    assert!(
        out.contains(
            "customresourcedefinition.apiextensions.k8s.io/sandboxruns.sandbox.iterion.io"
        ),
        "{out}"
    );
    // The samples kustomization builds too.
    let samples = run_ok(kubectl(&["kustomize", "config/samples"]), None);
    assert!(samples.contains("name: batch-report") && samples.contains("name: dev-sandbox"));
}

fn write_overlay(dir: &Path, base: &Path, namespace: &str) {
    // kustomize refuses an absolute path as a resource: climb from the overlay to / instead.
    let up = "../".repeat(dir.components().count().saturating_sub(1));
    let base = base.strip_prefix("/").unwrap_or(base);
    let text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: {namespace}\nresources:\n  - {up}{}\n",
        base.display()
    );
    std::fs::write(dir.join("kustomization.yaml"), text).expect("write overlay");
}

/// Deletes cluster-scoped objects a test created, even when it fails (`kind/name` each).
struct ClusterObjects(Vec<String>);

impl Drop for ClusterObjects {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let mut cmd = tool("kubectl");
        cmd.args(["delete", "--ignore-not-found", "--wait=false"])
            .args(&self.0);
        let _ = run(cmd, None);
    }
}

/// Issue #11 item 2, end to end: the operator never depends on its own webhook to let a run go.
/// The webhook is registered as the chart renders it (failurePolicy Fail, its matchConditions),
/// pointing at an endpoint that is down. A user's spec edit (and label edit) of the run is
/// refused — the webhook is really in the way — while the operator, running as the chart's
/// ServiceAccount with the chart's RBAC, drains the deleted run and releases its finalizer.
#[tokio::test]
async fn with_the_webhook_down_a_deleted_run_is_still_let_go_and_a_user_edit_is_refused() {
    use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
    use sandboxrun_operator::api::{Phase, ReadBack, ReadBackPath, SandboxRun, SandboxRunSpec};

    let client = client().await;
    ensure_crd(&client).await;
    // The release lives in one namespace, the runs in another (the chart's webhook never selects
    // its own namespace).
    let op_ns = TestNamespace::new(&client, "whdown-op").await;
    let runs_ns = TestNamespace::new(&client, "whdown-runs").await;
    let release = format!("whd{:06x}", rand_u32() & 0xffffff);
    let selector = format!(
        "webhook.namespaceSelector.matchLabels.sandboxrun-test={}",
        runs_ns.name
    );
    // The operator's identity only: `--skip-tests` leaves out the `helm test` hooks (their own
    // ServiceAccount and Role, templates/tests/).
    let rendered = run_ok(
        helm(&[
            "template",
            &release,
            CHART,
            "--namespace",
            &op_ns.name,
            "--set",
            &selector,
            "--skip-tests",
        ]),
        None,
    );
    let docs = yaml_docs(&rendered);
    let operator_user = webhook_skips(&docs);
    // The operator's ServiceAccount (the egress proxy has its own, labelled with its component).
    let accounts: Vec<&serde_yaml::Value> = docs
        .iter()
        .filter(|d| {
            d["kind"].as_str() == Some("ServiceAccount")
                && d["metadata"]["labels"]["app.kubernetes.io/component"].as_str()
                    != Some("egress-proxy")
        })
        .collect();
    assert_eq!(accounts.len(), 1, "one operator ServiceAccount expected");
    let account = accounts[0]["metadata"]["name"]
        .as_str()
        .expect("the chart's ServiceAccount")
        .to_string();
    assert_eq!(
        operator_user,
        format!("system:serviceaccount:{}:{account}", op_ns.name)
    );

    // The chart's ServiceAccount and RBAC, as rendered.
    let mut cluster = ClusterObjects(Vec::new());
    let mut identity = String::new();
    for doc in &docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        if [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        ]
        .contains(&kind)
        {
            if kind.starts_with("Cluster") {
                cluster.0.push(format!(
                    "{}/{}",
                    kind.to_lowercase(),
                    doc["metadata"]["name"].as_str().unwrap_or_default()
                ));
            }
            identity.push_str("---\n");
            identity.push_str(&serde_yaml::to_string(doc).expect("yaml"));
        }
    }
    run_ok(kubectl(&["apply", "-f", "-"]), Some(identity.as_bytes()));
    let kubeconfig = service_account_kubeconfig(&client, &op_ns.name, &account).await;
    // The chart lets the operator read a Pending pod's Events (FailedMount is only an Event).
    let can_i = run_ok(
        kubectl(&[
            "auth",
            "can-i",
            "list",
            "events",
            "-n",
            &runs_ns.name,
            "--as",
            &operator_user,
        ]),
        None,
    );
    assert_eq!(can_i.trim(), "yes");

    // The operator as that ServiceAccount, watching the runs' namespace (kwok plays the node).
    let store_url = format!("file://{}", host_dir("store-whdown").display());
    let op = Operator::builder(&runs_ns.name, &store_url)
        .kubeconfig(&kubeconfig)
        .flags(&["--pod-namespace", &op_ns.name])
        .start();
    let out = host_dir("whdown-out");
    std::fs::write(out.join("result.txt"), b"kept\n").expect("write");
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &runs_ns.name);
    let spec = SandboxRunSpec {
        image: Some("registry.example/tool:1".into()),
        user: Some("1000".into()),
        read_back: Some(ReadBack {
            paths: vec![ReadBackPath {
                path: out.display().to_string(),
                ..Default::default()
            }],
            drain_timeout: Some("30s".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    runs.create(&PostParams::default(), &SandboxRun::new("held", spec))
        .await
        .expect("create the run (no webhook yet)");
    eventually_or_log("the run Running", Duration::from_secs(90), &op, || {
        let runs = runs.clone();
        async move {
            let r = runs.get("held").await.ok()?;
            (r.status.as_ref()?.phase == Some(Phase::Running)).then_some(())
        }
    })
    .await;

    // Now the webhook, exactly as rendered but for its address: nothing listens there.
    let mut vwc = only(&docs, "ValidatingWebhookConfiguration").clone();
    let down = format!("https://127.0.0.1:{}/validate-sandboxrun", free_port());
    let hook = &mut vwc["webhooks"][0];
    assert_eq!(hook["failurePolicy"].as_str(), Some("Fail"));
    hook["clientConfig"] = serde_yaml::from_str(&format!("{{url: \"{down}\"}}")).expect("yaml");
    let vwc_name = vwc["metadata"]["name"]
        .as_str()
        .expect("the webhook's name")
        .to_string();
    cluster
        .0
        .push(format!("validatingwebhookconfiguration/{vwc_name}"));
    run_ok(
        kubectl(&["apply", "-f", "-"]),
        Some(serde_yaml::to_string(&vwc).expect("yaml").as_bytes()),
    );

    // A user's spec edit is refused while the webhook is down (failurePolicy Fail). The
    // apiserver picks the new configuration up within a moment: retry until it does.
    let refusal = eventually("the webhook in the way", Duration::from_secs(30), || {
        let runs = runs.clone();
        async move {
            let edit = json!({"spec": {"env": [{"name": "EDITED", "value": "1"}]}});
            match runs
                .patch("held", &PatchParams::default(), &Patch::Merge(&edit))
                .await
            {
                Err(kube::Error::Api(ae)) => Some(ae.message),
                _ => None,
            }
        }
    })
    .await;
    assert!(
        refusal.contains("sandboxruns.validate.sandbox.iterion.io")
            && refusal.contains("failed calling webhook"),
        "{refusal}"
    );
    let label = json!({"metadata": {"labels": {"edited": "yes"}}});
    let label_edit = runs
        .patch("held", &PatchParams::default(), &Patch::Merge(&label))
        .await;
    assert!(
        matches!(&label_edit, Err(kube::Error::Api(ae)) if ae.message.contains("failed calling webhook")),
        "a user's metadata edit goes through the webhook too: {label_edit:?}"
    );

    // kubectl delete: the operator drains the run and releases its finalizer (an UPDATE, made
    // as its ServiceAccount, which the matchConditions leave out).
    runs.delete("held", &DeleteParams::default())
        .await
        .expect("delete the run");
    wait_gone(&runs, "held", &op, Duration::from_secs(90)).await;
    let (store, prefix) =
        sandboxrun_operator::store::store_from_url(&store_url, &[]).expect("the store");
    let manifests =
        sandboxrun_operator::store::list_manifests(&store, &prefix, &runs_ns.name, "held")
            .await
            .expect("list manifests");
    assert_eq!(manifests.len(), 1, "drained before it was let go");
    let log = op.log_text();
    assert!(
        !log.contains("failed calling webhook"),
        "the operator's own writes never reached the webhook:\n{log}"
    );
    drop(cluster);
}

/// The `# store snippet: <name>` block of docs/operations.md: its Secret and its Helm values.
fn store_snippet(name: &str) -> (serde_yaml::Value, String) {
    let doc = std::fs::read_to_string(repo().join("docs/operations.md")).expect("operations.md");
    let marker = format!("```yaml\n# store snippet: {name}\n");
    let start = doc
        .find(&marker)
        .unwrap_or_else(|| panic!("no {marker:?} block in docs/operations.md"))
        + "```yaml\n".len();
    let block = &doc[start..start + doc[start..].find("```").expect("the block ends")];
    let (secret, values) = block.split_once("\n---\n").expect("a Secret, ---, values");
    (
        serde_yaml::from_str(secret).expect("the Secret parses"),
        values.to_string(),
    )
}

#[tokio::test]
async fn the_store_snippets_of_the_docs_render_and_are_accepted() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "chart-store").await;
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, scheme) in [("s3", "s3"), ("gcs", "gs"), ("azure", "az")] {
        let (secret, values) = store_snippet(name);
        assert_eq!(secret["kind"].as_str(), Some("Secret"), "{name}");
        let secret_name = secret["metadata"]["name"].as_str().expect("name");
        let keys: Vec<&str> = secret["stringData"]
            .as_mapping()
            .expect("stringData")
            .keys()
            .filter_map(|k| k.as_str())
            .collect();
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, &values).expect("write values");
        let release = format!("st{name}{:04x}", rand_u32() & 0xffff);
        let rendered = run_ok(
            helm(&[
                "template",
                &release,
                CHART,
                "-n",
                &ns.name,
                "-f",
                &file.display().to_string(),
                // The `helm test` hooks are dry-run on their own (their pod needs its
                // ServiceAccount to exist first): the_helm_test_hook_and_its_run_are_accepted….
                "--skip-tests",
            ]),
            None,
        );
        let docs = yaml_docs(&rendered);
        let pod = &operator_deployment(&docs)["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        let args: Vec<&str> = container["args"]
            .as_sequence()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        let url = args
            .iter()
            .find_map(|a| a.strip_prefix("--store-url="))
            .expect("--store-url");
        assert!(url.starts_with(&format!("{scheme}://")), "{name}: {url}");
        let options: Vec<(String, String)> = args
            .iter()
            .filter_map(|a| a.strip_prefix("--store-option="))
            .map(|o| {
                let (k, v) = o.split_once('=').expect("key=value");
                (k.to_string(), v.to_string())
            })
            .collect();
        // The operator's own validation of the URL and the option keys.
        sandboxrun_operator::store::StoreConfig::new(url, &options)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        match options.iter().find(|(k, _)| k == "service_account") {
            // A key file: a Secret volume of this Secret, mounted where the option points.
            Some((_, path)) => {
                let (dir_path, key) = path.rsplit_once('/').expect("a file path");
                assert!(keys.contains(&key), "{name}: {key} not in the Secret");
                let mount = container["volumeMounts"]
                    .as_sequence()
                    .expect("mounts")
                    .iter()
                    .find(|m| m["mountPath"].as_str() == Some(dir_path))
                    .unwrap_or_else(|| panic!("{name}: nothing mounted at {dir_path}"));
                let volume = pod["volumes"]
                    .as_sequence()
                    .expect("volumes")
                    .iter()
                    .find(|v| v["name"] == mount["name"])
                    .expect("the mounted volume");
                assert_eq!(
                    volume["secret"]["secretName"].as_str(),
                    Some(secret_name),
                    "{name}"
                );
            }
            // Environment variables the store builder reads, from this Secret.
            None => {
                assert_eq!(
                    container["envFrom"][0]["secretRef"]["name"].as_str(),
                    Some(secret_name),
                    "{name}"
                );
                let env_prefix = match scheme {
                    "s3" => "AWS_",
                    "gs" => "GOOGLE_",
                    _ => "AZURE_",
                };
                for key in &keys {
                    assert!(key.starts_with(env_prefix), "{name}: {key}");
                }
            }
        }
        let secret_text = serde_yaml::to_string(&secret).expect("secret yaml");
        server_dry_run(&format!("{secret_text}---\n{rendered}"));
    }
}

/// Every value of issue #14's chart work, on: what `helm lint --strict` and the server dry run get.
const ALL_NEW: &[&str] = &[
    "--set",
    "replicas=2",
    "--set",
    "store.url=s3://b/p",
    "--set",
    "metrics.prometheusRule.enabled=true",
    "--set",
    "metrics.grafanaDashboard.enabled=true",
    "--set",
    "metrics.grafanaDashboard.folder=Sandboxes",
    "--set",
    "networkPolicy.enabled=true",
    "--set",
    "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
    "--set",
    "networkPolicy.store.ports={443,9000}",
    "--set",
    "holderImagePullSecrets={regcred,mirror}",
];

#[test]
fn the_new_templates_lint_strict_and_render() {
    let mut args = vec!["lint", "--strict", CHART];
    args.extend_from_slice(ALL_NEW);
    run_ok(helm(&args), None);
    let mut args = vec!["template", "demo", CHART, "-n", "sbr-sys"];
    args.extend_from_slice(ALL_NEW);
    let text = run_ok(helm(&args), None);
    let docs = yaml_docs(&text);
    // The PodDisruptionBudget comes with replicas > 1 ...
    // (The egress proxy's own PodDisruptionBudget is not this one: egressProxy.pdb.)
    let operator_pdbs = |docs: &[serde_yaml::Value]| -> Vec<serde_yaml::Value> {
        docs.iter()
            .filter(|d| {
                d["kind"].as_str() == Some("PodDisruptionBudget")
                    && d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"].as_str()
                        != Some("egress-proxy")
            })
            .cloned()
            .collect()
    };
    let pdbs = operator_pdbs(&docs);
    assert_eq!(pdbs.len(), 1, "one operator PodDisruptionBudget expected");
    assert_eq!(pdbs[0]["spec"]["minAvailable"], serde_yaml::Value::from(1));
    // ... and not with one replica, unless forced.
    let one = run_ok(helm(&["template", "demo", CHART]), None);
    assert!(operator_pdbs(&yaml_docs(&one)).is_empty(), "{one}");
    let forced = run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "podDisruptionBudget.enabled=true",
            "--set",
            "podDisruptionBudget.maxUnavailable=1",
        ]),
        None,
    );
    let forced = operator_pdbs(&yaml_docs(&forced));
    assert_eq!(forced.len(), 1);
    assert_eq!(
        forced[0]["spec"]["maxUnavailable"],
        serde_yaml::Value::from(1)
    );
    let off = run_ok(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "replicas=2",
            "--set",
            "store.url=s3://b/p",
            "--set",
            "podDisruptionBudget.enabled=false",
        ]),
        None,
    );
    assert!(operator_pdbs(&yaml_docs(&off)).is_empty(), "{off}");
    // startupProbe on /healthz, the holder's pull secrets as flags.
    let deploy = operator_deployment(&docs);
    let container = &deploy["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["startupProbe"]["httpGet"]["path"],
        serde_yaml::Value::from("/healthz")
    );
    assert!(text.contains("- --pod-image-pull-secret=regcred\n"));
    assert!(text.contains("- --pod-image-pull-secret=mirror\n"));
    // The operator's NetworkPolicy: webhook and metrics in; DNS, the apiserver and the store
    // out. (The egress proxy has its own, ingress only: the proxy port from run pods.)
    let component = |d: &serde_yaml::Value| {
        d["metadata"]["labels"]["app.kubernetes.io/component"]
            .as_str()
            .map(str::to_string)
    };
    let policies: Vec<&serde_yaml::Value> = docs
        .iter()
        .filter(|d| d["kind"].as_str() == Some("NetworkPolicy"))
        .collect();
    let (proxy_np, operator_np): (Vec<_>, Vec<_>) = policies
        .into_iter()
        .partition(|d| component(d).as_deref() == Some("egress-proxy"));
    assert_eq!((operator_np.len(), proxy_np.len()), (1, 1), "{text}");
    let proxy_np_text = serde_yaml::to_string(proxy_np[0]).unwrap_or_default();
    assert!(proxy_np_text.contains("port: 3128"), "{proxy_np_text}");
    let np = operator_np[0];
    let np_text = serde_yaml::to_string(np).unwrap_or_default();
    for want in [
        "port: 9443",
        "port: 8080",
        "port: 53",
        "cidr: 10.0.0.1/32",
        "port: 9000",
    ] {
        assert!(np_text.contains(want), "{want} not in\n{np_text}");
    }
    // kubeVersion: the CRD's CEL rules and the webhook's matchConditions need 1.30.
    let chart = std::fs::read_to_string(repo().join(CHART).join("Chart.yaml")).unwrap_or_default();
    assert!(chart.contains("kubeVersion: \">=1.30.0-0\""), "{chart}");
    let out = run(
        helm(&["template", "demo", CHART, "--kube-version", "1.29.0"]),
        None,
    );
    assert!(!out.status.success(), "rendered for 1.29");
}

/// Issue #38 item 6a: the operator's NetworkPolicy opens the webhook's port to the apiserver
/// only: `networkPolicy.webhookFrom` when set, else `apiServer.cidrs` as ipBlocks (docs/contract.md
/// "The webhook is no RBAC oracle"); with neither, from anywhere (NOTES.txt warns).
#[test]
fn the_webhook_port_is_open_to_the_apiserver_only() {
    let webhook_from = |extra: &[&str]| -> Option<serde_yaml::Value> {
        let mut args = vec![
            "template",
            "demo",
            CHART,
            "--set",
            "networkPolicy.enabled=true",
        ];
        args.extend_from_slice(extra);
        let text = run_ok(helm(&args), None);
        let docs = yaml_docs(&text);
        let np = docs.iter().find(|d| {
            d["kind"].as_str() == Some("NetworkPolicy")
                && d["metadata"]["labels"]["app.kubernetes.io/component"].as_str()
                    == Some("controller")
        })?;
        let rules = np["spec"]["ingress"].as_sequence()?;
        let webhook = rules
            .iter()
            .find(|r| r["ports"][0]["port"].as_u64() == Some(9443))?;
        Some(webhook["from"].clone())
    };
    let from_cidrs = webhook_from(&["--set", "networkPolicy.apiServer.cidrs={10.0.0.1/32}"])
        .expect("a webhook rule");
    assert_eq!(
        from_cidrs[0]["ipBlock"]["cidr"].as_str(),
        Some("10.0.0.1/32"),
        "{from_cidrs:?}"
    );
    let from_peers = webhook_from(&[
        "--set",
        "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
        "--set-json",
        r#"networkPolicy.webhookFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"kube-system"}}}]"#,
    ])
    .expect("a webhook rule");
    assert_eq!(
        from_peers[0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"].as_str(),
        Some("kube-system"),
        "{from_peers:?}"
    );
    assert!(from_peers[0]["ipBlock"].is_null(), "webhookFrom wins");
    let anywhere = webhook_from(&[]).expect("a webhook rule");
    assert!(
        anywhere.is_null(),
        "neither set: from anywhere, {anywhere:?}"
    );
}

/// Issue #51 item 3 (docs/contract.md "The webhook answers only the apiserver"): without the full
/// `networkPolicy`, the old chart rendered no NetworkPolicy at all, so any pod could reach the
/// webhook's port and make up admission reviews. By default a policy fences the operator pod's
/// ingress — the webhook's port from the apiserver's CIDRs when set, metrics, nothing else — and
/// `webhook.clientCA` makes the webhook require the apiserver's client certificate.
#[test]
fn the_webhooks_port_is_fenced_by_default_and_a_client_ca_is_wired() {
    let render = |extra: &[&str]| -> Vec<serde_yaml::Value> {
        let mut args = vec!["template", "demo", CHART];
        args.extend_from_slice(extra);
        yaml_docs(&run_ok(helm(&args), None))
    };
    let fence = |docs: &[serde_yaml::Value]| {
        docs.iter()
            .find(|d| {
                d["kind"].as_str() == Some("NetworkPolicy")
                    && d["metadata"]["labels"]["app.kubernetes.io/component"].as_str()
                        == Some("webhook")
            })
            .cloned()
    };
    let default = fence(&render(&[])).expect("a NetworkPolicy fencing the webhook by default");
    assert_eq!(default["spec"]["policyTypes"][0].as_str(), Some("Ingress"));
    assert!(
        default["spec"]["policyTypes"][1].is_null(),
        "egress left alone"
    );
    let ports: Vec<u64> = default["spec"]["ingress"]
        .as_sequence()
        .expect("ingress rules")
        .iter()
        .filter_map(|r| r["ports"][0]["port"].as_u64())
        .collect();
    assert_eq!(ports[0], 9443, "{ports:?}");
    assert_eq!(
        ports.len(),
        2,
        "the webhook and metrics, nothing else: {ports:?}"
    );
    let fenced = fence(&render(&[
        "--set",
        "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
    ]))
    .expect("a fence");
    assert_eq!(
        fenced["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"].as_str(),
        Some("10.0.0.1/32")
    );
    // The full policy covers the webhook itself; the fence can be turned off.
    assert!(fence(&render(&["--set", "networkPolicy.enabled=true"])).is_none());
    assert!(fence(&render(&[
        "--set",
        "networkPolicy.webhookIngress.enabled=false"
    ]))
    .is_none());
    // The client CA: mounted from its Secret and named to the operator.
    let docs = render(&["--set", "webhook.clientCA.secretName=apiserver-client-ca"]);
    let deployment = docs
        .iter()
        .find(|d| {
            d["kind"].as_str() == Some("Deployment")
                && d["metadata"]["name"].as_str() == Some("demo-sandboxrun-operator")
        })
        .expect("the operator's Deployment");
    let spec = &deployment["spec"]["template"]["spec"];
    let args: Vec<&str> = spec["containers"][0]["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(
        args.contains(&"--webhook-client-ca=/etc/sandboxrun/webhook-client-ca/ca.crt"),
        "{args:?}"
    );
    let volumes = serde_yaml::to_string(&spec["volumes"]).expect("yaml");
    assert!(
        volumes.contains("secretName: apiserver-client-ca"),
        "{volumes}"
    );
}

/// Issue #38 item 5: the operator's memory limit is derived from the path slots
/// (docs/operations.md "Sizing": `drainMemory.baselineMi + maxConcurrentPathDrains ×
/// drainMemory.perPathDrainMi`), so the two cannot disagree; a limit set apart is refused.
#[test]
fn the_memory_limit_is_derived_from_the_path_slots() {
    let limit = |extra: &[&str]| -> Option<String> {
        let mut args = vec!["template", "demo", CHART];
        args.extend_from_slice(extra);
        let text = run_ok(helm(&args), None);
        let docs = yaml_docs(&text);
        let deploy = operator_deployment(&docs);
        let container = &deploy["spec"]["template"]["spec"]["containers"][0];
        container["resources"]["limits"]["memory"]
            .as_str()
            .map(str::to_string)
    };
    assert_eq!(limit(&[]).as_deref(), Some("1440Mi"), "128 + 8 × 164");
    assert_eq!(
        limit(&["--set", "maxConcurrentPathDrains=2"]).as_deref(),
        Some("456Mi"),
        "128 + 2 × 164"
    );
    assert_eq!(
        limit(&[
            "--set",
            "maxConcurrentPathDrains=16",
            "--set",
            "drainMemory.baselineMi=256"
        ])
        .as_deref(),
        Some("2880Mi")
    );
    let set_apart = run(
        helm(&[
            "template",
            "demo",
            CHART,
            "--set",
            "resources.limits.memory=1Gi",
        ]),
        None,
    );
    assert!(!set_apart.status.success(), "a limit set apart renders");
    let err = String::from_utf8_lossy(&set_apart.stderr);
    assert!(err.contains("drainMemory.baselineMi"), "{err}");
}

/// The metric names a PromQL text uses (`sandboxrun_…`, histogram suffixes removed).
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(pos) = text[i..].find("sandboxrun_") {
        let start = i + pos;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_lowercase() || bytes[end] == b'_') {
            end += 1;
        }
        let name = &text[start..end];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        out.insert(base.to_string());
        i = end;
    }
    out
}

/// Sharded, every replica reports `sandboxrun_leader` 1, so `SandboxRunNoLeader` watches the shards
/// held (`sandboxrun_shards_owned` summing to 0); with one replica or an elected leader, the leader
/// gauge (docs/operations.md "Metrics").
#[test]
fn the_no_leader_alert_watches_the_shards_when_the_replicas_are_sharded() {
    let expr = |extra: &[&str]| -> String {
        let mut args = vec![
            "template",
            "demo",
            CHART,
            "-n",
            "sbr-sys",
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            "store.url=s3://b/p",
        ];
        args.extend_from_slice(extra);
        let docs = yaml_docs(&run_ok(helm(&args), None));
        let rule = only(&docs, "PrometheusRule");
        rule["spec"]["groups"][0]["rules"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|r| r["alert"].as_str() == Some("SandboxRunNoLeader"))
            .and_then(|r| r["expr"].as_str())
            .expect("SandboxRunNoLeader")
            .to_string()
    };
    let sharded = expr(&["--set", "replicas=3"]);
    assert!(
        sharded.contains("sum(sandboxrun_shards_owned{"),
        "{sharded}"
    );
    assert!(!sharded.contains("sandboxrun_leader"), "{sharded}");
    for elected in [
        vec!["--set", "replicas=1"],
        vec![
            "--set",
            "replicas=2",
            "--set",
            "leaderElection.enabled=true",
        ],
        vec!["--set", "replicas=2", "--set", "sharding.enabled=false"],
    ] {
        let e = expr(&elected);
        assert!(e.contains("max(sandboxrun_leader{"), "{elected:?}: {e}");
    }
}

#[test]
fn alerts_and_dashboard_query_only_metrics_the_operator_exports() {
    use sandboxrun_operator::admission::webhook::WebhookMetrics;
    use sandboxrun_operator::metrics::Metrics;

    let m = Metrics::new().expect("metrics");
    let w = WebhookMetrics::register(
        &prometheus::Registry::new_custom(Some("sandboxrun".to_string()), None).expect("registry"),
    )
    .expect("webhook metrics");
    // Every name the operator registers (its metrics, the webhook's), as exported.
    let exported: std::collections::BTreeSet<String> =
        m.names.iter().chain(&w.names).cloned().collect();
    // The registry adds the `sandboxrun_` prefix to every name (the leader gauge, with no labels,
    // is always in the exposition: proof of the prefix).
    assert!(
        m.render().contains("\nsandboxrun_leader 0\n"),
        "{}",
        m.render()
    );

    let mut args = vec!["template", "demo", CHART, "-n", "sbr-sys"];
    args.extend_from_slice(ALL_NEW);
    let text = run_ok(helm(&args), None);
    let docs = yaml_docs(&text);
    let rule = only(&docs, "PrometheusRule");
    let rules = rule["spec"]["groups"][0]["rules"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    let alerts: Vec<&str> = rules.iter().filter_map(|r| r["alert"].as_str()).collect();
    assert_eq!(
        alerts,
        [
            "SandboxRunDrainFailed",
            "SandboxRunDrainCapped",
            "SandboxRunReconcileErrors",
            "SandboxRunWebhookSlow",
            "SandboxRunWebhookDenials",
            "SandboxRunNoLeader",
            "SandboxRunDrainQueueGrowing"
        ]
    );
    let mut used = std::collections::BTreeSet::new();
    for r in &rules {
        let expr = r["expr"].as_str().unwrap_or_default();
        assert!(
            expr.contains("namespace=\"sbr-sys\""),
            "not scoped to the release: {expr}"
        );
        used.extend(metric_names(expr));
    }
    let dashboard = only(&docs, "ConfigMap");
    assert_eq!(
        dashboard["metadata"]["labels"]["grafana_dashboard"],
        serde_yaml::Value::from("1")
    );
    let json: serde_json::Value = serde_json::from_str(
        dashboard["data"]["sandboxrun-operator.json"]
            .as_str()
            .unwrap_or_default(),
    )
    .expect("the dashboard is JSON");
    let panels = json["panels"].as_array().cloned().unwrap_or_default();
    assert!(panels.len() >= 8, "{} panels", panels.len());
    for p in &panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            used.extend(metric_names(t["expr"].as_str().unwrap_or_default()));
        }
    }
    let unknown: Vec<&String> = used.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "queried but not exported: {unknown:?}\nexported: {exported:?}"
    );
    // Every exported family is on the dashboard or in an alert.
    let unused: Vec<&String> = exported.difference(&used).collect();
    assert!(unused.is_empty(), "exported but never shown: {unused:?}");
}

#[tokio::test]
async fn the_new_templates_are_accepted_by_the_apiserver() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "chart-new").await;
    let mut args = vec!["template", "new", CHART, "--namespace", &ns.name];
    args.extend_from_slice(ALL_NEW);
    // The PrometheusRule needs the Prometheus Operator's CRDs, which the bed does not install:
    // it is checked offline (alerts_and_dashboard_query_only_metrics_the_operator_exports).
    for t in [
        "templates/pdb.yaml",
        "templates/networkpolicy.yaml",
        "templates/grafana-dashboard.yaml",
        "templates/deployment.yaml",
    ] {
        args.extend_from_slice(&["-s", t]);
    }
    let out = server_dry_run(&run_ok(helm(&args), None));
    for kind in [
        "poddisruptionbudget.policy/",
        "networkpolicy.networking.k8s.io/",
        "configmap/",
        "deployment.apps/",
    ] {
        assert!(out.contains(kind), "no {kind} in:\n{out}");
    }
}

/// `helm test`'s hook objects (templates/tests/selftest.yaml) rendered with `values`.
fn selftest_docs(namespace: &str, values: &[&str]) -> Vec<serde_yaml::Value> {
    let mut args = vec![
        "template",
        "st",
        CHART,
        "--namespace",
        namespace,
        "-s",
        "templates/tests/selftest.yaml",
    ];
    args.extend_from_slice(values);
    yaml_docs(&run_ok(helm(&args), None))
}

/// The tiny SandboxRun the selftest pod creates (its `SANDBOXRUN_SELFTEST_RUN`).
fn selftest_run(docs: &[serde_yaml::Value]) -> serde_json::Value {
    let pod = only(docs, "Pod");
    let env = &pod["spec"]["containers"][0]["env"][0];
    assert_eq!(env["name"].as_str(), Some("SANDBOXRUN_SELFTEST_RUN"));
    serde_json::from_str(env["value"].as_str().unwrap_or_default()).expect("the run is JSON")
}

const SELFTEST_VALUES: &[&str] = &[
    "--set",
    "watchNamespaces={runs-a,runs-b}",
    "--set",
    "test.image=registry.example/busybox:1.35",
    "--set",
    "test.timeout=90s",
    "--set-json",
    r#"test.nodeSelector={"sandbox.iterion.io/real-node":"true"}"#,
    "--set-json",
    r#"test.tolerations=[{"key":"sandbox.iterion.io/real-node","operator":"Equal","value":"true","effect":"NoSchedule"}]"#,
];

/// Issue #14 item 5's `helm test`: every object is a test hook deleted when the test passes, the
/// Role allows only create/get/delete of SandboxRuns in a namespace the operator watches, the pod
/// runs this chart's image as `selftest`, and the tiny run carries the test values.
#[test]
fn the_helm_test_hook_lints_strict_and_is_least_privilege() {
    let mut args = vec!["lint", "--strict", CHART];
    args.extend_from_slice(SELFTEST_VALUES);
    run_ok(helm(&args), None);
    let docs = selftest_docs("sbr-sys", SELFTEST_VALUES);
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(kinds, ["ServiceAccount", "Role", "RoleBinding", "Pod"]);
    for d in &docs {
        let a = &d["metadata"]["annotations"];
        assert_eq!(a["helm.sh/hook"].as_str(), Some("test"), "{d:?}");
        assert_eq!(
            a["helm.sh/hook-delete-policy"].as_str(),
            Some("before-hook-creation,hook-succeeded"),
            "{d:?}"
        );
    }
    let role = only(&docs, "Role");
    assert_eq!(role["metadata"]["namespace"].as_str(), Some("runs-a"));
    let rules = serde_json::to_value(&role["rules"]).expect("rules");
    // Its run tolerates the real node's taint, and a run's tolerations need its author's right to
    // create pods (the webhook's access check, src/policy/access.rs): that, and nothing else.
    assert_eq!(
        rules,
        serde_json::json!([
            {"apiGroups": ["sandbox.iterion.io"], "resources": ["sandboxruns"], "verbs": ["create", "get", "delete"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]},
        ])
    );
    // Without tolerations the run exercises no right of its author: runs only.
    let plain = selftest_docs("sbr-sys", &SELFTEST_VALUES[..SELFTEST_VALUES.len() - 2]);
    let plain_rules = serde_json::to_value(&only(&plain, "Role")["rules"]).expect("rules");
    assert_eq!(
        plain_rules,
        serde_json::json!([{"apiGroups": ["sandbox.iterion.io"], "resources": ["sandboxruns"], "verbs": ["create", "get", "delete"]}])
    );
    let binding = only(&docs, "RoleBinding");
    assert_eq!(
        binding["subjects"][0]["namespace"].as_str(),
        Some("sbr-sys")
    );
    let pod = only(&docs, "Pod");
    let container = &pod["spec"]["containers"][0];
    let full = run_ok(
        helm(&["template", "st", CHART, "--namespace", "sbr-sys"]),
        None,
    );
    let operator_image = operator_deployment(&yaml_docs(&full))["spec"]["template"]["spec"]
        ["containers"][0]["image"]
        .clone();
    assert_eq!(container["image"], operator_image, "the chart's own image");
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .map(|s| s.iter().filter_map(|a| a.as_str()).collect())
        .unwrap_or_default();
    assert_eq!(args, ["selftest", "--namespace=runs-a", "--timeout=90s"]);
    assert_eq!(
        pod["spec"]["serviceAccountName"], role["metadata"]["name"],
        "its own ServiceAccount"
    );
    let tiny = selftest_run(&docs);
    assert_eq!(tiny["spec"]["image"], "registry.example/busybox:1.35");
    assert_eq!(
        tiny["spec"]["nodeSelector"]["sandbox.iterion.io/real-node"],
        "true"
    );
    assert_eq!(tiny["spec"]["tolerations"][0]["effect"], "NoSchedule");
    assert_eq!(tiny["spec"]["readBack"]["paths"][0]["path"], "/work/out");
    // The release namespace when nothing is watched explicitly; nothing at all when disabled.
    let docs = selftest_docs(
        "sbr-sys",
        &["--set", "test.image=registry.example/busybox:1.35"],
    );
    assert_eq!(
        only(&docs, "Role")["metadata"]["namespace"].as_str(),
        Some("sbr-sys")
    );
    let off = run(
        helm(&[
            "template",
            "st",
            CHART,
            "-s",
            "templates/tests/selftest.yaml",
            "--set",
            "test.enabled=false",
        ]),
        None,
    );
    assert!(
        !off.status.success() && String::from_utf8_lossy(&off.stderr).contains("could not find"),
        "disabled renders nothing: {off:?}"
    );
    // Issue #42: no default image any cluster could pull exists, so `helm test` is off until
    // test.image is set (it defaulted to the local bed's registry).
    let unset = run(
        helm(&[
            "template",
            "st",
            CHART,
            "-s",
            "templates/tests/selftest.yaml",
        ]),
        None,
    );
    assert!(
        !unset.status.success()
            && String::from_utf8_lossy(&unset.stderr).contains("could not find"),
        "without test.image nothing renders: {unset:?}"
    );
}

/// The `helm test` objects and the tiny run they create pass a server-side dry run (the run
/// against the CRD's schema and CEL rules).
#[tokio::test]
async fn the_helm_test_hook_and_its_run_are_accepted_by_the_apiserver() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "chart-selftest").await;
    let mut args = vec![
        "template",
        "st",
        CHART,
        "--namespace",
        &ns.name,
        "-s",
        "templates/tests/selftest.yaml",
    ];
    args.extend_from_slice(&SELFTEST_VALUES[2..]);
    let rendered = run_ok(helm(&args), None);
    // Helm creates the ServiceAccount first (hook weight -1); a pod's dry run needs it to exist.
    let docs = yaml_docs(&rendered);
    let account = serde_yaml::to_string(only(&docs, "ServiceAccount")).expect("yaml");
    run_ok(
        kubectl(&["apply", "-n", &ns.name, "-f", "-"]),
        Some(account.as_bytes()),
    );
    let out = server_dry_run(&rendered);
    for kind in [
        "serviceaccount/",
        "role.rbac.authorization.k8s.io/",
        "rolebinding.rbac.authorization.k8s.io/",
        "pod/",
    ] {
        assert!(out.contains(kind), "no {kind} in:\n{out}");
    }
    let mut run = selftest_run(&docs);
    // generateName is not supported by `kubectl apply`: name it for the dry run.
    run["metadata"]["name"] = "selftest-dry-run".into();
    let out = run_ok(
        kubectl(&["create", "--dry-run=server", "-n", &ns.name, "-f", "-"]),
        Some(run.to_string().as_bytes()),
    );
    assert!(
        out.contains("sandboxrun.sandbox.iterion.io/selftest-dry-run"),
        "{out}"
    );
}

/// The Prometheus Operator's CRD `file` (PrometheusRule, ServiceMonitor), which hack/build-tools.sh
/// fetched from its Go module (PROMETHEUS_OPERATOR_VERSION in hack/versions.env) into the tool
/// cache beside the bed's binaries.
fn prometheus_operator_crd(file: &str) -> std::path::PathBuf {
    let versions =
        std::fs::read_to_string(repo().join("hack/versions.env")).expect("hack/versions.env");
    let version = versions
        .lines()
        .find_map(|l| l.strip_prefix("PROMETHEUS_OPERATOR_VERSION="))
        .expect("PROMETHEUS_OPERATOR_VERSION in hack/versions.env")
        .trim()
        .to_string();
    let cache = tools_bin()
        .and_then(|bin| Some(bin.parent()?.parent()?.to_path_buf()))
        .expect("the bed's tool cache (hack/local-cluster.sh env)");
    let path = cache
        .join(format!("prometheus-operator-crds-{version}"))
        .join(file);
    assert!(
        path.exists(),
        "{} is missing: hack/build-tools.sh fetches it",
        path.display()
    );
    path
}

/// Issue #14 item 5: the PrometheusRule and the ServiceMonitor are accepted by an apiserver that
/// serves the Prometheus Operator's CRDs (their OpenAPI schemas judge the objects' shape).
#[tokio::test]
async fn the_monitoring_templates_are_accepted_by_the_prometheus_operator_crds() {
    let client = client().await;
    ensure_crd(&client).await;
    for file in [
        "monitoring.coreos.com_prometheusrules.yaml",
        "monitoring.coreos.com_servicemonitors.yaml",
    ] {
        let crd = prometheus_operator_crd(file);
        run_ok(
            kubectl(&[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                &crd.display().to_string(),
            ]),
            None,
        );
    }
    run_ok(
        kubectl(&[
            "wait",
            "--for",
            "condition=established",
            "--timeout=60s",
            "crd/prometheusrules.monitoring.coreos.com",
            "crd/servicemonitors.monitoring.coreos.com",
        ]),
        None,
    );
    let ns = TestNamespace::new(&client, "chart-mon").await;
    let mut args = vec!["template", "mon", CHART, "--namespace", &ns.name];
    args.extend_from_slice(ALL_NEW);
    args.extend_from_slice(&[
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "-s",
        "templates/prometheusrule.yaml",
        "-s",
        "templates/servicemonitor.yaml",
    ]);
    let out = server_dry_run(&run_ok(helm(&args), None));
    for kind in [
        "prometheusrule.monitoring.coreos.com/",
        "servicemonitor.monitoring.coreos.com/",
    ] {
        assert!(out.contains(kind), "{kind} not applied:\n{out}");
    }
}

/// The chart as it was released before (commit b62eb4e, packaged with `helm package`): the one
/// `helm upgrade` must move from.
const PREVIOUS_CHART: &str = "tests/chart-previous/sandboxrun-operator-0.1.0-b62eb4e.tgz";

/// Issue #27: `helm upgrade` from the previous chart to this one must work (a Deployment's
/// selector is immutable: a chart that changes it can only be installed fresh). Installs the
/// previous chart, upgrades to this one with the same values, and checks the Deployment kept its
/// selector and runs the new template.
#[tokio::test]
async fn helm_upgrade_from_the_previous_chart_keeps_the_release() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "chart-upgrade").await;
    let release = format!("sbr{:06x}", rand_u32() & 0xffffff);
    let fullname = format!("{release}-sandboxrun-operator");
    let selector = format!(
        "webhook.namespaceSelector.matchLabels.sandboxrun-test={}",
        ns.name
    );
    let values = [
        "--set",
        selector.as_str(),
        "--set",
        "webhook.failurePolicy=Ignore",
        "--set",
        "image.repository=sandboxrun-operator",
        "--set",
        "image.tag=test",
        "--timeout",
        "60s",
    ];
    let install = |verb: &str, chart: &str| {
        let mut args = vec![verb, release.as_str(), chart, "--namespace", &ns.name];
        args.extend_from_slice(&values);
        run_ok(helm(&args), None)
    };
    install("install", PREVIOUS_CHART);
    let _uninstall = Uninstall {
        release: release.clone(),
        namespace: ns.name.clone(),
    };
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let before = deployments.get(&fullname).await.expect("deployment");
    install("upgrade", CHART);
    let after = deployments.get(&fullname).await.expect("deployment");
    let selector_of = |d: &Deployment| d.spec.as_ref().map(|s| s.selector.clone());
    assert_eq!(
        selector_of(&before),
        selector_of(&after),
        "the selector is kept"
    );
    assert!(
        after.metadata.generation > before.metadata.generation,
        "the upgrade changed the Deployment's template"
    );
    // The upgraded Deployment is this chart's: its args are the ones `helm template` renders now.
    let rendered = run_ok(
        helm(&[
            "template",
            &release,
            CHART,
            "--namespace",
            &ns.name,
            "--set",
            &selector,
            "--set",
            "webhook.failurePolicy=Ignore",
            "--set",
            "image.repository=sandboxrun-operator",
            "--set",
            "image.tag=test",
            "--show-only",
            "templates/deployment.yaml",
        ]),
        None,
    );
    let args = after
        .spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers[0].args.clone().unwrap_or_default())
        .unwrap_or_default();
    for arg in &args {
        assert!(
            rendered.contains(arg.as_str()),
            "{arg} is not in:\n{rendered}"
        );
    }
    assert!(
        args.iter().any(|a| a.starts_with("--egress-gate-probe=")),
        "the new chart's flags are in the Deployment: {args:?}"
    );
    let status = run_ok(helm(&["status", &release, "--namespace", &ns.name]), None);
    assert!(status.contains("REVISION: 2"), "{status}");
}
