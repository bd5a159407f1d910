//! The controller: watches SandboxRuns and their pods and reconciles each run in five stages —
//! observe → decide → plan → act → report. The stages live in the run's room, [`run`]:
//!
//! - [`run::observe`] reads the run's pod (and, for a pod stuck Pending, its Events) into a
//!   [`pod_view::PodView`];
//! - [`run::decide`] chooses the one next [`run::decide::Step`] (pure);
//! - [`run::plan`] turns the step into the status to write, the Events to publish and the effects
//!   to have (pure; statuses from [`run::status`], conditions from [`conditions`], Events from
//!   [`events`], creation back-off from [`run::refusals`], TTL and retention from
//!   [`run::retention`]);
//! - [`run::act`] carries the plan out — the only stage that changes the world — and answers
//!   (pod created / exists / refused, files purged) instead of deciding: `plan::after` plans the
//!   follow-up (`run/drive.rs` alternates the two); a teardown runs in the [`drains::pool`]
//!   (`drains/teardown.rs`), off the reconcile workers, over act's stream of drains;
//! - [`report`] counts the reconcile by step in the metrics.
//!
//! `run/pipeline.rs` runs the stages of one reconcile in order, with one `now`.
//!
//! Beside the run's room: the drains ([`drains`]), the pools' controller ([`pools`]), the test
//! scaffolding (`testkit/`), and the vocabulary several rooms share ([`pod_view`], [`conditions`],
//! [`events`]). This file is the wiring: the watches, the reconcile loop and its error policy.

pub(crate) mod conditions;
pub(crate) mod context;
pub(crate) mod drains;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod pod_view;
pub(crate) mod pools;
pub(crate) mod run;

#[cfg(test)]
mod doc_tables;
#[cfg(test)]
mod testkit;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::DynamicObject;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, ResourceExt};
use tracing::warn;

pub(crate) use context::Context;
pub(crate) use error::ControllerError;

use crate::api::{Phase, SandboxRun};
use crate::metrics::Metrics;

/// Runs the controller until `shutdown` resolves. `namespaces` empty = every namespace.
pub(crate) async fn run(
    ctx: Arc<Context>,
    namespaces: Vec<String>,
    concurrency: u16,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let workload = crate::kueue::workload_resource();
    let scopes = scopes(&namespaces).into_iter().map(|ns| match ns {
        None => (
            Api::<SandboxRun>::all(client.clone()),
            Api::<Pod>::all(client.clone()),
            Api::<DynamicObject>::all_with(client.clone(), &workload),
        ),
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
            Api::namespaced_with(client.clone(), ns, &workload),
        ),
    });
    let shutdown = futures::future::FutureExt::shared(Box::pin(shutdown));
    spawn_queue_gauge(Arc::downgrade(&ctx));
    let mut streams = Vec::new();
    for (runs, pods, workloads) in scopes {
        if let Some(gate) = &ctx.sharding.gate {
            tokio::spawn(crate::shard::label::label_new_runs(
                runs.clone(),
                Arc::clone(gate),
            ));
        }
        // The runs are cached without their managedFields, which nothing here reads and which
        // are a fifth of a run's bytes (the cache is most of the operator's memory at 10,000 runs).
        let (reader, writer) = kube::runtime::reflector::store();
        let cached = run_events(&ctx, runs)
            .modify(|run: &mut SandboxRun| run.managed_fields_mut().clear())
            .reflect(writer)
            .applied_objects();
        let mut controller = with_pods(Controller::for_stream(cached, reader), &ctx, pods);
        if ctx.lifecycle.kueue {
            // The runs' Kueue Workloads wake them (admitted, evicted): docs/user-guide.md
            // "Queueing with Kueue".
            let managed = crate::pod::managed_by_selector();
            controller = controller.owns_with(
                workloads,
                workload.clone(),
                watcher::Config::default().labels(&managed),
            );
        }
        let ends = drain_ends(&ctx, controller.store());
        let controller = controller
            .reconcile_on(ends)
            .with_config(kube::runtime::controller::Config::default().concurrency(concurrency));
        spawn_phase_gauge(controller.store(), ctx.metrics.clone());
        let stream = controller
            .graceful_shutdown_on(shutdown.clone())
            .run(reconcile_run, error_policy, ctx.clone())
            .for_each(|res| async move {
                if let Err(e) = res {
                    warn!(error = %e, "reconcile failed");
                }
            });
        streams.push(stream);
    }
    futures::future::join_all(streams).await;
}

/// Where a controller watches: every namespace (None) when `namespaces` is empty, else each of
/// them (`run --namespaces`).
pub(crate) fn scopes(namespaces: &[String]) -> Vec<Option<&str>> {
    if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().map(|ns| Some(ns.as_str())).collect()
    }
}

/// The runs' watch events: every run, or with sharding only the runs labelled with the shards
/// this replica owns (restarted when they change: docs/contract.md "Shards").
fn run_events(
    ctx: &Context,
    runs: Api<SandboxRun>,
) -> futures::stream::BoxStream<'static, Result<watcher::Event<SandboxRun>, watcher::Error>> {
    match &ctx.sharding.gate {
        Some(gate) => {
            crate::shard::watches::owned_watch(runs, watcher::Config::default(), gate.serving())
        }
        None => watcher(runs, watcher::Config::default()).boxed(),
    }
}

/// The run pods that wake their run: every pod this operator made, or with sharding the pods of
/// the shards this replica owns plus those with no shard label (made before sharding).
fn with_pods(
    controller: Controller<SandboxRun>,
    ctx: &Context,
    pods: Api<Pod>,
) -> Controller<SandboxRun> {
    let managed = crate::pod::managed_by_selector();
    let Some(gate) = &ctx.sharding.gate else {
        return controller.owns(pods, watcher::Config::default().labels(&managed));
    };
    let unlabelled = format!("{managed},!{}", crate::shard::SHARD_LABEL);
    let labelled = crate::shard::watches::owned_watch(
        pods.clone(),
        watcher::Config::default().labels(&managed),
        gate.serving(),
    )
    .touched_objects();
    controller
        .owns_stream(labelled)
        .owns(pods, watcher::Config::default().labels(&unlabelled))
}

/// The runs whose drain just ended, to reconcile again now (docs/contract.md "A run's next step
/// follows its drain"; [`drains::pool::wakes_at_end`]): those in this controller's cache only (its
/// namespace, its shards). A controller that fell behind misses some: their runs are looked at
/// again after the in-flight requeue.
fn drain_ends(
    ctx: &Context,
    cached: kube::runtime::reflector::Store<SandboxRun>,
) -> impl futures::Stream<Item = ObjectRef<SandboxRun>> + Send + 'static {
    use tokio::sync::broadcast::error::RecvError;
    futures::stream::unfold(ctx.in_flight.drains.ends(), |mut ends| async move {
        loop {
            match ends.recv().await {
                Ok(run) => return Some((run, ends)),
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return None,
            }
        }
    })
    .filter(move |run| futures::future::ready(cached.get(run).is_some()))
}

/// Keeps `sandboxrun_runs{phase}` up to date from the watch cache, every 10 s. A run with no
/// phase yet counts as `New`.
fn spawn_phase_gauge(store: kube::runtime::reflector::Store<SandboxRun>, metrics: Metrics) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let mut counts = std::collections::BTreeMap::<&'static str, i64>::new();
            for run in store.state() {
                let phase = run
                    .status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .map(Phase::as_str)
                    .unwrap_or(NEW_PHASE_LABEL);
                *counts.entry(phase).or_default() += 1;
            }
            for phase in std::iter::once(NEW_PHASE_LABEL).chain(Phase::ALL.map(Phase::as_str)) {
                metrics
                    .runs_by_phase
                    .with_label_values(&[phase])
                    .set(counts.get(phase).copied().unwrap_or(0));
            }
        }
    });
}

/// Keeps the age of the oldest teardown waiting for a drain slot up to date, every 5 s (the
/// queue's other gauges follow each change of it), while the controller's context lives.
fn spawn_queue_gauge(ctx: std::sync::Weak<Context>) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let Some(ctx) = ctx.upgrade() else {
                break;
            };
            ctx.in_flight.drains.refresh_metrics();
        }
    });
}

/// The `phase` label of runs that have no phase yet.
const NEW_PHASE_LABEL: &str = "New";

fn error_policy(run: Arc<SandboxRun>, error: &ControllerError, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[error.metric_label()])
        .inc();
    warn!(run = %run.name_any(), namespace = ?run.namespace(), %error, "reconcile error; retrying in 10s");
    Action::requeue(Duration::from_secs(10))
}

/// One reconcile: observe → decide → plan → act → report.
async fn reconcile_run(run: Arc<SandboxRun>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let started = Instant::now();
    // Sharded: only the runs of this replica's shards, each while its shard is held (a shard
    // acquired later restarts the run watch, whose fresh list reconciles its runs).
    let Some(_shard) = ctx.enter_shard(&run) else {
        return Ok(Action::await_change());
    };
    // The run's drain owns it until the drain ends; the drain's end wakes it again when this
    // reconcile saw its last write (docs/contract.md "A run's next step follows its drain"), else
    // that write's watch event does. While it waits for a slot, the reconcile only tells so.
    // A run without its identity is reconciled no further: nothing is written about it (an
    // error, counted and logged; docs/contract.md "A write always names its object").
    let id = crate::identity::RunId::of(&run)?;
    let seen = run.resource_version();
    if ctx
        .in_flight
        .drains
        .found_draining(&id.uid, seen.as_deref())
    {
        tracing::debug!(run = %id.name, seen = ?seen, "found draining");
        let requeue = run::pipeline::in_flight(&ctx, (&run, &id), Timestamp::now()).await?;
        return Ok(requeue.into_action());
    }
    if ctx.behind_own_write(&run) {
        tracing::debug!(run = %id.name, seen = ?seen, "the cache is behind this replica's write");
        return Ok(Action::await_change());
    }
    let run = ctx.with_unreported_pod(run);
    let reconciled = run::pipeline::reconcile(&ctx, &run, Timestamp::now()).await?;
    if let Some(step) = reconciled.step {
        report(&ctx.metrics, step, started);
    }
    Ok(reconciled.requeue.into_action())
}

/// Report: counts the reconcile and its duration under its step's label.
fn report(metrics: &Metrics, step: &'static str, started: Instant) {
    metrics.reconciles.with_label_values(&[step]).inc();
    metrics
        .reconcile_duration
        .with_label_values(&[step])
        .observe(started.elapsed().as_secs_f64());
}

#[cfg(test)]
mod tests {
    // The run resource's group and scope are asserted on the CRD generated from src/api.rs by
    // `crate::api::tests::crd_names_match_the_contract`.
    use super::*;

    #[test]
    fn metric_labels_are_the_documented_ones() {
        // docs/operations.md "Metrics" lists these labels; they are part of the API.
        let ops = include_str!("../../docs/operations.md");
        let phases: Vec<&str> = std::iter::once(NEW_PHASE_LABEL)
            .chain(Phase::ALL.map(Phase::as_str))
            .collect();
        assert_eq!(
            phases,
            [
                "New",
                "Pending",
                "Running",
                "Draining",
                "Succeeded",
                "Failed",
                "Stopped"
            ]
        );
        assert!(ops.contains(&format!("`phase` ({}; refreshed", phases.join(", "))));
    }
}
