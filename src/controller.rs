//! The controller shell: watches SandboxRuns and their pods, asks [`crate::reconcile::decide`] what
//! to do, and does it (create the pod, drain, delete, release the finalizer, report status and
//! Events). Everything it decides is pure and tested in `reconcile.rs`; this file only does I/O.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{AttachParams, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use object_store::ObjectStore;
use serde_json::json;
use thiserror::Error;
use tokio::io::AsyncRead;
use tracing::{info, warn};

use crate::api::{Phase, ReadBackPhase, ReadBackStatus, SandboxRun, SandboxRunStatus, FINALIZER};
use crate::config::CapSettings;
use crate::drain::run::{drain_path, PathJob};
use crate::metrics::Metrics;
use crate::pod::{self, PodSettings};
use crate::reconcile::{
    self, condition, DecideSettings, DrainSummary, PodView, Step, Trigger, WorkloadState,
};
pub use crate::reconcile::{REASON_CAPPED, REASON_DRAINED, REASON_DRAIN_FAILED};

/// Field manager of every status write (server-side apply, one manager).
pub const MANAGER: &str = "sandboxrun-operator";
/// How long the operator waits for `holder --mark-drained` to report its status.
const MARK_DRAINED_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of the mark-drained exec's output kept for the log (the rest is read and discarded).
const MARK_DRAINED_OUTPUT_KEPT: usize = 1024;

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
    /// Settings of the pure decision (image-pull timeout).
    pub decide: DecideSettings,
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
        decide: DecideSettings,
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
            decide,
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
    let step = reconcile::decide(&run, view.as_ref(), Timestamp::now(), &ctx.decide);
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
                pending_since: None,
                problem: None,
            });
            let status = reconcile::tracked_status(&run, &pod_name, &view, Timestamp::now());
            let before = run.status.clone().unwrap_or_default();
            if status.message != before.message && status.phase == Some(Phase::Pending) {
                if let Some(problem) = &view.problem {
                    let (reason, msg) = match problem {
                        reconcile::PodProblem::Unschedulable(m) => ("Unschedulable", m.clone()),
                        reconcile::PodProblem::ImagePull { message, .. } => {
                            (reconcile::REASON_IMAGE_PULL_FAILED, message.clone())
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
                && reconcile::decide(&live, None, Timestamp::now(), &ctx.decide) != Step::PodLost
            {
                return Ok(Action::requeue(Duration::from_millis(200)));
            }
            let run = Arc::new(live);
            let committed = committed_entries(&ctx, &run).await;
            let status = reconcile::pod_lost_status(&run, &committed, Timestamp::now());
            let newly_failed = status
                .read_back
                .iter()
                .filter(|e| e.phase == ReadBackPhase::Failed)
                .any(|entry| {
                    !run.status.as_ref().is_some_and(|s| {
                        s.read_back
                            .iter()
                            .any(|e2| e2.path == entry.path && e2.phase == ReadBackPhase::Failed)
                    })
                });
            if newly_failed {
                // One Event for every path (a series of per-path Events shows only the first).
                if let Some(summary) = reconcile::drain_summary(&status.read_back) {
                    publish_summary(&ctx, &run, &summary, "PodLost").await;
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

/// The status entries of the run's undrained paths whose manifest is already in the store (an
/// operator committed them and died before recording it). A manifest that cannot be read is not
/// taken for one: the path stays undrained (and is reported lost), with a warning.
async fn committed_entries(ctx: &Context, run: &SandboxRun) -> Vec<ReadBackStatus> {
    let recorded = |path: &str| {
        run.status.as_ref().is_some_and(|s| {
            s.read_back
                .iter()
                .any(|e| e.path == path && e.phase != ReadBackPhase::Pending)
        })
    };
    let compression = run
        .spec
        .read_back
        .as_ref()
        .map(|r| r.compression)
        .unwrap_or_default();
    let run_ref = crate::store::RunRef {
        namespace: run.namespace().unwrap_or_default(),
        name: run.name_any(),
        uid: run.uid().unwrap_or_default(),
    };
    let mut committed = Vec::new();
    for (index, declared) in run.spec.read_back_paths().iter().enumerate() {
        if recorded(&declared.path) {
            continue;
        }
        let keys = crate::store::object_keys(
            &ctx.store_prefix,
            &run_ref,
            index,
            &declared.path,
            compression,
        );
        match crate::store::try_read_manifest(&ctx.store, &keys.manifest).await {
            Ok(Some(manifest)) => committed.push(crate::drain::run::committed_status(
                &declared.path,
                &manifest,
                &keys,
                &ctx.store_url,
                manifest.attempt,
            )),
            Ok(None) => {}
            Err(e) => {
                warn!(path = %declared.path, error = %e, "could not read the manifest of a path whose pod is gone");
            }
        }
    }
    committed
}

/// The metric label of a step.
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
    // Read before the pod is deleted below: the evidence must outlive it.
    let workload = pod.and_then(reconcile::workload_termination);
    let mut status = if run.status.as_ref().and_then(|s| s.phase) == Some(Phase::Draining) {
        let mut s = run.status.clone().unwrap_or_default();
        reconcile::ensure_pending_entries(run, &mut s);
        // A teardown resumed after a restart, or begun before the workload exited.
        if s.workload.is_none() && workload.is_some() {
            s.workload = workload;
            apply_status(runs, &name, &s).await?;
        }
        s
    } else {
        let s = reconcile::draining_status(run, &trigger, workload, now);
        let (warning, reason, note) = reconcile::teardown_event(&trigger);
        let type_ = if warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        publish(ctx, run, type_, reason, &note, "Teardown").await;
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
            reconcile::never_started_entry(&declared.path, &trigger)
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
        status.read_back[entry_index] = outcome;
        apply_status(runs, &name, &status).await?;
    }
    // ONE Event for every path of the run: the Recorder folds Events with the same reason into a
    // series that shows only the first note, so one Event per path hid all but one (issue #17).
    if let Some(summary) = reconcile::drain_summary(&status.read_back) {
        publish_summary(ctx, run, &summary, "Drain").await;
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

/// The exec that tells the holder's preStop hook the drain is done: argv.
fn mark_drained_command() -> Vec<String> {
    [
        "sandboxrun-operator",
        "holder",
        "--state-dir",
        pod::HOLDER_STATE_DIR,
        "--mark-drained",
    ]
    .map(str::to_string)
    .to_vec()
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
async fn mark_drained(pods: &Api<Pod>, pod_name: &str) {
    let mut process = match pods
        .exec(pod_name, mark_drained_command(), &mark_drained_params())
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

async fn publish_summary(ctx: &Context, run: &SandboxRun, summary: &DrainSummary, action: &str) {
    let type_ = if summary.warning {
        EventType::Warning
    } else {
        EventType::Normal
    };
    publish(ctx, run, type_, summary.reason, &summary.note, action).await;
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
    if note.len() > reconcile::EVENT_NOTE_LIMIT {
        let mut cut = reconcile::EVENT_NOTE_LIMIT;
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
    use clap::Parser;

    #[test]
    fn drain_failed_reason_is_the_contract_string() {
        assert_eq!(REASON_DRAIN_FAILED, "sandbox_runfiles_drain_failed");
        assert!(REASON_DRAIN_FAILED.len() <= 128);
    }

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
        let argv = mark_drained_command();
        assert_eq!(argv[0], "sandboxrun-operator");
        match crate::cli::Cli::try_parse_from(&argv).map(|c| c.command) {
            Ok(crate::cli::Command::Holder(h)) => {
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

    #[test]
    fn run_resource_is_namespaced_in_our_group() {
        assert_eq!(SandboxRun::group(&()), crate::api::GROUP);
    }
}
