//! Act: the only stage that changes the world. It carries out a [`Plan`] — publishes its
//! Events, writes its status (server-side apply, one field manager), then does its effects in
//! order: finalizers, the pod, the drain pool, the holder's mark-drained exec, the stored files —
//! and runs the teardowns (the drains) in the drain pool. Nothing here decides: every choice is
//! made in [`super::decide`] and [`super::plan`].

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{AttachParams, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::io::AsyncRead;
use tracing::{info, warn};

use super::context::{Context, MANAGER};
use super::decide::{self, Preflight, Trigger};
use super::error::{kube_err, ControllerError};
use super::events::{PlannedEvent, EVENT_NOTE_LIMIT};
use super::observe::{self, Observation};
use super::plan::{self, Effect, PathWork, Plan, Purge, Requeue, StepPlan, LOOK_AGAIN_MARGIN};
use super::refusals;
use crate::admission::images::ImageResolver;
use crate::admission::webhook::pull_credentials;
use crate::api::{SandboxRun, SandboxRunStatus, FINALIZER};
use crate::drain::path_drain::{drain_path, PathJob};
use crate::inpod::holder::HolderCommand;
use crate::pod;
use crate::store::purge::delete_run_archives;
use crate::store::RunRef;

/// How long the operator waits for `holder --mark-drained` to report its status.
const MARK_DRAINED_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of the mark-drained exec's output kept for the log (the rest is read and discarded).
const MARK_DRAINED_OUTPUT_KEPT: usize = 1024;

/// Carries out the plan of a step for the run `observation` describes.
pub(crate) async fn carry_out_step(
    ctx: &Arc<Context>,
    run: &Arc<SandboxRun>,
    observation: &Observation,
    step_plan: StepPlan,
) -> Result<Requeue, ControllerError> {
    let pod_name = observation.pod_name.as_str();
    match step_plan {
        StepPlan::Carry(plan) => {
            carry_out(ctx, run, pod_name, observation.pod.as_ref(), *plan).await
        }
        StepPlan::CreatePod(pod) => create_pod(ctx, run, *pod).await,
        StepPlan::RecordPodLost => record_pod_lost(ctx, run, observation).await,
    }
}

/// Carries out `plan` for `run` and its pod `pod_name` (`pod`: as observed, the Events' `related`
/// object): its Events, then its status, then its effects, in order. Returns when to look again.
pub(crate) async fn carry_out(
    ctx: &Arc<Context>,
    run: &Arc<SandboxRun>,
    pod_name: &str,
    pod: Option<&Pod>,
    plan: Plan,
) -> Result<Requeue, ControllerError> {
    let ns = run.namespace().unwrap_or_default();
    let runs: Api<SandboxRun> = Api::namespaced(ctx.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    for event in &plan.events {
        publish(ctx, run, pod.filter(|_| event.about_pod), event).await;
    }
    if let Some(status) = &plan.status {
        apply_status(ctx, &runs, run, status).await?;
    }
    for effect in plan.effects {
        match effect {
            Effect::AddFinalizer => {
                let mut finalizers = run.finalizers().to_vec();
                finalizers.push(FINALIZER.to_string());
                patch_finalizers(&runs, run, finalizers).await?;
            }
            Effect::RemoveFinalizer => {
                remove_finalizer(&runs, run).await?;
                ctx.forget_written_status(run);
            }
            Effect::DeletePod { at_once } => delete_pod(&pods, pod_name, at_once).await?,
            Effect::MarkDrained => mark_drained(&pods, pod_name, &ctx.pod.holder_binary).await,
            Effect::StartTeardown(trigger) => start_teardown(ctx, run, trigger),
            Effect::DeleteExpiredRun(event) => delete_expired_run(ctx, run, &runs, &event).await?,
            Effect::PurgeStoredFiles => {
                if let Purge::RetryAfter(pause) = purge_stored_files(ctx, run).await {
                    return Ok(Requeue::After(pause));
                }
            }
            Effect::RecordCreateAttempt(at) => ctx.record_create_attempt(run, at),
            Effect::ForgetCreateAttempts => ctx.forget_create_attempt(run),
            Effect::RememberUnreportedPod => ctx.remember_unreported_pod(run),
        }
    }
    Ok(plan.requeue)
}

/// Creates the run's pod and carries out the plan of the apiserver's answer.
async fn create_pod(
    ctx: &Arc<Context>,
    run: &Arc<SandboxRun>,
    pod: Pod,
) -> Result<Requeue, ControllerError> {
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    // The pre-flight (`--preflight-images`) first: a run whose image does not exist gets no pod,
    // no NetworkPolicy, and fails at once (docs/contract.md ADR-006 §5).
    let mut unverified = None;
    if let Some(resolver) = &ctx.preflight {
        match preflight_image(ctx, resolver, run, &pod).await {
            Preflight::Proceed => {}
            Preflight::ProceedUnverified { message } => {
                warn!(run = %run.name_any(), %message, "image not verified; creating the pod anyway");
                unverified = Some(plan::image_unverified(&message));
            }
            Preflight::Unresolvable { message, hint } => {
                warn!(run = %run.name_any(), %message, "image does not resolve; the run fails");
                let plan = plan::image_unresolvable(run, &message, &hint, Timestamp::now());
                return carry_out(ctx, run, &pod_name, None, plan).await;
            }
        }
    }
    // The egress policy next: the pod never runs unfiltered (src/egress/apply.rs).
    if !crate::egress::apply::before_pod(ctx, run).await? {
        return Ok(Requeue::AwaitChange);
    }
    if let Some(event) = &unverified {
        publish(ctx, run, None, event).await;
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &run.namespace().unwrap_or_default());
    let now = Timestamp::now();
    match pods.create(&PostParams::default(), &pod).await {
        Ok(created) => {
            let plan = plan::pod_created(run, &pod_name, true, ctx.settle, now);
            carry_out(ctx, run, &pod_name, Some(&created), plan).await
        }
        Err(kube::Error::Api(ae)) if ae.code == 409 => {
            let plan = plan::pod_created(run, &pod_name, false, ctx.settle, now);
            carry_out(ctx, run, &pod_name, None, plan).await
        }
        Err(kube::Error::Api(ae)) if refusals::is_refusal(ae.code) => {
            let plan = plan::pod_refused(run, &ae.message, now);
            if let Requeue::After(retry) = plan.requeue {
                warn!(run = %run.name_any(), pod = %pod_name, code = ae.code, apiserver = %ae.message,
                    retry_seconds = retry.saturating_sub(LOOK_AGAIN_MARGIN).as_secs(),
                    "pod creation refused by the apiserver");
            }
            carry_out(ctx, run, &pod_name, None, plan).await
        }
        Err(e) => Err(kube_err(format!("create pod {pod_name}"))(e)),
    }
}

/// Resolves the image of `pod`'s workload container without pulling it, with the credentials of
/// the pod's imagePullSecrets (the run's and the operator's, read in the run's namespace; one
/// that cannot be read only makes a private image unverifiable), and judges the answer.
async fn preflight_image(
    ctx: &Context,
    resolver: &ImageResolver,
    run: &SandboxRun,
    pod: &Pod,
) -> Preflight {
    let spec = pod.spec.as_ref();
    let image = spec
        .and_then(|s| {
            s.containers
                .iter()
                .find(|c| c.name == pod::WORKLOAD_CONTAINER)
        })
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    let secrets: Vec<String> = spec
        .and_then(|s| s.image_pull_secrets.as_ref())
        .into_iter()
        .flatten()
        .map(|r| r.name.clone())
        .collect();
    let namespace = run.namespace().unwrap_or_default();
    let creds = pull_credentials(&ctx.client, &namespace, &secrets).await;
    let resolution = resolver.resolve(&image, creds.as_ref()).await;
    decide::preflight(&image, &resolution)
}

/// Reports the run's undrained paths lost, on the live run (see [`decide::pod_lost_holds`]) and
/// with the paths whose manifest the store already has.
async fn record_pod_lost(
    ctx: &Arc<Context>,
    run: &Arc<SandboxRun>,
    observation: &Observation,
) -> Result<Requeue, ControllerError> {
    let Some(live) =
        observe::live_run(&ctx.client, &observation.namespace, &observation.name).await?
    else {
        return Ok(Requeue::AwaitChange);
    };
    let live = ctx.with_unreported_pod(Arc::new(live));
    if !decide::pod_lost_holds(run, &live, Timestamp::now(), &ctx.decide) {
        return Ok(Requeue::After(LOOK_AGAIN_MARGIN));
    }
    let run = live;
    let committed = observe::committed_entries(&ctx.store_view(), &run).await;
    let plan = plan::record_pod_lost(&run, &committed, ctx.default_retention, Timestamp::now());
    carry_out(ctx, &run, &observation.pod_name, None, plan).await
}

/// Starts the run's teardown in the drain pool, unless one is in flight. The teardown waits for
/// a slot (or for this replica to stop), reads the pod as it is then (a queued teardown holds no
/// copy of it: thousands may wait at once), runs, and leaves the run to its next reconcile; a
/// teardown that fails is counted, logged, and retried by a later reconcile after a pause.
fn start_teardown(ctx: &Arc<Context>, run: &Arc<SandboxRun>, trigger: Trigger) {
    let uid = run.uid().unwrap_or_default();
    let job_ctx = Arc::clone(ctx);
    let run = Arc::clone(run);
    ctx.drains.start(uid, ctx.cancel.clone(), move || async move {
        let ctx = job_ctx;
        let result = match observe::own_pod(&ctx.client, &run).await {
            Ok(pod) => teardown(&ctx, &run, pod.as_ref(), &trigger).await,
            Err(error) => Err(error),
        };
        if let Err(error) = result {
            ctx.metrics
                .reconcile_errors
                .with_label_values(&[error.metric_label()])
                .inc();
            warn!(run = %run.name_any(), namespace = ?run.namespace(), %error, "teardown failed; retrying in 10s");
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(10)) => {}
                () = ctx.cancel.cancelled() => {}
            }
        }
    });
}

/// One teardown, planned now (it has its slot in the pool): the opening, every path's outcome
/// recorded as it is had, then the end.
// TEMPORARY (issue #26): over the 80-line limit until the controller round splits it; remove
// this allow with the split. No other function may carry it.
#[allow(clippy::too_many_lines)]
async fn teardown(
    ctx: &Arc<Context>,
    run: &Arc<SandboxRun>,
    pod: Option<&Pod>,
    trigger: &Trigger,
) -> Result<(), ControllerError> {
    let name = run.name_any();
    let ns = run.namespace().unwrap_or_default();
    let uid = run.uid().unwrap_or_default();
    let pod_name = pod::pod_name(&name);
    let runs: Api<SandboxRun> = Api::namespaced(ctx.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let timeout = ctx.drain_timeout_seconds(run);
    let planned = plan::teardown(run, pod, trigger, &ctx.caps, timeout, Timestamp::now());
    let deadline = tokio::time::Instant::now() + planned.drain_left;
    // The opening is written now, or once `--quiet-window` has passed with paths still draining
    // (`opening_waits`): a teardown that drains within it is written once, at its end.
    let mut opening = Some(planned.opening);
    if !planned.opening_waits || ctx.settle.is_zero() {
        if let Some(now) = opening.take() {
            carry_out(ctx, run, &pod_name, pod, now).await?;
        }
    }
    let settled = tokio::time::sleep(ctx.settle);
    tokio::pin!(settled);
    let compression = run
        .spec
        .read_back
        .as_ref()
        .map(|r| r.compression)
        .unwrap_or_default();
    let mut status = planned.status;
    // The owed paths drain at once, each waiting for one of the operator-wide path slots
    // (`--max-concurrent-path-drains`), which bound the drain memory whatever the number of runs
    // and paths; each outcome is recorded as it is had, in the order they finish.
    let (pods, pod_name, ns, name, uid) = (&pods, pod_name.as_str(), ns.as_str(), &name, &uid);
    let work = planned.paths.into_iter().map(move |path| async move {
        let outcome = match path.work {
            PathWork::Record(outcome) => Some(outcome),
            PathWork::Drain {
                cap_bytes,
                previous_attempts,
                holder_path,
            } => {
                let slot = tokio::select! {
                    slot = ctx.path_slots.acquire() => slot.ok(),
                    () = ctx.cancel.cancelled() => None,
                };
                match slot {
                    Some(_slot) => {
                        let job = PathJob {
                            pods,
                            pod_name,
                            pack_command: &ctx.pack_command,
                            store: &ctx.store,
                            open_uploads: ctx.open_uploads.as_deref(),
                            store_prefix: &ctx.store_prefix,
                            store_url: &ctx.store_url,
                            namespace: ns,
                            run_name: name,
                            run_uid: uid,
                            index: path.index,
                            path: &path.path,
                            holder_path: &holder_path,
                            cap_bytes,
                            compression,
                            wire: ctx.drain_wire,
                            idle: ctx.drain_idle,
                            deadline,
                            previous_attempts,
                            metrics: &ctx.metrics,
                            cancel: &ctx.cancel,
                        };
                        drain_path(&job).await
                    }
                    None => None,
                }
            }
        };
        (path.entry, outcome)
    });
    let mut owed = work.len();
    let mut finished = futures::stream::iter(work).buffer_unordered(usize::MAX);
    let mut stopped = false;
    loop {
        let (entry, outcome) = tokio::select! {
            next = finished.next() => match next {
                Some(done) => done,
                None => break,
            },
            () = &mut settled, if opening.is_some() && !stopped => {
                if let Some(mut late) = opening.take() {
                    late.status = Some(status.clone());
                    carry_out(ctx, run, pod_name, pod, late).await?;
                }
                continue;
            }
        };
        owed = owed.saturating_sub(1);
        match outcome {
            Some(outcome) if !stopped => {
                status.read_back[entry] = outcome;
                // Each outcome is written as it is had once the run is reported Draining; the
                // last one goes with the end.
                if opening.is_none() && owed > 0 {
                    apply_status(ctx, &runs, run, &status).await?;
                }
            }
            // This replica stops draining (lost lease, shutdown): record nothing more, so the
            // next leader resumes the unrecorded paths from the store's commit point. The other
            // paths' drains see the same cancellation and end without recording either.
            _ => stopped = true,
        }
    }
    if stopped {
        return Ok(());
    }
    let end = plan::teardown_end(
        run,
        status,
        planned.holder_running,
        pod.is_some(),
        ctx.default_retention,
        Timestamp::now(),
    );
    carry_out(ctx, run, pod_name, pod, end).await?;
    Ok(())
}

/// Deletes a run whose `spec.ttlSecondsAfterFinished` passed, then publishes `event`.
async fn delete_expired_run(
    ctx: &Context,
    run: &SandboxRun,
    runs: &Api<SandboxRun>,
    event: &PlannedEvent,
) -> Result<(), ControllerError> {
    let name = run.name_any();
    // Preconditioned on the uid: a run re-created under the same name is not the one that expired.
    let params = DeleteParams {
        preconditions: run.uid().map(|uid| kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match runs.delete(&name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(ae)) if ae.code == 404 || ae.code == 409 => return Ok(()),
        Err(e) => return Err(kube_err(format!("delete expired run {name}"))(e)),
    }
    // After the delete, so a refused one (RBAC) is not announced as done on every retry.
    publish(ctx, run, None, event).await;
    Ok(())
}

/// Deletes everything the run stored (only its own `<prefix>/<namespace>/<name>/<uid>/`) and
/// publishes what came of it ([`plan::purged`]).
async fn purge_stored_files(ctx: &Context, run: &SandboxRun) -> Purge {
    let reference = RunRef {
        namespace: run.namespace().unwrap_or_default(),
        name: run.name_any(),
        uid: run.uid().unwrap_or_default(),
    };
    let dir = crate::store::run_dir(&ctx.store_prefix, &reference);
    let location = format!("{}/{dir}/", ctx.store_url.trim_end_matches('/'));
    let result = delete_run_archives(&ctx.store, &ctx.store_prefix, &reference)
        .await
        .map_err(|e| e.to_string());
    let (event, purge) = plan::purged(
        run,
        result.clone(),
        &location,
        ctx.drain_timeout_seconds(run),
        Timestamp::now(),
    );
    match (&result, purge) {
        (Ok(count), _) => {
            info!(run = %reference.name, namespace = %reference.namespace, count, "deleted the run's stored files");
        }
        (Err(e), Purge::RetryAfter(_)) => {
            warn!(run = %reference.name, namespace = %reference.namespace, error = %e, "deleting the run's stored files failed; retrying");
        }
        (Err(e), Purge::Done) => {
            warn!(run = %reference.name, namespace = %reference.namespace, error = %e, "giving up deleting the run's stored files; releasing the finalizer");
        }
    }
    publish(ctx, run, None, &event).await;
    purge
}

/// Publishes `event` about `run`, `related` to its pod when there is one (the Events API's
/// `related`, kube's `secondary`), so `kubectl get events` links the two.
async fn publish(ctx: &Context, run: &SandboxRun, related: Option<&Pod>, event: &PlannedEvent) {
    // The apiserver caps an Event note at 1 KiB.
    let mut note = event.note.clone();
    if note.len() > EVENT_NOTE_LIMIT {
        let mut cut = EVENT_NOTE_LIMIT;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
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
async fn mark_drained(pods: &Api<Pod>, pod_name: &str, holder_binary: &str) {
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
async fn apply_status(
    ctx: &Context,
    runs: &Api<SandboxRun>,
    run: &SandboxRun,
    status: &SandboxRunStatus,
) -> Result<(), ControllerError> {
    let name = run.name_any();
    let written = ctx.written_status(run, status);
    if written.already {
        return Ok(());
    }
    let patch = json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRun",
        "status": status,
    });
    match runs
        .patch_status(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
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

async fn patch_finalizers(
    runs: &Api<SandboxRun>,
    run: &SandboxRun,
    finalizers: Vec<String>,
) -> Result<(), ControllerError> {
    // resourceVersion in a merge patch is a precondition: a concurrent change makes it a 409 and
    // the next reconcile starts from what is really there.
    let patch = json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": run.resource_version() }
    });
    match runs
        .patch(
            &run.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(ae)) if ae.code == 404 => Ok(()),
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
    patch_finalizers(runs, run, finalizers).await
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
