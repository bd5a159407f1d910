//! A pool pod's seal (docs/contract.md "A warm pool's launcher is the operator's code; a pool pod
//! serves one run (issue #39)", issue #51): what says the operator made a pod as a pool's pod,
//! where a tenant cannot forge it. Pure: the key is an argument.
//!
//! Labels, names and ownerReferences are the creator's to choose: a tenant with `pods/create` can
//! make a pod carrying a pool's labels, a run's `claimed-by` label, and an ownerReference to the
//! pool with `controller: true` (only `blockOwnerDeletion` needs a right on the owner). A pool
//! pod's uid is the apiserver's, never reused; so once the pool has created a pod it writes
//! [`SEAL_ANNOTATION`] on it: an HMAC, under the key only the operator holds (the admission stamps'
//! key, `crate::policy::stamp_key`), over the pod's namespace, pool, name and **uid**. A
//! look-alike has no seal; a seal copied from a pool pod names another uid (a pod re-created
//! under the same name after the sealed one is gone included). Only a sealed pod is counted,
//! claimed, started, or found as a warm run's pod.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::{json, Value};

pub use super::plan::Made;
use crate::policy::stamp::StampKey;

/// The annotation holding a pool pod's seal.
pub const SEAL_ANNOTATION: &str = "sandbox.iterion.io/pool-pod-seal";

/// How long a pod the pool controls may stay unsealed before it is taken for one whose creator
/// stopped before sealing it, and deleted.
pub const SEAL_GRACE: Duration = Duration::from_secs(120);

/// The version prefix of a seal's value.
const VERSION: &str = "v1";

/// The bytes the HMAC covers: what the seal is bound to.
fn message(namespace: &str, pool: &str, pod: &str, uid: &str) -> Vec<u8> {
    format!("pool-pod-seal {VERSION}\n{namespace}\n{pool}\n{pod}\n{uid}\n").into_bytes()
}

/// The pod's namespace, name and uid; None before the apiserver gave it a uid.
fn identity(pod: &Pod) -> Option<(String, String, String)> {
    Some((pod.namespace()?, pod.metadata.name.clone()?, pod.uid()?))
}

/// The seal of the created pool pod `pod` of the pool `pool` (its label value,
/// [`super::pod::label_value`]); None when it has no uid yet.
pub(crate) fn seal_of(key: &StampKey, pod: &Pod, pool: &str) -> Option<String> {
    let (namespace, name, uid) = identity(pod)?;
    let tag = key.sign(&message(&namespace, pool, &name, &uid));
    Some(format!("{VERSION}.{}", hex::encode(tag)))
}

/// The merge patch that seals the created pool pod `pod`: the annotation, and its uid, which the
/// apiserver checks (a pod of the same name re-created meanwhile is refused, 409).
pub(crate) fn seal_patch(key: &StampKey, pod: &Pod, pool: &str) -> Option<Value> {
    let seal = seal_of(key, pod, pool)?;
    Some(json!({
        "metadata": {
            "uid": pod.uid(),
            "annotations": {SEAL_ANNOTATION: seal},
        }
    }))
}

/// Whether `pod` carries the seal the operator wrote on it as a pod of the pool `pool` (its
/// label value). No key: nothing verifies (fail closed).
pub(crate) fn sealed(key: Option<&StampKey>, pod: &Pod, pool: &str) -> bool {
    let (Some(key), Some((namespace, name, uid))) = (key, identity(pod)) else {
        return false;
    };
    let value = pod.annotations().get(SEAL_ANNOTATION);
    let tag = value
        .and_then(|v| v.strip_prefix(VERSION)?.strip_prefix('.'))
        .and_then(|t| hex::decode(t).ok());
    tag.is_some_and(|tag| key.verifies(&message(&namespace, pool, &name, &uid), &tag))
}

/// Whether `pod`, found under the name of the run's current pod and owned by it, may be taken
/// for the run's pod: a pod of an attempt a warm pool served (`status.warmStart.pod`) must carry
/// that pool's seal, so a look-alike made under its name once the claimed pod is gone (owned by
/// the run, labelled as its) is never drained as the run's nor exec'd into. A cold pod is
/// judged as before.
pub(crate) fn runs_pod(key: Option<&StampKey>, run: &crate::api::SandboxRun, pod: &Pod) -> bool {
    let attempt = crate::identity::current_attempt(run);
    let warm = run
        .status
        .as_ref()
        .and_then(|s| s.warm_start.as_ref())
        .filter(|w| w.attempt() == attempt && w.pod.is_some());
    warm.is_none_or(|w| sealed(key, pod, &super::pod::label_value(&w.pool)))
}

/// How a pool tells its pods: its seal key, its label value, its uid, and now.
#[derive(Debug, Clone, Copy)]
pub struct Judge<'a> {
    /// The operator's key (None: no pod is sealed).
    pub key: Option<&'a StampKey>,
    /// The pool's label value ([`super::pod::label_value`] of its name).
    pub pool: &'a str,
    /// The pool's uid.
    pub pool_uid: &'a str,
    /// Now.
    pub now: Timestamp,
}

impl Judge<'_> {
    /// What `pod` is to the pool.
    pub fn of(&self, pod: &Pod) -> Made {
        if sealed(self.key, pod, self.pool) {
            return Made::Sealed;
        }
        let controlled = pod
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && o.uid == self.pool_uid);
        let grace = i64::try_from(SEAL_GRACE.as_secs()).unwrap_or(i64::MAX);
        let old = pod
            .metadata
            .creation_timestamp
            .as_ref()
            .is_some_and(|t| t.0.as_second().saturating_add(grace) <= self.now.as_second());
        if controlled && old {
            Made::Orphan
        } else {
            Made::Foreign
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    fn key() -> StampKey {
        StampKey::new(b"0123456789abcdef0123456789abcdef")
    }

    fn pod(name: &str, uid: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("team".into());
        pod.metadata.name = Some(name.into());
        pod.metadata.uid = Some(uid.into());
        pod
    }

    fn with_seal(mut pod: Pod, seal: &str) -> Pod {
        pod.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(SEAL_ANNOTATION.into(), seal.into());
        pod
    }

    #[test]
    fn only_the_pod_the_operator_sealed_by_its_uid_is_sealed() {
        let made = pod("agents-h-x1", "uid-1");
        let seal = seal_of(&key(), &made, "agents").unwrap();
        assert!(sealed(
            Some(&key()),
            &with_seal(made.clone(), &seal),
            "agents"
        ));
        // No seal: the pool's labels and owner are anyone's to write.
        assert!(!sealed(Some(&key()), &made, "agents"));
        // The seal copied onto a look-alike (another uid: a pod re-created under the same name
        // after the sealed one is gone too), onto another name, for another pool.
        let again = with_seal(pod("agents-h-x1", "uid-2"), &seal);
        assert!(!sealed(Some(&key()), &again, "agents"));
        assert!(!sealed(
            Some(&key()),
            &with_seal(pod("agents-h-x2", "uid-1"), &seal),
            "agents"
        ));
        assert!(!sealed(
            Some(&key()),
            &with_seal(made.clone(), &seal),
            "other"
        ));
        // Forged under another key, malformed, or no key to check with: not sealed.
        let forged = seal_of(&StampKey::new(b"guess"), &made, "agents").unwrap();
        assert!(!sealed(
            Some(&key()),
            &with_seal(made.clone(), &forged),
            "agents"
        ));
        assert!(!sealed(
            Some(&key()),
            &with_seal(made.clone(), "v1.zz"),
            "agents"
        ));
        assert!(!sealed(None, &with_seal(made.clone(), &seal), "agents"));
        // A pod without a uid (not created yet) has no seal.
        assert!(seal_of(&key(), &Pod::default(), "agents").is_none());
        let patch = seal_patch(&key(), &made, "agents").unwrap();
        assert_eq!(patch["metadata"]["uid"], "uid-1");
        assert_eq!(patch["metadata"]["annotations"][SEAL_ANNOTATION], seal);
    }

    #[test]
    fn an_unsealed_pod_the_pool_controls_is_an_orphan_after_the_grace_anyone_elses_is_foreign() {
        let now = Timestamp::from_second(10_000).unwrap();
        let k = key();
        let judge = Judge {
            key: Some(&k),
            pool: "agents",
            pool_uid: "pool-uid",
            now,
        };
        let made = pod("agents-h-x1", "uid-1");
        let seal = seal_of(&key(), &made, "agents").unwrap();
        assert_eq!(judge.of(&with_seal(made.clone(), &seal)), Made::Sealed);
        let mut controlled = made.clone();
        controlled.metadata.owner_references = Some(vec![OwnerReference {
            uid: "pool-uid".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        let created = |secs: i64| Some(Time(Timestamp::from_second(secs).unwrap()));
        controlled.metadata.creation_timestamp = created(10_000 - 30);
        assert_eq!(judge.of(&controlled), Made::Foreign, "within the grace");
        controlled.metadata.creation_timestamp = created(10_000 - 121);
        assert_eq!(judge.of(&controlled), Made::Orphan);
        let mut foreign = made;
        foreign.metadata.creation_timestamp = created(10_000 - 121);
        assert_eq!(judge.of(&foreign), Made::Foreign);
    }

    #[test]
    fn a_warm_runs_pod_is_its_pools_sealed_pod_never_a_look_alike_under_its_name() {
        use crate::api::{SandboxRun, SandboxRunSpec, SandboxRunStatus, WarmStart};
        let mut run = SandboxRun::new("job", SandboxRunSpec::default());
        let made = pod("agents-h-x1", "uid-1");
        // A cold run's pod: as before (its owner decides).
        assert!(runs_pod(Some(&key()), &run, &made));
        run.status = Some(SandboxRunStatus {
            warm_start: Some(WarmStart {
                pool: "agents".into(),
                pod: Some("agents-h-x1".into()),
                cold_reason: None,
                attempt: Some(1),
            }),
            ..SandboxRunStatus::default()
        });
        let seal = seal_of(&key(), &made, "agents").unwrap();
        assert!(runs_pod(
            Some(&key()),
            &run,
            &with_seal(made.clone(), &seal)
        ));
        // The claimed pod gone, a pod re-created under its name (the seal copied, or none).
        let look_alike = pod("agents-h-x1", "uid-2");
        assert!(!runs_pod(Some(&key()), &run, &look_alike));
        assert!(!runs_pod(Some(&key()), &run, &with_seal(look_alike, &seal)));
    }
}
