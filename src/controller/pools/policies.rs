//! The NetworkPolicies of a warm pool's pods (`crate::pool::egress`), planned (pure): the pool
//! controller applies one to each pod of a template whose runs restrict egress as soon as the pod
//! exists (owned by it: the garbage collector deletes it with the pod;
//! [`super::plan::after_create`]), and, while the pod's egress gate waits on a known node,
//! its version with that node denied (the gate probes the node; [`gates_waiting`]). Until the
//! policy is in force the gate holds the parked workload: nothing the tenant wrote runs
//! unfiltered. Act applies them ([`super::act`]).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;

use crate::api::SandboxRun;
use crate::egress::EgressSettings;
use crate::pool::egress::pool_pod_policy;
use crate::pool::plan::PoolPod;
use crate::pool::pod::CLAIMED_BY_LABEL;

/// The policies of the unclaimed pods whose gate waits on a known node: each with that node and
/// the egress proxy's pods (at `proxy`) denied (server-side apply of the same object changes
/// nothing; applied again each look while the gate waits, which also heals a policy lost in
/// between). The policy of a pod just created is [`super::plan::after_create`]'s.
pub(crate) fn gates_waiting<'a>(
    (stand_in, egress, proxy): (&'a SandboxRun, &'a EgressSettings, &'a [IpAddr]),
    (owned, views): (&'a [Pod], &'a [PoolPod]),
) -> impl Iterator<Item = NetworkPolicy> + 'a {
    gated(owned, views).filter_map(move |pod| {
        let node = pod
            .status
            .as_ref()
            .and_then(|s| s.host_ip.as_deref())
            .and_then(|ip| ip.parse().ok());
        pool_pod_policy(stand_in, egress, pod, (node, proxy))
    })
}

/// The pods of `owned` (seen as `views`, in the same order) whose gate waits on a node: only the
/// pool's own, sealed ones (issue #51). A look-alike carrying the pool's labels gets no policy
/// from the operator: its name, which the policy's name is made of, is its creator's choice, so
/// applying one could overwrite another pod's policy (a run's `<pod>-egress`) with the pool's
/// rules and selector.
fn gated<'a>(owned: &'a [Pod], views: &'a [PoolPod]) -> impl Iterator<Item = &'a Pod> + 'a {
    owned
        .iter()
        .zip(views)
        .filter(|(p, v)| v.sealed && waits_on_a_node(p))
        .map(|(p, _)| p)
}

/// An unclaimed pool pod, not being deleted, scheduled, whose egress gate has not ended.
fn waits_on_a_node(pod: &Pod) -> bool {
    !pod.labels().contains_key(CLAIMED_BY_LABEL)
        && pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().is_some_and(|s| s.host_ip.is_some())
        && crate::controller::pod_view::gate_waiting(pod)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::plan::Made;
    use k8s_openapi::api::core::v1::{
        Container, ContainerState, ContainerStateTerminated, ContainerStatus, PodSpec, PodStatus,
    };

    /// A pod of the pool's labels whose gate waits on a node.
    fn waiting(name: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.spec = Some(PodSpec {
            init_containers: Some(vec![Container {
                name: crate::inpod::gate::GATE_CONTAINER.into(),
                ..Container::default()
            }]),
            ..PodSpec::default()
        });
        pod.status = Some(PodStatus {
            host_ip: Some("10.1.2.3".into()),
            ..PodStatus::default()
        });
        pod
    }

    #[test]
    fn only_a_sealed_pool_pod_whose_gate_waits_gets_its_policy_never_a_look_alike() {
        let owned = [waiting("agents-h-x1"), waiting("victim-a1")];
        let views = [
            crate::pool::pod::view_of(&owned[0], Made::Sealed),
            crate::pool::pod::view_of(&owned[1], Made::Foreign),
        ];
        let names: Vec<String> = gated(&owned, &views).map(|p| p.name_any()).collect();
        assert_eq!(names, ["agents-h-x1"]);
    }

    /// Only an unclaimed pod, not being deleted, scheduled on a node, whose gate still waits
    /// gets its gate's policy: a claimed pod's policy is its run's, a deleting one needs none,
    /// an unscheduled one has no node to deny yet, and one whose gate ended is open already.
    #[test]
    fn a_claimed_deleting_unscheduled_or_opened_pool_pod_gets_no_gate_policy() {
        let sealed = |pods: &[Pod]| -> Vec<PoolPod> {
            pods.iter()
                .map(|p| crate::pool::pod::view_of(p, Made::Sealed))
                .collect()
        };
        let mut claimed = waiting("agents-h-claimed");
        claimed.metadata.labels = Some([(CLAIMED_BY_LABEL.to_string(), "uid".to_string())].into());
        let mut deleting = waiting("agents-h-deleting");
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
        let mut unscheduled = waiting("agents-h-unscheduled");
        unscheduled.status = Some(PodStatus::default());
        let mut opened = waiting("agents-h-opened");
        opened
            .status
            .get_or_insert_with(PodStatus::default)
            .init_container_statuses = Some(vec![ContainerStatus {
            name: crate::inpod::gate::GATE_CONTAINER.into(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated::default()),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }]);
        let owned = [
            claimed,
            deleting,
            unscheduled,
            opened,
            waiting("agents-h-waits"),
        ];
        let views = sealed(&owned);
        let names: Vec<String> = gated(&owned, &views).map(|p| p.name_any()).collect();
        assert_eq!(names, ["agents-h-waits"]);
    }
}
