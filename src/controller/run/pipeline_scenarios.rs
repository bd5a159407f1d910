//! Scenarios for one whole reconcile ([`pipeline::reconcile`]) against a routing mock apiserver
//! (no cluster): the requests it sends, in order, with their bodies, and the step and requeue it
//! returns — the finalizer added first, the pod created (after its NetworkPolicy), a refused pod
//! reported, a pod name another owns left alone, and a deleted run released (its stored files
//! deleted first with retention Delete).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde_json::{json, Value};

use super::pipeline::{self, Reconciled};
use super::plan::testing::deleting;
use super::plan::{Requeue, LOOK_AGAIN_MARGIN, NAME_CONFLICT_REQUEUE, SETTLE};
use crate::api::{
    NetworkMode, NetworkPolicy, Phase, Retention, SandboxRun, SandboxRunStatus, FINALIZER,
    SKIP_DRAIN_ANNOTATION,
};
use crate::controller::context::Context;
use crate::controller::testkit::fixtures::{now, run_with};
use crate::controller::testkit::mock_apiserver::{apiserver, context, status_failure, Route};
use crate::identity::RunId;
use crate::pod::HOLDER_CONTAINER;

const RUN: &str = "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxruns/demo";
const STATUS: &str = "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxruns/demo/status";
const PODS: &str = "/api/v1/namespaces/ns/pods";
const POD: &str = "/api/v1/namespaces/ns/pods/demo-sbr";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events";
const POLICIES: &str = "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/";

/// A run `demo` in `ns` (uid u1, resourceVersion 7) that declares `/out`, with the finalizer
/// ([`run_with`]).
pub(crate) fn run() -> SandboxRun {
    let mut run = run_with(&[("/out", false)]);
    run.metadata.resource_version = Some("7".into());
    run
}

/// The run as the apiserver returns it after a write.
pub(crate) fn written(run: &SandboxRun) -> Value {
    let mut after = run.clone();
    after.metadata.resource_version = Some("8".into());
    serde_json::to_value(after).unwrap()
}

/// Routes every write a reconcile of `run` may make (its pod absent unless routed before).
fn routes(run: &SandboxRun, pod_get: Route) -> Vec<Route> {
    vec![
        pod_get,
        Route::fixed("PATCH", RUN, 200, written(run)),
        Route::echo("POST", EVENTS, 201),
        Route::echo("PATCH", POLICIES, 200),
        Route::with("POST", PODS, |seen| {
            let mut pod = seen.body.clone();
            pod["metadata"]["uid"] = json!("p1");
            (201, pod)
        }),
    ]
}

fn no_pod() -> Route {
    Route::fixed(
        "GET",
        POD,
        404,
        status_failure(404, "NotFound", "pods \"demo-sbr\" not found"),
    )
}

async fn reconcile(ctx: Context, run: SandboxRun) -> Reconciled {
    pipeline::reconcile(&Arc::new(ctx), &Arc::new(run), now())
        .await
        .expect("the reconcile succeeds")
}

/// The JSON merge patch of the finalizers a run at resourceVersion 7 is sent.
fn finalizer_patch(finalizers: &[&str]) -> Value {
    json!({"metadata": {"finalizers": finalizers, "resourceVersion": "7"}})
}

/// Routes for a fresh run `r` (no finalizer) whose finalizer patch stores `stored`.
fn fresh_routes(r: &SandboxRun, stored: &SandboxRun) -> Vec<Route> {
    let mut routes = vec![no_pod(), Route::fixed("PATCH", RUN, 200, written(stored))];
    routes.extend(routes_after_the_run(r));
    routes
}

/// [`routes`] without its pod's GET and the run's PATCH.
fn routes_after_the_run(r: &SandboxRun) -> Vec<Route> {
    routes(r, no_pod()).into_iter().skip(2).collect()
}

#[tokio::test]
async fn a_fresh_run_gets_the_finalizer_then_its_pod_in_the_same_reconcile() {
    let mut r = run();
    r.metadata.finalizers = None;
    let stored = run();
    let (client, log) = apiserver(fresh_routes(&r, &stored));
    let done = reconcile(context(client, Arc::new(InMemory::new())), r).await;
    assert_eq!(done.step, Some("create_pod"));
    assert_eq!(done.requeue, Requeue::After(SETTLE + LOOK_AGAIN_MARGIN));
    // One read of the pod: the pod follows the finalizer on what this reconcile read.
    assert_eq!(
        log.lines(),
        [
            format!("GET {POD}"),
            format!("PATCH {RUN}"),
            format!("POST {PODS}")
        ]
    );
    let patch = &log.exactly("PATCH", RUN)[0];
    assert_eq!(patch.content_type, "application/merge-patch+json");
    assert_eq!(patch.body, finalizer_patch(&[FINALIZER]));
    let created: Pod = serde_json::from_value(log.matching("POST", PODS)[0].body.clone())
        .expect("the body is a Pod");
    assert_eq!(created.metadata.name.as_deref(), Some("demo-sbr"));
}

#[tokio::test]
async fn a_finalizer_patch_that_stored_more_waits_for_the_run_to_be_read_again() {
    // What the patch stored besides the finalizer (a mutating webhook's label, a spec it
    // changed, a deletion, no finalizer at all): nothing follows on the run this reconcile read.
    let mut labelled = run();
    labelled.metadata.labels = Some([("added".to_string(), "x".to_string())].into());
    let mut changed = run();
    changed.spec.image = Some("other:1".into());
    let mut deleted = run();
    deleted.metadata.deletion_timestamp = deleting(run()).metadata.deletion_timestamp;
    let mut unfinalized = run();
    unfinalized.metadata.finalizers = None;
    for stored in [labelled, changed, deleted, unfinalized] {
        let mut r = run();
        r.metadata.finalizers = None;
        let (client, log) = apiserver(fresh_routes(&r, &stored));
        let done = reconcile(context(client, Arc::new(InMemory::new())), r).await;
        assert_eq!(done.step, Some("add_finalizer"));
        assert_eq!(done.requeue, Requeue::AwaitChange);
        assert_eq!(log.lines(), [format!("GET {POD}"), format!("PATCH {RUN}")]);
    }
}

/// The containers of a pod body (init containers too: the holder may be a native sidecar).
fn container_names(pod: &Value) -> Vec<String> {
    ["containers", "initContainers"]
        .iter()
        .flat_map(|k| pod["spec"][k].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn a_run_without_a_pod_gets_its_pod_and_is_looked_at_again_after_the_quiet_window() {
    let r = run();
    let (client, log) = apiserver(routes(&r, no_pod()));
    let done = reconcile(context(client, Arc::new(InMemory::new())), r).await;
    assert_eq!(done.step, Some("create_pod"));
    // A fresh run's pod is reported only if it still starts after the quiet window.
    assert_eq!(done.requeue, Requeue::After(SETTLE + LOOK_AGAIN_MARGIN));
    assert_eq!(log.lines(), [format!("GET {POD}"), format!("POST {PODS}")]);
    let created = &log.matching("POST", PODS)[0].body;
    let pod: Pod = serde_json::from_value(created.clone()).expect("the body is a Pod");
    assert_eq!(pod.metadata.name.as_deref(), Some("demo-sbr"));
    assert_eq!(pod.metadata.namespace.as_deref(), Some("ns"));
    let owner = &pod.metadata.owner_references.unwrap_or_default()[0];
    assert_eq!((owner.uid.as_str(), owner.controller), ("u1", Some(true)));
    assert!(
        container_names(created)
            .iter()
            .any(|n| n == HOLDER_CONTAINER),
        "{:?}",
        container_names(created)
    );
}

#[tokio::test]
async fn a_restricted_runs_network_policy_is_applied_before_its_pod_is_created() {
    let mut r = run();
    // An allowlist with no rule denies all egress: a NetworkPolicy (enforced by default).
    r.spec.network = Some(NetworkPolicy {
        mode: NetworkMode::Allowlist,
        rules: Vec::new(),
    });
    let (client, log) = apiserver(routes(&r, no_pod()));
    let done = reconcile(context(client, Arc::new(InMemory::new())), r).await;
    assert_eq!(done.step, Some("create_pod"));
    let lines = log.lines();
    let applied = lines
        .iter()
        .position(|l| l.starts_with(&format!("PATCH {POLICIES}")))
        .unwrap_or_else(|| panic!("no policy applied: {lines:?}"));
    let created = lines
        .iter()
        .position(|l| *l == format!("POST {PODS}"))
        .unwrap_or_else(|| panic!("no pod created: {lines:?}"));
    assert!(applied < created, "{lines:?}");
    let apply = &log.matching("PATCH", POLICIES)[0];
    assert_eq!(apply.content_type, "application/apply-patch+yaml");
    assert!(
        apply.uri.contains("fieldManager=sandboxrun-operator"),
        "{}",
        apply.uri
    );
    assert_eq!(apply.body["kind"], "NetworkPolicy");
    assert_eq!(apply.body["apiVersion"], "networking.k8s.io/v1");
    assert_eq!(apply.body["metadata"]["namespace"], "ns");
    assert!(
        apply.body["spec"]["policyTypes"]
            .as_array()
            .is_some_and(|t| t.contains(&json!("Egress"))),
        "{}",
        apply.body
    );
}

#[tokio::test]
async fn a_forbidden_pod_is_reported_not_ready_and_retried_after_the_back_off() {
    let r = run();
    let words = "pods \"demo-sbr\" is forbidden: exceeded quota: compute";
    let mut table = vec![Route::fixed(
        "POST",
        PODS,
        403,
        status_failure(403, "Forbidden", words),
    )];
    table.extend(routes(&r, no_pod()));
    let (client, log) = apiserver(table);
    let done = reconcile(context(client, Arc::new(InMemory::new())), r).await;
    assert_eq!(done.step, Some("create_pod"));
    assert_eq!(done.requeue, Requeue::After(Duration::from_millis(10_200)));
    assert_eq!(
        log.lines(),
        [
            format!("GET {POD}"),
            format!("POST {PODS}"),
            format!("POST {EVENTS}"),
            format!("PATCH {STATUS}"),
        ]
    );
    let event = &log.matching("POST", EVENTS)[0].body;
    assert_eq!(
        (event["type"].as_str(), event["reason"].as_str()),
        (Some("Warning"), Some("PodCreateFailed"))
    );
    let status = &log.matching("PATCH", STATUS)[0].body["status"];
    let ready: Vec<&Value> = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] == "Ready")
        .collect();
    assert_eq!(ready.len(), 1, "{status}");
    assert_eq!(
        (ready[0]["status"].as_str(), ready[0]["reason"].as_str()),
        (Some("False"), Some("PodCreateFailed"))
    );
    assert!(
        status["message"].as_str().unwrap().contains(words),
        "{status}"
    );
}

#[tokio::test]
async fn a_pod_with_the_runs_name_that_another_owns_is_left_alone_and_told() {
    let r = run();
    let mut other = Pod::default();
    other.metadata.name = Some("demo-sbr".into());
    other.metadata.namespace = Some("ns".into());
    other.metadata.uid = Some("someone-else".into());
    let pod_get = Route::fixed("GET", POD, 200, serde_json::to_value(&other).unwrap());
    let (client, log) = apiserver(routes(&r, pod_get));
    let done = reconcile(context(client, Arc::new(InMemory::new())), r).await;
    assert_eq!(done.step, None);
    assert_eq!(done.requeue, Requeue::After(NAME_CONFLICT_REQUEUE));
    let lines = log.lines();
    assert!(
        !lines
            .iter()
            .any(|l| (l.starts_with("POST ") || l.starts_with("DELETE ")) && l.contains("/pods")),
        "{lines:?}"
    );
    let events = log.matching("POST", EVENTS);
    assert_eq!(events.len(), 1, "{lines:?}");
    assert_eq!(events[0].body["reason"], "PodNameConflict");
    assert_eq!(events[0].body["type"], "Warning");
    assert_eq!(events[0].body["related"]["uid"], "someone-else");
}

/// `run` finished (Succeeded), so a delete has nothing left to drain.
fn finished(mut run: SandboxRun) -> SandboxRun {
    run.status = Some(SandboxRunStatus {
        phase: Some(Phase::Succeeded),
        pod_name: Some("demo-sbr".into()),
        ..Default::default()
    });
    run
}

#[tokio::test]
async fn a_deleted_finished_run_is_released_by_removing_only_its_finalizer() {
    let mut r = deleting(finished(run()));
    r.metadata.finalizers = Some(vec!["other.example/keep".into(), FINALIZER.into()]);
    let (client, log) = apiserver(routes(&r, no_pod()));
    let done = reconcile(context(client, Arc::new(InMemory::new())), r).await;
    assert_eq!(done.step, Some("release_finalizer"));
    assert_eq!(done.requeue, Requeue::AwaitChange);
    assert_eq!(log.lines(), [format!("GET {POD}"), format!("PATCH {RUN}")]);
    let patch = &log.exactly("PATCH", RUN)[0];
    assert_eq!(patch.content_type, "application/merge-patch+json");
    assert_eq!(patch.body, finalizer_patch(&["other.example/keep"]));
}

#[tokio::test]
async fn skip_drain_releases_a_running_run_at_once_and_says_so() {
    let mut r = deleting(run());
    r.status = Some(SandboxRunStatus {
        phase: Some(Phase::Running),
        ..Default::default()
    });
    r.metadata.annotations = Some([(SKIP_DRAIN_ANNOTATION.to_string(), "true".to_string())].into());
    let (client, log) = apiserver(routes(&r, no_pod()));
    let done = reconcile(context(client, Arc::new(InMemory::new())), r).await;
    assert_eq!(done.step, Some("skip_drain"));
    assert_eq!(
        log.lines(),
        [
            format!("GET {POD}"),
            format!("POST {EVENTS}"),
            format!("PATCH {RUN}")
        ]
    );
    assert_eq!(
        log.matching("POST", EVENTS)[0].body["reason"],
        "DrainSkipped"
    );
    assert_eq!(log.exactly("PATCH", RUN)[0].body, finalizer_patch(&[]));
}

/// Puts `keys` in `store`, one small object each.
async fn stored(store: &InMemory, keys: &[Path]) {
    for key in keys {
        store.put(key, PutPayload::from_static(b"x")).await.unwrap();
    }
}

/// Every key in `store`.
pub(super) async fn keys_in(store: &InMemory) -> Vec<String> {
    use futures::TryStreamExt;
    let mut keys: Vec<String> = store
        .list(None)
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap();
    keys.sort();
    keys
}

#[tokio::test]
async fn retention_delete_deletes_the_runs_files_before_its_finalizer_is_removed() {
    let mut r = deleting(finished(run()));
    if let Some(read_back) = r.spec.read_back.as_mut() {
        read_back.retention = Some(Retention::Delete);
    }
    let prefix = Path::from("runs");
    let own = RunId {
        namespace: "ns".into(),
        name: "demo".into(),
        uid: "u1".into(),
    };
    let older = RunId {
        uid: "u0".into(),
        ..own.clone()
    };
    let dir = crate::store::run_dir(&prefix, &own);
    let manifest = crate::store::keys::manifest_key(&prefix, &own, 0, "/out");
    let archive = dir.clone().join("00-out.tar");
    let kept = crate::store::keys::manifest_key(&prefix, &older, 0, "/out");
    let store = Arc::new(InMemory::new());
    stored(&store, &[manifest.clone(), archive.clone(), kept.clone()]).await;
    // What the store holds when the finalizer patch arrives.
    let at_release = Arc::new(std::sync::Mutex::new(None));
    let (seen_store, seen) = (Arc::clone(&store), Arc::clone(&at_release));
    let body = written(&r);
    let release = Route::with("PATCH", RUN, move |_| {
        let keys = futures::executor::block_on(keys_in(&seen_store));
        *seen.lock().unwrap() = Some(keys);
        (200, body.clone())
    });
    let mut table = vec![release];
    table.extend(routes(&r, no_pod()));
    let (client, log) = apiserver(table);
    let done = reconcile(context(client, Arc::clone(&store)), r).await;
    assert_eq!(done.step, Some("release_finalizer"));
    assert_eq!(
        keys_in(&store).await,
        [kept.to_string()],
        "only the run's own files go"
    );
    assert_eq!(
        *at_release.lock().unwrap(),
        Some(vec![kept.to_string()]),
        "deleted before the finalizer is removed"
    );
    let lines = log.lines();
    assert_eq!(lines.last(), Some(&format!("PATCH {RUN}")), "{lines:?}");
    assert_eq!(log.exactly("PATCH", RUN)[0].body, finalizer_patch(&[]));
    assert!(log.matching("DELETE", PODS).is_empty(), "{lines:?}");
}

/// Issue #53: an upgrade that applied the older CRDs only (the docs named three of the four)
/// leaves no SandboxRunPool resource: with warm pools on, the claim's list of the namespace's
/// pools is answered 404. A templated run starts cold; on the old code the reconcile failed on
/// that list, every time, and no templated run ever got a pod.
#[tokio::test]
async fn a_templated_run_starts_cold_when_the_pool_crd_is_not_installed() {
    let mut r = run();
    r.spec = crate::api::SandboxRunSpec {
        template_ref: Some(crate::api::TemplateRef {
            kind: Default::default(),
            name: "agent-tools".into(),
        }),
        command: Some(vec!["sh".into(), "-c".into(), "true".into()]),
        ..Default::default()
    };
    let template = json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRunTemplate",
        "metadata": {"name": "agent-tools", "namespace": "ns", "generation": 1},
        "spec": {
            "template": {
                "image": "registry.example/tools@sha256:0000000000000000000000000000000000000000000000000000000000000000",
                "user": "1000",
                "readBack": {"paths": [{"path": "/out"}]},
            },
            "openFields": ["command"],
        },
    });
    let mut all = vec![Route::fixed(
        "GET",
        "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxruntemplates/agent-tools",
        200,
        template,
    )];
    all.extend(routes(&r, no_pod()));
    let (client, log) = apiserver(all);
    // The template is a right its author must hold: trusted here (the stamp is not the point).
    let rights = crate::policy::stamp::RightsPolicy {
        unadmitted: crate::policy::stamp::UnadmittedReferences::Trust,
        key: None,
    };
    let ctx = context(client, Arc::new(InMemory::new()))
        .with_warm_pools(true)
        .with_rights(rights);
    let done = reconcile(ctx, r).await;
    assert_eq!(done.step, Some("create_pod"));
    let pools = "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxrunpools";
    assert!(
        log.lines().iter().any(|l| l == &format!("GET {pools}")),
        "the pools were asked: {:?}",
        log.lines()
    );
    assert_eq!(
        log.matching("POST", PODS).len(),
        1,
        "the cold pod: {:?}",
        log.lines()
    );
}

/// The claim's cold start (issue #57 item 1 pins it before it becomes planned effects): a
/// templated run whose pool has no ready pod counts a miss on the pool (read, then a merge patch
/// guarded by its resourceVersion), then records why it starts cold in its status, and gets no
/// pod in this reconcile (looked at again soon, then created cold).
#[tokio::test]
async fn a_templated_run_whose_pool_has_no_ready_pod_counts_a_miss_then_records_its_cold_start() {
    let mut r = run();
    r.spec = crate::api::SandboxRunSpec {
        template_ref: Some(crate::api::TemplateRef::namespaced("agent-tools")),
        command: Some(vec!["sh".into(), "-c".into(), "true".into()]),
        ..Default::default()
    };
    let template = json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRunTemplate",
        "metadata": {"name": "agent-tools", "namespace": "ns", "generation": 1},
        "spec": {
            "template": {
                "image": "registry.example/tools@sha256:0000000000000000000000000000000000000000000000000000000000000000",
                "user": "1000",
                "readBack": {"paths": [{"path": "/out"}]},
            },
            "openFields": ["command"],
        },
    });
    let pools = "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxrunpools";
    let mut pool = crate::api::SandboxRunPool::new(
        "agents",
        crate::api::SandboxRunPoolSpec {
            template_ref: crate::api::TemplateRef::namespaced("agent-tools"),
            replicas: 1,
        },
    );
    pool.metadata.namespace = Some("ns".into());
    pool.metadata.uid = Some("pool-uid".into());
    pool.metadata.resource_version = Some("3".into());
    let pool = serde_json::to_value(pool).unwrap();
    let list = |kind: &str, items: Vec<Value>| json!({"apiVersion": "v1", "kind": kind, "metadata": {}, "items": items});
    let mut all = vec![
        Route::fixed(
            "GET",
            "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxruntemplates/agent-tools",
            200,
            template,
        ),
        Route::fixed("GET", &format!("{pools}/agents"), 200, pool.clone()),
        Route::fixed("PATCH", &format!("{pools}/agents"), 200, pool.clone()),
        Route::fixed("GET", pools, 200, list("SandboxRunPoolList", vec![pool])),
        no_pod(),
        Route::fixed("GET", PODS, 200, list("PodList", vec![])),
    ];
    all.extend(routes(&r, no_pod()));
    let (client, log) = apiserver(all);
    let rights = crate::policy::stamp::RightsPolicy {
        unadmitted: crate::policy::stamp::UnadmittedReferences::Trust,
        key: None,
    };
    let ctx = context(client, Arc::new(InMemory::new()))
        .with_warm_pools(true)
        .with_rights(rights);
    let done = reconcile(ctx, r).await;
    let writes: Vec<String> = log
        .lines()
        .into_iter()
        .filter(|l| !l.starts_with("GET "))
        .collect();
    assert_eq!(
        writes,
        [
            format!("PATCH {pools}/agents/status"),
            format!("PATCH {STATUS}")
        ],
        "{:?}",
        log.lines()
    );
    let miss = &log.exactly("PATCH", &format!("{pools}/agents/status"))[0];
    assert_eq!(
        miss.body,
        json!({"metadata": {"resourceVersion": "3"}, "status": {"misses": 1}})
    );
    let recorded = &log.exactly("PATCH", STATUS)[0].body["status"]["warmStart"];
    assert_eq!(recorded["pool"], "agents");
    assert!(recorded["coldReason"].is_string(), "{recorded}");
    assert!(
        matches!(done.requeue, Requeue::After(_)),
        "{:?}",
        done.requeue
    );
}

/// Issue #54: a templated run whose env takes a value from a Secret, held `RightsUnverified`
/// (no admission stamp proves its author may read that Secret), is never handed a pool pod: no
/// pool is asked, no Secret is read, no pod is claimed or created.
#[tokio::test]
async fn a_run_whose_rights_are_unverified_never_claims_a_pool_pod_nor_reads_its_secret() {
    let mut r = run();
    let spec = json!({
        "templateRef": {"name": "agent-tools"},
        "command": ["sh", "-c", "true"],
        "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}],
    });
    r.spec = serde_json::from_value(spec).unwrap();
    let template = json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRunTemplate",
        "metadata": {"name": "agent-tools", "namespace": "ns", "generation": 1},
        "spec": {
            "template": {
                "image": "registry.example/tools@sha256:0000000000000000000000000000000000000000000000000000000000000000",
                "user": "1000",
                "readBack": {"paths": [{"path": "/out"}]},
            },
            "openFields": ["command", "env"],
        },
    });
    let mut all = vec![Route::fixed(
        "GET",
        "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxruntemplates/agent-tools",
        200,
        template,
    )];
    all.extend(routes(&r, no_pod()));
    let (client, log) = apiserver(all);
    // The default: a run without a stamp is held (and here no key can verify one).
    let ctx = context(client, Arc::new(InMemory::new())).with_warm_pools(true);
    let _ = reconcile(ctx, r).await;
    let lines = log.lines();
    let touched = |what: &str| lines.iter().any(|l| l.contains(what));
    assert!(!touched("sandboxrunpools"), "a pool was asked: {lines:?}");
    assert!(!touched("/secrets/"), "a Secret was read: {lines:?}");
    assert!(log.matching("PATCH", PODS).is_empty(), "{lines:?}");
    assert!(log.matching("POST", PODS).is_empty(), "{lines:?}");
    let status = &log.exactly("PATCH", STATUS);
    assert!(
        status
            .iter()
            .any(|s| s.body.to_string().contains("RightsUnverified")),
        "{lines:?}"
    );
}

/// A run queued in `lq` (recorded in its status, `Queued=False Admitted` said) whose Workload
/// Kueue admitted, its label removed since: never its pod (docs/contract.md "Quota cannot be
/// edited away"). On the old code the gate keyed on the live label: the pod was created at once,
/// the Workload never read again.
#[tokio::test]
async fn a_queued_run_whose_queue_label_was_removed_gets_no_pod_even_when_admitted() {
    let mut r = run();
    let mut status = SandboxRunStatus {
        phase: Some(Phase::Pending),
        queue: Some("lq".into()),
        ..Default::default()
    };
    crate::controller::conditions::set_condition(
        &mut status.conditions,
        crate::controller::conditions::QUEUED,
        false,
        "Admitted",
        "admitted by Kueue to ClusterQueue cq",
        None,
        now(),
    );
    r.status = Some(status);
    let workload = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": "demo-sbr", "namespace": "ns", "resourceVersion": "3",
            "ownerReferences": [{"apiVersion": "sandbox.iterion.io/v1alpha1", "kind": "SandboxRun",
                "name": "demo", "uid": "u1", "controller": true}]},
        "spec": {"queueName": "lq"},
        "status": {"admission": {"clusterQueue": "cq"},
            "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                           {"type": "Admitted", "status": "True", "reason": "Admitted"}]},
    });
    let mut routes = vec![Route::fixed(
        "GET",
        "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads/demo-sbr",
        200,
        workload,
    )];
    routes.extend(self::routes(&r, no_pod()));
    routes.push(Route::echo("PATCH", STATUS, 200));
    let (client, log) = apiserver(routes);
    let ctx = context(client, Arc::new(InMemory::new())).with_kueue(true);
    reconcile(ctx, r).await;
    assert!(
        log.matching("POST", PODS).is_empty(),
        "no pod: {:?}",
        log.lines()
    );
    let written = log.matching("PATCH", STATUS);
    let queued = written
        .last()
        .and_then(|s| s.body["status"]["conditions"].as_array().cloned())
        .unwrap_or_default();
    assert!(
        queued
            .iter()
            .any(|c| c["type"] == "Queued" && c["reason"] == "QueueLabelChanged"),
        "{:?}",
        log.lines()
    );
}

/// A run queued in `lq` at WorkloadPriorityClass `low`, admitted, its pod running, whose
/// `kueue.x-k8s.io/priority-class` label was changed to `high` past the webhook (docs/contract.md
/// "A queued run keeps the queue and priority it was queued with"): one reconcile says it — a
/// Warning Event `QueueLabelEditIgnored`, `LabelEditIgnored=True` — and writes nothing to the
/// Workload. On the old code the reconcile went on with nothing said.
#[tokio::test]
async fn a_running_queued_runs_priority_label_edit_is_said_and_its_workload_untouched() {
    let mut r = run();
    let labels = r.metadata.labels.get_or_insert_with(Default::default);
    labels.insert(crate::kueue::QUEUE_LABEL.into(), "lq".into());
    labels.insert(crate::kueue::PRIORITY_LABEL.into(), "high".into());
    let mut status = SandboxRunStatus {
        phase: Some(Phase::Running),
        pod_name: Some("demo-sbr".into()),
        queue: Some("lq".into()),
        ..Default::default()
    };
    crate::controller::conditions::set_condition(
        &mut status.conditions,
        crate::controller::conditions::QUEUED,
        false,
        "Admitted",
        "admitted by Kueue to ClusterQueue cq",
        None,
        now(),
    );
    r.status = Some(status);
    let mut pod = super::plan::testing::a_pod(true, true);
    pod.metadata.name = Some("demo-sbr".into());
    pod.metadata.namespace = Some("ns".into());
    pod.metadata.uid = Some("p1".into());
    // Ready, as its Workload's PodsReady=True says: nothing else to write to the Workload.
    if let Some(status) = pod.status.as_mut() {
        status.conditions = Some(vec![k8s_openapi::api::core::v1::PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        }]);
    }
    pod.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "sandbox.iterion.io/v1alpha1".into(),
            kind: "SandboxRun".into(),
            name: "demo".into(),
            uid: "u1".into(),
            controller: Some(true),
            ..Default::default()
        },
    ]);
    let workload = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": "demo-sbr", "namespace": "ns", "resourceVersion": "3",
            "ownerReferences": [{"apiVersion": "sandbox.iterion.io/v1alpha1", "kind": "SandboxRun",
                "name": "demo", "uid": "u1", "controller": true}]},
        "spec": {"queueName": "lq", "priority": 10, "priorityClassRef":
            {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "low"}},
        "status": {"admission": {"clusterQueue": "cq"},
            "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                           {"type": "Admitted", "status": "True", "reason": "Admitted"},
                           {"type": "PodsReady", "status": "True", "reason": "Started"}]},
    });
    const WORKLOAD: &str = "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads/demo-sbr";
    let mut routes = vec![
        Route::fixed("GET", WORKLOAD, 200, workload),
        Route::echo("PATCH", WORKLOAD, 200),
    ];
    let pod_get = Route::fixed("GET", POD, 200, serde_json::to_value(&pod).unwrap());
    routes.extend(self::routes(&r, pod_get));
    routes.push(Route::echo("PATCH", STATUS, 200));
    let (client, log) = apiserver(routes);
    let ctx = context(client, Arc::new(InMemory::new())).with_kueue(true);
    reconcile(ctx, r).await;
    let lines = log.lines();
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("/workloads/") && !l.starts_with("GET ")),
        "the Workload is not touched: {lines:?}"
    );
    let events = log.matching("POST", EVENTS);
    assert!(
        events
            .iter()
            .any(|e| e.body["reason"] == "QueueLabelEditIgnored" && e.body["type"] == "Warning"),
        "{lines:?}"
    );
    let written = log.matching("PATCH", STATUS);
    let conditions = written
        .last()
        .and_then(|s| s.body["status"]["conditions"].as_array().cloned())
        .unwrap_or_default();
    assert!(
        conditions.iter().any(|c| c["type"] == "LabelEditIgnored"
            && c["status"] == "True"
            && c["reason"] == "PriorityLabelChanged"),
        "{lines:?}"
    );
}

/// A run labelled for a Kueue queue while the operator runs without `--kueue` (docs/contract.md
/// "A queue label the operator does not honour is said, not ignored"): before its pod,
/// `Queued=False KueueDisabled` and a Warning Event `QueueIgnored`; on the old code the pod was
/// created at once and nothing said the label was ignored.
#[tokio::test]
async fn a_run_labelled_for_a_queue_without_kueue_says_so_before_it_runs_unqueued() {
    let mut r = run();
    r.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(crate::kueue::QUEUE_LABEL.into(), "lq".into());
    let mut routes = routes(&r, no_pod());
    routes.push(Route::echo("PATCH", STATUS, 200));
    let (client, log) = apiserver(routes);
    reconcile(context(client, Arc::new(InMemory::new())), r).await;
    assert!(
        log.matching("POST", PODS).is_empty(),
        "said first, the pod on the next reconcile: {:?}",
        log.lines()
    );
    let events = log.matching("POST", EVENTS);
    assert!(
        events
            .iter()
            .any(|e| e.body["reason"] == "QueueIgnored" && e.body["type"] == "Warning"),
        "{:?}",
        log.lines()
    );
    let written = log.matching("PATCH", STATUS);
    let conditions = written
        .last()
        .and_then(|s| s.body["status"]["conditions"].as_array().cloned())
        .unwrap_or_default();
    assert!(
        conditions.iter().any(|c| c["type"] == "Queued"
            && c["status"] == "False"
            && c["reason"] == "KueueDisabled"),
        "{:?}",
        log.lines()
    );
}

/// A run with `spec.workspace.restore: Latest` at its second attempt (the first ended, paused).
fn resuming() -> SandboxRun {
    let mut r = run();
    r.spec.workspace = Some(crate::api::Workspace {
        restore: crate::api::WorkspaceRestore::Latest,
        ..Default::default()
    });
    r.status = Some(SandboxRunStatus {
        phase: Some(Phase::Pending),
        attempt: Some(2),
        attempts: vec![crate::api::AttemptStatus {
            index: 1,
            pod_name: "demo-sbr".into(),
            reason: "Suspended".into(),
            ..Default::default()
        }],
        ..Default::default()
    });
    r
}

const POD_A2: &str = "/api/v1/namespaces/ns/pods/demo-sbr-a2";

/// The resumed run at attempt 2, Running, and its pod: parked in the launcher, workload and
/// holder running (the restore is due).
fn resumed_and_parked() -> (SandboxRun, Value) {
    let mut r = resuming();
    if let Some(s) = r.status.as_mut() {
        s.pod_name = Some("demo-sbr-a2".into());
        s.phase = Some(Phase::Running);
    }
    let settings = crate::pod::PodSettings::default();
    let built = crate::pod::build_pod(&r, &settings).unwrap();
    let mut pod = crate::pool::park::park_in_launcher(built, &settings).unwrap();
    pod.metadata.uid = Some("p2".into());
    pod.status = Some(serde_json::from_value(json!({
        "phase": "Running",
        "containerStatuses": [
            {"name": crate::pod::WORKLOAD_CONTAINER, "ready": true, "restartCount": 0, "image": "img", "imageID": "", "state": {"running": {}}},
            {"name": HOLDER_CONTAINER, "ready": true, "restartCount": 0, "image": "img", "imageID": "", "state": {"running": {}}}
        ]
    }))
    .unwrap());
    (r, serde_json::to_value(&pod).unwrap())
}

/// docs/contract.md "Pause, resume and fork": the resumed attempt's pod is created parked in the
/// launcher (its command the launcher's, its workload waiting for the start), never started
/// with its paths empty. Fails on the old code: the pod ran the run's command at once.
#[tokio::test]
async fn a_resumed_attempts_pod_is_created_parked_until_its_paths_are_restored() {
    let r = resuming();
    let no_pod = Route::fixed("GET", POD_A2, 404, status_failure(404, "NotFound", "no"));
    let (client, log) = apiserver(routes(&r, no_pod));
    let done = reconcile(context(client, Arc::new(InMemory::new())), r).await;
    assert_eq!(done.step, Some("create_pod"));
    let created: Pod = serde_json::from_value(log.matching("POST", PODS)[0].body.clone()).unwrap();
    let spec = created.spec.unwrap();
    let workload = spec
        .containers
        .iter()
        .find(|c| c.name == crate::pod::WORKLOAD_CONTAINER)
        .unwrap();
    assert_eq!(
        workload.command.as_ref().unwrap()[0],
        crate::pool::park::launcher_path()
    );
    assert_eq!(workload.stdin_once, Some(false));
}

/// A reconcile of a copy of the run older than this operator's own write of its restore (the
/// watch cache lags; a pod event arrives first): the live run records attempt 2's restore, so
/// nothing is restored again, nothing exec'd in the started pod and nothing written. Fails on
/// the old code: it restored again into the pod whose launcher had started, and wrote that
/// second restore's refusal over the first one's success (`bench/pause_resume.sh`, warm resumes).
#[tokio::test]
async fn a_restore_recorded_after_the_reconciles_copy_was_read_is_never_done_again() {
    let (r, pod_json) = resumed_and_parked();
    let mut live = r.clone();
    if let Some(s) = live.status.as_mut() {
        s.restores = vec![crate::api::RestoreStatus {
            attempt: 2,
            from_attempt: 1,
            files: 2,
            bytes: 10,
            delivered: true,
            ..Default::default()
        }];
    }
    let mut all = routes(&r, Route::fixed("GET", POD_A2, 200, pod_json));
    all.push(Route::fixed(
        "GET",
        RUN,
        200,
        serde_json::to_value(&live).unwrap(),
    ));
    all.push(Route::fixed("PATCH", STATUS, 200, written(&r)));
    let (client, log) = apiserver(all);
    reconcile(context(client, Arc::new(InMemory::new())), r).await;
    let lines = log.lines();
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("/exec") || l.contains("/attach")),
        "nothing exec'd or handed over again: {lines:?}"
    );
    assert!(
        log.matching("PATCH", STATUS).is_empty(),
        "the recorded restore is not overwritten: {lines:?}"
    );
    assert!(
        lines.iter().any(|l| l == &format!("GET {RUN}")),
        "the run read live: {lines:?}"
    );
}

/// The resumed attempt's parked pod runs and attempt 1's manifest is not in the store: the
/// restore fails before anything is exec'd, the launcher is asked (launch-status) before it is
/// handed anything, and — the mock cannot attach — the failure is recorded undelivered: no
/// start, no Event, tried again. Never the run's start after a failed restore.
#[tokio::test]
async fn a_failed_restore_is_recorded_and_never_followed_by_the_runs_start() {
    let (r, pod_json) = resumed_and_parked();
    let mut all = routes(&r, Route::fixed("GET", POD_A2, 200, pod_json));
    all.push(Route::fixed("PATCH", STATUS, 200, written(&r)));
    let (client, log) = apiserver(all);
    reconcile(context(client, Arc::new(InMemory::new())), r).await;
    let lines = log.lines();
    assert!(
        !lines.iter().any(|l| l.contains("/attach")),
        "no start handed over: {lines:?}"
    );
    let patch = &log.matching("PATCH", STATUS);
    let last = &patch.last().expect("the status is written").body;
    let restore = &last["status"]["restores"][0];
    assert_eq!(restore["outcome"], "Failed", "{last}");
    assert_eq!(restore["fromAttempt"], 1);
    assert!(restore.get("delivered").is_none(), "{restore}");
    assert!(
        restore["message"].as_str().unwrap().contains("manifest"),
        "{restore}"
    );
    // launch-status asked before anything is written to the launcher.
    let exec = lines
        .iter()
        .position(|l| l.contains("/exec"))
        .expect("launch-status");
    let status = lines.iter().position(|l| l.contains("/status")).unwrap();
    assert!(exec < status, "{lines:?}");
}

/// Issue #54: a resumed attempt served by a warm pool's pod (`status.warmStart.pod`, sealed by
/// its pool) is restored in that pod as a cold parked one is: attempt 1's manifest is not in the
/// store, so the restore fails and the launcher is to be handed a refusal — never the run's
/// start (the mock cannot attach: the failure is recorded undelivered, tried again). On the old
/// code no run that restores was ever served by a pool pod.
#[tokio::test]
async fn a_warm_pods_failed_restore_is_recorded_and_never_followed_by_the_runs_start() {
    const WARM: &str = "agents-h-x1";
    let warm_path = format!("{PODS}/{WARM}");
    let mut r = resuming();
    if let Some(s) = r.status.as_mut() {
        s.phase = Some(Phase::Running);
        s.warm_start = Some(crate::api::WarmStart {
            pool: "agents".into(),
            pod: Some(WARM.into()),
            cold_reason: None,
            attempt: Some(2),
        });
    }
    let settings = crate::pod::PodSettings::default();
    let built = crate::pod::build_pod(&r, &settings).unwrap();
    let mut pod = crate::pool::park::park_in_launcher(built, &settings).unwrap();
    pod.metadata.name = Some(WARM.into());
    pod.metadata.uid = Some("p2".into());
    let key = crate::policy::stamp::StampKey::new(b"0123456789abcdef0123456789abcdef");
    let pool = crate::pool::pod::label_value("agents");
    let seal = crate::pool::seal::seal_of(&key, &pod, &pool).unwrap();
    pod.metadata.annotations = Some(
        [(crate::pool::seal::SEAL_ANNOTATION.to_string(), seal)]
            .into_iter()
            .collect(),
    );
    pod.status = Some(serde_json::from_value(json!({
        "phase": "Running",
        "containerStatuses": [
            {"name": crate::pod::WORKLOAD_CONTAINER, "ready": true, "restartCount": 0, "image": "img", "imageID": "", "state": {"running": {}}},
            {"name": HOLDER_CONTAINER, "ready": true, "restartCount": 0, "image": "img", "imageID": "", "state": {"running": {}}}
        ]
    }))
    .unwrap());
    let pod_json = serde_json::to_value(&pod).unwrap();
    let mut all = routes(&r, Route::fixed("GET", &warm_path, 200, pod_json));
    all.push(Route::fixed("PATCH", STATUS, 200, written(&r)));
    let (client, log) = apiserver(all);
    let rights = crate::policy::stamp::RightsPolicy {
        unadmitted: crate::policy::stamp::UnadmittedReferences::Trust,
        key: Some(key),
    };
    let ctx = context(client, Arc::new(InMemory::new()))
        .with_warm_pools(true)
        .with_rights(rights);
    reconcile(ctx, r).await;
    let lines = log.lines();
    assert!(
        lines.iter().any(|l| l == &format!("GET {warm_path}")),
        "the warm pod is the run's: {lines:?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("/attach")),
        "no start handed over: {lines:?}"
    );
    let patch = &log.matching("PATCH", STATUS);
    let last = &patch.last().expect("the status is written").body;
    let restore = &last["status"]["restores"][0];
    assert_eq!(restore["outcome"], "Failed", "{last}");
    assert_eq!(restore["fromAttempt"], 1);
    assert!(restore.get("delivered").is_none(), "{restore}");
    assert!(
        restore["message"].as_str().unwrap().contains("manifest"),
        "{restore}"
    );
}

const SOURCE_RUN: &str = "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxruns/a";

/// A run `demo` forked from run `a` (`spec.workspace.from`), at its first attempt.
fn forking() -> SandboxRun {
    let mut r = run();
    r.spec.workspace = Some(crate::api::Workspace {
        from: Some(crate::api::WorkspaceFrom {
            run: "a".into(),
            attempt: None,
            checkpoint: None,
        }),
        ..Default::default()
    });
    r
}

/// Run `a` as the apiserver returns it: uid `uid`, finished after one attempt.
fn source_run(uid: &str) -> Value {
    let mut a = run_with(&[("/out", false)]);
    a.metadata.name = Some("a".into());
    a.metadata.uid = Some(uid.into());
    a.status = Some(SandboxRunStatus {
        phase: Some(Phase::Succeeded),
        ..Default::default()
    });
    serde_json::to_value(a).unwrap()
}

/// docs/contract.md "Pause, resume and fork": with the webhook bypassed, a fork is held like a
/// run naming a Secret — no stamp vouches that its author may read the source, so no pod (and
/// the source is never read). Fails on the old code: the field did not exist; with it and
/// without the `required` row, the pod was created.
#[tokio::test]
async fn a_fork_no_admission_verified_gets_no_pod_and_reads_nothing() {
    let r = forking();
    let mut all = routes(&r, no_pod());
    all.push(Route::fixed("PATCH", STATUS, 200, written(&r)));
    let (client, log) = apiserver(all);
    reconcile(context(client, Arc::new(InMemory::new())), r).await;
    assert!(log.matching("POST", PODS).is_empty(), "{:?}", log.lines());
    assert!(
        !log.lines().iter().any(|l| l.contains("/sandboxruns/a")),
        "{:?}",
        log.lines()
    );
    let patch = log.matching("PATCH", STATUS);
    let last = &patch.last().expect("the status is written").body;
    assert!(last.to_string().contains("RightsUnverified"), "{last}");
}

/// A fork's first pod is created parked in the launcher: its workload waits for the source's
/// files. Fails on the old code: a first attempt was never parked.
#[tokio::test]
async fn a_forks_first_pod_is_created_parked_until_the_sources_files_are_restored() {
    let r = forking();
    let (client, log) = apiserver(routes(&r, no_pod()));
    let rights = crate::policy::stamp::RightsPolicy {
        unadmitted: crate::policy::stamp::UnadmittedReferences::Trust,
        key: None,
    };
    let ctx = context(client, Arc::new(InMemory::new())).with_rights(rights);
    let done = reconcile(ctx, r).await;
    assert_eq!(done.step, Some("create_pod"));
    let created: Pod = serde_json::from_value(log.matching("POST", PODS)[0].body.clone()).unwrap();
    let spec = created.spec.unwrap();
    let workload = spec
        .containers
        .iter()
        .find(|c| c.name == crate::pod::WORKLOAD_CONTAINER)
        .unwrap();
    assert_eq!(
        workload.command.as_ref().unwrap()[0],
        crate::pool::park::launcher_path()
    );
    let annotations = created.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations
            .get("sandbox.iterion.io/fork-from")
            .map(String::as_str),
        Some("a")
    );
}

/// The fork at `attempt` with its parked pod running: the routes of one reconcile that restores.
fn parked_fork(r: &mut SandboxRun, attempt: u32, pod_path: &str) -> Vec<Route> {
    let pod_name = pod_path.rsplit('/').next().unwrap().to_string();
    let status = r.status.get_or_insert_with(Default::default);
    status.pod_name = Some(pod_name);
    status.phase = Some(Phase::Running);
    status.attempt = Some(attempt);
    let settings = crate::pod::PodSettings::default();
    let built = crate::pod::build_pod(r, &settings).unwrap();
    let mut pod = crate::pool::park::park_in_launcher(built, &settings).unwrap();
    pod.metadata.uid = Some("p2".into());
    // The source the pod was created for (`plan::restore::parked_if_due`).
    pod.metadata.annotations =
        Some([("sandbox.iterion.io/fork-from".to_string(), "a".to_string())].into());
    pod.status = Some(serde_json::from_value(json!({
        "phase": "Running",
        "containerStatuses": [
            {"name": crate::pod::WORKLOAD_CONTAINER, "ready": true, "restartCount": 0, "image": "img", "imageID": "", "state": {"running": {}}},
            {"name": HOLDER_CONTAINER, "ready": true, "restartCount": 0, "image": "img", "imageID": "", "state": {"running": {}}}
        ]
    }))
    .unwrap());
    let pod_json = serde_json::to_value(&pod).unwrap();
    let mut all = routes(r, Route::fixed("GET", pod_path, 200, pod_json));
    all.push(Route::fixed("PATCH", STATUS, 200, written(r)));
    all
}

/// The restore record a reconcile of `r` writes last.
async fn restore_written(r: SandboxRun, all: Vec<Route>) -> (Value, Vec<String>) {
    let (client, log) = apiserver(all);
    let rights = crate::policy::stamp::RightsPolicy {
        unadmitted: crate::policy::stamp::UnadmittedReferences::Trust,
        key: None,
    };
    reconcile(
        context(client, Arc::new(InMemory::new())).with_rights(rights),
        r,
    )
    .await;
    let patch = log.matching("PATCH", STATUS);
    let last = patch.last().expect("the status is written").body.clone();
    let attempt = last["status"]["restores"]
        .as_array()
        .and_then(|all| all.last().cloned())
        .unwrap_or(Value::Null);
    (attempt, log.lines())
}

/// docs/contract.md "Pause, resume and fork": the fork's first restore reads its source once and
/// records its name, uid and attempt; a later attempt requires that uid, so a source deleted and
/// re-created under its name is refused (`RestoreFailed`) and its files never read. Fails on the
/// old code: a first attempt never restored.
#[tokio::test]
async fn a_forks_source_is_bound_by_its_uid_and_a_re_created_one_is_refused() {
    let mut r = forking();
    let mut all = parked_fork(&mut r, 1, POD);
    all.push(Route::fixed("GET", SOURCE_RUN, 200, source_run("ua")));
    let (record, lines) = restore_written(r.clone(), all).await;
    assert!(
        lines.iter().any(|l| l == &format!("GET {SOURCE_RUN}")),
        "{lines:?}"
    );
    assert_eq!(record["fromRun"], "a", "{record}");
    assert_eq!(record["fromUid"], "ua", "{record}");
    assert_eq!(record["fromAttempt"], 1, "{record}");
    // Nothing stored: the restore fails at the manifest, after the source was bound.
    assert_eq!(record["outcome"], "Failed", "{record}");
    assert!(
        record["message"].as_str().unwrap().contains("manifest"),
        "{record}"
    );
    // Attempt 2 (a retry): `a` was re-created meanwhile (uid ub).
    let mut retry = r.clone();
    let status = retry.status.get_or_insert_with(Default::default);
    status.attempts = vec![crate::api::AttemptStatus {
        index: 1,
        pod_name: "demo-sbr".into(),
        reason: "WorkloadFailed".into(),
        ..Default::default()
    }];
    status.restores = vec![serde_json::from_value(record).unwrap()];
    let mut all = parked_fork(&mut retry, 2, POD_A2);
    all.push(Route::fixed("GET", SOURCE_RUN, 200, source_run("ub")));
    let (record, _) = restore_written(retry, all).await;
    assert_eq!(
        (record["attempt"].as_u64(), record["fromUid"].as_str()),
        (Some(2), Some("ua")),
        "{record}"
    );
    assert_eq!(record["outcome"], "Failed", "{record}");
    assert!(
        record["message"].as_str().unwrap().contains("re-created"),
        "{record}"
    );
}

/// Run `a` as the apiserver returns it: uid `uid`, still running its first attempt, with
/// checkpoint 2 recorded (`/out` drained) and checkpoint 3 still being taken (`/out` pending).
fn checkpointed_source(uid: &str) -> Value {
    use crate::api::{CheckpointStatus, ReadBackPhase, ReadBackStatus};
    let mut a = run_with(&[("/out", false)]);
    a.metadata.name = Some("a".into());
    a.metadata.uid = Some(uid.into());
    let checkpoint = |index: u32, phase| CheckpointStatus {
        index,
        token: format!("t{index}"),
        attempt: Some(1),
        read_back: vec![ReadBackStatus {
            path: "/out".into(),
            phase,
            ..Default::default()
        }],
        ..Default::default()
    };
    a.status = Some(SandboxRunStatus {
        phase: Some(Phase::Running),
        checkpoints: vec![
            checkpoint(2, ReadBackPhase::Drained),
            checkpoint(3, ReadBackPhase::Pending),
        ],
        ..Default::default()
    });
    serde_json::to_value(a).unwrap()
}

/// A store holding the manifest of `/out` in checkpoint 2 of run `a` (uid `uid`), at its
/// checkpoint keys, as a checkpoint's drain writes it (`run_attempt` 1, `checkpoint` 2).
async fn checkpoint_stored(uid: &str) -> Arc<InMemory> {
    use crate::store::{DrainOutcome, Manifest, ManifestContext, Stored};
    let whose = RunId {
        namespace: "ns".into(),
        name: "a".into(),
        uid: uid.into(),
    };
    let prefix = Path::from("runs");
    let none = crate::api::Compression::None;
    let keys = crate::store::checkpoint_object_keys(&prefix, &whose, 2, 0, "/out", none);
    let ctx = ManifestContext {
        run: whose,
        declared_path: "/out".into(),
        index: 0,
        attempt: 1,
    };
    let stored = Stored {
        compression: none,
        cap_bytes: 10,
    };
    let t = jiff::Timestamp::UNIX_EPOCH;
    let mut manifest = Manifest::new(&ctx, &keys, stored, &DrainOutcome::default(), t, t);
    manifest.checkpoint = Some(2);
    let store = Arc::new(InMemory::new());
    let dyn_store: Arc<dyn ObjectStore> = store.clone();
    crate::store::write_manifest(&dyn_store, &keys.manifest, &manifest)
        .await
        .unwrap();
    store
}

/// The fork of run `a`'s checkpoint `checkpoint` (`spec.workspace.from.checkpoint`), parked at
/// its first attempt, reconciled once against `store`: its restore record and the requests.
async fn checkpoint_fork_written(checkpoint: u32, store: Arc<InMemory>) -> (Value, Vec<String>) {
    let mut r = forking();
    let from = r.spec.workspace.as_mut().and_then(|w| w.from.as_mut());
    from.unwrap().checkpoint = Some(checkpoint);
    let mut all = parked_fork(&mut r, 1, POD);
    all.push(Route::fixed(
        "GET",
        SOURCE_RUN,
        200,
        checkpointed_source("ua"),
    ));
    let (client, log) = apiserver(all);
    let rights = crate::policy::stamp::RightsPolicy {
        unadmitted: crate::policy::stamp::UnadmittedReferences::Trust,
        key: None,
    };
    reconcile(context(client, store).with_rights(rights), r).await;
    let patch = log.matching("PATCH", STATUS);
    let last = patch.last().expect("the status is written").body.clone();
    let record = last["status"]["restores"][0].clone();
    (record, log.lines())
}

/// docs/contract.md "Pause, resume and fork": a fork of a checkpoint (issue #54) binds the
/// source's uid and reads that checkpoint's keys; its manifest, which records that run, that
/// checkpoint and that path, passes the one manifest check, and the restore goes on to the pod
/// (the mock cannot exec: it fails there, past the store). Fails on the old code: the field did
/// not exist, and with the manifest check's `checkpoint.is_none()` restored the checkpoint's
/// manifest is refused as not the source's.
#[tokio::test]
async fn a_fork_of_a_recorded_checkpoint_binds_that_checkpoints_keys_and_manifest() {
    let (record, lines) = checkpoint_fork_written(2, checkpoint_stored("ua").await).await;
    assert_eq!(record["fromRun"], "a", "{record}");
    assert_eq!(record["fromUid"], "ua", "{record}");
    assert_eq!(record["fromCheckpoint"], 2, "{record}");
    assert_eq!(record["fromAttempt"], 1, "{record}");
    assert_eq!(record["outcome"], "Failed", "{record}");
    let message = record["message"].as_str().unwrap();
    assert!(!message.contains("manifest"), "{record}");
    assert!(message.contains("exec restore-unpack"), "{record}");
    assert!(lines.iter().any(|l| l.contains("/exec")), "{lines:?}");
}

/// docs/contract.md "Pause, resume and fork": a checkpoint the source does not record as saved
/// (none by that number, or one still being taken) is refused when its source is read, before
/// any manifest is read or anything restored, and the refusal names it (the launcher is handed
/// that refusal). Fails on the old code: the field did not exist (a fork
/// restored the source's attempt instead).
#[tokio::test]
async fn a_fork_of_a_checkpoint_the_source_does_not_record_saved_is_refused() {
    for checkpoint in [3, 9] {
        let (record, lines) =
            checkpoint_fork_written(checkpoint, checkpoint_stored("ua").await).await;
        assert_eq!(record["outcome"], "Failed", "{record}");
        assert_eq!(record["fromCheckpoint"], checkpoint, "{record}");
        let message = record["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("no checkpoint {checkpoint}")),
            "{record}"
        );
        // Refused at the bind: no manifest read, nothing exec'd to restore.
        assert!(!message.contains("manifest"), "{record}");
        assert!(!message.contains("restore-unpack"), "{record}");
        assert!(
            lines.iter().any(|l| l == &format!("GET {SOURCE_RUN}")),
            "{lines:?}"
        );
    }
}
