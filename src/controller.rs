//! The controller shell: watches SandboxRuns and their pods, asks [`crate::reconcile::decide`] what
//! to do, and does it (create the pod, drain, delete, release the finalizer, report status and
//! Events). Everything it decides is pure and tested in `reconcile.rs`; this file only does I/O.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod};
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

use crate::api::{
    Phase, ReadBackPhase, ReadBackStatus, Retention, SandboxRun, SandboxRunStatus, FINALIZER,
};
use crate::caps::CapSettings;
use crate::drain::path_drain::{drain_path, PathJob};
use crate::inpod::holder::HolderCommand;
use crate::metrics::Metrics;
use crate::pod::{self, PodSettings};
use crate::reconcile::{
    self, condition, DecideSettings, DrainSummary, PodView, Step, Trigger, WorkloadState,
};
pub use crate::reconcile::{REASON_CAPPED, REASON_DRAINED, REASON_DRAIN_FAILED};
use crate::retention::{self as after, Ttl};
use crate::store::purge::delete_run_archives;
use crate::store::RunRef;
use crate::{events, startup};

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
    /// When this process last tried to create each refused run's pod (by run uid): the back-off
    /// of [`crate::startup::create_retry_wait`]. Lost on restart by design (the next attempt is
    /// then immediate, and its pause already as long as the refusals have lasted).
    pub create_attempts: std::sync::Mutex<std::collections::HashMap<String, Timestamp>>,
    /// What deleting a run does to its stored files when its spec does not say
    /// (`run --default-retention`).
    pub default_retention: Retention,
    /// Cancelled when this replica must stop draining at once (lost lease, shutdown): in-flight
    /// drains record nothing and the next leader resumes them.
    pub cancel: tokio_util::sync::CancellationToken,
    /// The drains in flight, off the reconcile workers.
    pub drains: DrainPool,
    /// Aborts an S3 archive key's open multipart uploads before each attempt (None: not S3).
    pub open_uploads: Option<Arc<crate::store::open_uploads::OpenUploads>>,
}

/// Teardowns (the drains) run as tasks of their own, at most `max` at once, so a slow or stuck
/// drain never holds a reconcile worker: the reconcile that starts one returns at once, and the
/// run is reconciled again when the drain's status writes (or the requeue below) wake it. A run
/// whose drain is in flight is not started twice: its reconciles wait for the drain to end.
pub struct DrainPool {
    permits: Arc<tokio::sync::Semaphore>,
    in_flight: std::sync::Mutex<std::collections::HashSet<String>>,
    tasks: tokio_util::task::TaskTracker,
}

/// How often a run whose drain is in flight is looked at again (a safety net: the drain's own
/// status writes wake it when it ends).
const IN_FLIGHT_REQUEUE: Duration = Duration::from_secs(30);

impl DrainPool {
    /// A pool of `max` concurrent drains (at least 1).
    pub fn new(max: usize) -> DrainPool {
        DrainPool {
            permits: Arc::new(tokio::sync::Semaphore::new(max.max(1))),
            in_flight: std::sync::Mutex::new(std::collections::HashSet::new()),
            tasks: tokio_util::task::TaskTracker::new(),
        }
    }

    /// Whether the run with this uid has a drain in flight.
    pub fn is_in_flight(&self, uid: &str) -> bool {
        self.in_flight
            .lock()
            .map(|set| set.contains(uid))
            .unwrap_or(false)
    }

    /// Marks the run as draining; false when it already was.
    fn claim(&self, uid: &str) -> bool {
        self.in_flight
            .lock()
            .map(|mut set| set.insert(uid.to_string()))
            .unwrap_or(false)
    }

    fn release(&self, uid: &str) {
        if let Ok(mut set) = self.in_flight.lock() {
            set.remove(uid);
        }
    }

    /// Drains in flight or waiting for a slot.
    pub fn len(&self) -> usize {
        self.in_flight.lock().map(|set| set.len()).unwrap_or(0)
    }

    /// Whether no drain is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits (at most `limit`) for the drain tasks to end: after a cancel they stop promptly.
    pub async fn wait(&self, limit: Duration) -> bool {
        self.tasks.close();
        tokio::time::timeout(limit, self.tasks.wait()).await.is_ok()
    }
}

impl Context {
    /// The same context with `retention` as the operator-wide default of
    /// `spec.readBack.retention`.
    pub fn with_default_retention(mut self, retention: Retention) -> Context {
        self.default_retention = retention;
        self
    }

    /// The same context with the clean-up of open multipart uploads before each attempt.
    pub fn with_open_uploads(
        mut self,
        open_uploads: Option<Arc<crate::store::open_uploads::OpenUploads>>,
    ) -> Context {
        self.open_uploads = open_uploads;
        self
    }

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
        max_concurrent_drains: usize,
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
            create_attempts: Default::default(),
            default_retention: Retention::default(),
            cancel: tokio_util::sync::CancellationToken::new(),
            drains: DrainPool::new(max_concurrent_drains),
            open_uploads: None,
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
        let pods_cfg = watcher::Config::default().labels(&pod::managed_by_selector());
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
    // The run's drain owns it until the drain ends (its status writes, then this requeue, wake it).
    if ctx.drains.is_in_flight(&run.uid().unwrap_or_default()) {
        return Ok(Action::requeue(IN_FLIGHT_REQUEUE));
    }
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
        Some(other) => {
            let msg = format!("a pod named {pod_name} exists and is not owned by this run; delete it or rename the run");
            publish(
                &ctx,
                &run,
                Some(&other),
                EventType::Warning,
                events::POD_NAME_CONFLICT,
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
    let mut view = pod.as_ref().map(PodView::of);
    // A pod that stays Pending with nothing in its status may be stuck on something only its
    // Events say (FailedMount): read them, bounded.
    if let (Some(v), Some(p)) = (view.as_mut(), pod.as_ref()) {
        if startup::should_read_pod_events(v, Timestamp::now()) {
            v.problem = stuck_problem_from_events(&ctx.client, &ns, p).await;
        }
    }
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
            let now = Timestamp::now();
            let status = reconcile::tracked_status(&run, &pod_name, &view, now);
            let before = run.status.clone().unwrap_or_default();
            // One PodStuck Event per distinct cause (Ready's reason and message), not one per
            // reconcile. Its action is the cause: the Recorder folds Events that share type,
            // reason and action into one series that keeps the FIRST note, so a second cause
            // under one action would be hidden behind the first.
            if let (Some(note), Some(problem)) = (
                reconcile::newly_stuck(&before, view.problem.as_ref()),
                view.problem.as_ref(),
            ) {
                publish(
                    &ctx,
                    &run,
                    pod.as_ref(),
                    EventType::Warning,
                    events::POD_STUCK,
                    &note,
                    problem.reason(),
                )
                .await;
            }
            if before.phase != Some(Phase::Running) && status.phase == Some(Phase::Running) {
                publish(
                    &ctx,
                    &run,
                    pod.as_ref(),
                    EventType::Normal,
                    events::RUNNING,
                    &format!("pod {pod_name} is running"),
                    "Track",
                )
                .await;
            }
            if status != before {
                apply_status(&runs, &name, &status).await?;
            }
            // A pod that has not started is looked at again even if nothing changes on it (a
            // missing volume changes nothing in its status).
            let requeue = match (requeue, startup::pending_recheck(&view, now)) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match requeue {
                Some(d) => Action::requeue(d + Duration::from_millis(200)),
                None => Action::await_change(),
            }
        }
        Step::Teardown(trigger) => {
            start_teardown(&ctx, run.clone(), runs, pods, pod_name, pod, trigger);
            Action::requeue(IN_FLIGHT_REQUEUE)
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
                    publish_summary(&ctx, &run, None, &summary, "PodLost").await;
                }
            }
            apply_status(&runs, &name, &status).await?;
            // With retention Delete the next reconcile (woken by this final status) deletes
            // the stored files first (Step::ReleaseFinalizer).
            if run.metadata.deletion_timestamp.is_some()
                && after::retention(&run, ctx.default_retention) == Retention::Retain
            {
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
            match after::ttl(&run, Timestamp::now()) {
                // At the exact time the TTL passes (a little after, so the decision sees it passed).
                Ttl::Wait(d) if run.metadata.deletion_timestamp.is_none() => {
                    Action::requeue(d + Duration::from_millis(200))
                }
                _ => Action::await_change(),
            }
        }
        Step::Expire => {
            expire(&ctx, &run, &runs).await?;
            Action::await_change()
        }
        Step::ReleaseFinalizer => {
            forget_create_attempt(&ctx, &run);
            if pod.is_some() {
                delete_pod(&pods, &pod_name, true).await?;
            }
            match purge_stored_files(&ctx, &run).await {
                Purge::Done => {
                    remove_finalizer(&runs, &run).await?;
                    Action::await_change()
                }
                Purge::RetryAfter(d) => Action::requeue(d),
            }
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
            let mut note = if undrained.is_empty() {
                "sandbox.iterion.io/skip-drain=true: finalizer released without draining"
                    .to_string()
            } else {
                format!(
                    "sandbox.iterion.io/skip-drain=true: finalizer released; NOT drained: {}",
                    undrained.join(", ")
                )
            };
            if after::retention(&run, ctx.default_retention) == Retention::Delete {
                note.push_str("; retention: Delete skipped too, stored files are kept");
            }
            publish(
                &ctx,
                &run,
                pod.as_ref(),
                EventType::Warning,
                events::DRAIN_SKIPPED,
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
            Ok(Some(manifest)) => committed.push(crate::drain::path_drain::committed_status(
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
        Step::Expire => "expire",
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
    // The apiserver refused this run's pod before: wait out the back-off (a watch event, such as
    // our own status write, must not turn it into a hot loop).
    if let Some(wait) = startup::create_retry_wait(run, last_create_attempt(ctx, run), now) {
        return Ok(Action::requeue(wait + Duration::from_millis(200)));
    }
    match pod::build_pod(run, &ctx.pod) {
        Err(e) => {
            // A malformed run is recorded and awaited (a spec change wakes it), not retried hot.
            let msg = format!("cannot build the pod: {e}");
            if status.message.as_deref() != Some(msg.as_str()) {
                publish(
                    ctx,
                    run,
                    None,
                    EventType::Warning,
                    events::INVALID_SPEC,
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
                reconcile::REASON_INVALID_SPEC,
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
                Ok(created) => {
                    forget_create_attempt(ctx, run);
                    publish(
                        ctx,
                        run,
                        Some(&created),
                        EventType::Normal,
                        events::POD_CREATED,
                        &format!("created pod {pod_name}"),
                        "CreatePod",
                    )
                    .await;
                }
                Err(kube::Error::Api(ae)) if ae.code == 409 => {}
                // Refused (quota, Pod Security, a webhook, RBAC): say so where the user looks,
                // and try again after a back-off rather than every 10 s.
                Err(kube::Error::Api(ae)) if startup::is_refusal(ae.code) => {
                    let status = startup::refused_status(run, &ae.message, now);
                    let note = status.message.clone().unwrap_or_default();
                    publish(
                        ctx,
                        run,
                        None,
                        EventType::Warning,
                        events::POD_CREATE_FAILED,
                        &note,
                        "CreatePod",
                    )
                    .await;
                    record_create_attempt(ctx, run, now);
                    let since =
                        startup::refused_since_in(&status, run.metadata.generation).unwrap_or(now);
                    let retry = startup::retry_delay(since, now);
                    warn!(run = %name, pod = %pod_name, code = ae.code, apiserver = %ae.message,
                        retry_seconds = retry.as_secs(), "pod creation refused by the apiserver");
                    apply_status(runs, &name, &status).await?;
                    return Ok(Action::requeue(retry + Duration::from_millis(200)));
                }
                Err(e) => return Err(kube_err(format!("create pod {pod_name}"))(e)),
            }
            status.phase = Some(Phase::Pending);
            status.pod_name = Some(pod_name);
            status.message = Some("waiting for the pod to run".to_string());
            reconcile::set_condition(
                &mut status.conditions,
                condition::READY,
                false,
                reconcile::REASON_POD_CREATED,
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

/// Starts the run's teardown in the drain pool, unless one is in flight. The drain waits for a
/// slot (or for this replica to stop), runs, and leaves the run to its next reconcile.
fn start_teardown(
    ctx: &Arc<Context>,
    run: Arc<SandboxRun>,
    runs: Api<SandboxRun>,
    pods: Api<Pod>,
    pod_name: String,
    pod: Option<Pod>,
    trigger: Trigger,
) {
    let uid = run.uid().unwrap_or_default();
    if !ctx.drains.claim(&uid) {
        return;
    }
    let ctx = Arc::clone(ctx);
    let tasks = ctx.drains.tasks.clone();
    tasks.spawn(async move {
        let permits = Arc::clone(&ctx.drains.permits);
        let permit = tokio::select! {
            permit = permits.acquire_owned() => permit.ok(),
            () = ctx.cancel.cancelled() => None,
        };
        if let Some(_permit) = permit {
            if let Err(error) =
                teardown(&ctx, &run, &runs, &pods, &pod_name, pod.as_ref(), trigger).await
            {
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
        }
        ctx.drains.release(&uid);
    });
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
        publish(
            ctx,
            run,
            pod,
            event_type(warning),
            reason,
            &note,
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
                .and_then(|q| crate::units::quantity_to_bytes(q).ok());
            let job = PathJob {
                pods,
                pod_name,
                pack_command: &ctx.pack_command,
                store: &ctx.store,
                open_uploads: ctx.open_uploads.as_deref(),
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
                cancel: &ctx.cancel,
            };
            match drain_path(&job).await {
                Some(outcome) => outcome,
                // This replica stops draining (lost lease, shutdown): record nothing, so the next
                // leader resumes the path from the store's commit point.
                None => return Ok(()),
            }
        };
        status.read_back[entry_index] = outcome;
        apply_status(runs, &name, &status).await?;
    }
    // ONE Event for every path of the run: the Recorder folds Events with the same reason into a
    // series that shows only the first note, so one Event per path hid all but one (issue #17).
    if let Some(summary) = reconcile::drain_summary(&status.read_back) {
        publish_summary(ctx, run, pod, &summary, "Drain").await;
    }

    let status = reconcile::finished_status(run, status, Timestamp::now());
    // A Warning whenever the run ended badly (Failed=True), whatever its phase.
    let (warning, reason) = events::ending_event(&status);
    publish(
        ctx,
        run,
        pod,
        event_type(warning),
        reason,
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
    // A deleted run lets go here. With retention Delete its stored files go first; a delete that
    // fails is retried by the next reconciles (Step::ReleaseFinalizer), which the drain pool
    // defers until this task has ended.
    if run.metadata.deletion_timestamp.is_some()
        && matches!(purge_stored_files(ctx, run).await, Purge::Done)
    {
        remove_finalizer(runs, run).await?;
    }
    Ok(())
}

/// Deletes a run whose `spec.ttlSecondsAfterFinished` passed. The delete only sets the deletion
/// timestamp: the finalizer path runs as for any deletion (docs/contract.md).
async fn expire(
    ctx: &Context,
    run: &SandboxRun,
    runs: &Api<SandboxRun>,
) -> Result<(), ControllerError> {
    let name = run.name_any();
    let ttl = run.spec.ttl_seconds_after_finished.unwrap_or_default();
    let kept = match after::retention(run, ctx.default_retention) {
        Retention::Retain => "its stored files are kept",
        Retention::Delete => "its stored files are deleted (retention: Delete)",
    };
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
    publish(
        ctx,
        run,
        None,
        EventType::Normal,
        events::TTL_EXPIRED,
        &format!("finished more than ttlSecondsAfterFinished={ttl}s ago: deleted the run; {kept}"),
        "Expire",
    )
    .await;
    Ok(())
}

/// What [`purge_stored_files`] leaves to the caller.
enum Purge {
    /// Nothing (more) to delete, or the retries ran out: release the finalizer.
    Done,
    /// The delete failed; try again after this long (the finalizer stays).
    RetryAfter(Duration),
}

/// For a run with retention Delete, deletes everything it stored (only its own
/// `<prefix>/<namespace>/<name>/<uid>/`). A failure is a Warning Event and is retried with
/// back-off until the run's drain timeout has passed since the later of the deletion and the
/// drain's end; then the files are left and the finalizer released (docs/contract.md "Stored
/// files when a run is deleted").
async fn purge_stored_files(ctx: &Context, run: &SandboxRun) -> Purge {
    if after::retention(run, ctx.default_retention) != Retention::Delete {
        return Purge::Done;
    }
    let reference = RunRef {
        namespace: run.namespace().unwrap_or_default(),
        name: run.name_any(),
        uid: run.uid().unwrap_or_default(),
    };
    let dir = crate::store::run_dir(&ctx.store_prefix, &reference);
    let where_ = format!("{}/{dir}/", ctx.store_url.trim_end_matches('/'));
    match delete_run_archives(&ctx.store, &ctx.store_prefix, &reference).await {
        Ok(count) => {
            info!(run = %reference.name, namespace = %reference.namespace, count, "deleted the run's stored files");
            publish(
                ctx,
                run,
                None,
                EventType::Normal,
                events::ARCHIVES_DELETED,
                &format!("retention: Delete: deleted {count} stored objects (archives and manifests) under {where_}"),
                "Delete",
            )
            .await;
            Purge::Done
        }
        Err(e) => {
            let now = Timestamp::now();
            let bound_secs = pod::drain_timeout_seconds(run, &ctx.pod)
                .unwrap_or(ctx.pod.default_drain_timeout_seconds);
            let bound = Duration::from_secs(u64::try_from(bound_secs).unwrap_or(0));
            let start = after::purge_window_start(run, now);
            match after::purge_retry_after(start, bound, now) {
                Some(pause) => {
                    warn!(run = %reference.name, namespace = %reference.namespace, error = %e, "deleting the run's stored files failed; retrying");
                    publish(
                        ctx,
                        run,
                        None,
                        EventType::Warning,
                        events::ARCHIVE_DELETE_FAILED,
                        &format!("retention: Delete: could not delete the stored files under {where_}: {e}; retrying in {}s (gives up {bound_secs}s after deletion; annotate sandbox.iterion.io/skip-drain=true to release the run now)", pause.as_secs().max(1)),
                        "Delete",
                    )
                    .await;
                    Purge::RetryAfter(pause)
                }
                None => {
                    warn!(run = %reference.name, namespace = %reference.namespace, error = %e, "giving up deleting the run's stored files; releasing the finalizer");
                    publish(
                        ctx,
                        run,
                        None,
                        EventType::Warning,
                        events::ARCHIVE_DELETE_ABANDONED,
                        &format!("retention: Delete: gave up after {bound_secs}s (the drain timeout): the stored files under {where_} were NOT all deleted ({e}); the run is released, delete them by hand"),
                        "Delete",
                    )
                    .await;
                    Purge::Done
                }
            }
        }
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
async fn mark_drained(pods: &Api<Pod>, pod_name: &str) {
    let mut process = match pods
        .exec(
            pod_name,
            HolderCommand::MarkDrained.argv(),
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

async fn publish_summary(
    ctx: &Context,
    run: &SandboxRun,
    pod: Option<&Pod>,
    summary: &DrainSummary,
    action: &str,
) {
    publish(
        ctx,
        run,
        pod,
        event_type(summary.warning),
        summary.reason,
        &summary.note,
        action,
    )
    .await;
}

fn event_type(warning: bool) -> EventType {
    if warning {
        EventType::Warning
    } else {
        EventType::Normal
    }
}

/// Publishes an Event about `run`, `related` to its pod when there is one (the Events API's
/// `related`, kube's `secondary`), so `kubectl get events` links the two. `reason` is one of
/// [`events::ALL`].
async fn publish(
    ctx: &Context,
    run: &SandboxRun,
    related: Option<&Pod>,
    type_: EventType,
    reason: &'static str,
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
        secondary: related.map(|p| p.object_ref(&())),
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

fn last_create_attempt(ctx: &Context, run: &SandboxRun) -> Option<Timestamp> {
    let uid = run.metadata.uid.as_deref()?;
    ctx.create_attempts.lock().ok()?.get(uid).copied()
}

fn record_create_attempt(ctx: &Context, run: &SandboxRun, at: Timestamp) {
    if let (Some(uid), Ok(mut map)) = (run.metadata.uid.clone(), ctx.create_attempts.lock()) {
        map.insert(uid, at);
    }
}

fn forget_create_attempt(ctx: &Context, run: &SandboxRun) {
    if let (Some(uid), Ok(mut map)) = (run.metadata.uid.as_deref(), ctx.create_attempts.lock()) {
        map.remove(uid);
    }
}

/// The cause a Pending pod's Warning Events give for not starting (FailedMount, …), reading at
/// most [`startup::POD_EVENTS_LIMIT`] of them. A failed read is logged and counts as no cause.
async fn stuck_problem_from_events(
    client: &Client,
    ns: &str,
    pod: &Pod,
) -> Option<reconcile::PodProblem> {
    let uid = pod.metadata.uid.as_deref()?;
    let api: Api<CoreEvent> = Api::namespaced(client.clone(), ns);
    let params = ListParams::default()
        .fields(&format!("involvedObject.uid={uid},type=Warning"))
        .limit(startup::POD_EVENTS_LIMIT);
    let list = match api.list(&params).await {
        Ok(l) => l,
        Err(e) => {
            warn!(pod = ?pod.metadata.name, error = %e, "could not read the pod's Events");
            return None;
        }
    };
    let facts: Vec<startup::PodEventFact> = list
        .items
        .into_iter()
        .map(|e| startup::PodEventFact {
            last_seen: e
                .series
                .as_ref()
                .and_then(|s| s.last_observed_time.as_ref())
                .map(|t| t.0)
                .or(e.last_timestamp.as_ref().map(|t| t.0))
                .or(e.event_time.as_ref().map(|t| t.0)),
            reason: e.reason.unwrap_or_default(),
            message: e.message.unwrap_or_default(),
        })
        .collect();
    startup::stuck_from_events(&facts)
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

    #[tokio::test]
    async fn a_run_is_drained_once_at_a_time_and_the_pool_waits_for_its_tasks() {
        let pool = DrainPool::new(2);
        assert!(pool.claim("uid-a"));
        assert!(
            !pool.claim("uid-a"),
            "a drain in flight is not started twice"
        );
        assert!(pool.claim("uid-b"));
        assert!(pool.is_in_flight("uid-a") && pool.is_in_flight("uid-b"));
        assert_eq!(pool.len(), 2);
        pool.release("uid-a");
        assert!(!pool.is_in_flight("uid-a"));
        assert!(pool.claim("uid-a"), "claimable again once ended");
        // Tasks beyond the pool's size wait for a permit; the pool waits for all of them.
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let done = Arc::new(AtomicUsize::new(0));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        for _ in 0..5 {
            let permits = Arc::clone(&pool.permits);
            let (done, running, most) = (done.clone(), running.clone(), most.clone());
            pool.tasks.spawn(async move {
                let _permit = permits.acquire_owned().await;
                let now = running.fetch_add(1, SeqCst) + 1;
                most.fetch_max(now, SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                running.fetch_sub(1, SeqCst);
                done.fetch_add(1, SeqCst);
            });
        }
        assert!(pool.wait(Duration::from_secs(10)).await);
        assert_eq!(done.load(SeqCst), 5);
        assert_eq!(
            most.load(SeqCst),
            2,
            "never more than the pool's size at once"
        );
    }

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
        let argv = HolderCommand::MarkDrained.argv();
        assert_eq!(argv[0], "sandboxrun-operator");
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

    #[test]
    fn run_resource_is_namespaced_in_our_group() {
        assert_eq!(SandboxRun::group(&()), crate::api::GROUP);
    }
}
