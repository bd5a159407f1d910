//! Who a run is: its namespace, name and uid ([`RunId`]), made once from the object the
//! apiserver sent, and the resourceVersion a guarded write is preconditioned on. A field that is
//! missing is a typed error ([`MissingIdentity`]), never an empty string: an empty namespace
//! aims a request at the wrong path, an empty uid makes two runs one, an empty resourceVersion
//! drops a precondition (docs/contract.md "A write always names its object"). And which of its
//! attempts and pods is the run's now ([`current_attempt`], [`current_pod_name`], [`owned_by`]).
//! Pure, a leaf beside `api` and `names`.

use k8s_openapi::api::core::v1::Pod;
use kube::{Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::api::SandboxRun;

/// A run's identity: the directory of its stored files, the key of its drain, the owner its
/// objects name (a re-created run with the same name has another uid and collides with none).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunId {
    /// Namespace of the SandboxRun.
    pub namespace: String,
    /// Name of the SandboxRun.
    pub name: String,
    /// UID of the SandboxRun.
    pub uid: String,
}

/// An object without one of the fields every object read from the apiserver has (it was built
/// locally, or a client sent a partial one): nothing is written about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[error("the {kind} has no metadata.{field}; it must be read from the apiserver first")]
pub struct MissingIdentity {
    /// The object's kind, e.g. `SandboxRun`.
    pub kind: &'static str,
    /// The field, e.g. `uid`.
    pub field: &'static str,
}

impl RunId {
    /// The identity of `run`; an error names the first of namespace, name, uid it lacks (an
    /// empty one counts as lacking).
    pub fn of(run: &SandboxRun) -> Result<RunId, MissingIdentity> {
        let meta = run.meta();
        Ok(RunId {
            namespace: required::<SandboxRun>("namespace", meta.namespace.as_deref())?.to_string(),
            name: required::<SandboxRun>("name", meta.name.as_deref())?.to_string(),
            uid: required::<SandboxRun>("uid", meta.uid.as_deref())?.to_string(),
        })
    }
}

/// The namespace of a namespaced object (a pool, a pod), or which field it lacks.
pub fn namespace_of<K: Resource<DynamicType = ()>>(object: &K) -> Result<&str, MissingIdentity> {
    required::<K>("namespace", object.meta().namespace.as_deref())
}

/// The name of an object, or which field it lacks.
pub fn name_of<K: Resource<DynamicType = ()>>(object: &K) -> Result<&str, MissingIdentity> {
    required::<K>("name", object.meta().name.as_deref())
}

/// The uid of an object, or which field it lacks.
pub fn uid_of<K: Resource<DynamicType = ()>>(object: &K) -> Result<&str, MissingIdentity> {
    required::<K>("uid", object.meta().uid.as_deref())
}

/// The resourceVersion a write about `object` is preconditioned on: a write guarded by it fails
/// when the object changed since it was read. Never None or empty, which would drop the guard.
pub fn resource_version<K: Resource<DynamicType = ()>>(
    object: &K,
) -> Result<&str, MissingIdentity> {
    required::<K>("resourceVersion", object.meta().resource_version.as_deref())
}

/// `value` unless it is None or empty; else which field of a `K` it is.
fn required<'a, K: Resource<DynamicType = ()>>(
    field: &'static str,
    value: Option<&'a str>,
) -> Result<&'a str, MissingIdentity> {
    value.filter(|v| !v.is_empty()).ok_or(MissingIdentity {
        kind: kind_of::<K>(),
        field,
    })
}

/// The kind of `K` (a typed resource's kind is a `&'static str`).
fn kind_of<K: Resource<DynamicType = ()>>() -> &'static str {
    match K::kind(&()) {
        std::borrow::Cow::Borrowed(kind) => kind,
        std::borrow::Cow::Owned(_) => "object",
    }
}

/// The attempt a run is at (from 1): one more than the attempts its status lists as ended.
pub fn current_attempt(run: &SandboxRun) -> u32 {
    let ended = run.status.as_ref().map_or(0, |s| s.attempts.len());
    u32::try_from(ended)
        .unwrap_or(u32::MAX - 1)
        .saturating_add(1)
}

/// The name of the run's current pod: its current attempt's (`names::attempt_pod_name`), except
/// for an attempt served by a warm pool: the pool pod it took (`status.warmStart.pod` of that
/// attempt, docs/user-guide.md "Sandboxes for agents: warm pools").
pub fn current_pod_name(run: &SandboxRun) -> String {
    let attempt = current_attempt(run);
    let warm = run
        .status
        .as_ref()
        .and_then(|s| s.warm_start.as_ref())
        .filter(|w| w.attempt() == attempt)
        .and_then(|w| w.pod.clone());
    warm.unwrap_or_else(|| crate::names::attempt_pod_name(&run.name_any(), attempt))
}

/// Whether the pod belongs to the run (owner reference by uid).
pub fn owned_by(pod: &Pod, run: &SandboxRun) -> bool {
    let Some(uid) = run.uid() else { return false };
    pod.owner_references()
        .iter()
        .any(|o| o.uid == uid && o.controller == Some(true))
        && pod.meta().namespace == run.namespace()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SandboxRunSpec;
    use k8s_openapi::api::core::v1::Pod;

    fn run() -> SandboxRun {
        let mut run = SandboxRun::new("demo", SandboxRunSpec::default());
        run.metadata.namespace = Some("ns".into());
        run.metadata.uid = Some("u1".into());
        run.metadata.resource_version = Some("7".into());
        run
    }

    #[test]
    fn a_run_read_from_the_apiserver_has_its_identity() {
        let id = RunId::of(&run()).unwrap();
        assert_eq!(
            id,
            RunId {
                namespace: "ns".into(),
                name: "demo".into(),
                uid: "u1".into()
            }
        );
    }

    #[test]
    fn a_run_without_a_namespace_a_name_or_a_uid_has_no_identity() {
        for field in ["namespace", "name", "uid"] {
            for missing in [None, Some(String::new())] {
                let mut r = run();
                match field {
                    "namespace" => r.metadata.namespace = missing.clone(),
                    "name" => r.metadata.name = missing.clone(),
                    _ => r.metadata.uid = missing.clone(),
                }
                assert_eq!(
                    RunId::of(&r),
                    Err(MissingIdentity {
                        kind: "SandboxRun",
                        field
                    }),
                    "{field} = {missing:?}"
                );
            }
        }
    }

    #[test]
    fn a_missing_resource_version_is_no_precondition_but_an_error() {
        let mut r = run();
        assert_eq!(resource_version(&r), Ok("7"));
        r.metadata.resource_version = Some(String::new());
        let err = resource_version(&r).unwrap_err();
        assert_eq!(err.field, "resourceVersion");
        let mut pod = Pod::default();
        assert_eq!(uid_of(&pod).unwrap_err().kind, "Pod");
        pod.metadata.namespace = Some("ns".into());
        assert_eq!(namespace_of(&pod), Ok("ns"));
        assert_eq!(name_of(&pod).unwrap_err().field, "name");
        assert_eq!(
            err.to_string(),
            "the SandboxRun has no metadata.resourceVersion; it must be read from the apiserver first"
        );
    }
}
