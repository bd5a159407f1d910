//! Warm pools trust what the operator made and computed, never what a tenant can change (issue
//! #51; docs/contract.md "A warm pool's launcher is the operator's code; a pool pod serves one run
//! (issue #39)"): a template narrowed in its network rules replaces the pool's ready pods and no
//! run takes one of the old, wider ones; a pod the tenant made with a pool's labels, or labelled
//! `claimed-by=<a run's uid>` and owned by that run, is never claimed, started or drained as the
//! run's. The operator runs as a process on this host; kwok plays the node (nothing here needs a
//! real container: the claim's labels, the pods' NetworkPolicies and the runs' statuses are the
//! apiserver's).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy as NetPol;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use sandboxrun_operator::api::{
    NetworkMode, OpenField, Phase, SandboxRun, SandboxRunPool, SandboxRunSpec, SandboxRunTemplate,
    SandboxRunTemplateSpec, WarmStart,
};
use serde_json::json;

use crate::support::*;

/// How long the tests wait for the operator.
const CONVERGE: Duration = Duration::from_secs(90);

/// The operator with warm pools and the egress settings a filtered run needs, and `more` flags.
fn warm_operator(ns: &str, secret: &std::path::Path, more: &[&str]) -> Operator {
    // The admission key (which seals the pool's pods) in the test's namespace.
    let flags = [&["--warm-pools", "--pod-namespace", ns][..], more].concat();
    egress_operator(ns, "warm", secret, &flags)
}

/// A template whose runs reach only `rules` (an allowlist of address ranges), or open.
fn template(rules: Option<&[&str]>) -> SandboxRunTemplateSpec {
    let out = host_dir("out");
    let mut made = spec(&[&out]);
    if let Some(rules) = rules {
        made = made.network(NetworkMode::Allowlist, rules);
    }
    template_of(made.build(), &[OpenField::Command, OpenField::Env])
}

/// A run of the template `name` that sets only its command (it may take a pool pod).
fn work_from_template(name: &str) -> SandboxRunSpec {
    from_template(
        name,
        SandboxRunSpec {
            command: Some(vec!["sh".into(), "-c".into(), "work".into()]),
            ..SandboxRunSpec::default()
        },
    )
}

async fn make_pool(client: &Client, ns: &str, name: &str, rules: Option<&[&str]>, replicas: i32) {
    make_template_and_pool(client, ns, (name, name), template(rules), replicas).await;
}

/// The pool's status once it says its template hash and `ready` ready pods.
async fn pool_ready(pools: &Api<SandboxRunPool>, name: &str, ready: i32, op: &Operator) -> String {
    eventually_or_log(
        &format!("pool {name}: {ready} ready pods"),
        CONVERGE,
        op,
        || async move {
            let s = pools.get(name).await.ok()?.status?;
            (s.ready_replicas == ready).then_some(s.template_hash?)
        },
    )
    .await
}

/// The run's warm-pool decision, once made.
async fn warm_start(runs: &Api<SandboxRun>, name: &str, op: &Operator) -> WarmStart {
    eventually_or_log(
        &format!("run {name}'s warm-pool decision"),
        CONVERGE,
        op,
        || async move { runs.get(name).await.ok()?.status?.warm_start },
    )
    .await
}

/// The (pod, template hash) pairs seen labelled `claimed-by`.
type Claims = Arc<Mutex<BTreeSet<(String, String)>>>;

/// Every (pod, template hash) seen labelled `claimed-by` in `ns` while the returned task runs (a
/// watch: a claim seen once is kept, even if the pod is deleted right after).
fn record_claims(client: &Client, ns: &str) -> (Claims, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let into = seen.clone();
    let task = tokio::spawn(async move {
        let config = watcher::Config::default().labels(CLAIMED_BY_LABEL);
        let mut events = watcher(pods, config).boxed();
        while let Some(event) = events.next().await {
            let pods = match event {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => vec![p],
                _ => continue,
            };
            for pod in pods {
                let hash = pod.labels().get(HASH_LABEL).cloned().unwrap_or_default();
                if let Ok(mut seen) = into.lock() {
                    seen.insert((pod.name_any(), hash));
                }
            }
        }
    });
    (seen, task)
}

/// Issue #51 item 1: a template whose network rules are narrowed is a new version. Its pool
/// replaces the ready pods of the old one (each new pod's NetworkPolicy allows only the narrowed
/// range), and a run made from the narrowed template never takes a pod of the old version, not
/// even while the pool has not rolled out yet. (Before, the hash covered only the pod spec: the
/// rules are not in it, the old pods stayed, kept their wider policy, and the run claimed one.)
#[tokio::test]
async fn a_pool_pod_whose_template_narrowed_its_egress_is_replaced_and_never_claimed() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "warm-narrow").await;
    let secret = egress_secret_file();
    let op = warm_operator(&ns.name, secret.path(), &[]);
    let wide: &[&str] = &["203.0.113.0/24", "198.51.100.0/24"];
    make_pool(&client, &ns.name, "agents", Some(wide), 2).await;
    let pools: Api<SandboxRunPool> = Api::namespaced(client.clone(), &ns.name);
    let old = pool_ready(&pools, "agents", 2, &op).await;
    let (claims, watch) = record_claims(&client, &ns.name);
    // Narrowed: one range dropped. A run made at once (the pool has not looked again yet).
    let templates: Api<SandboxRunTemplate> = Api::namespaced(client.clone(), &ns.name);
    let narrowed = json!({"spec": {"template": {"network": {"rules": ["203.0.113.0/24"]}}}});
    templates
        .patch("agents", &PatchParams::default(), &Patch::Merge(&narrowed))
        .await
        .expect("narrow the template");
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    create(&runs, "after", work_from_template("agents")).await;
    let decided = warm_start(&runs, "after", &op).await;
    // The pool rolls out: a new version, its pods' policies narrowed, no old pod left unclaimed.
    let new = eventually_or_log("the pool's new version", CONVERGE, &op, || {
        let pools = pools.clone();
        let old = old.clone();
        async move {
            let s = pools.get("agents").await.ok()?.status?;
            let hash = s.template_hash.filter(|h| *h != old)?;
            (s.ready_replicas == 2).then_some(hash)
        }
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let policies: Api<NetPol> = Api::namespaced(client.clone(), &ns.name);
    let live = pods
        .list(&ListParams::default().labels(&format!("{POOL_LABEL}=agents,!{CLAIMED_BY_LABEL}")))
        .await
        .expect("list pool pods")
        .items;
    let live: Vec<&Pod> = live
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    assert!(!live.is_empty());
    for pod in live {
        assert_eq!(pod.labels()[HASH_LABEL], new, "{}", pod.name_any());
        let policy = policies
            .get(&format!("{}-egress", pod.name_any()))
            .await
            .expect("the pool pod's policy");
        let text = serde_json::to_string(&policy.spec).unwrap_or_default();
        assert!(text.contains("203.0.113.0/24"), "{text}");
        assert!(!text.contains("198.51.100.0/24"), "a wider policy: {text}");
    }
    watch.abort();
    let claims = claims.lock().map(|c| c.clone()).unwrap_or_default();
    assert!(
        claims.iter().all(|(_, hash)| *hash != old),
        "a pod of the old, wider version was claimed: {claims:?} (run: {decided:?})\n{}",
        op.log_text()
    );
}

/// A pod as a tenant with `pods/create` makes it: `labels`, owned (`controller: true`) by
/// `owner` (kind, name, uid), a workload and a holder (kwok runs both).
fn look_alike(name: &str, labels: BTreeMap<String, String>, owner: (&str, &str, &str)) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": "sandbox.iterion.io/v1alpha1",
                "kind": owner.0, "name": owner.1, "uid": owner.2, "controller": true,
            }],
        },
        "spec": {"containers": [
            {"name": "workload", "image": DIGEST_IMAGE, "command": ["sh"]},
            {"name": "holder", "image": DIGEST_IMAGE, "command": ["sh"]},
        ]},
    }))
    .expect("a pod")
}

/// Issue #51 item 6: a claim trusts the pod, not its labels. A tenant makes two pods before the
/// runs are looked at: one with the pool's labels and current template hash, owned by the pool
/// (`controller: true`); one labelled `claimed-by=<a run's uid>` (and the run's uid label), owned
/// by that run. Neither is claimed, started or taken for a run's pod: both runs start cold and
/// say why, their own pods are drained, and both look-alikes are left as they were. (Before, the
/// first was claimed — and deleted when its launcher did not answer — and the second was
/// recorded as the run's pod: `status.warmStart.pod`, the pod its teardown drained.)
#[tokio::test]
async fn a_look_alike_pod_with_a_pools_or_a_claims_labels_is_never_claimed_started_or_drained() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "warm-lookalike").await;
    let secret = egress_secret_file();
    make_pool(&client, &ns.name, "agents", None, 0).await;
    let pools: Api<SandboxRunPool> = Api::namespaced(client.clone(), &ns.name);
    // The pool's version, as the tenant reads it in its status.
    let mut op = warm_operator(&ns.name, secret.path(), &[]);
    let hash = pool_ready(&pools, "agents", 0, &op).await;
    op.kill();
    let pool_uid = pools.get("agents").await.expect("pool").uid().expect("uid");
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let lured = create(&runs, "lured", work_from_template("agents")).await;
    let run_uid = lured.uid().expect("uid");
    create(&runs, "plain", work_from_template("agents")).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pool_labels = BTreeMap::from([
        (POOL_LABEL.to_string(), "agents".to_string()),
        (HASH_LABEL.to_string(), hash.clone()),
        (
            "app.kubernetes.io/managed-by".into(),
            "sandboxrun-operator".into(),
        ),
        ("sandbox.iterion.io/pool-pod".into(), "agents-fake".into()),
    ]);
    let unclaimed = look_alike(
        "agents-fake",
        pool_labels.clone(),
        ("SandboxRunPool", "agents", &pool_uid),
    );
    let mut claimed_labels = pool_labels;
    claimed_labels.insert(CLAIMED_BY_LABEL.into(), run_uid.clone());
    claimed_labels.insert("sandbox.iterion.io/claimed-attempt".into(), "1".into());
    claimed_labels.insert("sandbox.iterion.io/run-uid".into(), run_uid.clone());
    claimed_labels.insert("sandbox.iterion.io/pool-pod".into(), "lured-fake".into());
    let claimed = look_alike(
        "lured-fake",
        claimed_labels,
        ("SandboxRun", "lured", &run_uid),
    );
    for pod in [&unclaimed, &claimed] {
        pods.create(&PostParams::default(), pod)
            .await
            .expect("a tenant's pod");
    }
    for name in ["agents-fake", "lured-fake"] {
        eventually(&format!("{name} running"), CONVERGE, || {
            let pods = pods.clone();
            async move {
                let s = pods.get(name).await.ok()?.status?;
                (s.phase.as_deref() == Some("Running")).then_some(())
            }
        })
        .await;
    }
    let op = warm_operator(&ns.name, secret.path(), &[]);
    for run in ["lured", "plain"] {
        let decided = warm_start(&runs, run, &op).await;
        assert_eq!(decided.pod, None, "{run}: {decided:?}\n{}", op.log_text());
        let why = decided.cold_reason.unwrap_or_default();
        assert!(why.contains("no ready pod"), "{run}: {why}");
    }
    // Both look-alikes as the tenant made them: not relabelled, not deleted.
    for (name, before) in [("agents-fake", &unclaimed), ("lured-fake", &claimed)] {
        let now = pods.get(name).await.expect("the look-alike is still there");
        assert!(now.metadata.deletion_timestamp.is_none(), "{name} deleted");
        assert_eq!(now.labels(), before.labels(), "{name} relabelled");
        assert_eq!(now.owner_references(), before.owner_references(), "{name}");
    }
    // Each run's own pod is drained; the look-alike never is the run's.
    for run in ["lured", "plain"] {
        run_then_finish(&runs, &pods, run, &op).await;
        let done = wait_phase(&runs, run, Phase::Succeeded, &op).await;
        let status = done.status.expect("status");
        assert_ne!(status.pod_name.as_deref(), Some("lured-fake"), "{run}");
        assert_ne!(status.pod_name.as_deref(), Some("agents-fake"), "{run}");
    }
}

/// The pool's status as `kubectl wait --for=jsonpath=…` reads it: (templateGeneration,
/// replicas, updatedReplicas, readyReplicas).
type Seen = (Option<i64>, i32, i32, i32);

/// Every status the pool `name` is seen with while the returned task runs (a watch).
fn record_statuses(
    pools: &Api<SandboxRunPool>,
    name: &str,
) -> (Arc<Mutex<Vec<Seen>>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let into = seen.clone();
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(pools.clone(), config).boxed();
    let task = tokio::spawn(async move {
        while let Some(event) = events.next().await {
            let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = event else {
                continue;
            };
            let Some(s) = p.status else { continue };
            let row = (
                s.template_generation,
                s.replicas,
                s.updated_replicas,
                s.ready_replicas,
            );
            if let Ok(mut seen) = into.lock() {
                seen.push(row);
            }
        }
    });
    (seen, task)
}

/// Issue #54 item 4: a pool's status shows its rollout in the Deployment's words. After an edit
/// of its template, `templateGeneration` follows the template's, `updatedReplicas` rises from 0
/// to `replicas` (the outdated pods counted in `replicas` until their deletion is seen) and
/// `readyReplicas` follows; after an edit of the pool, `observedGeneration` follows its
/// generation. (Before, the status counted only the current version's pods and said neither
/// `updatedReplicas` nor which template generation it described: a wait could not tell a pool
/// that had rolled out from one that had not looked at the edit yet.)
#[tokio::test]
async fn a_template_edit_shows_updated_replicas_rising_to_replicas_and_the_generations_followed() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "warm-rollout").await;
    let secret = egress_secret_file();
    let op = warm_operator(&ns.name, secret.path(), &[]);
    let wide: &[&str] = &["203.0.113.0/24", "198.51.100.0/24"];
    make_pool(&client, &ns.name, "agents", Some(wide), 2).await;
    let pools: Api<SandboxRunPool> = Api::namespaced(client.clone(), &ns.name);
    pool_ready(&pools, "agents", 2, &op).await;
    let before = pools
        .get("agents")
        .await
        .expect("pool")
        .status
        .expect("status");
    assert_eq!(
        (
            before.template_generation,
            before.replicas,
            before.updated_replicas
        ),
        (Some(1), 2, 2),
        "{before:?}"
    );
    let (statuses, watch) = record_statuses(&pools, "agents");
    let templates: Api<SandboxRunTemplate> = Api::namespaced(client.clone(), &ns.name);
    let narrowed = json!({"spec": {"template": {"network": {"rules": ["203.0.113.0/24"]}}}});
    let edited = templates
        .patch("agents", &PatchParams::default(), &Patch::Merge(&narrowed))
        .await
        .expect("edit the template");
    let generation = edited.metadata.generation;
    assert_eq!(generation, Some(2));
    // The wait a platform team writes: the template's generation, then every count at spec.
    let done = eventually_or_log("the rollout done", CONVERGE, &op, || {
        let pools = pools.clone();
        async move {
            let s = pools.get("agents").await.ok()?.status?;
            let counts = [s.replicas, s.updated_replicas, s.ready_replicas];
            (s.template_generation == generation && counts == [2, 2, 2]).then_some(s)
        }
    })
    .await;
    assert_ne!(done.template_hash, before.template_hash);
    watch.abort();
    let seen = statuses.lock().map(|s| s.clone()).unwrap_or_default();
    let rolling: Vec<&Seen> = seen.iter().filter(|s| s.0 == generation).collect();
    assert!(
        rolling.first().is_some_and(|s| s.2 < s.1 || s.3 < s.2),
        "the first status of the new template generation shows the rollout under way: {seen:?}"
    );
    assert!(
        rolling
            .windows(2)
            .all(|w| w[0].2 <= w[1].2 || w[1].1 < w[0].1),
        "updatedReplicas only rises: {seen:?}"
    );
    // An edit of the pool itself: observedGeneration follows it.
    let scaled = pools
        .patch(
            "agents",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .expect("scale the pool");
    let wanted = scaled.metadata.generation;
    eventually_or_log("observedGeneration followed", CONVERGE, &op, || {
        let pools = pools.clone();
        async move {
            let s = pools.get("agents").await.ok()?.status?;
            let counts = [s.replicas, s.updated_replicas, s.ready_replicas];
            (s.observed_generation == wanted && counts == [3, 3, 3]).then_some(())
        }
    })
    .await;
}

/// Issue #54 item 4: the kube-controller-manager's HorizontalPodAutoscaler drives a pool through
/// its scale subresource: it raises `spec.replicas` to its minReplicas and lowers it to its
/// maxReplicas; the scale subresource's status says the pool's replicas and a selector that
/// selects exactly them. (No metric drives it here — this operator serves no metrics API — so
/// the HPA's min and max do; the metric-driven path, the operator's `--external-metrics`, is
/// `real_node::warm::an_hpa_on_the_operators_external_metric_scales_a_pool_as_runs_claim_its_pods`.)
#[tokio::test]
async fn a_horizontal_pod_autoscaler_scales_a_pool_through_its_scale_subresource() {
    use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "warm-hpa").await;
    let secret = egress_secret_file();
    let op = warm_operator(&ns.name, secret.path(), &[]);
    make_pool(&client, &ns.name, "agents", None, 1).await;
    let pools: Api<SandboxRunPool> = Api::namespaced(client.clone(), &ns.name);
    pool_ready(&pools, "agents", 1, &op).await;
    let hpa: HorizontalPodAutoscaler = serde_json::from_value(json!({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "agents"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "sandbox.iterion.io/v1alpha1",
                "kind": "SandboxRunPool", "name": "agents"},
            "minReplicas": 2, "maxReplicas": 3,
            "metrics": [{"type": "External", "external": {
                "metric": {"name": "sandboxrun_pool_pods",
                    "selector": {"matchLabels": {"pool": "agents", "state": "claimed"}}},
                "target": {"type": "AverageValue", "averageValue": "1"}}}]
        }
    }))
    .expect("an HPA");
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &ns.name);
    hpas.create(&PostParams::default(), &hpa)
        .await
        .expect("create the HPA");
    let desired = |n: i32, why: &'static str| {
        let pools = pools.clone();
        let hpas = hpas.clone();
        let op = &op;
        async move {
            eventually_or_log(why, CONVERGE, op, || {
                let (pools, hpas) = (pools.clone(), hpas.clone());
                async move {
                    let pool = pools.get("agents").await.ok()?;
                    let s = pool.status?;
                    let current = hpas.get("agents").await.ok()?.status?.current_replicas;
                    let counts = [pool.spec.replicas, s.replicas, s.ready_replicas];
                    (counts == [n; 3] && current == Some(n)).then_some(())
                }
            })
            .await
        }
    };
    desired(2, "the HPA raised the pool to its minReplicas").await;
    pools
        .patch(
            "agents",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .expect("scale the pool past the HPA's max");
    desired(3, "the HPA lowered the pool to its maxReplicas").await;
    let scale = pools.get_scale("agents").await.expect("the pool's scale");
    let status = scale.status.expect("the scale's status");
    let selector = status.selector.expect("the scale's selector");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let selected = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("the selector parses")
        .items;
    let live = selected
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none());
    assert_eq!((status.replicas, live.count()), (3, 3), "{selector}");
}

/// `sandboxrun_pool_pods{pool_namespace=ns, pool, state}` on the operator's metrics at `port`.
async fn pool_pods_metric(port: u16, ns: &str, pool: &str, state: &str) -> Option<i64> {
    let series = format!(
        "sandboxrun_pool_pods{{pool=\"{pool}\",pool_namespace=\"{ns}\",state=\"{state}\"}}"
    );
    // The gauge's values are whole counts.
    operator_metric(port, &series).await.map(|v| v as i64)
}

/// Issue #54 item 4: the metric an autoscaler scales a pool on. The operator's `/metrics` say a
/// pool's ready pods, then its claimed one once a pod carries a claim's label, and nothing of it
/// once the pool is deleted.
#[tokio::test]
async fn a_pools_ready_and_claimed_pods_are_on_the_operators_metrics_until_it_is_deleted() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "warm-metric").await;
    let secret = egress_secret_file();
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let op = warm_operator(&ns.name, secret.path(), &["--metrics-addr", &metrics]);
    make_pool(&client, &ns.name, "agents", None, 2).await;
    let pools: Api<SandboxRunPool> = Api::namespaced(client.clone(), &ns.name);
    pool_ready(&pools, "agents", 2, &op).await;
    let ns_name = ns.name.clone();
    let seen = |state: &'static str, n: i64| {
        let ns_name = ns_name.clone();
        async move { (pool_pods_metric(port, &ns_name, "agents", state).await == Some(n)).then_some(()) }
    };
    eventually_or_log("2 ready pool pods on /metrics", CONVERGE, &op, || {
        seen("ready", 2)
    })
    .await;
    eventually_or_log("0 claimed pool pods on /metrics", CONVERGE, &op, || {
        seen("claimed", 0)
    })
    .await;
    // A claim's labels on one ready pod (kwok serves no attach, so no run's claim completes
    // here): the pool counts it claimed and makes another.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let unclaimed = format!("{POOL_LABEL}=agents,!{CLAIMED_BY_LABEL}");
    let taken = pods
        .list(&ListParams::default().labels(&unclaimed))
        .await
        .expect("list pool pods")
        .items
        .into_iter()
        .next()
        .expect("a pool pod");
    let claim = json!({"metadata": {"labels": {CLAIMED_BY_LABEL: "a-runs-uid"}}});
    pods.patch(
        &taken.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&claim),
    )
    .await
    .expect("claim a pool pod");
    eventually_or_log("1 claimed pool pod on /metrics", CONVERGE, &op, || {
        seen("claimed", 1)
    })
    .await;
    eventually_or_log("2 ready again on /metrics", CONVERGE, &op, || {
        seen("ready", 2)
    })
    .await;
    pools
        .delete("agents", &Default::default())
        .await
        .expect("delete the pool");
    eventually_or_log("the deleted pool's series gone", CONVERGE, &op, || {
        let ns_name = ns_name.clone();
        async move {
            pool_pods_metric(port, &ns_name, "agents", "ready")
                .await
                .is_none()
                .then_some(())
        }
    })
    .await;
}
