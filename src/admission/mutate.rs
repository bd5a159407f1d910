//! The webhook's mutating half, `POST /mutate-sandboxrun` (docs/contract.md "A run uses only its
//! author's rights"; the route is [`super::webhook`]'s, which judges the request as
//! `/validate-sandboxrun` does): on a run it admits after verifying every right the run exercises
//! for the requesting user, the stamp of [`crate::policy::stamp`] in its annotations — what the controller requires before it gives
//! such a run a pod. The validating half still runs after every mutating webhook, so a spec
//! another webhook changed later is judged as stored (and its stamp no longer matches it).
//!
//! A stamp is issued only for a request that is what the apiserver is really doing (issue #51
//! item 3): a named CREATE of a run that does not exist, an UPDATE whose old object is the run
//! as stored (same uid and resourceVersion); the stamp binds that request ([`stamp::Binding`]).
//! And a request that is not stamped cannot write a stamp of its own: a stamp it adds or
//! changes is put back as stored (docs/contract.md "A run uses only its author's rights").

use kube::core::admission::{AdmissionRequest, Operation};
use kube::core::DynamicObject;

use crate::api::SandboxRunSpec;
use crate::policy::stamp::{self, Binding, StampKey, Subject, STAMP_ANNOTATION};

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

/// The run as the apiserver stores it, read by the webhook when a review arrives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StoredRun {
    /// No run of that name.
    Absent,
    /// The stored run's uid, resourceVersion and generation.
    Present {
        /// `metadata.uid`.
        uid: Option<String>,
        /// `metadata.resourceVersion`.
        resource_version: Option<String>,
        /// `metadata.generation`.
        generation: Option<i64>,
    },
    /// Not read (no client, a read error, a run named by the apiserver later).
    Unknown,
}

/// The request a review stamps for, when the review is what the apiserver is doing with the
/// stored run: a CREATE of a name no run has (or a `generateName` one, which has no name yet);
/// an UPDATE whose old object is the stored run (its uid, resourceVersion and generation), making
/// the next generation. None: a review that is not (a forged one, or one raced by another write).
fn binding<'a>(
    req: &'a AdmissionRequest<DynamicObject>,
    stored: &StoredRun,
) -> Option<Binding<'a>> {
    match req.operation {
        Operation::Create if req.name.is_empty() => Some(Binding::Create),
        Operation::Create => (*stored == StoredRun::Absent).then_some(Binding::Create),
        Operation::Update => {
            let old = &req.old_object.as_ref()?.metadata;
            let (uid, version) = (old.uid.as_deref()?, old.resource_version.as_deref()?);
            let StoredRun::Present {
                uid: Some(stored_uid),
                resource_version: Some(stored_version),
                generation: Some(stored_generation),
            } = stored
            else {
                return None;
            };
            let generation = old.generation?;
            let same =
                stored_uid == uid && stored_version == version && *stored_generation == generation;
            same.then_some(Binding::Update {
                uid,
                generation: generation.checked_add(1)?,
            })
        }
        _ => None,
    }
}

/// The patch the mutating route answers an admitted request with: the stamp of what it
/// verified ([`stamp_patch`]), else, when the request wrote a stamp of its own (added one,
/// changed or copied one), the stored one put back ([`restore_patch`]). None: nothing to change.
pub(crate) fn mutation(
    stamping: Stamping<'_>,
    req: &AdmissionRequest<DynamicObject>,
    specs: Specs<'_>,
    stored: &StoredRun,
    issued: i64,
) -> Option<json_patch::Patch> {
    stamp_patch(stamping, req, specs, stored, issued).or_else(|| restore_patch(req))
}

/// The JSON patch that stamps `req`'s run at `issued`, when this request verified every right
/// the run exercises: a CREATE, or an UPDATE before its pod exists that changes what shapes the
/// pod ([`crate::policy::access::to_verify`]), with the access checks on and a key, and the review is
/// the apiserver's real request on `stored` ([`binding`]). None otherwise. Called by the
/// webhook's mutating route once the same judgement as the validating one admitted the request.
pub(crate) fn stamp_patch(
    stamping: Stamping<'_>,
    req: &AdmissionRequest<DynamicObject>,
    specs: Specs<'_>,
    stored: &StoredRun,
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
    let required = crate::policy::access::required(spec);
    let verified = crate::policy::access::to_verify(specs.old, spec, specs.pod_exists);
    if required.is_empty() || verified.len() != required.len() {
        return None;
    }
    let binding = binding(req, stored)?;
    let name = stamp::bound_name(&req.name, object.metadata.generate_name.as_deref());
    let subject = Subject {
        namespace: req.namespace.as_deref()?,
        name: &name,
        spec,
    };
    let value = stamp::issue(key, &subject, binding, issued);
    Some(annotate(object, value))
}

/// The patch that puts the stored stamp back on a request that wrote its own: a CREATE that
/// carries one loses it, an UPDATE that added or changed one gets the stored value back (or
/// none). None: the request left the stamp as stored (or removed it: that only loses rights).
pub(crate) fn restore_patch(req: &AdmissionRequest<DynamicObject>) -> Option<json_patch::Patch> {
    use json_patch::jsonptr::PointerBuf;
    use json_patch::{PatchOperation, RemoveOperation, ReplaceOperation};
    if !matches!(req.operation, Operation::Create | Operation::Update)
        || req.sub_resource.as_deref().is_some_and(|s| !s.is_empty())
    {
        return None;
    }
    let stamp_of = |o: &DynamicObject| {
        o.metadata
            .annotations
            .as_ref()?
            .get(STAMP_ANNOTATION)
            .cloned()
    };
    let written = stamp_of(req.object.as_ref()?)?;
    let stored = req.old_object.as_ref().and_then(stamp_of);
    if stored.as_deref() == Some(written.as_str()) {
        return None;
    }
    let path = PointerBuf::from_tokens(["metadata", "annotations", STAMP_ANNOTATION]);
    let operation = match stored {
        Some(value) => PatchOperation::Replace(ReplaceOperation {
            path,
            value: serde_json::Value::String(value),
        }),
        None => PatchOperation::Remove(RemoveOperation { path }),
    };
    Some(json_patch::Patch(vec![operation]))
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
            "metadata": {"name": "report", "namespace": "team-a", "uid": "u-1", "resourceVersion": "7", "generation": 1},
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

    /// [`stamp_patch`] with the specs read from the review, as the webhook reads them, for the
    /// apiserver's real request: a CREATE of a run that does not exist, an UPDATE of the run as
    /// stored.
    fn patched(
        stamping: Stamping<'_>,
        req: &AdmissionRequest<DynamicObject>,
        issued: i64,
    ) -> Option<json_patch::Patch> {
        let stored = match &req.old_object {
            None => StoredRun::Absent,
            Some(old) => StoredRun::Present {
                uid: old.metadata.uid.clone(),
                resource_version: old.metadata.resource_version.clone(),
                generation: old.metadata.generation,
            },
        };
        patched_on(stamping, req, &stored, issued)
    }

    /// [`stamp_patch`] against `stored`.
    fn patched_on(
        stamping: Stamping<'_>,
        req: &AdmissionRequest<DynamicObject>,
        stored: &StoredRun,
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
        stamp_patch(stamping, req, specs, stored, issued)
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
        let facts = stamp::RunFacts {
            created: 1_000,
            uid: "u-1",
            generation: 1,
        };
        assert_eq!(
            stamp::verify(&key, value.as_str(), &subject, None, facts),
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

    /// The value of a stamp patch's single operation.
    fn stamp_of(patch: &json_patch::Patch) -> String {
        match &patch.0[..] {
            [json_patch::PatchOperation::Add(add)] => {
                add.value[STAMP_ANNOTATION].as_str().map_or_else(
                    || add.value.as_str().unwrap_or_default().to_string(),
                    str::to_string,
                )
            }
            other => panic!("{other:?}"),
        }
    }

    /// Issue #51 item 3: a pod that reached the webhook POSTed a review it made up — a CREATE
    /// of a run that already exists, or an UPDATE whose old object is not the stored run — and
    /// got a stamp for a run held `RightsUnverified`. Only the apiserver's real request on the
    /// stored run is stamped, and the stamp binds it: the run's uid and the generation the
    /// update makes.
    #[test]
    fn a_review_that_is_not_the_apiservers_request_on_the_stored_run_is_never_stamped() {
        let key = StampKey::new(b"key");
        let state = stamping(&key);
        let held = StoredRun::Present {
            uid: Some("u-1".into()),
            resource_version: Some("7".into()),
            generation: Some(1),
        };
        // A CREATE of a name a run already has.
        let create = review("CREATE", run("make", false), None);
        assert!(patched_on(state, &create, &held, 1_000).is_none());
        assert!(patched_on(state, &create, &StoredRun::Unknown, 1_000).is_none());
        // An UPDATE whose old object claims an older generation / another resourceVersion / uid.
        let mut older = run("sleep", false);
        older["metadata"]["resourceVersion"] = "6".into();
        let forged = review("UPDATE", run("make", false), Some(older));
        assert!(patched_on(state, &forged, &held, 1_000).is_none());
        let mut other_uid = run("sleep", false);
        other_uid["metadata"]["uid"] = "u-2".into();
        let forged = review("UPDATE", run("make", false), Some(other_uid));
        assert!(patched_on(state, &forged, &held, 1_000).is_none());
        // The stored resourceVersion copied, but an older generation claimed (so that the stamp
        // would name the generation the run already has).
        let held_later = StoredRun::Present {
            uid: Some("u-1".into()),
            resource_version: Some("7".into()),
            generation: Some(2),
        };
        let forged = review("UPDATE", run("make", false), Some(run("sleep", false)));
        assert!(patched_on(state, &forged, &held_later, 1_000).is_none());
        // The real update of the stored run: stamped for the generation it makes (2).
        let real = review("UPDATE", run("make", false), Some(run("sleep", false)));
        let stamp = stamp_of(&patched_on(state, &real, &held, 1_000).expect("stamped"));
        assert!(stamp.starts_with("v2.1000.u2."), "{stamp}");
    }

    /// Issue #51 item 3: a stamp survived metadata-only updates, and such an update could write
    /// one (obtained elsewhere) on a held run. A request that is not stamped cannot write a
    /// stamp: a CREATE loses the one it carries, an UPDATE that adds or changes one gets the
    /// stored one back; one that leaves it alone is left alone.
    #[test]
    fn a_request_that_was_not_stamped_cannot_write_a_stamp_of_its_own() {
        let with_stamp = |mut run: serde_json::Value, value: &str| {
            run["metadata"]["annotations"] = serde_json::json!({ STAMP_ANNOTATION: value });
            run
        };
        let remove = |patch: &json_patch::Patch| matches!(&patch.0[..], [json_patch::PatchOperation::Remove(r)] if r.path.to_string().ends_with("admitted-rights"));
        let create = review("CREATE", with_stamp(run("make", false), "v2.1.c.00"), None);
        assert!(restore_patch(&create).is_some_and(|p| remove(&p)));
        let added = review(
            "UPDATE",
            with_stamp(run("make", false), "v2.1.c.00"),
            Some(run("make", false)),
        );
        assert!(restore_patch(&added).is_some_and(|p| remove(&p)));
        let changed = review(
            "UPDATE",
            with_stamp(run("make", false), "v2.9.u2.ff"),
            Some(with_stamp(run("make", false), "v2.1.c.00")),
        );
        match restore_patch(&changed).expect("put back").0.as_slice() {
            [json_patch::PatchOperation::Replace(r)] => assert_eq!(r.value, "v2.1.c.00"),
            other => panic!("{other:?}"),
        }
        let kept = review(
            "UPDATE",
            with_stamp(run("make", true), "v2.1.c.00"),
            Some(with_stamp(run("make", true), "v2.1.c.00")),
        );
        assert!(restore_patch(&kept).is_none());
        // Through the route's decision: a metadata-only update writing a stamp gets none.
        let key = StampKey::new(b"key");
        let held = StoredRun::Present {
            uid: Some("u-1".into()),
            resource_version: Some("7".into()),
            generation: Some(1),
        };
        let spec: SandboxRunSpec =
            serde_json::from_value(run("make", false)["spec"].clone()).unwrap();
        let specs = Specs {
            new: &spec,
            old: Some(&spec),
            pod_exists: false,
        };
        let patch = mutation(stamping(&key), &added, specs, &held, 1_000);
        assert!(patch.is_some_and(|p| remove(&p)));
    }
}
