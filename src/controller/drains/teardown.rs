//! A teardown, in the drain pool (off the reconcile workers): planned when it gets its slot
//! ([`plan::teardown`]), its drains run by [`act::drain_paths`], what to write and when decided
//! by [`TeardownProgress`] (pure), and its end planned by [`plan::teardown_end`].

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tracing::{info, warn};

use super::pool::Slot;
use super::queue::Waiter;
use crate::api::{ReadBackStatus, SandboxRun};
use crate::controller::context::Context;
use crate::controller::error::{kube_err, ControllerError};
use crate::controller::run::act::{self, DrainTarget};
use crate::controller::run::decide::Trigger;
use crate::controller::run::drive;
use crate::controller::run::observe;
use crate::controller::run::plan::{self, TeardownPlan, TeardownProgress};
use crate::identity::{self, RunId};
use crate::shard::drain_claim::{Claim, DrainHold};
use crate::store::tenant_read::RunStore;

/// Starts the run's teardown in the drain pool, unless one is in flight. The teardown waits for
/// a slot (or for this replica to stop) in the fair queue — first when its pod is being deleted
/// or evicted (docs/contract.md "Fair drain slots") —, reads the pod as it is then (a queued
/// teardown holds no copy of it: thousands may wait at once), runs, and leaves the run to its
/// next reconcile, which follows at once (docs/contract.md "A run's next step follows its
/// drain"); a teardown that fails is counted, logged, and retried by a later reconcile
/// after a pause.
pub(crate) fn start(ctx: &Arc<Context>, (run, id): (&Arc<SandboxRun>, &RunId), trigger: Trigger) {
    let waiter = Waiter::of(id, trigger.is_urgent());
    let job_ctx = Arc::clone(ctx);
    let run = Arc::clone(run);
    // Sharded: the teardown holds its shard until it ends, and one still waiting for a slot is
    // cancelled when the shard is released (docs/contract.md "Shards").
    let shard = ctx.join_shard(&run);
    let cancel = shard.as_ref().map_or_else(
        || ctx.in_flight.cancel.clone(),
        |guard| guard.cancel.clone(),
    );
    let named = ObjectRef::from_obj(run.as_ref());
    ctx.in_flight.drains.start(waiter, named, cancel, move |slot| async move {
        let _shard = shard;
        let ctx = job_ctx;
        let result = claimed_teardown(&ctx, &run, &trigger, Some(slot)).await;
        if let Err(error) = result {
            ctx.metrics
                .reconcile_errors
                .with_label_values(&[error.metric_label()])
                .inc();
            warn!(run = %run.name_any(), namespace = ?run.namespace(), %error, "teardown failed; retrying in 10s");
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(10)) => {}
                () = ctx.in_flight.cancel.cancelled() => {}
            }
        }
        ctx.written_version(&run)
    });
}

/// The teardown, once this replica holds the run's drain claim (with sharding; without, at
/// once): one teardown of a run at a time across replicas, whatever its shard label says
/// (src/shard/drain_claim.rs, issue #38). Claimed, the run is read afresh first: the cache may
/// predate what the claim's previous holder wrote. Held by a live replica: nothing is done, a
/// later reconcile asks again. `slot`: the teardown's drain slot, given back once its drains
/// are done (None: the caller holds none).
pub(crate) async fn claimed_teardown(
    ctx: &Context,
    run: &SandboxRun,
    trigger: &Trigger,
    slot: Option<Slot>,
) -> Result<(), ControllerError> {
    let hold = match drain_claim(ctx, run).await? {
        Claimed::Unsharded => {
            let pod = observe::own_pod(ctx.seal_check(), run).await?;
            let run = crate::started::as_started(run.clone(), pod.as_ref());
            return teardown(ctx, &run, pod.as_ref(), trigger, (None, slot)).await;
        }
        Claimed::Busy => return Ok(()),
        Claimed::Held(hold) => hold,
    };
    let result = fresh_teardown(ctx, run, trigger, (&hold, slot)).await;
    hold.release().await;
    result
}

/// The answer of [`drain_claim`].
pub(crate) enum Claimed {
    /// No sharding: no claim to take, the drain goes on.
    Unsharded,
    /// This replica holds the run's drain claim until the hold is released.
    Held(DrainHold),
    /// Another live replica drains the run: nothing is done here.
    Busy,
}

/// The run's drain claim for this replica (with sharding: one drain of a run — a teardown or a
/// checkpoint — at a time across replicas, src/shard/drain_claim.rs, issue #38; docs/contract.md
/// "Shards").
pub(crate) async fn drain_claim(
    ctx: &Context,
    run: &SandboxRun,
) -> Result<Claimed, ControllerError> {
    let Some(claims) = ctx.sharding.drain_claims.as_ref() else {
        return Ok(Claimed::Unsharded);
    };
    let uid = RunId::of(run)?.uid;
    match claims
        .claim(&uid, &ctx.in_flight.cancel)
        .await
        .map_err(kube_err(format!("take the drain claim of run {uid}")))?
    {
        Claim::Held(hold) => Ok(Claimed::Held(hold)),
        Claim::Busy(holder) => {
            info!(run = %run.name_any(), namespace = ?run.namespace(), %holder, "another replica drains this run; not draining it here");
            Ok(Claimed::Busy)
        }
    }
}

/// [`teardown`] of the run as the apiserver has it now, under `hold`.
async fn fresh_teardown(
    ctx: &Context,
    run: &SandboxRun,
    trigger: &Trigger,
    (hold, slot): (&DrainHold, Option<Slot>),
) -> Result<(), ControllerError> {
    let Some(live) = observe::live_made_run(&ctx.client, run).await? else {
        return Ok(());
    };
    let pod = observe::own_pod(ctx.seal_check(), &live).await?;
    let live = crate::started::as_started(live, pod.as_ref());
    teardown(ctx, &live, pod.as_ref(), trigger, (Some(hold), slot)).await
}

/// The store the teardown drains into, resolved now (docs/contract.md "A store per namespace"),
/// and its paths: read only when a path is still to drain; when it cannot be used, every path
/// still to drain is recorded Failed naming it ([`plan::without_store`]) and nothing is drained.
/// A read that may pass (the apiserver unreachable or failing) is an error: the teardown is
/// retried.
pub(crate) async fn teardown_store(
    ctx: &Context,
    run: &SandboxRun,
    paths: Vec<plan::PathPlan>,
) -> Result<(RunStore, Vec<plan::PathPlan>), ControllerError> {
    if !paths
        .iter()
        .any(|p| matches!(p.work, plan::PathWork::Drain { .. }))
    {
        return Ok((ctx.operator_store(), paths));
    }
    let namespace = RunId::of(run)?.namespace;
    match ctx.run_store((&namespace, run)).await {
        Ok(store) => Ok((store, paths)),
        Err(error) => {
            let why = crate::controller::error::store_verdict(error)?;
            warn!(run = %run.name_any(), namespace = ?run.namespace(), error = %why, "the run's store cannot be used; its drains fail");
            let paths = plan::without_store(paths, &why.to_string());
            Ok((ctx.operator_store(), paths))
        }
    }
}

/// Whether the run's read-back status is still what this teardown started from, and this replica
/// still drains: the late opening (the status a teardown writes once it outlasts the quiet
/// window) is written only then. A replica that was stalled (frozen, starved) past its lease
/// wakes with its quiet-window timer due before it learns the lease is gone; the next owner may
/// have ended the run meanwhile, and the stale opening would overwrite its `Drained` with
/// `Pending` (docs/contract.md "What the store holds across attempts").
async fn unchanged_since_start(ctx: &Context, run: &SandboxRun) -> Result<bool, ControllerError> {
    if ctx.in_flight.cancel.is_cancelled() {
        return Ok(false);
    }
    let id = RunId::of(run)?;
    let Some(live) = observe::live_run(&ctx.client, &id.namespace, &id.name).await? else {
        return Ok(false);
    };
    let read_back = |r: &SandboxRun| r.status.as_ref().map(|s| s.read_back.clone());
    Ok(read_back(&live) == read_back(run))
}

/// What happened next while draining.
enum Next {
    /// A path's drain ended (no outcome: this replica stops draining).
    Outcome(usize, Option<ReadBackStatus>),
    /// The quiet window passed.
    QuietWindowPassed,
    /// Every drain ended.
    Drained,
}

/// One teardown, planned now (it has its slot in the pool): the opening, every path's outcome
/// recorded as it is had, then the end. The slot is given back once every drain ended, before
/// the end is written: the end drains nothing, and the next teardown need not wait for its
/// writes (docs/contract.md "Fair drain slots").
async fn teardown(
    ctx: &Context,
    run: &SandboxRun,
    pod: Option<&Pod>,
    trigger: &Trigger,
    (hold, slot): (Option<&DrainHold>, Option<Slot>),
) -> Result<(), ControllerError> {
    let pod_name = identity::current_pod_name(run);
    let now = Timestamp::now();
    let timeout = ctx.drain_timeout_seconds(run);
    let TeardownPlan {
        opening,
        opening_waits,
        status,
        drain_left,
        paths,
        holder_running,
    } = plan::teardown(run, pod, trigger, &ctx.caps, timeout, now);
    let (store, paths) = teardown_store(ctx, run, paths).await?;
    let deleting = pod.is_some_and(|p| p.metadata.deletion_timestamp.is_some());
    let mut target = DrainTarget::new(ctx, run, store, tokio::time::Instant::now() + drain_left)?
        .urgent(deleting);
    if let Some(hold) = hold {
        target = target.claimed(hold.lost().clone(), hold.fence());
    }
    let (mut progress, opening) = TeardownProgress::begin(
        opening,
        opening_waits,
        status,
        paths.len(),
        ctx.lifecycle.settle,
    );
    if let Some(opening) = opening {
        drive::carry_out(ctx, run, &pod_name, pod, opening, now).await?;
    }
    let settled = tokio::time::sleep(ctx.lifecycle.settle);
    tokio::pin!(settled);
    let mut drains = act::drain_paths(ctx, &target, paths);
    loop {
        let next = tokio::select! {
            next = drains.next() => match next {
                Some((entry, outcome)) => Next::Outcome(entry, outcome),
                None => Next::Drained,
            },
            () = &mut settled, if progress.waits_for_quiet_window() => Next::QuietWindowPassed,
        };
        match next {
            Next::Outcome(entry, outcome) => {
                if let Some(status) = progress.outcome(entry, outcome) {
                    act::write_status(ctx, run, &status).await?;
                }
            }
            Next::QuietWindowPassed => {
                if let Some(late) = progress.quiet_window_passed() {
                    if unchanged_since_start(ctx, run).await? {
                        drive::carry_out(ctx, run, &pod_name, pod, late, now).await?;
                    }
                }
            }
            Next::Drained => break,
        }
    }
    drop(slot);
    // This replica stopped draining (lost lease, shutdown): the next leader ends it.
    let Some(status) = progress.finish() else {
        return Ok(());
    };
    let now = Timestamp::now();
    let attempt = crate::controller::run::retry::AttemptEnd::of(trigger, pod);
    let end = plan::attempt_end(
        run,
        status,
        (holder_running, pod.is_some()),
        ctx.lifecycle.default_retention,
        attempt.as_ref(),
        now,
    );
    drive::carry_out(ctx, run, &pod_name, pod, end, now).await?;
    Ok(())
}
