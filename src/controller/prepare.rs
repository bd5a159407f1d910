//! What the cold path reads just before it creates a run's pod, shared by the pipeline's pod
//! creation and a warm pool's claim (`super::warm`): whether the run's store can be used, and
//! the namespace policies' default runtime class.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tracing::warn;

use super::context::Context;
use super::error::ControllerError;
use super::observe;
use crate::api::SandboxRun;

/// The pod of a run Kueue admitted, placed on its admitted flavors (their nodeLabels and
/// tolerations, as Kueue does for its own jobs: docs/user-guide.md "Queueing with Kueue"); any
/// other run's pod as it is. A flavor that cannot be read is an error (retried): the pod is never
/// created off its flavor.
pub(super) async fn kueue_flavors(
    ctx: &Context,
    run: &SandboxRun,
    pod: Pod,
) -> Result<Pod, ControllerError> {
    if !ctx.lifecycle.kueue || crate::kueue::queue_of(run).is_none() {
        return Ok(pod);
    }
    let Some(workload) = observe::workload(&ctx.client, run).await? else {
        return Ok(pod);
    };
    let mut flavors = Vec::new();
    for name in crate::kueue::admitted_flavors(&workload) {
        flavors.push(observe::resource_flavor(&ctx.client, &name).await?);
    }
    Ok(crate::kueue::with_flavors(pod, &flavors))
}

/// Why the run's store cannot be used, before its pod is created (docs/contract.md "A store
/// per namespace"): only with tenant stores on and paths to drain; a read that may pass is an
/// error (retried), never a verdict.
pub(super) async fn store_unusable(
    ctx: &Context,
    run: &SandboxRun,
) -> Result<Option<String>, ControllerError> {
    if !ctx.stores.tenants.enabled() || run.spec.read_back_paths().is_empty() {
        return Ok(None);
    }
    let Err(error) = ctx.run_store(run).await else {
        return Ok(None);
    };
    let why = super::error::store_verdict(error)?;
    warn!(run = %run.name_any(), error = %why, "the run's store cannot be used; its pod is not created");
    Ok(Some(why.to_string()))
}

/// The pod with its namespace policies' default runtime class when the run names none: the
/// namespace's labels are read only when a policy gives a default (docs/contract.md "The
/// platform's namespace policies"). A namespace that cannot be read is an error (the reconcile
/// is retried): the pod is never created without the default its policy sets.
pub(super) async fn namespace_default(
    ctx: &Context,
    run: &SandboxRun,
    pod: Pod,
) -> Result<Pod, ControllerError> {
    let policies = &ctx.pod.namespace_policies;
    if run.spec.runtime_class_name.is_some()
        || !crate::admission::namespace_policy::gives_defaults(policies)
    {
        return Ok(pod);
    }
    let namespace = run.namespace().unwrap_or_default();
    let labels = observe::namespace_labels(&ctx.client, &namespace).await?;
    Ok(crate::pod::with_namespace_default(
        pod, run, &labels, policies,
    ))
}
