//! The pools' controller's act stage: carries out one [`PoolEffect`] and answers what the world
//! said ([`PoolAnswer`]); it never decides (what follows an answer is
//! [`super::plan`]'s), reads no clock and calls no other stage. The only writes of the
//! pools' controller (hack/io-outside-act.py holds them here), and the attach held open to a
//! ready pod's launcher ([`open_attach`], for `super::attaches`).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::plan::{PoolAnswer, PoolEffect, PoolEvent};
use crate::api::{SandboxRunPool, SandboxRunPoolStatus};
use crate::controller::context::Context;
use crate::controller::error::{kube_err, ControllerError};
use crate::pool::attaches::HeldAttach;

/// Carries out `effect` for `pool`.
pub(crate) async fn carry_out(
    ctx: &Context,
    pool: &SandboxRunPool,
    effect: PoolEffect,
) -> Result<PoolAnswer, ControllerError> {
    let ns = crate::identity::namespace_of(pool)?.to_string();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    match effect {
        PoolEffect::DeletePod {
            name,
            uid,
            resource_version,
        } => delete_pod(&pods, &name, uid, resource_version).await,
        PoolEffect::EndUnclaimed { .. } => carry_out_shortened(ctx, &ns, effect).await,
        PoolEffect::ApplyPolicy(policy) => {
            crate::controller::run::act::apply_network_policy(&ctx.client, &policy).await?;
            Ok(PoolAnswer::Done)
        }
        PoolEffect::CreatePod(pod) => create_pod(&pods, pool, &pod).await,
        PoolEffect::SealPod { name, patch } => {
            let sealed = pods
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(kube_err(format!("seal pool pod {name}")));
            undone_unless(&pods, &name, sealed, "could not be sealed").await
        }
        PoolEffect::ApplyPodPolicy { pod, policy } => {
            let applied =
                crate::controller::run::act::apply_network_policy(&ctx.client, &policy).await;
            undone_unless(&pods, &pod, applied, "NetworkPolicy was not applied").await
        }
        PoolEffect::Publish(event) => {
            publish(ctx, pool, event).await;
            Ok(PoolAnswer::Done)
        }
        PoolEffect::WriteStatus(status) => write_status(ctx, pool, &ns, *status).await,
    }
}

/// Carries out a [`super::plan::shortened_deletion`] in `ns` (it needs no pool: its pool may be
/// gone): the pod deleted again with the short grace period and, when that took effect, its
/// holder's preStop told the drain is done. Any other effect needs its pool and is not carried
/// out here.
pub(crate) async fn carry_out_shortened(
    ctx: &Context,
    ns: &str,
    effect: PoolEffect,
) -> Result<PoolAnswer, ControllerError> {
    let PoolEffect::EndUnclaimed {
        name,
        uid,
        resource_version,
    } = effect
    else {
        return Ok(PoolAnswer::Done);
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    if delete_unclaimed(&pods, &name, uid, resource_version).await? {
        info!(pod = %name, "an unclaimed pool pod being deleted: ending it now");
        crate::controller::run::act::mark_drained(&pods, &name, &ctx.pod.holder_binary).await;
    }
    Ok(PoolAnswer::Done)
}

/// `done`, or, when it failed, the pod `name` deleted (best effort) and the failure.
async fn undone_unless<T>(
    pods: &Api<Pod>,
    name: &str,
    done: Result<T, ControllerError>,
    what: &str,
) -> Result<PoolAnswer, ControllerError> {
    match done {
        Ok(_) => Ok(PoolAnswer::Done),
        Err(e) => {
            warn!(pod = %name, error = %e, "a pool pod {what}; deleting it");
            let _ = pods.delete(name, &unclaimed_delete()).await;
            Err(e)
        }
    }
}

async fn create_pod(
    pods: &Api<Pod>,
    pool: &SandboxRunPool,
    pod: &Pod,
) -> Result<PoolAnswer, ControllerError> {
    match pods.create(&PostParams::default(), pod).await {
        Ok(made) => Ok(PoolAnswer::Created(Box::new(made))),
        Err(kube::Error::Api(ae)) if ae.code == 409 => Ok(PoolAnswer::Exists),
        Err(kube::Error::Api(ae)) if ae.code == 403 || ae.code == 422 => {
            warn!(pool = %pool.name_any(), reason = %ae.message, "a pool pod was refused");
            Ok(PoolAnswer::Refused(ae.message))
        }
        Err(e) => {
            let ns = pool.namespace().unwrap_or_default();
            let name = pool.name_any();
            Err(kube_err(format!("create a pod of pool {ns}/{name}"))(e))
        }
    }
}

/// How the pool deletes a pod no run claimed: with [`super::plan::UNCLAIMED_GRACE_SECONDS`].
fn unclaimed_delete() -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(super::plan::UNCLAIMED_GRACE_SECONDS),
        ..DeleteParams::default()
    }
}

async fn delete_pod(
    pods: &Api<Pod>,
    name: &str,
    uid: Option<String>,
    resource_version: Option<String>,
) -> Result<PoolAnswer, ControllerError> {
    if delete_unclaimed(pods, name, uid, resource_version).await? {
        info!(pod = %name, "pool pod deleted (outdated or surplus)");
    }
    Ok(PoolAnswer::Done)
}

/// Deletes the unclaimed pool pod `name` as it was read (its uid and resourceVersion as
/// preconditions, so a pod a run claimed meanwhile is never deleted): whether the delete took
/// effect (404 and 409, a change that came first, are no error).
async fn delete_unclaimed(
    pods: &Api<Pod>,
    name: &str,
    uid: Option<String>,
    resource_version: Option<String>,
) -> Result<bool, ControllerError> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version,
        }),
        ..unclaimed_delete()
    };
    match pods.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(ae)) if ae.code == 404 || ae.code == 409 => Ok(false),
        Err(e) => Err(kube_err(format!("delete pool pod {name}"))(e)),
    }
}

/// Publishes an Event about `pool` (best effort: a failure is logged).
async fn publish(ctx: &Context, pool: &SandboxRunPool, event: PoolEvent) {
    let reason = event.reason;
    let published = Event {
        type_: if event.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.to_string(),
        note: Some(event.note),
        action: "Reconcile".to_string(),
        secondary: None,
    };
    if let Err(e) = ctx
        .recorder
        .publish(&published, &pool.object_ref(&()))
        .await
    {
        warn!(pool = %pool.name_any(), reason, error = %e, "could not publish Event");
    }
}

/// Writes the pool's status (server-side apply, the operator's field manager).
async fn write_status(
    ctx: &Context,
    pool: &SandboxRunPool,
    ns: &str,
    status: SandboxRunPoolStatus,
) -> Result<PoolAnswer, ControllerError> {
    let api: Api<SandboxRunPool> = Api::namespaced(ctx.client.clone(), ns);
    let name = pool.name_any();
    let body = serde_json::json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRunPool",
        "metadata": {"name": name, "namespace": ns},
        "status": status,
    });
    api.patch_status(
        &name,
        &PatchParams::apply(crate::names::MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(kube_err(format!("write the status of pool {ns}/{name}")))?;
    Ok(PoolAnswer::Done)
}

/// An attach to the launcher of `pod` (the pod of `uid`), held open for a claim
/// (`super::attaches`): stdin only, nothing written; None when it cannot be opened (the claim
/// then opens its own).
pub(super) async fn open_attach(pods: &Api<Pod>, pod: &str, uid: String) -> Option<HeldAttach> {
    let params = crate::controller::run::launcher_attach_params();
    let opened = tokio::time::timeout(Duration::from_secs(10), pods.attach(pod, &params)).await;
    let mut process = match opened {
        Ok(Ok(process)) => process,
        Ok(Err(e)) => {
            debug!(pod, error = %e, "could not hold an attach to a pool pod's launcher");
            return None;
        }
        Err(_) => return None,
    };
    let stdin = process.stdin()?;
    let status = Box::pin(process.take_status()?);
    Some(HeldAttach::new(uid, stdin, status, Some(process)))
}
