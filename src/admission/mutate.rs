//! The webhook's mutating half, `POST /mutate-sandboxrun` (docs/contract.md "A run uses only its
//! author's rights"): the same judgement as `/validate-sandboxrun` ([`super::webhook`]), and on a
//! run it admits after verifying every right the run exercises for the requesting user, the
//! stamp of [`super::stamp`] in its annotations — what the controller requires before it gives
//! such a run a pod. The validating half still runs after every mutating webhook, so a spec
//! another webhook changed later is judged as stored (and its stamp no longer matches it).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use kube::core::admission::{AdmissionRequest, Operation};
use kube::core::DynamicObject;
use tracing::{debug, warn};

use super::stamp::{self, StampKey, Subject, STAMP_ANNOTATION};
use super::webhook::WebhookState;
use super::webhook::{pod_exists, read_review, review_request, spec_value, typed_specs};

/// Judges the review as `/validate-sandboxrun` does; an admitted run whose rights were all
/// verified is stamped.
pub(crate) async fn mutate(
    State(state): State<Arc<WebhookState>>,
    body: Bytes,
) -> impl IntoResponse {
    let request = match read_review(&body) {
        Ok(request) => request,
        Err(unreadable) => return *unreadable,
    };
    let (response, verdict) = review_request(&state, &request).await;
    let response = match (response.allowed, stamp_patch(&state, &request, now())) {
        (true, Some(patch)) => match response.clone().with_patch(patch) {
            Ok(stamped) => stamped,
            Err(e) => {
                warn!(error = %e, name = %request.name, "the admission stamp could not be written; the run will be held");
                response
            }
        },
        _ => response,
    };
    debug!(uid = %request.uid, name = %request.name, verdict, "admission review (mutating)");
    (StatusCode::OK, Json(response.into_review()))
}

/// Now, in Unix seconds.
fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// The JSON patch that stamps `req`'s run at `issued`, when this request verified every right
/// the run exercises: a CREATE, or an UPDATE before its pod exists that changes what shapes the
/// pod ([`super::access::to_verify`]), with the access checks on and a key. None otherwise —
/// then a stamp the run already has is left as it is.
fn stamp_patch(
    state: &WebhookState,
    req: &AdmissionRequest<DynamicObject>,
    issued: i64,
) -> Option<json_patch::Patch> {
    let key: &StampKey = state.stamp_key.as_ref()?;
    if !state.access_checks
        || !matches!(req.operation, Operation::Create | Operation::Update)
        || req.sub_resource.as_deref().is_some_and(|s| !s.is_empty())
    {
        return None;
    }
    let object = req.object.as_ref()?;
    let old = req.old_object.as_ref();
    let (spec, old_spec) = typed_specs(spec_value(object), old.map(spec_value))?;
    let required = super::access::required(&spec);
    let verified = super::access::to_verify(old_spec.as_ref(), &spec, old.is_some_and(pod_exists));
    if required.is_empty() || verified.len() != required.len() {
        return None;
    }
    let name = stamp::bound_name(&req.name, object.metadata.generate_name.as_deref());
    let subject = Subject {
        namespace: req.namespace.as_deref()?,
        name: &name,
        spec: &spec,
    };
    let value = stamp::issue(key, &subject, issued);
    Some(annotate(object, value))
}

/// The patch that sets [`STAMP_ANNOTATION`] to `value` on `object`.
fn annotate(object: &DynamicObject, value: String) -> json_patch::Patch {
    use json_patch::jsonptr::PointerBuf;
    use json_patch::{AddOperation, PatchOperation};
    let operation = if object.metadata.annotations.is_some() {
        AddOperation {
            path: PointerBuf::from_tokens(["metadata", "annotations", STAMP_ANNOTATION]),
            value: serde_json::Value::String(value),
        }
    } else {
        AddOperation {
            path: PointerBuf::from_tokens(["metadata", "annotations"]),
            value: serde_json::json!({ STAMP_ANNOTATION: value }),
        }
    };
    json_patch::Patch(vec![PatchOperation::Add(operation)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::admission::AdmissionReview;

    fn review(
        operation: &str,
        object: serde_json::Value,
        old: Option<serde_json::Value>,
    ) -> AdmissionRequest<DynamicObject> {
        let body = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "1",
                "kind": {"group": "sandbox.iterion.io", "version": "v1alpha1", "kind": "SandboxRun"},
                "resource": {"group": "sandbox.iterion.io", "version": "v1alpha1", "resource": "sandboxruns"},
                "name": "report",
                "namespace": "team-a",
                "operation": operation,
                "userInfo": {"username": "alice"},
                "object": object,
                "oldObject": old,
                "dryRun": false,
            }
        });
        let review: AdmissionReview<DynamicObject> = serde_json::from_value(body).unwrap();
        review.try_into().unwrap()
    }

    fn run(command: &str, pod: bool) -> serde_json::Value {
        let mut run = serde_json::json!({
            "apiVersion": "sandbox.iterion.io/v1alpha1",
            "kind": "SandboxRun",
            "metadata": {"name": "report", "namespace": "team-a"},
            "spec": {
                "image": "img@sha256:abc",
                "user": "1000",
                "command": ["sh", "-c", command],
                "mounts": [{"name": "db", "type": "secret", "source": "db", "target": "/secret"}],
            },
        });
        if pod {
            run["status"] = serde_json::json!({"podName": "report-sbr"});
        }
        run
    }

    fn state() -> WebhookState {
        WebhookState {
            access_checks: true,
            stamp_key: Some(StampKey::new(b"key")),
            ..Default::default()
        }
    }

    /// The stamp is written exactly when this request verified every right the run uses, and
    /// it verifies for the run as the controller sees it.
    #[test]
    fn a_run_is_stamped_only_when_every_right_it_uses_was_verified_in_this_request() {
        let state = state();
        let created = review("CREATE", run("make", false), None);
        let patch = stamp_patch(&state, &created, 1_000).expect("a CREATE is stamped");
        let value = match &patch.0[..] {
            [json_patch::PatchOperation::Add(add)] => add.value[STAMP_ANNOTATION].clone(),
            other => panic!("{other:?}"),
        };
        let spec: crate::api::SandboxRunSpec =
            serde_json::from_value(run("make", false)["spec"].clone()).unwrap();
        let subject = Subject {
            namespace: "team-a",
            name: "report",
            spec: &spec,
        };
        let key = state.stamp_key.clone().unwrap();
        assert_eq!(
            stamp::verify(&key, value.as_str(), &subject, None, 1_000),
            Ok(())
        );
        // Before the pod exists a changed command re-verifies everything: stamped again.
        let changed = review(
            "UPDATE",
            run("cat /secret/*", false),
            Some(run("make", false)),
        );
        assert!(stamp_patch(&state, &changed, 1_001).is_some());
        // A metadata-only update verified nothing: the stamp the run has is left alone.
        let same = review("UPDATE", run("make", false), Some(run("make", false)));
        assert!(stamp_patch(&state, &same, 1_002).is_none());
        // Without the access checks, or a key, nothing was verified or can be vouched for.
        let unchecked = WebhookState {
            access_checks: false,
            ..state.clone()
        };
        assert!(stamp_patch(&unchecked, &created, 1_000).is_none());
        let keyless = WebhookState {
            stamp_key: None,
            ..state
        };
        assert!(stamp_patch(&keyless, &created, 1_000).is_none());
    }
}
