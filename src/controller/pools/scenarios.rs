//! Scenarios for the pools' controller against a mock apiserver (tower-test, no cluster): one
//! look at a pool — its reads, then its writes in order (deletes, creations each sealed, the
//! status, its Events) — as observe, [`super::plan`] and [`super::act`] carry it out.

use std::sync::Arc;

use object_store::memory::InMemory;
use serde_json::{json, Value};

use crate::api::{
    ReadBack, ReadBackPath, SandboxRunPool, SandboxRunPoolSpec, SandboxRunPoolStatus,
    SandboxRunSpec, TemplateRef,
};
use crate::controller::testkit::mock_apiserver::{self, status_failure, Log, Route, Seen};
use crate::policy::stamp::StampKey;

const PODS: &str = "/api/v1/namespaces/ns/pods";
const TEMPLATE: &str = "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxruntemplates/agent";
const STATUS: &str =
    "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxrunpools/agents/status";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events";

fn pool(replicas: i32) -> SandboxRunPool {
    let mut pool = SandboxRunPool::new(
        "agents",
        SandboxRunPoolSpec {
            template_ref: TemplateRef::namespaced("agent"),
            replicas,
        },
    );
    pool.metadata.namespace = Some("ns".into());
    pool.metadata.uid = Some("pool-uid".into());
    pool.metadata.generation = Some(1);
    pool
}

fn template() -> Value {
    let spec = SandboxRunSpec {
        image: Some("busybox".into()),
        command: Some(vec!["sh".into(), "-c".into(), "sleep 1".into()]),
        user: Some("1000".into()),
        read_back: Some(ReadBack {
            paths: vec![ReadBackPath {
                path: "/work/out".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1", "kind": "SandboxRunTemplate",
        "metadata": {"name": "agent", "namespace": "ns", "generation": 1},
        "spec": {"template": spec}
    })
}

/// A pod created: the request's body with a uid the apiserver gave it.
fn created(seen: &Seen) -> (u16, Value) {
    let mut pod = seen.body.clone();
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    pod["metadata"]["uid"] = json!(format!("uid-{name}"));
    pod["metadata"]["namespace"] = json!("ns");
    (201, pod)
}

fn empty_list() -> Value {
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []})
}

/// The routes of a namespace with the pool's template and no pods, `create` answering the pods'
/// creations, before `more`.
fn apiserver(create: Route, more: Vec<Route>) -> (kube::Client, Log) {
    let mut routes = more;
    routes.extend([
        Route::fixed("GET", PODS, 200, empty_list()),
        Route::fixed("GET", TEMPLATE, 200, template()),
        create,
        Route::echo("PATCH", PODS, 200),
        Route::with("PATCH", STATUS, |seen| {
            let mut written = serde_json::to_value(pool(1)).unwrap_or_default();
            written["status"] = seen.body["status"].clone();
            (200, written)
        }),
        Route::echo("POST", EVENTS, 201),
        Route::fixed(
            "DELETE",
            PODS,
            200,
            json!({"kind": "Status", "status": "Success"}),
        ),
    ]);
    mock_apiserver::apiserver(routes)
}

fn context(client: kube::Client, key: bool) -> Arc<crate::controller::context::Context> {
    let mut ctx = mock_apiserver::context(client, Arc::new(InMemory::new()));
    if key {
        ctx.admission.rights.key = Some(StampKey::new(b"0123456789abcdef0123456789abcdef"));
    }
    Arc::new(ctx)
}

/// The writes, as `METHOD path`, in order (the reads left out), Events named by their reason.
fn writes(seen: &Log) -> Vec<String> {
    seen.all()
        .iter()
        .filter(|s| s.method != "GET")
        .map(|s| match s.path() {
            EVENTS => format!("Event {}", s.body["reason"].as_str().unwrap_or_default()),
            p if p.starts_with(PODS) && s.method != "POST" => format!("{} pod", s.method),
            _ => s.line(),
        })
        .collect()
}

fn status_sent(seen: &Log) -> SandboxRunPoolStatus {
    let sent = seen.exactly("PATCH", STATUS);
    assert_eq!(sent.len(), 1, "{:?}", seen.lines());
    serde_json::from_value(sent[0].body["status"].clone()).unwrap()
}

#[tokio::test]
async fn a_pool_short_of_pods_creates_and_seals_each_then_says_so_and_writes_its_status() {
    let (client, seen) = apiserver(Route::with("POST", PODS, created), vec![]);
    let ctx = context(client, true);
    super::reconcile(Arc::new(pool(2)), ctx).await.unwrap();
    assert_eq!(
        writes(&seen),
        [
            format!("POST {PODS}"),
            "PATCH pod".into(),
            format!("POST {PODS}"),
            "PATCH pod".into(),
            "Event PodsCreated".into(),
            format!("PATCH {STATUS}"),
        ]
    );
    let seals = seen.matching("PATCH", &format!("{PODS}/"));
    assert!(
        seals
            .iter()
            .all(|s| s.body["metadata"]["annotations"].is_object()),
        "{seals:?}"
    );
    let status = status_sent(&seen);
    assert_eq!((status.replicas, status.message), (0, None));
    let selector = crate::pool::pod::unclaimed_selector("agents");
    assert_eq!(status.selector, Some(selector));
}

#[tokio::test]
async fn a_pod_the_namespace_refuses_stops_the_creations_and_its_warning_is_pod_refused() {
    let refused = status_failure(403, "Forbidden", "exceeded quota: pods");
    let (client, seen) = apiserver(Route::fixed("POST", PODS, 403, refused), vec![]);
    let ctx = context(client, true);
    super::reconcile(Arc::new(pool(3)), ctx).await.unwrap();
    assert_eq!(
        writes(&seen),
        [
            format!("POST {PODS}"),
            format!("PATCH {STATUS}"),
            "Event PodRefused".into()
        ]
    );
    let message = status_sent(&seen).message.unwrap_or_default();
    assert_eq!(
        message,
        "the namespace refused a pool pod: exceeded quota: pods"
    );
}

#[tokio::test]
async fn a_pool_without_the_operators_key_makes_no_pods_and_its_warning_is_not_pooled() {
    let (client, seen) = apiserver(Route::with("POST", PODS, created), vec![]);
    let ctx = context(client, false);
    super::reconcile(Arc::new(pool(2)), ctx).await.unwrap();
    assert_eq!(
        writes(&seen),
        [format!("PATCH {STATUS}"), "Event NotPooled".into()]
    );
    let message = status_sent(&seen).message.unwrap_or_default();
    assert!(message.contains("admission key"), "{message}");
}

#[tokio::test]
async fn a_pool_whose_status_already_says_why_writes_nothing_again() {
    let (client, seen) = apiserver(Route::with("POST", PODS, created), vec![]);
    let ctx = context(client.clone(), false);
    super::reconcile(Arc::new(pool(2)), ctx).await.unwrap();
    let mut again = pool(2);
    again.status = Some(status_sent(&seen));
    let (client, seen) = apiserver(Route::with("POST", PODS, created), vec![]);
    super::reconcile(Arc::new(again), context(client, false))
        .await
        .unwrap();
    assert!(writes(&seen).is_empty(), "{:?}", seen.lines());
}

#[tokio::test]
async fn a_pool_pod_that_cannot_be_sealed_is_deleted_and_the_look_fails() {
    let broken = Route::fixed(
        "PATCH",
        &format!("{PODS}/"),
        500,
        status_failure(500, "InternalError", "etcd is gone"),
    );
    let (client, seen) = apiserver(Route::with("POST", PODS, created), vec![broken]);
    let ctx = context(client, true);
    assert!(super::reconcile(Arc::new(pool(1)), ctx).await.is_err());
    assert_eq!(
        writes(&seen),
        [
            format!("POST {PODS}"),
            "PATCH pod".into(),
            "DELETE pod".into()
        ]
    );
    let deleted = seen.all().into_iter().find(|s| s.method == "DELETE");
    let body = deleted.map(|s| s.body).unwrap_or_default();
    assert_eq!(
        body["gracePeriodSeconds"], 1,
        "an unsealed, unclaimed pod: {body}"
    );
}

#[tokio::test]
async fn a_missing_template_is_said_in_the_status_and_a_not_pooled_warning() {
    let missing = Route::fixed(
        "GET",
        TEMPLATE,
        404,
        status_failure(404, "NotFound", "not found"),
    );
    let (client, seen) = apiserver(Route::with("POST", PODS, created), vec![missing]);
    let ctx = context(client, true);
    super::reconcile(Arc::new(pool(1)), ctx).await.unwrap();
    assert_eq!(
        writes(&seen),
        [format!("PATCH {STATUS}"), "Event NotPooled".into()]
    );
}

/// A ready pool pod of the template version `hash`, sealed with the scenarios' key.
fn sealed_pod(name: &str, hash: &str) -> Value {
    use crate::pool::pod::{HASH_LABEL, POOL_LABEL};
    use k8s_openapi::api::core::v1::Pod;
    let running = |c: &str| {
        json!({"name": c, "ready": true, "restartCount": 0, "image": "busybox",
        "imageID": "", "state": {"running": {}}})
    };
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "labels": {POOL_LABEL: "agents", HASH_LABEL: hash}},
        "spec": {"containers": []},
        "status": {"containerStatuses": [running(crate::pod::WORKLOAD_CONTAINER),
            running(crate::names::HOLDER_CONTAINER)]}
    });
    let key = StampKey::new(b"0123456789abcdef0123456789abcdef");
    let typed: Pod = serde_json::from_value(pod.clone()).unwrap();
    let seal = crate::pool::seal::seal_of(&key, &typed, "agents").unwrap();
    pod["metadata"]["annotations"] = json!({crate::pool::seal::SEAL_ANNOTATION: seal});
    pod
}

/// Issue #54 item 4: on the old code a pool counted only its current version's pods, so the look
/// that saw a template edit wrote `replicas: 0` (the HPA read a pool of none) and nothing told
/// the outdated pods from the updated ones, nor which template generation the status described.
#[tokio::test]
async fn a_template_edit_shows_the_outdated_pods_in_replicas_and_none_updated() {
    let outdated = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {},
        "items": [sealed_pod("agents-a", "before-the-edit"), sealed_pod("agents-b", "before-the-edit")]});
    let pods = Route::fixed("GET", PODS, 200, outdated);
    let (client, seen) = apiserver(Route::with("POST", PODS, created), vec![pods]);
    super::reconcile(Arc::new(pool(2)), context(client, true))
        .await
        .unwrap();
    assert_eq!(
        writes(&seen)[..2],
        ["DELETE pod".to_string(), "DELETE pod".into()]
    );
    // Unclaimed, outdated: deleted with a grace period of 1 s, under its uid precondition (on
    // the old code the pod's own grace period, 330 s, held by the holder's preStop).
    for delete in seen.all().iter().filter(|s| s.method == "DELETE") {
        assert_eq!(delete.body["gracePeriodSeconds"], 1, "{}", delete.body);
        assert!(
            delete.body["preconditions"]["uid"].is_string(),
            "{}",
            delete.body
        );
    }
    let status = status_sent(&seen);
    assert_eq!(
        (
            status.replicas,
            status.updated_replicas,
            status.ready_replicas
        ),
        (2, 0, 0),
        "{status:?}"
    );
    assert_eq!(
        (status.template_generation, status.observed_generation),
        (Some(1), Some(1))
    );
}
