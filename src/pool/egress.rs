//! A pool pod's NetworkPolicy (docs/user-guide.md "Sandboxes for agents: warm pools",
//! docs/contract.md "A filtered run never has an unfiltered instant"): the policy a run made from
//! the pool's template would get, selecting the one pool pod by its [`POOL_POD_LABEL`] and owned
//! by it (the garbage collector deletes it with the pod, claimed or not). Pure.
//!
//! A pool pod of a template whose runs restrict egress starts behind the egress gate as a run's
//! pod does: its gate holds the parked workload until this policy is in force, so nothing the
//! tenant wrote runs unfiltered. A claim keeps the pod's labels: this policy keeps selecting the
//! pod after the run's own (the same rules, applied before the claim) selects it too, so there is
//! no instant when neither does.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::{Resource, ResourceExt};

use super::pod::POOL_POD_LABEL;
use crate::api::SandboxRun;
use crate::egress::policy::{build_policy, policy_while_gated, POLICY_SUFFIX};
use crate::egress::EgressSettings;

/// The NetworkPolicy of the pool pod `pod` (as built, before or after its creation) of the
/// pool whose template made `stand_in`; while its gate waits, the version with what the gate
/// needs denied ([`policy_while_gated`]: the node at `node` when the gate probes it, the egress
/// proxy's pods at `proxy`). None when the template's runs have open egress.
pub fn pool_pod_policy(
    stand_in: &SandboxRun,
    settings: &EgressSettings,
    pod: &Pod,
    (node, proxy): (Option<IpAddr>, &[IpAddr]),
) -> Option<NetworkPolicy> {
    let gated = policy_while_gated(stand_in, settings, node, proxy)
        .ok()
        .flatten();
    let mut policy = match gated {
        Some(policy) => policy,
        None => build_policy(stand_in, settings).ok()??,
    };
    let name = pod.name_any();
    policy.metadata.name = Some(format!("{name}{POLICY_SUFFIX}"));
    policy.metadata.labels = Some(BTreeMap::from([
        (
            crate::names::MANAGED_BY_LABEL.to_string(),
            crate::names::MANAGED_BY.to_string(),
        ),
        (POOL_POD_LABEL.to_string(), name.clone()),
    ]));
    // Owned by the pod once it exists (its uid is known): the policy goes with it.
    policy.metadata.owner_references = pod.uid().map(|uid| {
        vec![OwnerReference {
            api_version: Pod::api_version(&()).to_string(),
            kind: Pod::kind(&()).to_string(),
            name: name.clone(),
            uid,
            ..OwnerReference::default()
        }]
    });
    if let Some(spec) = policy.spec.as_mut() {
        spec.pod_selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(POOL_POD_LABEL.to_string(), name)])),
            match_expressions: None,
        });
    }
    Some(policy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{NetworkMode, NetworkPolicy as Network};

    fn stand_in(network: Option<Network>) -> SandboxRun {
        crate::testkit::sandbox_run("agents")
            .namespace("team")
            .uid("pool-uid")
            .edit(|spec| spec.network = network)
            .build()
    }

    fn pod(uid: Option<&str>) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some("agents-abc-x1y2z".into());
        pod.metadata.uid = uid.map(str::to_string);
        pod
    }

    #[test]
    fn a_pool_pods_policy_is_the_runs_selecting_that_pod_and_owned_by_it() {
        // The default gate probes the node; the wide denylist allows the ranges the node is
        // carved from.
        let settings = EgressSettings {
            denylist_wide: true,
            ..EgressSettings::default()
        };
        assert!(pool_pod_policy(&stand_in(None), &settings, &pod(None), (None, &[])).is_none());
        let denylist = stand_in(Some(Network {
            mode: NetworkMode::Denylist,
            rules: vec!["192.0.2.0/24".into()],
        }));
        let run_policy = build_policy(&denylist, &settings).unwrap().unwrap();
        let before = pool_pod_policy(&denylist, &settings, &pod(None), (None, &[])).unwrap();
        assert_eq!(
            before.metadata.name.as_deref(),
            Some("agents-abc-x1y2z-egress")
        );
        assert!(before.metadata.owner_references.is_none());
        let selector = before.spec.as_ref().unwrap().pod_selector.clone().unwrap();
        assert_eq!(
            selector.match_labels.unwrap()[POOL_POD_LABEL],
            "agents-abc-x1y2z"
        );
        // The same rules as the run's own policy: only who it selects differs.
        assert_eq!(
            before.spec.as_ref().unwrap().egress,
            run_policy.spec.as_ref().unwrap().egress
        );
        // Scheduled, under the node probe: the node is denied, and the pod owns it.
        let node: IpAddr = "10.1.2.3".parse().unwrap();
        let after = pool_pod_policy(
            &denylist,
            &settings,
            &pod(Some("pod-uid")),
            (Some(node), &[]),
        )
        .unwrap();
        let on_node = policy_while_gated(&denylist, &settings, Some(node), &[])
            .unwrap()
            .unwrap();
        assert_eq!(
            after.spec.as_ref().unwrap().egress,
            on_node.spec.as_ref().unwrap().egress
        );
        assert_ne!(
            after.spec.as_ref().unwrap().egress,
            before.spec.as_ref().unwrap().egress
        );
        let owner = &after.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Pod", "pod-uid")
        );
    }
}
