//! A checkpoint of a running sandbox (`spec.checkpoint`, docs/user-guide.md "Checkpoints", issue
//! #40), in the drain pool like a teardown — one drain of a run at a time, fair in the slots —
//! but the pod keeps running: every declared path is drained from the holder into the
//! checkpoint's own generation (`<uid>/checkpoint-N/`), then recorded ([`plan::checkpoint_recorded`]).
//! With sharding it holds the run's drain claim as a teardown does ([`drain_claim`]).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tracing::warn;

use super::queue::Waiter;
use super::teardown::{drain_claim, Claimed};
use crate::api::ReadBackStatus;
use crate::api::SandboxRun;
use crate::controller::context::Context;
use crate::controller::error::ControllerError;
use crate::controller::run::act::{self, DrainTarget};
use crate::controller::run::drive;
use crate::controller::run::observe;
use crate::controller::run::plan;
use crate::identity::RunId;
use crate::shard::drain_claim::DrainHold;

/// Starts the run's checkpoint in the drain pool, unless a drain of the run is in flight (the
/// next reconcile asks again).
pub(crate) fn start(ctx: &Arc<Context>, (run, id): (&Arc<SandboxRun>, &RunId)) {
    let waiter = Waiter::of(id, false);
    let shard = ctx.join_shard(run);
    let cancel = shard.as_ref().map_or_else(
        || ctx.in_flight.cancel.clone(),
        |guard| guard.cancel.clone(),
    );
    let job_ctx = Arc::clone(ctx);
    let run = Arc::clone(run);
    let named = ObjectRef::from_obj(run.as_ref());
    ctx.in_flight.drains.start(waiter, named, cancel, move |slot| async move {
        // A checkpoint holds its slot until it ends.
        let (_shard, _slot) = (shard, slot);
        if let Err(error) = checkpoint(&job_ctx, &run).await {
            warn!(run = %run.name_any(), namespace = ?run.namespace(), %error, "checkpoint failed; a later reconcile asks again");
        }
        job_ctx.written_version(&run)
    });
}

/// The checkpoint, under the run's drain claim (with sharding), like a teardown: one drain of a
/// run at a time across replicas, each manifest committed only while the claim holds, and the
/// checkpoint recorded only while it still holds (docs/contract.md "Checkpoints are fenced like
/// teardowns"). Held by a live replica: nothing is done, a later reconcile asks again.
pub(crate) async fn checkpoint(ctx: &Context, run: &SandboxRun) -> Result<(), ControllerError> {
    let hold = match drain_claim(ctx, run).await? {
        Claimed::Unsharded => return take(ctx, run, None).await,
        Claimed::Busy => return Ok(()),
        Claimed::Held(hold) => hold,
    };
    let result = take(ctx, run, Some(&hold)).await;
    hold.release().await;
    result
}

/// The checkpoint, on the run as the apiserver has it now (the cache, or the claim's previous
/// holder, may not show the last one), under `hold` when sharded.
async fn take(
    ctx: &Context,
    run: &SandboxRun,
    hold: Option<&DrainHold>,
) -> Result<(), ControllerError> {
    let Some(live) = observe::live_made_run(&ctx.client, run).await? else {
        return Ok(());
    };
    let Some(token) = live.checkpoint_due() else {
        return Ok(());
    };
    let Some(pod) = observe::own_pod(ctx.seal_check(), &live).await? else {
        return Ok(());
    };
    let live = crate::started::as_started(live, Some(&pod));
    let pod_name = crate::identity::current_pod_name(&live);
    let Some(index) = plan::checkpoint_number(&live, ctx.lifecycle.max_checkpoints) else {
        let now = Timestamp::now();
        let plan = plan::checkpoint_refused(&live, token, ctx.lifecycle.max_checkpoints, now);
        drive::carry_out(ctx, &live, &pod_name, Some(&pod), plan, now).await?;
        return Ok(());
    };
    let paths = plan::checkpoint_paths(&live, &pod, &ctx.caps);
    let (store, paths) = super::teardown::teardown_store(ctx, &live, paths).await?;
    let timeout = u64::try_from(ctx.drain_timeout_seconds(&live)).unwrap_or(0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    let mut target = DrainTarget::new(ctx, &live, store, deadline)?.checkpoint(index);
    if let Some(hold) = hold {
        target = target.claimed(hold.lost().clone(), hold.fence());
    }
    let mut outcomes: Vec<Option<ReadBackStatus>> = vec![None; paths.len()];
    let mut drains = act::drain_paths(ctx, &target, paths);
    while let Some((entry, outcome)) = drains.next().await {
        match (outcomes.get_mut(entry), outcome) {
            (Some(slot), Some(outcome)) => *slot = Some(outcome),
            // This replica stops draining (shutdown, a lost claim): nothing is recorded.
            _ => return Ok(()),
        }
    }
    drop(drains);
    // A claim lost after the last commit: the replica that took it over records the checkpoint.
    if let Some(hold) = hold {
        if !hold.fence().holds().await {
            return Ok(());
        }
    }
    let read_back: Vec<ReadBackStatus> = outcomes.into_iter().flatten().collect();
    let now = Timestamp::now();
    let plan = plan::checkpoint_recorded(&live, token, index, read_back, now);
    drive::carry_out(ctx, &live, &pod_name, Some(&pod), plan, now).await?;
    Ok(())
}
