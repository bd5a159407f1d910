//! The NetworkPolicies of a warm pool's pods (`crate::pool::egress`): the pool controller applies
//! one to each pod of a template whose runs restrict egress as soon as the pod exists (owned by
//! it: the garbage collector deletes it with the pod), and, while the pod's egress gate waits on
//! a known node, its version with that node denied (the gate probes the node). Until the policy
//! is in force the gate holds the parked workload: nothing the tenant wrote runs unfiltered.

use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::{Api, ResourceExt};
use tracing::warn;

use super::context::Context;
use super::error::ControllerError;
use crate::api::SandboxRun;
use crate::pool::egress::pool_pod_policy;
use crate::pool::plan::PoolPod;
use crate::pool::pod::CLAIMED_BY_LABEL;

/// Applies the policy of the pool pod `created` (as the apiserver returned it). A pod whose
/// policy cannot be applied is deleted: its gate would only time out.
pub(super) async fn created(
    ctx: &Context,
    stand_in: &SandboxRun,
    created: &Pod,
) -> Result<(), ControllerError> {
    let proxy = ctx.egress_proxy.addresses();
    let gated = (None, proxy.as_slice());
    let Some(policy) = pool_pod_policy(stand_in, &ctx.pod.egress, created, gated) else {
        return Ok(());
    };
    if let Err(e) = super::act::apply_network_policy(&ctx.client, &policy).await {
        let ns = created.namespace().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
        let name = created.name_any();
        warn!(pod = %name, error = %e, "a pool pod's NetworkPolicy was not applied; deleting the pod");
        let _ = pods.delete(&name, &DeleteParams::default()).await;
        return Err(e);
    }
    Ok(())
}

/// Applies, to each unclaimed pod whose gate waits on a known node, its policy with that node
/// and the egress proxy's pods denied (server-side apply of the same object changes nothing;
/// applied again each look while the gate waits, which also heals a policy lost in between).
pub(super) async fn gates_waiting(
    ctx: &Context,
    stand_in: &SandboxRun,
    (owned, views): (&[Pod], &[PoolPod]),
) -> Result<(), ControllerError> {
    let proxy = ctx.egress_proxy.addresses();
    for pod in gated(owned, views) {
        let node = pod
            .status
            .as_ref()
            .and_then(|s| s.host_ip.as_deref())
            .and_then(|ip| ip.parse().ok());
        let gated = (node, proxy.as_slice());
        if let Some(policy) = pool_pod_policy(stand_in, &ctx.pod.egress, pod, gated) {
            super::act::apply_network_policy(&ctx.client, &policy).await?;
        }
    }
    Ok(())
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
        && super::observe::gate_waiting(pod)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::plan::Made;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus};

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
}
