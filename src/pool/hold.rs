//! Which pool pods this replica holds an attach open to (docs/contract.md "A claim writes its
//! start on an attach held open"): the launcher of a sealed, unclaimed pool pod whose workload
//! container runs is attached to ahead of any claim, so a claim writes its start on an open
//! stream instead of opening one (the attach's setup was the longest step of a warm start).
//! The attach is stdin only and writes nothing until a claim: the launcher reads the one line
//! the claim writes. The pod's stdin is not `stdinOnce` (`super::park`), so a held attach that
//! ends unused (a restart, a claim by another replica, the kubelet's idle timeout) leaves the
//! launcher waiting, as it was. Pure: the watch event's pod and the key are arguments.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::pod::{CLAIMED_BY_LABEL, POOL_LABEL};
use crate::policy::stamp::StampKey;

/// What a replica does with its held attach to a pool pod it sees pass on the pools' watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Hold one open to this pod (the pod's uid), unless one is held or being opened.
    Open { uid: String },
    /// The pod was claimed: a held attach is the claim's to take; one left after the delivery
    /// timeout (a claim by another replica, a claim that fell back) is closed then.
    ClaimedLetGoLater,
    /// The pod is going or not this pool's to serve: close any held attach now.
    LetGo,
    /// Nothing to do (the pod is not ready yet).
    Wait,
}

/// What to do with a held attach to `pod` ([`Hold`]); None for a pod that is no pool's.
pub fn hold_for(pod: &Pod, key: Option<&StampKey>) -> Option<Hold> {
    let pool = pod.labels().get(POOL_LABEL)?;
    let uid = pod.metadata.uid.clone()?;
    if pod.metadata.deletion_timestamp.is_some() || !super::seal::sealed(key, pod, pool) {
        return Some(Hold::LetGo);
    }
    if pod.labels().contains_key(CLAIMED_BY_LABEL) {
        return Some(Hold::ClaimedLetGoLater);
    }
    if !super::park::is_parked(pod) {
        return Some(Hold::LetGo);
    }
    Some(if launcher_runs(pod) {
        Hold::Open { uid }
    } else {
        Hold::Wait
    })
}

/// Whether the pod's workload container (its parked launcher) runs.
fn launcher_runs(pod: &Pod) -> bool {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    statuses.into_iter().flatten().any(|c| {
        c.name == crate::pod::WORKLOAD_CONTAINER
            && c.state.as_ref().is_some_and(|s| s.running.is_some())
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        Container, ContainerState, ContainerStateRunning, ContainerStatus, PodSpec, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn key() -> StampKey {
        StampKey::new(b"0123456789abcdef0123456789abcdef")
    }

    /// A sealed pool pod of `agents` whose launcher runs.
    fn ready() -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some("agents-abcde".into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.uid = Some("u-pod".into());
        pod.metadata.labels = Some(BTreeMap::from([(POOL_LABEL.into(), "agents".into())]));
        pod.spec = Some(PodSpec {
            containers: vec![Container {
                name: crate::pod::WORKLOAD_CONTAINER.into(),
                command: Some(vec![crate::pool::park::launcher_path(), "launch".into()]),
                ..Container::default()
            }],
            ..PodSpec::default()
        });
        pod.status = Some(PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: crate::pod::WORKLOAD_CONTAINER.into(),
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning::default()),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        });
        seal(pod)
    }

    fn seal(mut pod: Pod) -> Pod {
        let patch = crate::pool::seal::seal_patch(&key(), &pod, "agents").expect("a seal");
        let value = patch["metadata"]["annotations"][crate::pool::seal::SEAL_ANNOTATION]
            .as_str()
            .expect("the seal's value")
            .to_string();
        pod.annotations_mut()
            .insert(crate::pool::seal::SEAL_ANNOTATION.into(), value);
        pod
    }

    #[test]
    fn only_a_sealed_unclaimed_pool_pod_whose_launcher_runs_gets_an_attach_held() {
        let k = key();
        assert_eq!(
            hold_for(&ready(), Some(&k)),
            Some(Hold::Open {
                uid: "u-pod".into()
            })
        );
        // Not started yet: later.
        let mut starting = ready();
        starting.status = None;
        assert_eq!(hold_for(&starting, Some(&k)), Some(Hold::Wait));
        // A look-alike (no seal, or no key to verify one), a pod being deleted, a pod not
        // parked in the launcher: nothing held.
        let mut look_alike = ready();
        look_alike.annotations_mut().clear();
        assert_eq!(hold_for(&look_alike, Some(&k)), Some(Hold::LetGo));
        assert_eq!(hold_for(&ready(), None), Some(Hold::LetGo));
        let mut deleting = ready();
        deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        assert_eq!(hold_for(&deleting, Some(&k)), Some(Hold::LetGo));
        let mut unparked = ready();
        if let Some(spec) = unparked.spec.as_mut() {
            spec.containers[0].command = Some(vec!["sh".into()]);
        }
        assert_eq!(hold_for(&unparked, Some(&k)), Some(Hold::LetGo));
        // Claimed: the claim takes it; what is left is let go later.
        let mut claimed = ready();
        claimed
            .labels_mut()
            .insert(CLAIMED_BY_LABEL.into(), "u-run".into());
        assert_eq!(hold_for(&claimed, Some(&k)), Some(Hold::ClaimedLetGoLater));
        // Any other pod: not the pools'.
        let mut other = ready();
        other.labels_mut().clear();
        assert_eq!(hold_for(&other, Some(&k)), None);
    }
}
