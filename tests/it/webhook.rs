//! The validating webhook, in-process: real AdmissionReview JSON through the router.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use sandboxrun_operator::admission::webhook::{router, WebhookMetrics, WebhookState};
use sandboxrun_operator::caps::CapSettings;
use sandboxrun_operator::policy::RuleSettings;
use sandboxrun_operator::registry::{ImageResolver, ImageSettings};
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

/// The operator after `--max-cap` went from 16Gi (the default) down to 4Gi.
fn tightened() -> WebhookState {
    WebhookState {
        settings: RuleSettings {
            caps: CapSettings {
                default_bytes: 1 << 30,
                max_bytes: 4 << 30,
            },
            ..RuleSettings::default()
        },
        ..Default::default()
    }
}

fn with_metadata(mut object: Value, metadata: Value) -> Value {
    object["metadata"] = metadata;
    object
}

fn allowed(body: &Value) -> bool {
    body["response"]["allowed"] == true
}

fn message(body: &Value) -> String {
    body["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_run_admitted_under_a_looser_cap_can_still_be_updated_stopped_and_let_go_of() {
    // Admitted under --max-cap 16Gi; the operator now runs with 4Gi (issue #11).
    let spec = json!({
        "image": DIGEST_IMAGE,
        "user": "1000",
        "readBack": {"paths": [{"path": "/work/out", "sizeLimit": "8Gi"}]},
    });
    let running = json!({"podName": "r1-sbr", "phase": "Running"});
    let stored = with_metadata(
        run_object(spec.clone(), running.clone()),
        json!({"name": "r1", "namespace": "dev", "finalizers": ["sandbox.iterion.io/drain"]}),
    );
    // Today's rules refuse that spec on CREATE…
    let (_, body) = post(
        tightened(),
        review("CREATE", Some(run_object(spec.clone(), json!({}))), None),
    )
    .await;
    assert!(!allowed(&body), "{body}");
    assert!(
        message(&body).contains("[read-back-size-limit] spec.readBack.paths[0].sizeLimit"),
        "{body}"
    );

    // …but an update that leaves the spec alone is not re-judged: a label, then the finalizer
    // release of the deleting run (the operator's merge patch at the end of the drain).
    let labelled = with_metadata(
        run_object(spec.clone(), running.clone()),
        json!({"name": "r1", "namespace": "dev", "labels": {"team": "a"},
               "finalizers": ["sandbox.iterion.io/drain"]}),
    );
    let (_, body) = post(
        tightened(),
        review("UPDATE", Some(labelled), Some(stored.clone())),
    )
    .await;
    assert!(allowed(&body), "{body}");
    assert!(body["response"]["warnings"].is_null(), "{body}");
    let deleting = |finalizers: Value| {
        with_metadata(
            run_object(spec.clone(), running.clone()),
            json!({"name": "r1", "namespace": "dev", "finalizers": finalizers,
                   "deletionTimestamp": "2026-01-01T00:00:00Z"}),
        )
    };
    let (_, body) = post(
        tightened(),
        review(
            "UPDATE",
            Some(deleting(json!([]))),
            Some(deleting(json!(["sandbox.iterion.io/drain"]))),
        ),
    )
    .await;
    assert!(allowed(&body), "the finalizer release is allowed: {body}");

    // Setting stop changes the spec: allowed, the admitted cap only warned about.
    let mut stop_spec = spec.clone();
    stop_spec["stop"] = json!(true);
    let (_, body) = post(
        tightened(),
        review(
            "UPDATE",
            Some(run_object(stop_spec, running.clone())),
            Some(stored.clone()),
        ),
    )
    .await;
    assert!(allowed(&body), "{body}");
    let warnings = body["response"]["warnings"].to_string();
    assert!(
        warnings.contains("[read-back-size-limit]") && warnings.contains("not re-judged"),
        "{body}"
    );

    // A real edit of the started run is still refused.
    let mut edited = spec.clone();
    edited["user"] = json!("2000");
    let (_, body) = post(
        tightened(),
        review("UPDATE", Some(run_object(edited, running)), Some(stored)),
    )
    .await;
    assert!(!allowed(&body), "{body}");
    assert!(
        message(&body).contains("[update-immutable] spec.user"),
        "{body}"
    );
    assert!(
        !message(&body).contains("[read-back-size-limit]"),
        "the admitted cap does not deny: {body}"
    );
}

/// A registry that has no image at all (every manifest is a 404) and counts the questions.
async fn empty_registry() -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let app = axum::Router::new().fallback(move || {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            StatusCode::NOT_FOUND
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("127.0.0.1:{}", addr.port()), hits)
}

#[tokio::test]
async fn with_check_images_an_update_resolves_the_image_only_when_it_changed() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (registry, hits) = empty_registry().await;
    let resolver = ImageResolver::new(ImageSettings {
        timeout: Duration::from_secs(5),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let state = WebhookState {
        images: Some(Arc::new(resolver)),
        ..Default::default()
    };
    // The tag the run was admitted with is gone from the registry.
    let spec = |image: &str, args: &[&str]| json!({"image": format!("{registry}/team/app{image}"), "user": "1000", "args": args});
    let stored = run_object(spec(":gone", &[]), json!({}));
    let (_, body) = post(state.clone(), review("CREATE", Some(stored.clone()), None)).await;
    assert!(!allowed(&body), "CREATE resolves the image: {body}");
    assert!(
        message(&body).contains("[image-resolvable] spec.image"),
        "{body}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);

    // Metadata only, then another field of the spec: the image is not asked about again.
    let finalized = with_metadata(
        stored.clone(),
        json!({"name": "r1", "namespace": "dev", "finalizers": ["sandbox.iterion.io/drain"]}),
    );
    let (_, body) = post(
        state.clone(),
        review("UPDATE", Some(finalized), Some(stored.clone())),
    )
    .await;
    assert!(allowed(&body), "{body}");
    let (_, body) = post(
        state.clone(),
        review(
            "UPDATE",
            Some(run_object(spec(":gone", &["--fast"]), json!({}))),
            Some(stored.clone()),
        ),
    )
    .await;
    assert!(allowed(&body), "{body}");
    assert_eq!(hits.load(Ordering::SeqCst), 1, "no registry round trip");

    // A new image is resolved.
    let (_, body) = post(
        state,
        review(
            "UPDATE",
            Some(run_object(spec(":also-gone", &[]), json!({}))),
            Some(stored),
        ),
    )
    .await;
    assert!(!allowed(&body), "{body}");
    assert!(
        message(&body).contains("[image-resolvable] spec.image")
            && message(&body).contains(":also-gone"),
        "{body}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 2);
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

/// The cluster's run policy (docs/contract.md "A run uses only its author's rights": the runtime
/// classes, priority classes and toleration keys a run may ask for), one table through both
/// front doors: the webhook refuses exactly what `doctor --strict` fails, naming the field and the
/// `run-policy` rule, and allows the rest.
#[tokio::test]
async fn the_run_policy_is_enforced_alike_by_the_webhook_and_doctor() {
    use sandboxrun_operator::doctor::{self, DoctorArgs, Output};
    use sandboxrun_operator::policy::run_policy::RunPolicy;

    let policy = RunPolicy {
        runtime_classes: Some(vec!["gvisor".into()]),
        priority_classes: Some(vec!["batch-low".into()]),
        toleration_keys: Some(vec!["sandbox".into()]),
    };
    let settings = RuleSettings {
        policy,
        ..RuleSettings::default()
    };
    let cases = [
        (json!({"runtimeClassName": "gvisor"}), None),
        (
            json!({"runtimeClassName": "runc"}),
            Some("spec.runtimeClassName"),
        ),
        (json!({"priorityClassName": "batch-low"}), None),
        (
            json!({"priorityClassName": "system-node-critical"}),
            Some("spec.priorityClassName"),
        ),
        (
            json!({"tolerations": [{"key": "sandbox", "operator": "Exists"}]}),
            None,
        ),
        (
            json!({"tolerations": [{"key": "sandbox", "operator": "Exists"}, {"key": "gpu", "operator": "Exists"}]}),
            Some("spec.tolerations[1]"),
        ),
        (
            json!({"tolerations": [{"operator": "Exists"}]}),
            Some("spec.tolerations[0]"),
        ),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    for (i, (fields, refused)) in cases.iter().enumerate() {
        let mut spec = json!({"image": DIGEST_IMAGE, "user": "1000"});
        for (k, v) in fields.as_object().expect("fields") {
            spec[k] = v.clone();
        }
        let state = WebhookState {
            settings: settings.clone(),
            ..WebhookState::default()
        };
        let (_, body) = post(
            state,
            review("CREATE", Some(run_object(spec.clone(), json!({}))), None),
        )
        .await;
        let allowed = body["response"]["allowed"].as_bool();
        let msg = body["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert_eq!(allowed, Some(refused.is_none()), "case {i}: {msg}");
        if let Some(field) = refused {
            assert!(
                msg.contains("run-policy") && msg.contains(field),
                "case {i}: {msg}"
            );
        }

        let manifest = json!({
            "apiVersion": "sandbox.iterion.io/v1alpha1",
            "kind": "SandboxRun",
            "metadata": {"name": format!("case-{i}")},
            "spec": spec,
        });
        let file = dir.path().join(format!("case-{i}.yaml"));
        std::fs::write(&file, serde_yaml::to_string(&manifest).expect("yaml")).expect("write");
        let args = DoctorArgs {
            files: vec![file.display().to_string()],
            strict: true,
            output: Output::Text,
            allowed_runtime_classes: Some("gvisor".into()),
            allowed_priority_classes: Some("batch-low".into()),
            allowed_toleration_keys: Some("sandbox".into()),
            ..Default::default()
        };
        let mut out = Vec::new();
        let code = doctor::run(args, RuleSettings::default(), &mut out).await;
        let text = String::from_utf8_lossy(&out);
        assert_eq!(code, u8::from(refused.is_some()), "case {i}: {text}");
        if let Some(field) = refused {
            assert!(
                text.contains(&format!("run-policy {field}")),
                "case {i}: {text}"
            );
        }
    }
}

/// Issue #27: a run created in a namespace the operator does not watch used to be admitted and
/// sit with no status for ever. With the watched namespaces given (`--webhook-refuse-unwatched`),
/// the webhook refuses it on CREATE naming them; an UPDATE (e.g. letting an older run go) and an
/// operator watching every namespace are never refused for it.
#[tokio::test]
async fn a_run_in_a_namespace_the_operator_does_not_watch_is_refused_on_create() {
    let spec = json!({"image": DIGEST_IMAGE, "user": "1000"});
    let state = |watched: &[&str]| WebhookState {
        watched_namespaces: watched.iter().map(|s| s.to_string()).collect(),
        ..WebhookState::default()
    };
    let create = || review("CREATE", Some(run_object(spec.clone(), json!({}))), None);
    // review() puts the run in namespace `dev`.
    let (_, body) = post(state(&["team-a", "team-b"]), create()).await;
    let msg = body["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(body["response"]["allowed"], false, "{body}");
    assert!(
        msg.contains("namespace-not-watched") && msg.contains("team-a, team-b"),
        "{msg}"
    );
    let (_, body) = post(state(&["dev"]), create()).await;
    assert_eq!(body["response"]["allowed"], true, "{body}");
    let (_, body) = post(state(&[]), create()).await;
    assert_eq!(body["response"]["allowed"], true, "{body}");
    let update = review(
        "UPDATE",
        Some(run_object(spec.clone(), json!({}))),
        Some(run_object(spec.clone(), json!({}))),
    );
    let (_, body) = post(state(&["team-a"]), update).await;
    assert_eq!(body["response"]["allowed"], true, "{body}");
}
