//! RBAC proof: the operator binary, running with the identity of the chart's ServiceAccount and
//! nothing but the chart's (Cluster)Roles, completes a full run + drain (applying the run's
//! egress NetworkPolicy first) and deletes a run whose
//! ttlSecondsAfterFinished passed; with one rule removed
//! (pods/exec) the drain fails with a clear Forbidden in status and in the drain_failed Event.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject,
};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::Api;
use sandboxrun_operator::api::{NetworkMode, Phase, ReadBackPhase, SandboxRun};

use crate::support::*;

/// The chart's RBAC objects and the Deployment's `--lease-name`, rendered by `helm template` with
/// leader election on (so the Lease rules are part of what is proven).
fn chart_rbac(
    release: &str,
    namespace: &str,
    sets: &[&str],
) -> (Vec<ClusterRole>, Vec<Role>, String) {
    let helm = tools_bin()
        .map(|b| b.join("helm"))
        .unwrap_or_else(|| "helm".into());
    let out = Command::new(helm)
        .args([
            "template",
            release,
            "charts/sandboxrun-operator",
            "--namespace",
            namespace,
        ])
        .args(["--set", "leaderElection.enabled=true"])
        .args(sets.iter().flat_map(|s| ["--set", s]))
        // The operator's RBAC, not the `helm test` hook's own Role (templates/tests/).
        .arg("--skip-tests")
        .args(["--kube-version", &bed_kube_version()])
        .current_dir(repo())
        .output()
        .expect("helm template");
    assert!(
        out.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut cluster_roles = Vec::new();
    let mut roles = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let Ok(value) = serde_yaml::Value::deserialize(doc) else {
            continue;
        };
        match value.get("kind").and_then(|k| k.as_str()) {
            Some("ClusterRole") => {
                cluster_roles.push(serde_yaml::from_value(value).expect("ClusterRole"))
            }
            Some("Role") => roles.push(serde_yaml::from_value(value).expect("Role")),
            _ => {}
        }
    }
    assert!(
        !cluster_roles.is_empty(),
        "the chart renders no ClusterRole"
    );
    let lease = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("- --lease-name="))
        .expect("the Deployment passes --lease-name")
        .to_string();
    (cluster_roles, roles, lease)
}

use serde::Deserialize;

/// A ServiceAccount of the test's namespace bound to exactly `cluster_roles` (renamed after the
/// namespace) and `roles`: the names of the ClusterRoles made, and a kubeconfig that
/// authenticates as it and nothing else.
async fn bind_service_account(
    client: &kube::Client,
    ns: &str,
    cluster_roles: Vec<ClusterRole>,
    roles: Vec<Role>,
) -> (Vec<String>, std::path::PathBuf) {
    // The chart's ServiceAccount identity, bound to exactly the chart's rules.
    let sa_name = "sandboxrun-operator-under-test";
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    sas.create(
        &PostParams::default(),
        &ServiceAccount {
            metadata: ObjectMeta {
                name: Some(sa_name.into()),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: sa_name.into(),
        namespace: Some(ns.to_string()),
        api_group: None,
    };
    let crs: Api<ClusterRole> = Api::all(client.clone());
    let crbs: Api<ClusterRoleBinding> = Api::all(client.clone());
    let mut cr_names = Vec::new();
    for mut cr in cluster_roles {
        let name = format!("{}-{}", ns, cr.metadata.name.clone().unwrap_or_default());
        cr.metadata = ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        };
        crs.create(&PostParams::default(), &cr).await.unwrap();
        crbs.create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..Default::default()
                },
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "ClusterRole".into(),
                    name: name.clone(),
                },
                subjects: Some(vec![subject.clone()]),
            },
        )
        .await
        .unwrap();
        cr_names.push(name);
    }
    let rs: Api<Role> = Api::namespaced(client.clone(), ns);
    let rbs: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
    for mut r in roles {
        let name = r.metadata.name.clone().unwrap_or_default();
        r.metadata = ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        };
        rs.create(&PostParams::default(), &r).await.unwrap();
        rbs.create(
            &PostParams::default(),
            &RoleBinding {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..Default::default()
                },
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name,
                },
                subjects: Some(vec![subject.clone()]),
            },
        )
        .await
        .unwrap();
    }

    // A kubeconfig that authenticates as that ServiceAccount and nothing else.
    let sa_kubeconfig = service_account_kubeconfig(client, ns, sa_name).await;
    (cr_names, sa_kubeconfig)
}

#[tokio::test]
async fn the_chart_rbac_is_enough_for_a_full_run_and_each_rule_is_needed() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "rbac").await;
    let release = format!("rbac{:06x}", rand_u32() & 0xffffff);
    let (cluster_roles, roles, lease) = chart_rbac(&release, &ns.name, &[]);

    let (cr_names, sa_kubeconfig) =
        bind_service_account(&client, &ns.name, cluster_roles, roles).await;
    let crs: Api<ClusterRole> = Api::all(client.clone());
    let crbs: Api<ClusterRoleBinding> = Api::all(client.clone());

    let store_url = format!("file://{}", host_dir("store-rbac").display());
    // The operator as the chart's ServiceAccount, started (and restarted) by `start`.
    let start = || {
        Operator::builder(&ns.name, &store_url)
            .kubeconfig(&sa_kubeconfig)
            .flags(&[
                "--pod-namespace",
                &ns.name,
                "--pod-name",
                "rbac-op",
                "--leader-elect",
                "--lease-name",
                &lease,
            ])
            .start()
    };
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let run_once = |name: &'static str| {
        let runs = runs.clone();
        let pods = pods.clone();
        async move {
            let out = host_dir("out");
            std::fs::write(out.join("x.txt"), b"x\n").unwrap();
            create(
                &runs,
                name,
                spec(&[&out])
                    .image(TAGGED_IMAGE)
                    .user("1000")
                    .command(Some(&["true"]))
                    .drain_timeout("15s")
                    // Restricted egress: the run's NetworkPolicy is applied under the chart's rules.
                    .network(NetworkMode::Denylist, &["169.254.169.254"]),
            )
            .await;
            let r = eventually(&format!("{name} Running"), Duration::from_secs(90), || {
                let runs = runs.clone();
                async move {
                    let r = runs.get(name).await.ok()?;
                    (r.status.as_ref()?.phase == Some(Phase::Running)).then_some(r)
                }
            })
            .await;
            finish_workload(&pods, &pod_of(&r), 0).await;
            eventually(&format!("{name} final"), Duration::from_secs(90), || {
                let runs = runs.clone();
                async move {
                    let r = runs.get(name).await.ok()?;
                    r.status.as_ref()?.phase.filter(|p| p.is_final()).map(|_| r)
                }
            })
            .await
        }
    };

    // 1. With the chart's rules: a full run and drain.
    let mut op = start();
    let done = run_once("allowed").await;
    let status = done.status.unwrap();
    assert_eq!(
        status.phase,
        Some(Phase::Succeeded),
        "{status:?}\n{}",
        op.log_text()
    );
    assert_eq!(status.read_back[0].phase, ReadBackPhase::Drained);

    // ... and the delete of a run whose ttlSecondsAfterFinished passed.
    let out = host_dir("out");
    let mut expiring = spec(&[&out])
        .image(TAGGED_IMAGE)
        .user("1000")
        .command(Some(&["true"]))
        .drain_timeout("15s")
        .build();
    expiring.ttl_seconds_after_finished = Some(0);
    let created = runs
        .create(
            &PostParams::default(),
            &SandboxRun::new("expires", expiring),
        )
        .await
        .unwrap();
    assert_eq!(
        created.spec.ttl_seconds_after_finished,
        Some(0),
        "the CRD serves ttlSecondsAfterFinished"
    );
    let r = eventually("expires Running", Duration::from_secs(90), || {
        let runs = runs.clone();
        async move {
            let r = runs.get("expires").await.ok()?;
            (r.status.as_ref()?.phase == Some(Phase::Running)).then_some(r)
        }
    })
    .await;
    finish_workload(&pods, &pod_of(&r), 0).await;
    // Deleted by the operator under the chart's rules.
    wait_gone(&runs, "expires", &op, Duration::from_secs(90)).await;

    // 2. Without pods/exec: the drain is Forbidden, and says so.
    for name in &cr_names {
        let mut cr = crs.get(name).await.unwrap();
        let before = cr.rules.as_ref().map(Vec::len).unwrap_or(0);
        for rule in cr.rules.iter_mut().flatten() {
            if let Some(resources) = rule.resources.as_mut() {
                resources.retain(|r| r != "pods/exec");
            }
        }
        cr.rules
            .as_mut()
            .unwrap()
            .retain(|r| r.resources.as_ref().is_none_or(|rs| !rs.is_empty()));
        let _ = before;
        cr.metadata.managed_fields = None;
        crs.replace(name, &PostParams::default(), &cr)
            .await
            .unwrap();
    }
    let done = run_once("forbidden").await;
    let status = done.status.unwrap();
    let entry = &status.read_back[0];
    assert_eq!(entry.phase, ReadBackPhase::Failed, "{status:?}");
    let msg = entry.message.clone().unwrap_or_default();
    assert!(
        msg.contains("Forbidden") || msg.contains("forbidden"),
        "the failure must say Forbidden: {msg}"
    );
    op.kill();
    for name in cr_names {
        let _ = crbs.delete(&name, &DeleteParams::default()).await;
        let _ = crs.delete(&name, &DeleteParams::default()).await;
    }
}

/// A sharded replica (`--sharding`) under exactly the chart's rules: it creates and renews its
/// shard and heartbeat Leases, labels a new run with its shard and runs it to the end; without
/// the chart's sharding Role it holds no shard and says Forbidden.
#[tokio::test]
async fn the_chart_rbac_is_enough_for_a_sharded_replica_and_its_role_is_needed() {
    use k8s_openapi::api::coordination::v1::Lease;
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "rbacshard").await;
    let release = format!("rbac{:06x}", rand_u32() & 0xffffff);
    let (cluster_roles, roles, lease) = chart_rbac(&release, &ns.name, &[]);
    assert!(
        roles.iter().any(|r| r
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| n.ends_with("-sharding"))),
        "the chart renders the sharding Role by default"
    );
    let (cr_names, sa_kubeconfig) =
        bind_service_account(&client, &ns.name, cluster_roles, roles).await;
    let store_url = format!("file://{}", host_dir("store-rbacshard").display());
    let start = || {
        Operator::builder(&ns.name, &store_url)
            .kubeconfig(&sa_kubeconfig)
            .flags(&[
                "--pod-namespace",
                &ns.name,
                "--pod-name",
                "rbac-shard-op",
                "--sharding",
                "--shards",
                "4",
                "--lease-name",
                &lease,
                "--settings-configmap",
                "",
            ])
            .start()
    };
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    let held = || async {
        let listed = leases.list(&Default::default()).await.ok()?.items;
        let shards = listed
            .iter()
            .filter(|l| {
                l.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&format!("{lease}-shard-")))
            })
            .filter(|l| {
                l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some("rbac-shard-op")
            })
            .count();
        let heartbeat = listed
            .iter()
            .any(|l| l.metadata.name.as_deref() == Some(&format!("{lease}-replica-rbac-shard-op")));
        Some((shards, heartbeat))
    };
    let op = start();
    eventually_or_log(
        "the 4 shards and the heartbeat held",
        Duration::from_secs(60),
        &op,
        || async { (held().await == Some((4, true))).then_some(()) },
    )
    .await;
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let out = host_dir("out-rbacshard");
    std::fs::write(out.join("x.txt"), b"x\n").unwrap();
    create(
        &runs,
        "sharded",
        spec(&[&out])
            .image(TAGGED_IMAGE)
            .user("1000")
            .drain_timeout("15s"),
    )
    .await;
    run_then_finish(&runs, &pods, "sharded", &op).await;
    let done = wait_final(&runs, "sharded", &op, Duration::from_secs(90)).await;
    assert_eq!(
        done.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Succeeded),
        "{}",
        op.log_text()
    );
    assert!(
        done.metadata
            .labels
            .unwrap_or_default()
            .contains_key("sandbox.iterion.io/shard"),
        "labelled with its shard under the chart's rules"
    );
    drop(op);

    // Without the sharding Role: no shard is ever held, and the log says Forbidden.
    let rs: Api<Role> = Api::namespaced(client.clone(), &ns.name);
    let name = format!("{release}-sandboxrun-operator-sharding");
    rs.delete(&name, &DeleteParams::default())
        .await
        .expect("delete the sharding Role");
    for l in leases.list(&Default::default()).await.unwrap().items {
        let _ = leases
            .delete(
                l.metadata.name.as_deref().unwrap(),
                &DeleteParams::default(),
            )
            .await;
    }
    let op = start();
    eventually_or_log(
        "a Forbidden lease write",
        Duration::from_secs(60),
        &op,
        || async { op.log_text().contains("forbidden").then_some(()) },
    )
    .await;
    assert_eq!(
        held().await.map(|h| h.0),
        Some(0),
        "no shard held without the Role"
    );
    drop(op);
    let crs: Api<ClusterRole> = Api::all(client.clone());
    let crbs: Api<ClusterRoleBinding> = Api::all(client.clone());
    for name in cr_names {
        let _ = crbs.delete(&name, &DeleteParams::default()).await;
        let _ = crs.delete(&name, &DeleteParams::default()).await;
    }
}

/// docs/operations.md's RBAC table says exactly what the chart grants the operator (every
/// resource and verb of its ClusterRoles and Roles, with the optional image check on): issue #27
/// found `networkpolicies` missing from it. Core and our own group are written without a group.
#[test]
fn the_operations_rbac_table_is_the_charts_rbac() {
    use std::collections::BTreeSet;
    let (cluster_roles, roles, _) = chart_rbac(
        "doc",
        "doc-sys",
        &[
            "webhook.checkImages=true",
            "preflightImages=true",
            "runPolicy.namespacePolicies[0].name=doc",
            "tenantStores.enabled=true",
            "kueue.enabled=true",
            "externalMetrics.enabled=true",
        ],
    );
    let rules = cluster_roles
        .iter()
        .filter(|r| {
            !r.metadata
                .name
                .as_deref()
                .unwrap_or("")
                .ends_with("-egress-proxy")
        })
        .flat_map(|r| r.rules.clone().unwrap_or_default())
        .chain(
            roles
                .iter()
                .flat_map(|r| r.rules.clone().unwrap_or_default()),
        );
    let mut granted = BTreeSet::new();
    for rule in rules {
        for group in rule.api_groups.unwrap_or_default() {
            for resource in rule.resources.clone().unwrap_or_default() {
                let key = match group.as_str() {
                    "" | "sandbox.iterion.io" => resource.clone(),
                    g => format!("{g}/{resource}"),
                };
                for verb in &rule.verbs {
                    granted.insert((key.clone(), verb.clone()));
                }
            }
        }
    }
    let doc = std::fs::read_to_string(repo().join("docs/operations.md")).expect("operations.md");
    let table = doc
        .split("\n## RBAC\n")
        .nth(1)
        .and_then(|t| t.split("\n## ").next())
        .expect("the RBAC section");
    let mut documented = BTreeSet::new();
    for row in table.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let resource = cells[1].split('`').nth(1).expect("a resource in backticks");
        for verb in cells[2].split([',', ';']) {
            let verb = verb.split_whitespace().next().expect("a verb");
            documented.insert((resource.to_string(), verb.to_string()));
        }
    }
    assert_eq!(documented, granted);
}
