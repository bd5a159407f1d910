//! Act: the only stage that changes the world. It carries out a [`Plan`] — publishes its
//! Events, writes its status (server-side apply, one field manager), then does its effects in
//! order: finalizers, the run's NetworkPolicy, the pod, the holder's mark-drained exec, the
//! stored files — and runs a teardown's drains ([`drain_paths`]). Nothing here decides: an
//! effect whose follow-up depends on the answer (creating the pod, deleting the stored files)
//! ends the carrying out with a typed [`Answer`], which [`super::plan::after`] plans.

use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{AttachParams, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tracing::{info, warn};

use super::launcher::{self, DeliveryError};
use super::plan::claim::{Claim, Delivery, Miss, MissCount, NotDelivered};
use super::plan::{Answer, Effect, NotPurged, PathPlan, PathWork, Plan, PurgeTarget, Requeue};
use super::refusals;
use crate::api::{Compression, ReadBackStatus, SandboxRun, SandboxRunStatus, FINALIZER};
use crate::controller::context::{Context, MANAGER};
use crate::controller::drains::queue::Waiter;
use crate::controller::error::{kube_err, ControllerError};
use crate::controller::events::{PlannedEvent, EVENT_NOTE_LIMIT};
use crate::drain::path_drain::{
    drain_path, DrainControl, DrainLimits, JobGeneration, PathJob, PathSpec, PodSource, StoreTarget,
};
use crate::identity::{self, MissingIdentity, RunId};
use crate::inpod::holder::HolderCommand;
use crate::inpod::launch::{LaunchStatus, StartMessage};
use crate::pod;
use crate::pool::attaches::HeldAttaches;
use crate::store::purge::delete_run_archives;
use crate::store::tenant_read::RunStore;

/// How long the operator waits for `holder --mark-drained` to report its status.
const MARK_DRAINED_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of the mark-drained exec's output kept for the log (the rest is read and discarded).
const MARK_DRAINED_OUTPUT_KEPT: usize = 1024;

/// How far a plan was carried out.
#[derive(Debug)]
pub(crate) enum Carried {
    /// All of it; look again per its requeue.
    Done(Requeue),
    /// Up to an effect whose follow-up depends on `answer`: `rest` are the effects left,
    /// `requeue` the plan's.
    Answer {
        /// What the world answered.
        answer: Answer,
        /// The effects not carried out yet.
        rest: Vec<Effect>,
        /// The plan's requeue.
        requeue: Requeue,
    },
}

/// Carries out `plan` for `run` and its pod `pod_name` (`pod`: as observed, the Events' `related`
/// object): its Events, then its status, then its effects, in order, up to the first that
/// answers. A run without its identity gets none of it (docs/contract.md "A write always names
/// its object").
pub(crate) async fn carry_out(
    ctx: &Context,
    run: &SandboxRun,
    pod_name: &str,
    pod: Option<&Pod>,
    plan: Plan,
) -> Result<Carried, ControllerError> {
    let id = RunId::of(run)?;
    for event in &plan.events {
        publish(ctx, run, pod.filter(|_| event.about_pod), event).await;
    }
    if let Some(status) = &plan.status {
        write_status(ctx, run, status).await?;
    }
    let mut effects = plan.effects.into_iter();
    while let Some(effect) = effects.next() {
        if let Some(answer) = effect_of(ctx, (run, &id), pod_name, pod, effect).await? {
            return Ok(Carried::Answer {
                answer,
                rest: effects.collect(),
                requeue: plan.requeue,
            });
        }
    }
    Ok(Carried::Done(plan.requeue))
}

/// Does one effect; Some: its answer, which the plan's follow-up depends on.
async fn effect_of(
    ctx: &Context,
    (run, id): (&SandboxRun, &RunId),
    pod_name: &str,
    pod: Option<&Pod>,
    effect: Effect,
) -> Result<Option<Answer>, ControllerError> {
    let ns = id.namespace.as_str();
    let runs: Api<SandboxRun> = Api::namespaced(ctx.client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    match effect {
        Effect::AddFinalizer => {
            add_finalizer(ctx, run).await?;
        }
        Effect::RemoveFinalizer => {
            remove_finalizer(&runs, run).await?;
            ctx.forget_written_status(run);
        }
        Effect::DeletePod { at_once } => delete_pod(&pods, pod_name, at_once).await?,
        Effect::MarkDrained => mark_drained(&pods, pod_name, &ctx.pod.holder_binary).await,
        Effect::DeleteExpiredRun(event) => {
            delete_expired_run(ctx, (run, id), &runs, &event).await?;
        }
        Effect::PurgeStoredFiles => return Ok(Some(purge_store(ctx, (run, id)).await)),
        Effect::DeleteStoredFiles(target) => return Ok(Some(delete_stored_files(&target).await)),
        Effect::RecordCreateAttempt(at) => ctx.record_create_attempt(run, at),
        Effect::ForgetCreateAttempts => ctx.forget_create_attempt(run),
        Effect::RememberUnreportedPod => ctx.remember_unreported_pod(run),
        Effect::Publish(event) => publish(ctx, run, pod.filter(|_| event.about_pod), &event).await,
        Effect::ApplyNetworkPolicy(policy) => apply_network_policy(&ctx.client, &policy).await?,
        Effect::CreatePod(new) => return create_pod(&pods, &new).await.map(Some),
        Effect::RestoreWorkspace(from) => {
            if super::workspace::already_recorded(ctx, (run, id)).await {
                return Ok(Some(Answer::RestoreAlreadyRecorded));
            }
            let parked = Parked(&pods);
            let (from, result) =
                super::workspace::restore(ctx, (run, id), (pod_name, &parked), &from).await;
            return Ok(Some(Answer::Restored { from, result }));
        }
        Effect::DeliverStart(record) => {
            let parked = Parked(&pods);
            let result =
                super::workspace::deliver(ctx, (run, id), (pod_name, &parked), &record).await;
            return Ok(Some(Answer::StartDelivered { record, result }));
        }
        Effect::CreateWorkload(w) => create_workload(&ctx.client, ns, *w).await?,
        Effect::PatchWorkloadStatus(patch) => {
            let name = crate::kueue::workload_name(&id.name);
            patch_workload_status(&ctx.client, ns, &name, &patch).await?;
        }
        Effect::PatchWorkload(patch) => {
            let name = crate::kueue::workload_name(&id.name);
            patch_workload(&ctx.client, ns, &name, &patch).await?;
        }
        Effect::ClaimPoolPod { claim, patch } => {
            return claim_pool_pod(ctx, run, claim, &patch).await.map(Some)
        }
        Effect::HandPoolStart(delivery) => {
            let parked = HeldFirst {
                parked: Parked(&pods),
                held: &ctx.memory.held_attaches,
                namespace: ns,
                counted: &ctx.metrics.start_attaches,
            };
            return Ok(Some(hand_pool_start(&parked, delivery).await));
        }
        Effect::DeletePoolPod(name) => delete_pool_pod(&pods, &name).await,
        Effect::CountPoolMiss(miss) => return Ok(Some(count_pool_miss(ctx, ns, miss).await)),
        Effect::CountPoolStart(start) => {
            let starts = &ctx.metrics.pool_starts;
            starts.with_label_values(&[start.label()]).inc();
        }
    }
    Ok(None)
}

/// Creates a run's Kueue Workload; one of that name that exists is an answer, not an error (the
/// next reconcile reads whose it is).
async fn create_workload(
    client: &kube::Client,
    ns: &str,
    workload: serde_json::Value,
) -> Result<(), ControllerError> {
    let ar = crate::kueue::workload_resource();
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    let name = workload["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let object: kube::api::DynamicObject = serde_json::from_value(workload)
        .map_err(|e| kube_err(format!("build Workload {name}"))(kube::Error::SerdeError(e)))?;
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => {
            info!(namespace = %ns, workload = %name, "Kueue Workload created");
            Ok(())
        }
        Err(kube::Error::Api(ae)) if ae.code == 409 => Ok(()),
        Err(e) => Err(kube_err(format!("create Workload {name}"))(e)),
    }
}

/// Merge-patches the status of Workload `name` (a 409 is an error: it is read again).
async fn patch_workload_status(
    client: &kube::Client,
    ns: &str,
    name: &str,
    patch: &serde_json::Value,
) -> Result<(), ControllerError> {
    let ar = crate::kueue::workload_resource();
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(kube_err(format!("patch the status of Workload {name}")))?;
    info!(namespace = %ns, workload = %name, "Kueue Workload status patched");
    Ok(())
}

/// Merge-patches Workload `name` itself (its `spec.active`).
async fn patch_workload(
    client: &kube::Client,
    ns: &str,
    name: &str,
    patch: &serde_json::Value,
) -> Result<(), ControllerError> {
    let ar = crate::kueue::workload_resource();
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(kube_err(format!("patch Workload {name}")))?;
    info!(namespace = %ns, workload = %name, "Kueue Workload patched");
    Ok(())
}

/// Creates `pod`: the apiserver's answer, typed. A refusal (quota, Pod Security, a webhook,
/// RBAC) and a name already taken are answers; anything else is an error.
async fn create_pod(pods: &Api<Pod>, pod: &Pod) -> Result<Answer, ControllerError> {
    match pods.create(&PostParams::default(), pod).await {
        Ok(created) => Ok(Answer::PodCreated(Box::new(created))),
        Err(kube::Error::Api(ae)) if ae.code == 409 => Ok(Answer::PodExists),
        Err(kube::Error::Api(ae)) if refusals::is_refusal(ae.code) => Ok(Answer::PodRefused {
            code: ae.code,
            message: ae.message,
        }),
        Err(e) => Err(kube_err(format!(
            "create pod {}",
            pod.metadata.name.as_deref().unwrap_or_default()
        ))(e)),
    }
}

/// Server-side applies a NetworkPolicy (a run's, a pool pod's) in its namespace.
pub(crate) async fn apply_network_policy(
    client: &kube::Client,
    policy: &NetworkPolicy,
) -> Result<(), ControllerError> {
    let ns = crate::identity::namespace_of(policy)?;
    let name = crate::identity::name_of(policy)?;
    let api: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    let body = crate::egress::verdict::apply_body(policy);
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(kube_err(format!("apply NetworkPolicy {name}")))?;
    info!(namespace = %ns, policy = %name, "egress policy applied");
    Ok(())
}

/// Where a teardown's drains read from and write to.
pub(crate) struct DrainTarget {
    /// The store the run uses, resolved when its teardown started (docs/contract.md "A store per
    /// namespace"); a run whose store cannot be used has no path to drain (each is recorded).
    store: RunStore,
    pods: Api<Pod>,
    pod_name: String,
    run: RunId,
    compression: Compression,
    deadline: tokio::time::Instant,
    urgent: bool,
    /// Cancelled when this replica must stop draining the run: `ctx.in_flight.cancel`, or its drain claim
    /// lost (src/shard/drain_claim.rs).
    cancel: tokio_util::sync::CancellationToken,
    /// Asked before each manifest commit (the drain claim, when sharded).
    fence: Option<crate::drain::Fence>,
    /// The run's attempt being drained (`spec.retryPolicy`).
    attempt: u32,
    /// The checkpoint being taken (`spec.checkpoint`), None at a teardown.
    checkpoint: Option<u32>,
}

impl DrainTarget {
    /// The drains of `run`'s pod into `store`, each ending by `deadline`; none for a run
    /// without its identity (its keys would name another run's directory).
    pub(crate) fn new(
        ctx: &Context,
        run: &SandboxRun,
        store: RunStore,
        deadline: tokio::time::Instant,
    ) -> Result<Self, MissingIdentity> {
        let id = RunId::of(run)?;
        Ok(DrainTarget {
            store,
            pods: Api::namespaced(ctx.client.clone(), &id.namespace),
            pod_name: identity::current_pod_name(run),
            compression: run.spec.compression(),
            run: id,
            deadline,
            urgent: false,
            cancel: ctx.in_flight.cancel.clone(),
            fence: None,
            attempt: identity::current_attempt(run),
            checkpoint: None,
        })
    }

    /// The same target, draining into checkpoint `n` (`spec.checkpoint`) instead of the
    /// attempt's teardown generation.
    pub(crate) fn checkpoint(mut self, n: u32) -> Self {
        self.checkpoint = Some(n);
        self
    }

    /// The same target, its drains stopped when `cancel` fires and committed only while `fence`
    /// holds: the run's drain claim (src/shard/drain_claim.rs).
    pub(crate) fn claimed(
        mut self,
        cancel: tokio_util::sync::CancellationToken,
        fence: crate::drain::Fence,
    ) -> Self {
        self.cancel = cancel;
        self.fence = Some(fence);
        self
    }

    /// The same target, its paths served first by the path slots: its pod is being deleted or
    /// evicted (docs/contract.md "Fair drain slots").
    pub(crate) fn urgent(mut self, urgent: bool) -> Self {
        self.urgent = urgent;
        self
    }
}

/// The owed `paths` drained at once, each waiting for one of the operator-wide path slots
/// (`--max-concurrent-path-drains`, which bound the drain memory whatever the number of runs
/// and paths; at most `--max-path-drains-per-run` held by one run, handed out fairly across
/// namespaces: docs/contract.md "Fair drain slots"): each path's status entry and outcome, in
/// the order they finish. No outcome: this replica stops draining (cancelled).
pub(crate) fn drain_paths<'a>(
    ctx: &'a Context,
    target: &'a DrainTarget,
    paths: Vec<PathPlan>,
) -> impl Stream<Item = (usize, Option<ReadBackStatus>)> + 'a {
    futures::stream::iter(
        paths
            .into_iter()
            .map(move |path| drain_one(ctx, target, path)),
    )
    .buffer_unordered(usize::MAX)
}

async fn drain_one(
    ctx: &Context,
    target: &DrainTarget,
    path: PathPlan,
) -> (usize, Option<ReadBackStatus>) {
    let (cap_bytes, previous_attempts, holder_path) = match path.work {
        PathWork::Record(outcome) => return (path.entry, Some(outcome)),
        PathWork::Drain {
            cap_bytes,
            previous_attempts,
            holder_path,
        } => (cap_bytes, previous_attempts, holder_path),
    };
    let waiter = Waiter::of(&target.run, target.urgent);
    let Some(_slot) = ctx
        .in_flight
        .path_slots
        .acquire(waiter, target.cancel.clone())
        .await
    else {
        return (path.entry, None);
    };
    let store = &target.store;
    let job = PathJob {
        pod: PodSource {
            pods: &target.pods,
            name: &target.pod_name,
            pack_command: &ctx.drain.pack_command,
        },
        store: StoreTarget {
            objects: &store.store,
            // A tenant's store is cleaned by its own lifecycle rule: the clean-up signs with the
            // operator's credentials.
            open_uploads: ctx
                .stores
                .open_uploads
                .as_deref()
                .filter(|_| store.tenant.is_none()),
            prefix: &store.prefix,
            url: &store.url,
            tenant: store.tenant.as_deref(),
        },
        run: &target.run,
        generation: JobGeneration {
            attempt: target.attempt,
            checkpoint: target.checkpoint,
        },
        path: PathSpec {
            index: path.index,
            declared: &path.path,
            holder_path: &holder_path,
            cap_bytes,
            previous_attempts,
        },
        limits: DrainLimits {
            compression: target.compression,
            wire: ctx.drain.wire,
            idle: ctx.drain.idle,
            bandwidth: &ctx.drain.bandwidth,
            deadline: target.deadline,
        },
        control: DrainControl {
            metrics: &ctx.metrics,
            cancel: &target.cancel,
            fence: target.fence.as_ref(),
        },
    };
    (path.entry, drain_path(&job).await)
}

/// Deletes a run whose `spec.ttlSecondsAfterFinished` passed, then publishes `event`.
async fn delete_expired_run(
    ctx: &Context,
    (run, id): (&SandboxRun, &RunId),
    runs: &Api<SandboxRun>,
    event: &PlannedEvent,
) -> Result<(), ControllerError> {
    let name = &id.name;
    // Preconditioned on the uid: a run re-created under the same name is not the one that expired.
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some(id.uid.clone()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match runs.delete(name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(ae)) if ae.code == 404 || ae.code == 409 => return Ok(()),
        Err(e) => return Err(kube_err(format!("delete expired run {name}"))(e)),
    }
    // After the delete, so a refused one (RBAC) is not announced as done on every retry.
    publish(ctx, run, None, event).await;
    Ok(())
}

/// The store `run` uses now, for the delete of its stored files (what is deleted is planned
/// from it: [`super::plan::after`]).
async fn purge_store(ctx: &Context, (run, id): (&SandboxRun, &RunId)) -> Answer {
    match ctx.run_store((&id.namespace, run)).await {
        Ok(store) => Answer::PurgeStore(Ok(Box::new(store))),
        Err(e) => {
            warn!(run = %id.name, namespace = %id.namespace, error = %e, "the run's store cannot be used; its stored files are not deleted");
            Answer::PurgeStore(Err(NotPurged::StoreUnusable(e.to_string())))
        }
    }
}

/// Deletes everything the run stored (only its own `<prefix>/<namespace>/<name>/<uid>/`, as
/// `target` names it), from the store it uses and with that store's credentials
/// (docs/contract.md "A store per namespace"): how many objects, or the store's words.
async fn delete_stored_files(target: &PurgeTarget) -> Answer {
    let PurgeTarget {
        store,
        run,
        manifests,
        location,
    } = target;
    let result = delete_run_archives(&store.store, &store.prefix, run, manifests)
        .await
        .map_err(|e| NotPurged::Store {
            store: store.describe(),
            error: e.to_string(),
        });
    match &result {
        Ok(count) => {
            info!(run = %run.name, namespace = %run.namespace, count, "deleted the run's stored files");
        }
        Err(e) => {
            warn!(run = %run.name, namespace = %run.namespace, error = %e, "deleting the run's stored files failed");
        }
    }
    Answer::FilesPurged {
        result,
        location: location.clone(),
    }
}

/// Publishes `event` about `run`, `related` to its pod when there is one (the Events API's
/// `related`, kube's `secondary`), so `kubectl get events` links the two.
async fn publish(ctx: &Context, run: &SandboxRun, related: Option<&Pod>, event: &PlannedEvent) {
    // The apiserver caps an Event note at 1 KiB.
    let mut note = event.note.clone();
    crate::text::truncate(&mut note, EVENT_NOTE_LIMIT);
    let published = Event {
        type_: if event.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: event.reason.to_string(),
        note: Some(note),
        action: event.action.to_string(),
        secondary: related.map(|p| p.object_ref(&())),
    };
    if let Err(e) = ctx.recorder.publish(&published, &run.object_ref(&())).await {
        warn!(run = %run.name_any(), reason = event.reason, error = %e, "could not publish Event");
    }
}

/// The exec that tells the holder's preStop hook the drain is done: streams. kube's client
/// refuses, before sending anything, an exec with no stream attached (`AttachParams: one of
/// stdin, stdout, or stderr must be true`), and the marker was then never written (issue #17):
/// stdout and stderr are attached, read and discarded (their start is kept for the log).
fn mark_drained_params() -> AttachParams {
    AttachParams::default()
        .container(pod::HOLDER_CONTAINER)
        .stdin(false)
        .stdout(true)
        .stderr(true)
        .tty(false)
}

/// Tells the holder's preStop hook that the drain is done, so a pod deleted gracefully stops at
/// once instead of at the end of its grace period. Best effort (the pod is deleted next with no
/// grace period): a failure is a WARN with the exec's status, never an error.
pub(crate) async fn mark_drained(pods: &Api<Pod>, pod_name: &str, holder_binary: &str) {
    let mut process = match pods
        .exec(
            pod_name,
            HolderCommand::MarkDrained.argv(holder_binary),
            &mark_drained_params(),
        )
        .await
    {
        Ok(p) => p,
        Err(e) => {
            warn!(pod = pod_name, error = %e, "could not mark the pod drained: the exec did not start");
            return;
        }
    };
    let stdout = process.stdout();
    let stderr = process.stderr();
    let status = process.take_status();
    let finished = async move {
        let status = async move {
            match status {
                Some(s) => s.await,
                None => None,
            }
        };
        tokio::join!(
            read_bounded(stdout, MARK_DRAINED_OUTPUT_KEPT),
            read_bounded(stderr, MARK_DRAINED_OUTPUT_KEPT),
            status
        )
    };
    match tokio::time::timeout(MARK_DRAINED_TIMEOUT, finished).await {
        Ok((_, _, Some(s))) if s.status.as_deref() == Some("Success") => {
            info!(pod = pod_name, "marked the pod drained");
        }
        Ok((stdout, stderr, Some(s))) => warn!(
            pod = pod_name,
            status = %crate::drain::exec::describe_status(&s),
            %stdout,
            %stderr,
            "could not mark the pod drained: the holder's mark-drained exec did not succeed"
        ),
        Ok((stdout, stderr, None)) => warn!(
            pod = pod_name,
            %stdout,
            %stderr,
            "could not mark the pod drained: the exec ended without a status (connection lost)"
        ),
        Err(_) => {
            process.abort();
            warn!(
                pod = pod_name,
                timeout_seconds = MARK_DRAINED_TIMEOUT.as_secs(),
                "could not mark the pod drained: the exec did not report in time"
            );
        }
    }
}

/// Reads `stream` to its end, keeping its first `keep` bytes (as text) and discarding the rest.
async fn read_bounded(stream: Option<impl AsyncRead + Unpin>, keep: usize) -> String {
    let Some(stream) = stream else {
        return String::new();
    };
    let (kept, _) = crate::drain::exec::read_to_end_keeping(stream, keep).await;
    String::from_utf8_lossy(&kept).trim().to_string()
}

/// Writes `status` (server-side apply), unless this replica wrote exactly it already and the
/// cached `run` is still the one it wrote over or the one the write made: a reconcile woken
/// before the watch delivered our own write would otherwise write it again (a no-op for the
/// apiserver, still a request).
pub(crate) async fn write_status(
    ctx: &Context,
    run: &SandboxRun,
    status: &SandboxRunStatus,
) -> Result<(), ControllerError> {
    let id = RunId::of(run)?;
    let name = &id.name;
    let written = ctx.written_status(run, status);
    if written.already {
        return Ok(());
    }
    let runs: Api<SandboxRun> = Api::namespaced(ctx.client.clone(), &id.namespace);
    match runs
        .patch_status(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&status_body(status)),
        )
        .await
    {
        Ok(after) => {
            ctx.remember_written_status(run, written.digest, after.resource_version());
            Ok(())
        }
        // The run is gone (finalizer released elsewhere): nothing left to report on.
        Err(kube::Error::Api(ae)) if ae.code == 404 => Ok(()),
        Err(e) => Err(kube_err(format!("apply status of {name}"))(e)),
    }
}

/// The body of the status server-side apply: the whole status, under this operator's one field
/// manager.
fn status_body(status: &SandboxRunStatus) -> serde_json::Value {
    json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRun",
        "status": status,
    })
}

/// The run's `AddFinalizer` effect: the run as the apiserver stored it with the finalizer, or
/// None when it is gone. The pipeline goes on to the run's first step with it
/// (docs/contract.md "A new run's finalizer and first step in one reconcile").
pub(super) async fn add_finalizer(
    ctx: &Context,
    run: &SandboxRun,
) -> Result<Option<SandboxRun>, ControllerError> {
    let namespace = identity::namespace_of(run)?;
    let runs: Api<SandboxRun> = Api::namespaced(ctx.client.clone(), namespace);
    let mut finalizers = run.finalizers().to_vec();
    finalizers.push(FINALIZER.to_string());
    let stored = patch_finalizers(&runs, run, finalizers).await?;
    if let Some(stored) = &stored {
        ctx.remember_finalized(stored);
    }
    Ok(stored)
}

async fn patch_finalizers(
    runs: &Api<SandboxRun>,
    run: &SandboxRun,
    finalizers: Vec<String>,
) -> Result<Option<SandboxRun>, ControllerError> {
    // resourceVersion in a merge patch is a precondition: a concurrent change makes it a 409 and
    // the next reconcile starts from what is really there. Without one there is no precondition:
    // nothing is sent (docs/contract.md "A write always names its object").
    let resource_version = crate::identity::resource_version(run)?;
    let patch = json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": resource_version }
    });
    match runs
        .patch(
            &run.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(stored) => Ok(Some(stored)),
        Err(kube::Error::Api(ae)) if ae.code == 404 => Ok(None),
        Err(e) => Err(kube_err(format!("patch finalizers of {}", run.name_any()))(
            e,
        )),
    }
}

async fn remove_finalizer(runs: &Api<SandboxRun>, run: &SandboxRun) -> Result<(), ControllerError> {
    let finalizers: Vec<String> = run
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    patch_finalizers(runs, run, finalizers).await.map(drop)
}

async fn delete_pod(pods: &Api<Pod>, pod_name: &str, drained: bool) -> Result<(), ControllerError> {
    // Once drained nothing in the pod is owed: no grace period. Otherwise the holder's grace
    // period (set from drainTimeout) applies.
    let params = if drained {
        DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        }
    } else {
        DeleteParams::default()
    };
    match pods.delete(pod_name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(ae)) if ae.code == 404 => Ok(()),
        Err(e) => Err(kube_err(format!("delete pod {pod_name}"))(e)),
    }
}

// The warm claim's effects (`super::plan::claim` plans them and what each answer means;
// docs/user-guide.md "Sandboxes for agents: warm pools").

/// Makes the pool pod the run's with the claim's merge `patch` (guarded by the resourceVersion
/// it carries): claimed, or taken first by another run (409). A claim not made gives back the
/// replica's reservation of the pod (`crate::pool::reservations`), so the burst's other runs may
/// pick it.
async fn claim_pool_pod(
    ctx: &Context,
    run: &SandboxRun,
    claim: Box<Claim>,
    patch: &serde_json::Value,
) -> Result<Answer, ControllerError> {
    let ns = run
        .namespace()
        .ok_or(ControllerError::Metadata("namespace"))?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pod = claim.pod.as_str();
    let patched = pods
        .patch(pod, &PatchParams::default(), &Patch::Merge(patch))
        .await;
    if patched.is_err() {
        let uid = run.uid().ok_or(ControllerError::Metadata("uid"))?;
        ctx.memory.claims.release(&format!("{ns}/{pod}"), &uid);
    }
    match patched {
        Ok(_) => {
            info!(run = %run.name_any(), pod, pool = %claim.pool, "took a warm pool pod");
            Ok(Answer::PoolPodClaimed(claim))
        }
        Err(kube::Error::Api(ae)) if ae.code == 409 => Ok(Answer::PoolPodTaken),
        Err(e) => Err(kube_err(format!("claim pool pod {pod}"))(e)),
    }
}

/// Hands the run's start to the launcher parked in the claimed pod ([`launcher::deliver`]: a
/// resumed claim writes only to a launcher still waiting); whether it took it is the answer.
async fn hand_pool_start(parked: &HeldFirst<'_>, delivery: Box<Delivery>) -> Answer {
    let pod = delivery.claim.pod.as_str();
    let (message, resumed) = (&delivery.claim.message, delivery.resumed);
    let result = launcher::deliver(parked, pod, message, resumed)
        .await
        .map_err(|why| {
            warn!(pod, %why, "the pool pod's launcher did not take the start");
            NotDelivered(why.to_string())
        });
    Answer::PoolStartHanded { delivery, result }
}

/// A parked launcher's talk ([`launcher::Talk`]) carried out on the pods of a namespace: the
/// `launch-status` exec and the attach that writes the start (for the claim's hand-over and the
/// restore's, `super::workspace`).
pub(super) struct Parked<'a>(pub &'a Api<Pod>);

impl launcher::Talk for Parked<'_> {
    async fn status(&self, pod: &str) -> Result<LaunchStatus, DeliveryError> {
        let params = launcher::status_params();
        let mut process = (self.0)
            .exec(pod, launcher::status_argv(), &params)
            .await
            .map_err(DeliveryError::Exec)?;
        let mut stdout = process.stdout().ok_or(DeliveryError::NoStream("stdout"))?;
        let read = async move {
            let mut said = String::new();
            let limit = launcher::STATUS_LIMIT;
            let _ = (&mut stdout).take(limit).read_to_string(&mut said).await;
            said
        };
        let said = tokio::time::timeout(launcher::DELIVERY_TIMEOUT, read)
            .await
            .map_err(|_| DeliveryError::StatusTimeout)?;
        launcher::status_said(&said)
    }

    async fn write(&self, pod: &str, message: &StartMessage) -> Result<(), DeliveryError> {
        let line = launcher::start_line(message)?;
        let mut attached = (self.0)
            .attach(pod, &launcher::attach_params())
            .await
            .map_err(DeliveryError::Attach)?;
        let stdin = attached.stdin().ok_or(DeliveryError::NoStream("stdin"))?;
        let status = attached
            .take_status()
            .ok_or(DeliveryError::NoStream("status"))?;
        let said = say(stdin, status, line, launcher::DELIVERY_TIMEOUT).await;
        drop(attached);
        said
    }
}

/// Writes `line` on an attach's `stdin` and ends it: Ok once the attach ended with success
/// within `timeout`.
async fn say(
    mut stdin: impl tokio::io::AsyncWrite + Unpin,
    status: impl std::future::Future<
        Output = Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>,
    >,
    line: Vec<u8>,
    timeout: Duration,
) -> Result<(), DeliveryError> {
    let talk = async move {
        stdin.write_all(&line).await?;
        stdin.shutdown().await?;
        drop(stdin);
        // The kubelet ends the attach once the container's stdin took it all, with a status.
        Ok::<_, DeliveryError>(status.await)
    };
    let status = tokio::time::timeout(timeout, talk)
        .await
        .map_err(|_| DeliveryError::AttachTimeout)??;
    launcher::attach_ended(status)
}

/// A claim's talk with its pool pod's launcher: the start written on the attach the pools'
/// controller holds open to the pod, when one is ([`HeldAttaches`]); otherwise, or when that
/// one fails, as [`Parked`] does (a failed held write is followed by a fresh one only while the
/// launcher still waits: `launch-status`).
pub(super) struct HeldFirst<'a> {
    parked: Parked<'a>,
    held: &'a HeldAttaches,
    namespace: &'a str,
    counted: &'a prometheus::IntCounterVec,
}

/// How long a start written on a held attach may take before the claim asks the launcher.
const HELD_TIMEOUT: Duration = Duration::from_secs(3);

impl launcher::Talk for HeldFirst<'_> {
    async fn status(&self, pod: &str) -> Result<LaunchStatus, DeliveryError> {
        self.parked.status(pod).await
    }

    async fn write(&self, pod: &str, message: &StartMessage) -> Result<(), DeliveryError> {
        let Some(held) = self.held.take(self.namespace, pod) else {
            self.counted.with_label_values(&["opened"]).inc();
            return self.parked.write(pod, message).await;
        };
        let (stdin, status, process) = held.into_parts();
        let said = say(stdin, status, launcher::start_line(message)?, HELD_TIMEOUT).await;
        drop(process);
        match said {
            Ok(()) => {
                self.counted.with_label_values(&["held"]).inc();
                Ok(())
            }
            Err(why) => {
                warn!(pod, %why, "the start on the held attach failed; asking the launcher");
                self.counted.with_label_values(&["opened"]).inc();
                launcher::deliver_if_waiting(&self.parked, pod, message).await
            }
        }
    }
}

/// Deletes a claimed pool pod whose launcher did not take the start (best effort: the pod is
/// the run's, which starts cold; a pod left behind goes with the run).
async fn delete_pool_pod(pods: &Api<Pod>, pod: &str) {
    if let Err(e) = pods.delete(pod, &DeleteParams::default()).await {
        warn!(pod, error = %e, "could not delete the pool pod whose launcher did not start");
    }
}

/// Counts a run that starts cold in its pool's `status.misses`: one read, then one merge patch
/// guarded by the pool's resourceVersion. Best effort: a pool whose count cannot be read or
/// written says so in the log; one that changed in between is the answer
/// (`plan::claim::after_count` counts again, on a fresh read).
async fn count_pool_miss(ctx: &Context, ns: &str, miss: Box<Miss>) -> Answer {
    let pool = miss.pool.as_str();
    if miss.tries == 1 {
        info!(pool, why = %miss.why, "starting cold");
    }
    let api: Api<crate::api::SandboxRunPool> = Api::namespaced(ctx.client.clone(), ns);
    let counted = match api.get_status(pool).await {
        Err(e) => {
            warn!(pool, error = %e, "could not read the pool to count a miss");
            MissCount::Failed
        }
        Ok(read) => {
            let misses = read.status.and_then(|s| s.misses).unwrap_or(0) + 1;
            let patch = serde_json::json!({
                "metadata": {"resourceVersion": read.metadata.resource_version},
                "status": {"misses": misses},
            });
            let params = PatchParams::default();
            match api.patch_status(pool, &params, &Patch::Merge(&patch)).await {
                Ok(_) => MissCount::Counted,
                Err(kube::Error::Api(ae)) if ae.code == 409 => MissCount::Changed,
                Err(e) => {
                    warn!(pool, error = %e, "could not count a miss");
                    MissCount::Failed
                }
            }
        }
    };
    if counted == MissCount::Changed && miss.tries >= super::plan::claim::MISS_TRIES {
        warn!(pool, "could not count a miss: the pool kept changing");
    }
    Answer::MissCounted { miss, counted }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn mark_drained_attaches_a_stream_kube_accepts() {
        // kube's client refuses an exec with no stream attached, and one with tty and stderr
        // (AttachParams::validate); the marker was never written because of the first (#17).
        let p = mark_drained_params();
        assert!(
            p.stdin || p.stdout || p.stderr,
            "an exec with no stream is refused before it is sent"
        );
        assert!(
            !(p.tty && p.stderr),
            "tty and stderr cannot both be attached"
        );
        assert!(!p.stdin, "nothing is sent to the holder");
        assert_eq!(p.container.as_deref(), Some(pod::HOLDER_CONTAINER));
    }

    #[test]
    fn mark_drained_execs_the_holder_mode_that_writes_the_marker() {
        let argv = HolderCommand::MarkDrained.argv(pod::HOLDER_BINARY);
        assert_eq!(argv[0], "/usr/local/bin/sandboxrun-operator");
        match crate::cmd::Cli::try_parse_from(&argv).map(|c| c.command) {
            Ok(crate::cmd::Command::Holder(h)) => {
                assert!(h.mark_drained);
                assert_eq!(h.wait_drained, None);
                assert_eq!(h.state_dir, std::path::Path::new(pod::HOLDER_STATE_DIR));
            }
            other => panic!("{argv:?} parsed as {other:?}"),
        }
    }

    #[tokio::test]
    async fn exec_output_is_read_to_the_end_and_kept_bounded() {
        let data = vec![b'a'; 10_000];
        assert_eq!(read_bounded(Some(&data[..]), 4).await, "aaaa");
        assert_eq!(read_bounded(Some(&b" done\n"[..]), 1024).await, "done");
        assert_eq!(read_bounded(None::<&[u8]>, 1024).await, "");
    }
}
