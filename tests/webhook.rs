//! The validating webhook, in-process: real AdmissionReview JSON through the router.

use axum::body::Body;
use http::{Request, StatusCode};
use sandboxrun_operator::admission::webhook::{router, WebhookMetrics, WebhookState};
use serde_json::{json, Value};
use tower::ServiceExt;

const DIGEST_IMAGE: &str =
    "ghcr.io/iterion/workload@sha256:3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f";

fn run_object(spec: Value, status: Value) -> Value {
    json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRun",
        "metadata": {"name": "r1", "namespace": "dev"},
        "spec": spec,
        "status": status,
    })
}

fn review(operation: &str, object: Option<Value>, old: Option<Value>) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "sandbox.iterion.io", "version": "v1alpha1", "kind": "SandboxRun"},
            "resource": {"group": "sandbox.iterion.io", "version": "v1alpha1", "resource": "sandboxruns"},
            "name": "r1",
            "namespace": "dev",
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false
        }
    })
}

async fn post(state: WebhookState, body: Value) -> (StatusCode, Value) {
    let req = Request::post("/validate-sandboxrun")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_else(|e| panic!("{e}"));
    let resp = router(state)
        .oneshot(req)
        .await
        .unwrap_or_else(|e| match e {});
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn a_valid_run_is_allowed_without_warnings() {
    let spec = json!({"image": DIGEST_IMAGE, "user": "1000"});
    let (status, body) = post(
        WebhookState::default(),
        review("CREATE", Some(run_object(spec, json!({}))), None),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body["response"]["uid"],
        "705ab4f5-6393-11e8-b7cc-42010a800002"
    );
    assert_eq!(body["response"]["allowed"], true, "{body}");
    assert!(body["response"]["warnings"].is_null(), "{body}");
    assert_eq!(body["kind"], "AdmissionReview");
}

#[tokio::test]
async fn every_failure_is_listed_with_field_and_hint() {
    let spec = json!({"hostState": "auto", "user": "0", "mounts": [{"name": "h", "type": "bind", "target": "/h"}]});
    let (_, body) = post(
        WebhookState::default(),
        review("CREATE", Some(run_object(spec, json!({}))), None),
    )
    .await;
    let resp = &body["response"];
    assert_eq!(resp["allowed"], false, "{body}");
    let msg = resp["status"]["message"].as_str().unwrap_or_default();
    for needle in [
        "[image-required] spec.image",
        "[host-state-auto] spec.hostState",
        "[user-non-root] spec.user",
        "[mount-bind] spec.mounts[0].type",
        "hint: set hostState: none",
        "4 failing check(s)",
    ] {
        assert!(msg.contains(needle), "missing {needle:?} in {msg}");
    }
    assert_eq!(resp["status"]["code"], 422);
}

#[tokio::test]
async fn warnings_are_returned_and_the_run_allowed() {
    let spec = json!({"image": "alpine:3.20", "user": "1000", "network": {"mode": "open", "rules": ["x.com"]}});
    let (_, body) = post(
        WebhookState::default(),
        review("CREATE", Some(run_object(spec, json!({}))), None),
    )
    .await;
    assert_eq!(body["response"]["allowed"], true, "{body}");
    let warnings: Vec<String> =
        serde_json::from_value(body["response"]["warnings"].clone()).unwrap_or_default();
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("[image-digest] spec.image")),
        "{warnings:?}"
    );
    assert!(
        warnings.iter().any(|w| w.contains("network-rules-ignored")),
        "{warnings:?}"
    );
}

#[tokio::test]
async fn an_object_that_does_not_deserialize_is_denied_clearly() {
    let spec = json!({"image": DIGEST_IMAGE, "user": "1000", "hostState": "sometimes"});
    let (_, body) = post(
        WebhookState::default(),
        review("CREATE", Some(run_object(spec, json!({}))), None),
    )
    .await;
    assert_eq!(body["response"]["allowed"], false);
    let msg = body["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        msg.contains("dev/r1")
            && msg.contains("not a valid SandboxRun")
            && msg.contains("sometimes"),
        "{msg}"
    );
}

#[tokio::test]
async fn once_the_pod_exists_only_stop_may_change() {
    let old_spec = json!({"image": DIGEST_IMAGE, "user": "1000"});
    let running = json!({"podName": "r1-pod", "phase": "Running"});
    let old = run_object(old_spec.clone(), running.clone());
    let stop = run_object(
        json!({"image": DIGEST_IMAGE, "user": "1000", "stop": true}),
        running.clone(),
    );
    let (_, body) = post(
        WebhookState::default(),
        review("UPDATE", Some(stop), Some(old.clone())),
    )
    .await;
    assert_eq!(body["response"]["allowed"], true, "{body}");

    let changed = run_object(json!({"image": DIGEST_IMAGE, "user": "2000"}), running);
    let (_, body) = post(
        WebhookState::default(),
        review("UPDATE", Some(changed.clone()), Some(old)),
    )
    .await;
    assert_eq!(body["response"]["allowed"], false, "{body}");
    let msg = body["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        msg.contains("[update-immutable] spec.user") && msg.contains("delete and re-create"),
        "{msg}"
    );

    // Before the pod exists the same change is fine.
    let pending = run_object(old_spec, json!({}));
    let (_, body) = post(
        WebhookState::default(),
        review("UPDATE", Some(changed), Some(pending)),
    )
    .await;
    assert_eq!(body["response"]["allowed"], true, "{body}");
}

#[tokio::test]
async fn delete_is_allowed_and_garbage_is_a_bad_request() {
    let (_, body) = post(
        WebhookState::default(),
        review("DELETE", None, Some(run_object(json!({}), json!({})))),
    )
    .await;
    assert_eq!(body["response"]["allowed"], true, "{body}");
    let (status, body) = post(WebhookState::default(), json!({"hello": "world"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["response"]["allowed"], false);
}

#[tokio::test]
async fn reviews_are_counted_by_verdict() {
    let registry = prometheus::Registry::new();
    let metrics = WebhookMetrics::register(&registry).unwrap_or_else(|e| panic!("{e}"));
    let state = WebhookState {
        metrics: Some(metrics.clone()),
        ..Default::default()
    };
    let _ = post(
        state.clone(),
        review("CREATE", Some(run_object(json!({}), json!({}))), None),
    )
    .await;
    let ok = json!({"image": DIGEST_IMAGE, "user": "1000"});
    let _ = post(
        state,
        review("CREATE", Some(run_object(ok, json!({}))), None),
    )
    .await;
    assert_eq!(
        metrics
            .reviews
            .with_label_values(&["create", "denied"])
            .get(),
        1
    );
    assert_eq!(
        metrics
            .reviews
            .with_label_values(&["create", "allowed"])
            .get(),
        1
    );
    assert_eq!(metrics.latency.get_sample_count(), 2);
}

#[tokio::test]
async fn healthz_answers() {
    let req = Request::get("/healthz")
        .body(Body::empty())
        .unwrap_or_else(|e| panic!("{e}"));
    let resp = router(WebhookState::default())
        .oneshot(req)
        .await
        .unwrap_or_else(|e| match e {});
    assert_eq!(resp.status(), StatusCode::OK);
}
