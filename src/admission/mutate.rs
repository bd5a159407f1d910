//! The webhook's mutating half, `POST /mutate-sandboxrun` (docs/contract.md "A run uses only its
//! author's rights"; the route is [`super::webhook`]'s, which judges the request as
//! `/validate-sandboxrun` does): on a run it admits after verifying every right the run exercises
//! for the requesting user, the stamp of [`super::stamp`] in its annotations — what the controller requires before it gives
//! such a run a pod. The validating half still runs after every mutating webhook, so a spec
//! another webhook changed later is judged as stored (and its stamp no longer matches it).

use kube::core::admission::{AdmissionRequest, Operation};
use kube::core::DynamicObject;

use super::stamp::{self, StampKey, Subject, STAMP_ANNOTATION};
use crate::api::SandboxRunSpec;

/// What the webhook stamps with: its key (None: nothing is stamped) and whether it checked the
/// requesting user's rights at all.
#[derive(Clone, Copy)]
pub(crate) struct Stamping<'a> {
    /// The key.
    pub key: Option<&'a StampKey>,
    /// Whether the access checks ran (without them nothing was verified).
    pub access_checks: bool,
}

/// The request's specs as the webhook read them: the new one, the stored one (UPDATE), and
/// whether the stored run names its pod.
#[derive(Clone, Copy)]
pub(crate) struct Specs<'a> {
    /// The spec the request writes.
    pub new: &'a SandboxRunSpec,
    /// The stored spec, on UPDATE.
    pub old: Option<&'a SandboxRunSpec>,
    /// Whether the stored run's status names its pod.
    pub pod_exists: bool,
}

/// The JSON patch that stamps `req`'s run at `issued`, when this request verified every right
/// the run exercises: a CREATE, or an UPDATE before its pod exists that changes what shapes the
/// pod ([`super::access::to_verify`]), with the access checks on and a key. None otherwise —
/// then a stamp the run already has is left as it is. Called by the webhook's mutating route
/// once the same judgement as the validating one admitted the request.
pub(crate) fn stamp_patch(
    stamping: Stamping<'_>,
    req: &AdmissionRequest<DynamicObject>,
    specs: Specs<'_>,
    issued: i64,
) -> Option<json_patch::Patch> {
    let key = stamping.key?;
    if !stamping.access_checks
        || !matches!(req.operation, Operation::Create | Operation::Update)
        || req.sub_resource.as_deref().is_some_and(|s| !s.is_empty())
    {
        return None;
    }
    let object = req.object.as_ref()?;
    let spec = specs.new;
    let required = super::access::required(spec);
    let verified = super::access::to_verify(specs.old, spec, specs.pod_exists);
    if required.is_empty() || verified.len() != required.len() {
        return None;
    }
    let name = stamp::bound_name(&req.name, object.metadata.generate_name.as_deref());
    let subject = Subject {
        namespace: req.namespace.as_deref()?,
        name: &name,
        spec,
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

    /// [`stamp_patch`] with the specs read from the review, as the webhook reads them.
    fn patched(
        stamping: Stamping<'_>,
        req: &AdmissionRequest<DynamicObject>,
        issued: i64,
    ) -> Option<json_patch::Patch> {
        let spec = |o: &DynamicObject| -> SandboxRunSpec {
            serde_json::from_value(o.data["spec"].clone()).unwrap()
        };
        let new = spec(req.object.as_ref().unwrap());
        let old = req.old_object.as_ref().map(spec);
        let pod_exists = req
            .old_object
            .as_ref()
            .is_some_and(|o| o.data.pointer("/status/podName").is_some());
        let specs = Specs {
            new: &new,
            old: old.as_ref(),
            pod_exists,
        };
        stamp_patch(stamping, req, specs, issued)
    }

    fn stamping(key: &StampKey) -> Stamping<'_> {
        Stamping {
            key: Some(key),
            access_checks: true,
        }
    }

    /// The stamp is written exactly when this request verified every right the run uses, and
    /// it verifies for the run as the controller sees it.
    #[test]
    fn a_run_is_stamped_only_when_every_right_it_uses_was_verified_in_this_request() {
        let key = StampKey::new(b"key");
        let state = stamping(&key);
        let created = review("CREATE", run("make", false), None);
        let patch = patched(state, &created, 1_000).expect("a CREATE is stamped");
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
        assert!(patched(state, &changed, 1_001).is_some());
        // A metadata-only update verified nothing: the stamp the run has is left alone.
        let same = review("UPDATE", run("make", false), Some(run("make", false)));
        assert!(patched(state, &same, 1_002).is_none());
        // Without the access checks, or a key, nothing was verified or can be vouched for.
        let unchecked = Stamping {
            access_checks: false,
            ..state
        };
        assert!(patched(unchecked, &created, 1_000).is_none());
        let keyless = Stamping { key: None, ..state };
        assert!(patched(keyless, &created, 1_000).is_none());
    }
}
