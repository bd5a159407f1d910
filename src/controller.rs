//! The controller shell: watches SandboxRuns and their pods, asks [`crate::reconcile::decide`] what
//! to do, and does it (create the pod, drain, delete, release the finalizer, report status and
//! Events). Everything it decides is pure and tested in `reconcile.rs`; this file only does I/O.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use object_store::ObjectStore;
use serde_json::json;
use thiserror::Error;
use tracing::{info, warn};

use crate::api::{Phase, ReadBackPhase, ReadBackStatus, SandboxRun, SandboxRunStatus, FINALIZER};
use crate::config::CapSettings;
use crate::drain::run::{drain_path, PathJob};
use crate::metrics::Metrics;
use crate::pod::{self, PodSettings};
use crate::reconcile::{self, condition, PodView, Step, Trigger, WorkloadState};

/// Field manager of every status write (server-side apply, one manager).
pub const MANAGER: &str = "sandboxrun-operator";
/// Event reason of a failed drain (ADR-143 §4); `kubectl describe sbr` shows it.
pub const REASON_DRAIN_FAILED: &str = "sandbox_runfiles_drain_failed";
/// Event reason of a drain that hit its cap.
pub const REASON_CAPPED: &str = "sandbox_runfiles_readback_capped";

/// What the controller needs besides the cluster.
pub struct Context {
    /// The cluster.
    pub client: Client,
    /// Where drained archives go.
    pub store: Arc<dyn ObjectStore>,
    /// Key prefix inside the store.
    pub store_prefix: object_store::path::Path,
    /// The store URL (for object URLs in status).
    pub store_url: String,
    /// Pod builder settings.
    pub pod: PodSettings,
    /// Read-back caps.
    pub caps: CapSettings,
    /// argv of the packer in the holder (the path is appended).
    pub pack_command: Vec<String>,
    /// Publishes Events.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Metrics,
}

impl Context {
    /// A context with an Event recorder reporting as `instance`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        store: Arc<dyn ObjectStore>,
        store_prefix: object_store::path::Path,
        store_url: String,
        pod: PodSettings,
        caps: CapSettings,
        pack_command: Vec<String>,
        metrics: Metrics,
        instance: String,
    ) -> Context {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: MANAGER.to_string(),
                instance: Some(instance),
            },
        );
        Context {
            client,
            store,
            store_prefix,
            store_url,
            pod,
            caps,
            pack_command,
            recorder,
            metrics,
        }
    }
}

/// A reconcile that could not finish; retried with a pause (never a hot loop).
#[derive(Debug, Error)]
pub enum ControllerError {
    /// A call to the apiserver failed.
    #[error("{action} failed: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The run has no namespace or name (cannot happen for a namespaced CR read from the API).
    #[error("the run has no {0}")]
    Metadata(&'static str),
}

impl ControllerError {
    /// Label for the errors metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ControllerError::Kube { .. } => "kube",
            ControllerError::Metadata(_) => "metadata",
        }
    }
}

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> ControllerError {
    let action = action.into();
    move |source| ControllerError::Kube { action, source }
}

/// Runs the controller until `shutdown` resolves. `namespaces` empty = every namespace.
pub async fn run(
    ctx: Arc<Context>,
    namespaces: Vec<String>,
    concurrency: u16,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let scopes: Vec<(Api<SandboxRun>, Api<Pod>)> = if namespaces.is_empty() {
        vec![(Api::all(client.clone()), Api::all(client.clone()))]
    } else {
        namespaces
            .iter()
            .map(|ns| {
                (
                    Api::namespaced(client.clone(), ns),
                    Api::namespaced(client.clone(), ns),
                )
            })
            .collect()
    };
    let shutdown = futures::future::FutureExt::shared(Box::pin(shutdown));
    let mut streams = Vec::new();
    for (runs, pods) in scopes {
        let pods_cfg =
            watcher::Config::default().labels("app.kubernetes.io/managed-by=sandboxrun-operator");
        let controller = Controller::new(runs, watcher::Config::default())
            .owns(pods, pods_cfg)
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

fn spawn_phase_gauge(store: kube::runtime::reflector::Store<SandboxRun>, metrics: Metrics) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let mut counts = std::collections::BTreeMap::<String, i64>::new();
            for run in store.state() {
                let phase = run
                    .status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .map(|p| format!("{p:?}"))
                    .unwrap_or_else(|| "New".to_string());
                *counts.entry(phase).or_default() += 1;
            }
            for phase in [
                "New",
                "Pending",
                "Running",
                "Draining",
                "Succeeded",
                "Failed",
                "Stopped",
            ] {
                metrics
                    .runs_by_phase
                    .with_label_values(&[phase])
                    .set(counts.get(phase).copied().unwrap_or(0));
            }
        }
    });
}

fn error_policy(run: Arc<SandboxRun>, error: &ControllerError, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[error.metric_label()])
        .inc();
    warn!(run = %run.name_any(), namespace = ?run.namespace(), %error, "reconcile error; retrying in 10s");
    Action::requeue(Duration::from_secs(10))
}

async fn reconcile_run(run: Arc<SandboxRun>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let started = std::time::Instant::now();
    let ns = run
        .namespace()
        .ok_or(ControllerError::Metadata("namespace"))?;
    let name = run
        .metadata
        .name
        .clone()
        .ok_or(ControllerError::Metadata("name"))?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let runs: Api<SandboxRun> = Api::namespaced(ctx.client.clone(), &ns);
    let pod_name = pod::pod_name(&name);
    let found = pods
        .get_opt(&pod_name)
        .await
        .map_err(kube_err(format!("get pod {ns}/{pod_name}")))?;
    // A pod with our name that the run does not own is not ours to drain or delete.
    let pod = match found {
        Some(p) if pod::owned_by(&p, &run) => Some(p),
        Some(_) => {
            let msg = format!("a pod named {pod_name} exists and is not owned by this run; delete it or rename the run");
            publish(
                &ctx,
                &run,
                EventType::Warning,
                "PodNameConflict",
                &msg,
                "Reconcile",
            )
            .await;
            let mut status = run.status.clone().unwrap_or_default();
            status.message = Some(msg);
            apply_status(&runs, &name, &status).await?;
            return Ok(Action::requeue(Duration::from_secs(60)));
        }
        None => None,
    };
    let view = pod.as_ref().map(PodView::of);
    let step = reconcile::decide(&run, view.as_ref(), Timestamp::now());
    let label = step_label(&step);
    info!(run = %name, namespace = %ns, step = label, "reconcile");
    let action = match step {
        Step::AddFinalizer => {
            let mut finalizers = run.finalizers().to_vec();
            finalizers.push(FINALIZER.to_string());
            patch_finalizers(&runs, &run, finalizers).await?;
            Action::await_change()
        }
        Step::CreatePod => create_pod(&ctx, &run, &runs, &pods).await?,
        Step::Track { requeue } => {
            let view = view.unwrap_or(PodView {
                deleting: false,
                holder_running: false,
                workload: WorkloadState::NotStarted,
                started_at: None,
                problem: None,
            });
            let status = reconcile::tracked_status(&run, &pod_name, &view, Timestamp::now());
            let before = run.status.clone().unwrap_or_default();
            if status.message != before.message && status.phase == Some(Phase::Pending) {
                if let Some(problem) = &view.problem {
                    let (reason, msg) = match problem {
                        reconcile::PodProblem::Unschedulable(m) => ("Unschedulable", m.clone()),
                        reconcile::PodProblem::ImagePull { message, .. } => {
                            ("ImagePullFailed", message.clone())
                        }
                    };
                    publish(&ctx, &run, EventType::Warning, reason, &msg, "Track").await;
                }
            }
            if before.phase != Some(Phase::Running) && status.phase == Some(Phase::Running) {
                publish(
                    &ctx,
                    &run,
                    EventType::Normal,
                    "Running",
                    &format!("pod {pod_name} is running"),
                    "Track",
                )
                .await;
            }
            if status != before {
                apply_status(&runs, &name, &status).await?;
            }
            match requeue {
                Some(d) => Action::requeue(d + Duration::from_millis(200)),
                None => Action::await_change(),
            }
        }
        Step::Teardown(trigger) => {
            teardown(&ctx, &run, &runs, &pods, &pod_name, pod.as_ref(), trigger).await?;
            Action::await_change()
        }
        Step::PodLost => {
            // The pod is read live but the run comes from the watch cache, which can lag behind
            // our own last status write: a teardown that recorded its drain, then deleted the pod,
            // is reconciled again (the pod's deletion) with the pre-teardown run. Deciding "pod
            // lost" on that stale copy overwrote the recorded drain outcome with "the pod was
            // gone". Re-read the run and decide only on the live object.
            let Some(live) = runs
                .get_opt(&name)
                .await
                .map_err(kube_err(format!("get {ns}/{name}")))?
            else {
                return Ok(Action::await_change());
            };
            if live.metadata.resource_version != run.metadata.resource_version
                && reconcile::decide(&live, None, Timestamp::now()) != Step::PodLost
            {
                return Ok(Action::requeue(Duration::from_millis(200)));
            }
            let run = Arc::new(live);
            let status = reconcile::pod_lost_status(&run, Timestamp::now());
            for entry in status
                .read_back
                .iter()
                .filter(|e| e.phase == ReadBackPhase::Failed)
            {
                let already = run.status.as_ref().is_some_and(|s| {
                    s.read_back
                        .iter()
                        .any(|e2| e2.path == entry.path && e2.phase == ReadBackPhase::Failed)
                });
                if !already {
                    drain_failed_event(&ctx, &run, entry).await;
                }
            }
            apply_status(&runs, &name, &status).await?;
            if run.metadata.deletion_timestamp.is_some() {
                remove_finalizer(&runs, &run).await?;
            }
            Action::await_change()
        }
        Step::CleanUp => {
            if let Some(p) = &pod {
                if p.metadata.deletion_timestamp.is_none() || reconcile::drain_settled(&run) {
                    delete_pod(&pods, &pod_name, reconcile::drain_settled(&run)).await?;
                }
            }
            if run.metadata.deletion_timestamp.is_some()
                && run.finalizers().iter().any(|f| f == FINALIZER)
            {
                remove_finalizer(&runs, &run).await?;
            }
            Action::await_change()
        }
        Step::ReleaseFinalizer => {
            if pod.is_some() {
                delete_pod(&pods, &pod_name, true).await?;
            }
            remove_finalizer(&runs, &run).await?;
            Action::await_change()
        }
        Step::SkipDrain => {
            let undrained: Vec<String> = run
                .spec
                .read_back_paths()
                .iter()
                .filter(|p| {
                    !run.status.as_ref().is_some_and(|s| {
                        s.read_back
                            .iter()
                            .any(|e| e.path == p.path && e.phase != ReadBackPhase::Pending)
                    })
                })
                .map(|p| p.path.clone())
                .collect();
            let note = if undrained.is_empty() {
                "sandbox.iterion.io/skip-drain=true: finalizer released without draining"
                    .to_string()
            } else {
                format!(
                    "sandbox.iterion.io/skip-drain=true: finalizer released; NOT drained: {}",
                    undrained.join(", ")
                )
            };
            publish(
                &ctx,
                &run,
                EventType::Warning,
                "DrainSkipped",
                &note,
                "Delete",
            )
            .await;
            if pod.is_some() {
                delete_pod(&pods, &pod_name, true).await?;
            }
            remove_finalizer(&runs, &run).await?;
            Action::await_change()
        }
    };
    ctx.metrics.reconciles.with_label_values(&[label]).inc();
    ctx.metrics
        .reconcile_duration
        .with_label_values(&[label])
        .observe(started.elapsed().as_secs_f64());
    Ok(action)
}

fn step_label(step: &Step) -> &'static str {
    match step {
        Step::AddFinalizer => "add_finalizer",
        Step::ReleaseFinalizer => "release_finalizer",
        Step::SkipDrain => "skip_drain",
        Step::CreatePod => "create_pod",
        Step::Track { .. } => "track",
        Step::Teardown(_) => "teardown",
        Step::PodLost => "pod_lost",
        Step::CleanUp => "clean_up",
    }
}

async fn create_pod(
    ctx: &Context,
    run: &SandboxRun,
    runs: &Api<SandboxRun>,
    pods: &Api<Pod>,
) -> Result<Action, ControllerError> {
    let name = run.name_any();
    let mut status = run.status.clone().unwrap_or_default();
    status.observed_generation = run.metadata.generation;
    let now = Timestamp::now();
    match pod::build_pod(run, &ctx.pod) {
        Err(e) => {
            // A malformed run is recorded and awaited (a spec change wakes it), not retried hot.
            let msg = format!("cannot build the pod: {e}");
            if status.message.as_deref() != Some(msg.as_str()) {
                publish(
                    ctx,
                    run,
                    EventType::Warning,
                    "InvalidSpec",
                    &msg,
                    "CreatePod",
                )
                .await;
            }
            status.phase = Some(Phase::Pending);
            status.message = Some(msg.clone());
            reconcile::set_condition(
                &mut status.conditions,
                condition::READY,
                false,
                "InvalidSpec",
                msg,
                run.metadata.generation,
                now,
            );
            apply_status(runs, &name, &status).await?;
            Ok(Action::await_change())
        }
        Ok(pod) => {
            let pod_name = pod.metadata.name.clone().unwrap_or_default();
            match pods.create(&PostParams::default(), &pod).await {
                Ok(_) => {
                    publish(
                        ctx,
                        run,
                        EventType::Normal,
                        "PodCreated",
                        &format!("created pod {pod_name}"),
                        "CreatePod",
                    )
                    .await;
                }
                Err(kube::Error::Api(ae)) if ae.code == 409 => {}
                Err(e) => return Err(kube_err(format!("create pod {pod_name}"))(e)),
            }
            status.phase = Some(Phase::Pending);
            status.pod_name = Some(pod_name);
            status.message = Some("waiting for the pod to run".to_string());
            reconcile::set_condition(
                &mut status.conditions,
                condition::READY,
                false,
                "PodCreated",
                "waiting for the pod to run",
                run.metadata.generation,
                now,
            );
            reconcile::ensure_pending_entries(run, &mut status);
            apply_status(runs, &name, &status).await?;
            Ok(Action::await_change())
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn teardown(
    ctx: &Context,
    run: &SandboxRun,
    runs: &Api<SandboxRun>,
    pods: &Api<Pod>,
    pod_name: &str,
    pod: Option<&Pod>,
    trigger: Trigger,
) -> Result<(), ControllerError> {
    let name = run.name_any();
    let now = Timestamp::now();
    let mut status = if run.status.as_ref().and_then(|s| s.phase) == Some(Phase::Draining) {
        let mut s = run.status.clone().unwrap_or_default();
        reconcile::ensure_pending_entries(run, &mut s);
        s
    } else {
        let s = reconcile::draining_status(run, &trigger, now);
        publish(
            ctx,
            run,
            EventType::Normal,
            "TearingDown",
            &format!("{}; draining", trigger.describe()),
            "Teardown",
        )
        .await;
        apply_status(runs, &name, &s).await?;
        s
    };
    // The drain's deadline runs from the start of teardown (the Drained=Unknown transition), so a
    // restart mid-drain does not grant a fresh timeout.
    let timeout =
        pod::drain_timeout_seconds(run, &ctx.pod).unwrap_or(ctx.pod.default_drain_timeout_seconds);
    let began = status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::DRAINED && c.status == "Unknown")
        .map(|c| c.last_transition_time.0)
        .unwrap_or(now);
    let elapsed = now.duration_since(began);
    let left = jiff::SignedDuration::from_secs(timeout)
        .checked_sub(elapsed)
        .unwrap_or_default();
    let deadline = tokio::time::Instant::now() + Duration::try_from(left).unwrap_or(Duration::ZERO);

    let view = pod.map(PodView::of);
    let holder_running = view.as_ref().is_some_and(|v| v.holder_running);
    let never_started = view
        .as_ref()
        .is_none_or(|v| v.workload == WorkloadState::NotStarted)
        && status.start_time.is_none();
    let ns = run.namespace().unwrap_or_default();
    let uid = run.uid().unwrap_or_default();
    let compression = run
        .spec
        .read_back
        .as_ref()
        .map(|r| r.compression)
        .unwrap_or_default();
    for (index, declared) in run.spec.read_back_paths().iter().enumerate() {
        let Some(entry_index) = status
            .read_back
            .iter()
            .position(|e| e.path == declared.path)
        else {
            continue;
        };
        if status.read_back[entry_index].phase != ReadBackPhase::Pending {
            continue;
        }
        let outcome = if never_started {
            ReadBackStatus {
                path: declared.path.clone(),
                phase: ReadBackPhase::Empty,
                message: Some("the workload never started, so it wrote nothing".to_string()),
                ..Default::default()
            }
        } else if !holder_running {
            ReadBackStatus {
                path: declared.path.clone(),
                phase: ReadBackPhase::Failed,
                message: Some(
                    "the holder container is not running, so the path cannot be read (exec into a stopped container is impossible)"
                        .to_string(),
                ),
                ..Default::default()
            }
        } else {
            let requested = declared
                .size_limit
                .as_ref()
                .and_then(|q| crate::admission::rules::quantity_to_bytes(q).ok());
            let job = PathJob {
                pods,
                pod_name,
                pack_command: &ctx.pack_command,
                store: &ctx.store,
                store_prefix: &ctx.store_prefix,
                store_url: &ctx.store_url,
                namespace: &ns,
                run_name: &name,
                run_uid: &uid,
                index,
                path: &declared.path,
                cap_bytes: ctx.caps.effective(requested),
                compression,
                deadline,
                previous_attempts: status.read_back[entry_index].attempts,
                metrics: &ctx.metrics,
            };
            drain_path(&job).await
        };
        match outcome.phase {
            ReadBackPhase::Failed => drain_failed_event(ctx, run, &outcome).await,
            ReadBackPhase::Capped => {
                let note = format!(
                    "{}: cap reached, {} member(s) dropped and listed in the manifest; {} stored",
                    outcome.path, outcome.dropped_members, outcome.members
                );
                publish(ctx, run, EventType::Warning, REASON_CAPPED, &note, "Drain").await;
            }
            _ => {
                let note = format!(
                    "{}: {:?}, {} member(s), {} byte(s){}",
                    outcome.path,
                    outcome.phase,
                    outcome.members,
                    outcome.bytes,
                    outcome
                        .object
                        .as_ref()
                        .map(|o| format!(" -> {o}"))
                        .unwrap_or_default()
                );
                publish(ctx, run, EventType::Normal, "Drained", &note, "Drain").await;
            }
        }
        status.read_back[entry_index] = outcome;
        apply_status(runs, &name, &status).await?;
    }

    let status = reconcile::finished_status(run, status, Timestamp::now());
    let phase = status.phase.unwrap_or(Phase::Failed);
    publish(
        ctx,
        run,
        if phase == Phase::Failed {
            EventType::Warning
        } else {
            EventType::Normal
        },
        &format!("{phase:?}"),
        status.message.as_deref().unwrap_or_default(),
        "Teardown",
    )
    .await;
    apply_status(runs, &name, &status).await?;
    if holder_running {
        mark_drained(pods, pod_name).await;
    }
    if pod.is_some() {
        delete_pod(pods, pod_name, true).await?;
    }
    if run.metadata.deletion_timestamp.is_some() {
        remove_finalizer(runs, run).await?;
    }
    Ok(())
}

/// Tells the holder's preStop hook that the drain is done (best effort: the pod is deleted next).
async fn mark_drained(pods: &Api<Pod>, pod_name: &str) {
    let params = kube::api::AttachParams::default()
        .container(pod::HOLDER_CONTAINER)
        .stdout(false)
        .stderr(false)
        .stdin(false);
    let cmd = [
        "sandboxrun-operator",
        "holder",
        "--state-dir",
        pod::HOLDER_STATE_DIR,
        "--mark-drained",
    ];
    match pods.exec(pod_name, cmd, &params).await {
        Ok(mut p) => {
            if let Some(status) = p.take_status() {
                let _ = tokio::time::timeout(Duration::from_secs(10), status).await;
            }
        }
        Err(e) => warn!(pod = pod_name, error = %e, "could not mark the pod drained"),
    }
}

async fn drain_failed_event(ctx: &Context, run: &SandboxRun, entry: &ReadBackStatus) {
    let note = format!(
        "drain of {} failed after {} attempt(s), {} byte(s) stored: {}",
        entry.path,
        entry.attempts,
        entry.bytes,
        entry.message.as_deref().unwrap_or("no detail")
    );
    publish(
        ctx,
        run,
        EventType::Warning,
        REASON_DRAIN_FAILED,
        &note,
        "Drain",
    )
    .await;
}

async fn publish(
    ctx: &Context,
    run: &SandboxRun,
    type_: EventType,
    reason: &str,
    note: &str,
    action: &str,
) {
    // The apiserver caps an Event note at 1 KiB.
    let mut note = note.to_string();
    if note.len() > 1000 {
        let mut cut = 1000;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: action.to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &run.object_ref(&())).await {
        warn!(run = %run.name_any(), reason, error = %e, "could not publish Event");
    }
}

async fn apply_status(
    runs: &Api<SandboxRun>,
    name: &str,
    status: &SandboxRunStatus,
) -> Result<(), ControllerError> {
    let patch = json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRun",
        "status": status,
    });
    match runs
        .patch_status(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
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

/// Lists the runs of a namespace (used by the CLI and tests).
pub async fn list_runs(client: Client, namespace: &str) -> Result<Vec<SandboxRun>, kube::Error> {
    let api: Api<SandboxRun> = Api::namespaced(client, namespace);
    Ok(api.list(&ListParams::default()).await?.items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_failed_reason_is_the_contract_string() {
        assert_eq!(REASON_DRAIN_FAILED, "sandbox_runfiles_drain_failed");
        assert!(REASON_DRAIN_FAILED.len() <= 128);
    }

    #[test]
    fn run_resource_is_namespaced_in_our_group() {
        assert_eq!(SandboxRun::group(&()), crate::api::GROUP);
    }
}
