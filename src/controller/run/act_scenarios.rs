//! Scenarios for act against a mock apiserver (tower-test, no cluster): the status
//! server-side apply act sends, the finalizer patch and its resourceVersion precondition, and the
//! apiserver's answers to a pod create (201, 409, 403) as the typed answers plan::after reads.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use object_store::memory::InMemory;
use serde_json::{json, Value};

use super::act::{carry_out, Carried};
use super::plan::{Answer, Effect, Plan, Requeue};
use crate::api::{Phase, SandboxRun, SandboxRunStatus, FINALIZER};
use crate::controller::context::Context;
use crate::controller::testkit::mock_apiserver::{self, status_failure, Log, Route, Seen};

/// A mock apiserver answering every request with `status` and `body`
/// ([`crate::controller::testkit::mock_apiserver`]); returns the client and what it was sent.
fn apiserver(status: u16, body: Value) -> (kube::Client, Log) {
    mock_apiserver::apiserver(vec![Route::any(status, body)])
}

fn context(client: kube::Client) -> Context {
    mock_apiserver::context(client, Arc::new(InMemory::new()))
}

fn run() -> SandboxRun {
    crate::testkit::sandbox_run("demo")
        .namespace("ns")
        .uid("u1")
        .resource_version("7")
        .build()
}

/// The run as the apiserver returns it after a write: a new resourceVersion.
fn written(run: &SandboxRun, resource_version: &str) -> Value {
    let mut after = run.clone();
    after.metadata.resource_version = Some(resource_version.into());
    serde_json::to_value(after).unwrap()
}

fn pod() -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some("demo-sbr".into());
    pod.metadata.namespace = Some("ns".into());
    pod
}

fn plan(status: Option<SandboxRunStatus>, effects: Vec<Effect>) -> Plan {
    Plan {
        status,
        effects,
        ..Plan::wait(Requeue::AwaitChange)
    }
}

#[tokio::test]
async fn the_status_is_one_server_side_apply_of_the_whole_status_and_is_not_sent_twice() {
    let r = run();
    let (client, seen) = apiserver(200, written(&r, "8"));
    let ctx = context(client);
    let status = SandboxRunStatus {
        phase: Some(Phase::Running),
        message: Some("running".into()),
        ..Default::default()
    };
    let carried = carry_out(
        &ctx,
        &r,
        "demo-sbr",
        None,
        plan(Some(status.clone()), vec![]),
    )
    .await
    .unwrap();
    assert!(matches!(carried, Carried::Done(Requeue::AwaitChange)));
    {
        let seen = seen.all();
        assert_eq!(seen.len(), 1, "{seen:?}");
        let s = &seen[0];
        assert_eq!(s.method, "PATCH");
        assert!(
            s.uri.starts_with(
                "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxruns/demo/status?"
            ),
            "{}",
            s.uri
        );
        assert!(
            s.uri.contains("fieldManager=sandboxrun-operator"),
            "{}",
            s.uri
        );
        assert!(s.uri.contains("force=true"), "{}", s.uri);
        assert_eq!(s.content_type, "application/apply-patch+yaml");
        assert_eq!(
            s.body,
            json!({
                "apiVersion": "sandbox.iterion.io/v1alpha1",
                "kind": "SandboxRun",
                "status": serde_json::to_value(&status).unwrap(),
            })
        );
    }
    // The same status again, on the run as our write left it: no second request.
    let mut after = r.clone();
    after.metadata.resource_version = Some("8".into());
    carry_out(&ctx, &after, "demo-sbr", None, plan(Some(status), vec![]))
        .await
        .unwrap();
    assert_eq!(seen.all().len(), 1);
}

#[tokio::test]
async fn the_finalizer_is_a_merge_patch_preconditioned_on_the_resource_version() {
    let r = run();
    let (client, seen) = apiserver(200, written(&r, "8"));
    let ctx = context(client);
    carry_out(
        &ctx,
        &r,
        "demo-sbr",
        None,
        plan(None, vec![Effect::AddFinalizer]),
    )
    .await
    .unwrap();
    let mut held = run();
    held.metadata.finalizers = Some(vec!["other.example/keep".into(), FINALIZER.into()]);
    carry_out(
        &ctx,
        &held,
        "demo-sbr",
        None,
        plan(None, vec![Effect::RemoveFinalizer]),
    )
    .await
    .unwrap();
    let seen = seen.all();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for s in seen.iter() {
        assert_eq!(s.method, "PATCH");
        assert!(
            s.uri
                .starts_with("/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxruns/demo?"),
            "{}",
            s.uri
        );
        assert_eq!(s.content_type, "application/merge-patch+json");
    }
    assert_eq!(
        seen[0].body,
        json!({"metadata": {"finalizers": [FINALIZER], "resourceVersion": "7"}})
    );
    assert_eq!(
        seen[1].body,
        json!({"metadata": {"finalizers": ["other.example/keep"], "resourceVersion": "7"}})
    );
}

#[tokio::test]
async fn a_finalizer_patch_without_a_resource_version_is_never_sent_unguarded() {
    // docs/contract.md "A write always names its object": without a resourceVersion the merge
    // patch would carry no precondition, and would overwrite a concurrent change.
    for resource_version in [None, Some(String::new())] {
        let mut r = run();
        r.metadata.resource_version = resource_version.clone();
        let (client, seen) = apiserver(200, written(&run(), "8"));
        let ctx = context(client);
        let result = carry_out(
            &ctx,
            &r,
            "demo-sbr",
            None,
            plan(None, vec![Effect::AddFinalizer]),
        )
        .await;
        assert!(result.is_err(), "{resource_version:?}: {result:?}");
        let sent = seen.all();
        assert!(
            sent.is_empty(),
            "{resource_version:?}: nothing is sent: {sent:?}"
        );
    }
}

#[tokio::test]
async fn nothing_is_written_about_a_run_without_its_namespace_or_uid() {
    // An empty namespace aims the write at `namespaces//…`; an empty uid names no run.
    for field in ["namespace", "uid"] {
        let mut r = run();
        match field {
            "namespace" => r.metadata.namespace = None,
            _ => r.metadata.uid = None,
        }
        let (client, seen) = apiserver(200, written(&run(), "8"));
        let ctx = context(client);
        let status = SandboxRunStatus {
            phase: Some(Phase::Running),
            ..Default::default()
        };
        let effects = vec![Effect::AddFinalizer, Effect::DeletePod { at_once: false }];
        let result = carry_out(&ctx, &r, "demo-sbr", None, plan(Some(status), effects)).await;
        assert!(result.is_err(), "{field}: {result:?}");
        let sent = seen.all();
        assert!(sent.is_empty(), "{field}: nothing is sent: {sent:?}");
    }
}

#[tokio::test]
async fn a_conflict_on_the_finalizer_patch_is_an_error_for_the_next_reconcile() {
    let (client, _) = apiserver(
        409,
        status_failure(409, "Conflict", "the object has been modified"),
    );
    let ctx = context(client);
    let result = carry_out(
        &ctx,
        &run(),
        "demo-sbr",
        None,
        plan(None, vec![Effect::AddFinalizer]),
    )
    .await;
    assert!(result.is_err(), "a stale resourceVersion is not ignored");
}

async fn create_answer(code: u16, body: Value) -> (Answer, Vec<Seen>) {
    let (client, seen) = apiserver(code, body);
    let ctx = context(client);
    let effects = vec![
        Effect::CreatePod(Box::new(pod())),
        Effect::ForgetCreateAttempts,
    ];
    let carried = carry_out(&ctx, &run(), "demo-sbr", None, plan(None, effects))
        .await
        .unwrap();
    let Carried::Answer {
        answer,
        rest,
        requeue,
    } = carried
    else {
        panic!("a create answers: {carried:?}");
    };
    assert_eq!(
        rest,
        vec![Effect::ForgetCreateAttempts],
        "the effects after it wait"
    );
    assert_eq!(requeue, Requeue::AwaitChange);
    let seen = seen.all();
    (answer, seen)
}

#[tokio::test]
async fn a_created_pod_is_the_answer_with_the_pod_the_apiserver_returned() {
    let mut created = pod();
    created.metadata.uid = Some("p1".into());
    let (answer, seen) = create_answer(201, serde_json::to_value(&created).unwrap()).await;
    assert_eq!(answer, Answer::PodCreated(Box::new(created)));
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "POST");
    assert!(
        seen[0].uri.starts_with("/api/v1/namespaces/ns/pods?"),
        "{}",
        seen[0].uri
    );
    assert_eq!(seen[0].body["metadata"]["name"], "demo-sbr");
}

#[tokio::test]
async fn a_pod_that_exists_already_is_the_exists_answer() {
    let (answer, _) = create_answer(
        409,
        status_failure(409, "AlreadyExists", "pods \"demo-sbr\" already exists"),
    )
    .await;
    assert_eq!(answer, Answer::PodExists);
}

#[tokio::test]
async fn a_forbidden_pod_is_a_refusal_with_its_code_and_the_apiservers_words() {
    let words = "pods \"demo-sbr\" is forbidden: exceeded quota: compute";
    let (answer, _) = create_answer(403, status_failure(403, "Forbidden", words)).await;
    assert_eq!(
        answer,
        Answer::PodRefused {
            code: 403,
            message: words.to_string()
        }
    );
}

#[tokio::test]
async fn a_throttled_create_is_an_error_not_an_answer() {
    let (client, _) = apiserver(429, status_failure(429, "TooManyRequests", "slow down"));
    let ctx = context(client);
    let result = carry_out(
        &ctx,
        &run(),
        "demo-sbr",
        None,
        plan(None, vec![Effect::CreatePod(Box::new(pod()))]),
    )
    .await;
    assert!(result.is_err());
}
