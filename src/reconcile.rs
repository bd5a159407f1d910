//! The pure middle of reconcile: what phase a run is in and what must happen next.
//!
//! `observe` (the controller reads the run and its pod) → [`PodView::of`] + [`decide`] (pure, here)
//! → `act` (the controller creates the pod, drains, deletes, releases the finalizer) → `report`
//! (status by server-side apply, built by the functions here). No client, no clock: `now` is an
//! argument, so every transition is unit tested.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ContainerState, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use crate::api::{
    Phase, ReadBackPhase, ReadBackStatus, SandboxRun, SandboxRunStatus, WorkloadTermination,
    FINALIZER, SKIP_DRAIN_ANNOTATION,
};
use crate::pod::{HOLDER_CONTAINER, WORKLOAD_CONTAINER};

/// Condition types written on every run.
pub mod condition {
    /// The pod runs (both containers started).
    pub const READY: &str = "Ready";
    /// The workload container terminated (batch runs).
    pub const WORKLOAD_FINISHED: &str = "WorkloadFinished";
    /// Every declared path has a final drain outcome, none failed.
    pub const DRAINED: &str = "Drained";
    /// The run ended successfully (batch/v1 Job semantics): phase `Succeeded`, or `Stopped` by
    /// `spec.stop` or deletion with no path `Failed`. Absent otherwise
    /// (`kubectl wait --for=condition=Complete`).
    pub const COMPLETE: &str = "Complete";
    /// The run ended in failure: phase `Failed`, a run stopped by its deadline or by its pod's
    /// deletion/eviction, or a stopped run with a path `Failed`. The reason says which
    /// ([`super::failure_reason`]). Absent otherwise (`kubectl wait --for=condition=Failed`).
    /// Exactly one of Complete and Failed is True once the run has a final phase.
    pub const FAILED: &str = "Failed";
}

/// Failed reason: the batch workload exited non-zero.
pub const REASON_WORKLOAD_FAILED: &str = "WorkloadFailed";
/// Failed reason (and Ready=False reason while draining): `spec.activeDeadlineSeconds` passed.
pub const REASON_DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
/// Failed reason (and Drained=False reason): a read-back path could not be drained.
pub const REASON_CONDITION_DRAIN_FAILED: &str = "DrainFailed";
/// Failed reason: the pod vanished before teardown could drain it.
pub const REASON_POD_LOST: &str = "PodLost";
/// Failed reason (and Ready=False reason while draining): someone else deleted or evicted the pod
/// before the workload finished.
pub const REASON_POD_DELETED: &str = "PodDeleted";
/// Ready=False reason while the pod is created or starting and nothing is known to block it.
pub const REASON_POD_PENDING: &str = "PodPending";
/// Ready=True reason: both containers run.
pub const REASON_POD_RUNNING: &str = "PodRunning";
/// Ready=False reason right after the pod was created.
pub const REASON_POD_CREATED: &str = "PodCreated";
/// Ready=False reason: the pod cannot be built from the spec.
pub const REASON_INVALID_SPEC: &str = "InvalidSpec";
/// Ready=False reason once the run has a final phase (except [`REASON_IMAGE_PULL_FAILED`], which
/// Ready keeps: the pod never ran and the kubelet's words say why).
pub const REASON_RUN_ENDED: &str = "RunEnded";

/// Why a run is being torn down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The workload container exited.
    WorkloadFinished {
        /// Its exit code.
        exit_code: i32,
    },
    /// `spec.stop` was set.
    Stop,
    /// `spec.activeDeadlineSeconds` passed.
    Deadline,
    /// The run is being deleted (the finalizer holds it).
    Deleting,
    /// The pod is being deleted or evicted by someone else (or by foreground cascading deletion):
    /// drain at once, inside the holder's grace window.
    PodDeleting,
    /// An image of the pod cannot be pulled and retrying will not help (see
    /// [`image_pull_is_definitive`] and [`DecideSettings::image_pull_timeout`]): the workload
    /// never started, the run fails with reason [`REASON_IMAGE_PULL_FAILED`].
    ImagePullFailed {
        /// The kubelet's words (`container <name>: <reason>: <message>`).
        message: String,
    },
}

impl Trigger {
    /// Words for status messages and Events.
    pub fn describe(&self) -> String {
        match self {
            Trigger::WorkloadFinished { exit_code } => {
                format!("workload exited with code {exit_code}")
            }
            Trigger::Stop => "spec.stop was set".to_string(),
            Trigger::Deadline => "activeDeadlineSeconds passed".to_string(),
            Trigger::Deleting => "the run is being deleted".to_string(),
            Trigger::PodDeleting => "the pod is being deleted or evicted".to_string(),
            Trigger::ImagePullFailed { message } => {
                format!("the image could not be pulled ({message})")
            }
        }
    }
}

/// What the workload container is doing, as the pod reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkloadState {
    /// Not started (pod pending, image pulling, …).
    NotStarted,
    /// Running.
    Running,
    /// Exited.
    Terminated {
        /// Exit code.
        exit_code: i32,
    },
}

/// A reason the pod cannot make progress, worth telling the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodProblem {
    /// The scheduler cannot place the pod (may resolve itself as the cluster changes).
    Unschedulable(String),
    /// An image cannot be pulled.
    ImagePull {
        /// Retrying cannot help, whatever the time: an invalid name, `imagePullPolicy: Never`
        /// without the image, or a registry that answered "not found"
        /// ([`image_pull_is_definitive`]). Any other pull error is retried by the kubelet and
        /// only becomes fatal once [`DecideSettings::image_pull_timeout`] has passed.
        fatal: bool,
        /// The kubelet's words (`container <name>: <reason>: <message>`).
        message: String,
    },
    /// The pod cannot start for another reason: a container the kubelet cannot create
    /// ([`crate::startup::STUCK_CONTAINER_REASONS`]) or a Warning Event on the pod such as
    /// `FailedMount` ([`crate::startup::STUCK_EVENT_REASONS`]).
    Stuck {
        /// The kubelet's reason (`CreateContainerConfigError`, `FailedMount`, …): Ready's reason.
        reason: &'static str,
        /// Its words (`container <name>: <message>` for a container).
        message: String,
    },
}

impl PodProblem {
    /// Ready's reason while the problem lasts.
    pub fn reason(&self) -> &'static str {
        match self {
            PodProblem::Unschedulable(_) => REASON_UNSCHEDULABLE,
            PodProblem::ImagePull { .. } => REASON_IMAGE_PULL_FAILED,
            PodProblem::Stuck { reason, .. } => reason,
        }
    }

    /// Its words, for Ready's message, `.status.message` and the PodStuck Event.
    pub fn message(&self) -> &str {
        match self {
            PodProblem::Unschedulable(m) => m,
            PodProblem::ImagePull { message, .. } | PodProblem::Stuck { message, .. } => message,
        }
    }
}

/// Ready=False reason while the scheduler cannot place the pod.
pub const REASON_UNSCHEDULABLE: &str = "Unschedulable";

/// Event and condition reason of a run whose image cannot be pulled.
pub const REASON_IMAGE_PULL_FAILED: &str = "ImagePullFailed";

/// Operator-wide inputs to [`decide`] that come from `run` flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecideSettings {
    /// How long a retryable image-pull error (`ErrImagePull` / `ImagePullBackOff` whose message
    /// is not a definitive "not found") may last before the run is failed (`run
    /// --image-pull-timeout`, `SANDBOXRUN_IMAGE_PULL_TIMEOUT`).
    ///
    /// A waiting container state carries no timestamp, so "lasted" is measured from when the
    /// kubelet accepted the pod (`status.startTime`, which is before it pulls any image), else
    /// from the pod's `creationTimestamp`; see [`PodView::pending_since`]. A slow pull that is
    /// still progressing is never judged (it is not in an error state); a pull still failing
    /// this long after the pod started is.
    pub image_pull_timeout: Duration,
}

impl Default for DecideSettings {
    fn default() -> Self {
        DecideSettings {
            image_pull_timeout: crate::caps::DEFAULT_IMAGE_PULL_TIMEOUT,
        }
    }
}

/// Whether an image-pull error says retrying cannot help, at once.
///
/// `InvalidImageName` and `ErrImageNeverPull` never resolve themselves. `ErrImagePull` and
/// `ImagePullBackOff` are usually transient (registry down, network, rate limits, credentials
/// being rolled out), except when the registry answered that the image does not exist: the
/// kubelet's message then carries the CRI's `code = NotFound`, ends with `: not found`
/// (containerd: `failed to resolve image: <ref>: not found`), or says `manifest unknown` (the
/// distribution API's `MANIFEST_UNKNOWN`). The back-off state repeats the pull error in its
/// message (`Back-off pulling image "…": ErrImagePull: rpc error: code = NotFound …`), so both
/// states are judged alike.
pub fn image_pull_is_definitive(reason: &str, message: &str) -> bool {
    match reason {
        "InvalidImageName" | "ErrImageNeverPull" => true,
        "ErrImagePull" | "ImagePullBackOff" => {
            let m = message.trim_end();
            m.contains("code = NotFound")
                || m.ends_with(": not found")
                || m.to_ascii_lowercase().contains("manifest unknown")
        }
        _ => false,
    }
}

fn is_image_pull_reason(reason: &str) -> bool {
    matches!(
        reason,
        "InvalidImageName" | "ErrImageNeverPull" | "ErrImagePull" | "ImagePullBackOff"
    )
}

/// The facts of a pod the decision needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    /// The pod has a deletionTimestamp.
    pub deleting: bool,
    /// The holder container is running (the drain can exec into it).
    pub holder_running: bool,
    /// The workload container's state.
    pub workload: WorkloadState,
    /// When the pod started running.
    pub started_at: Option<Timestamp>,
    /// Since when the pod has been trying to start: `status.startTime` (the kubelet accepted the
    /// pod; image pulls come after), else `metadata.creationTimestamp`. The clock of
    /// [`DecideSettings::image_pull_timeout`].
    pub pending_since: Option<Timestamp>,
    /// Something blocking the pod.
    pub problem: Option<PodProblem>,
}

impl PodView {
    /// Reads the facts out of a pod.
    pub fn of(pod: &Pod) -> PodView {
        let status = pod.status.as_ref();
        let statuses = status.and_then(|s| s.container_statuses.as_ref());
        let state_of = |name: &str| -> Option<&ContainerState> {
            statuses?.iter().find(|c| c.name == name)?.state.as_ref()
        };
        let workload = match state_of(WORKLOAD_CONTAINER) {
            Some(s) if s.terminated.is_some() => WorkloadState::Terminated {
                exit_code: s.terminated.as_ref().map(|t| t.exit_code).unwrap_or(-1),
            },
            Some(s) if s.running.is_some() => WorkloadState::Running,
            _ => WorkloadState::NotStarted,
        };
        let holder_running = state_of(HOLDER_CONTAINER).is_some_and(|s| s.running.is_some());
        let mut problem = None;
        if let Some(cond) = status.and_then(|s| s.conditions.as_ref()).and_then(|c| {
            c.iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        }) {
            if cond.reason.as_deref() == Some("Unschedulable") {
                problem = Some(PodProblem::Unschedulable(
                    cond.message.clone().unwrap_or_default(),
                ));
            }
        }
        // The workload's pull problem is reported before the holder's: it is the one the user
        // can fix, and the one that keeps the workload from ever starting. The same holds for a
        // container the kubelet cannot create (a missing ConfigMap/Secret key, …).
        let mut pull_problems: Vec<(bool, PodProblem)> = Vec::new();
        let mut stuck: Vec<(bool, PodProblem)> = Vec::new();
        for cs in statuses.into_iter().flatten() {
            if let Some(waiting) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) {
                let reason = waiting.reason.as_deref().unwrap_or_default();
                if let Some(reason) =
                    crate::startup::known(reason, crate::startup::STUCK_CONTAINER_REASONS)
                {
                    let message = waiting.message.as_deref().unwrap_or_default();
                    stuck.push((
                        cs.name == WORKLOAD_CONTAINER,
                        PodProblem::Stuck {
                            reason,
                            message: format!("container {}: {message}", cs.name),
                        },
                    ));
                }
                if is_image_pull_reason(reason) {
                    let message = waiting.message.as_deref().unwrap_or_default();
                    pull_problems.push((
                        cs.name == WORKLOAD_CONTAINER,
                        PodProblem::ImagePull {
                            fatal: image_pull_is_definitive(reason, message),
                            message: format!("container {}: {reason}: {message}", cs.name),
                        },
                    ));
                }
            }
        }
        for found in [stuck, pull_problems] {
            if let Some((_, p)) = found
                .iter()
                .find(|(workload, _)| *workload)
                .or_else(|| found.first())
            {
                problem = Some(p.clone());
            }
        }
        PodView {
            deleting: pod.metadata.deletion_timestamp.is_some(),
            holder_running,
            workload,
            started_at: status.and_then(|s| s.start_time.as_ref()).map(|t| t.0),
            pending_since: status
                .and_then(|s| s.start_time.as_ref())
                .or(pod.metadata.creation_timestamp.as_ref())
                .map(|t| t.0),
            problem,
        }
    }
}

/// What an image-pull problem of the pod means at `now`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PullVerdict {
    /// No image-pull problem.
    Clear,
    /// A retryable pull error: the kubelet keeps trying; look again after `left` at the latest.
    Retrying {
        /// Time until [`DecideSettings::image_pull_timeout`] passes (None: no clock to judge
        /// by, so it never does).
        left: Option<Duration>,
    },
    /// Give up: fail the run with this message.
    Fatal(String),
}

/// Judges the pod's image-pull problem at `now` (the rule of [`DecideSettings`]).
pub fn pull_verdict(pod: &PodView, now: Timestamp, settings: &DecideSettings) -> PullVerdict {
    let Some(PodProblem::ImagePull { fatal, message }) = &pod.problem else {
        return PullVerdict::Clear;
    };
    if *fatal {
        return PullVerdict::Fatal(message.clone());
    }
    let Some(since) = pod.pending_since else {
        return PullVerdict::Retrying { left: None };
    };
    let timeout = jiff::SignedDuration::try_from(settings.image_pull_timeout)
        .unwrap_or(jiff::SignedDuration::MAX);
    let lasted = since.duration_until(now);
    if lasted >= timeout {
        PullVerdict::Fatal(format!(
            "{message} (still failing {} after the pod started; --image-pull-timeout is {})",
            words(lasted),
            words(timeout)
        ))
    } else {
        PullVerdict::Retrying {
            left: timeout
                .checked_sub(lasted)
                .and_then(|d| Duration::try_from(d).ok()),
        }
    }
}

/// A duration in short words: `5m`, `90s`, `1h2m3s`.
fn words(d: jiff::SignedDuration) -> String {
    let total = d.as_secs().max(0);
    let (h, m, s) = (total / 3600, total % 3600 / 60, total % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

/// The next step for a run.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Put the finalizer on the run before anything exists that would need draining.
    AddFinalizer,
    /// The run is gone or going and owes nothing: release the finalizer.
    ReleaseFinalizer,
    /// `sandbox.iterion.io/skip-drain` asks to release the finalizer at once (recorded).
    SkipDrain,
    /// Create the pod.
    CreatePod,
    /// Reflect the pod in status; look again after `requeue` (e.g. at the deadline).
    Track {
        /// When to look again without a watch event.
        requeue: Option<Duration>,
    },
    /// Tear down: drain every path not drained yet, then finish the run.
    Teardown(Trigger),
    /// The pod vanished before teardown: report every undrained path as lost.
    PodLost,
    /// The run is over: make sure its pod is gone (and release the finalizer when deleting).
    CleanUp,
    /// The run finished `spec.ttlSecondsAfterFinished` ago: delete it (through the finalizer).
    Expire,
}

/// Whether every declared path has a final outcome in `status`.
pub fn drain_settled(run: &SandboxRun) -> bool {
    let declared = run.spec.read_back_paths();
    let entries = run
        .status
        .as_ref()
        .map(|s| s.read_back.as_slice())
        .unwrap_or(&[]);
    declared.iter().all(|p| {
        entries
            .iter()
            .any(|e| e.path == p.path && e.phase != ReadBackPhase::Pending)
    })
}

fn phase(run: &SandboxRun) -> Option<Phase> {
    run.status.as_ref().and_then(|s| s.phase)
}

/// When the run's deadline passes, if it has one.
pub fn deadline(run: &SandboxRun) -> Option<Timestamp> {
    let secs = run.spec.active_deadline_seconds?;
    let start = run
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map(|t| t.0)
        .or_else(|| run.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
    start
        .checked_add(jiff::SignedDuration::from_secs(secs))
        .ok()
}

/// Decides the next step from the run, its pod (if any), the time and the operator's settings.
pub fn decide(
    run: &SandboxRun,
    pod: Option<&PodView>,
    now: Timestamp,
    settings: &DecideSettings,
) -> Step {
    let has_finalizer = run.finalizers().iter().any(|f| f == FINALIZER);
    let current = phase(run);
    let is_final = current.is_some_and(Phase::is_final);

    if run.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            return Step::CleanUp;
        }
        if run
            .annotations()
            .get(SKIP_DRAIN_ANNOTATION)
            .map(String::as_str)
            == Some("true")
        {
            return Step::SkipDrain;
        }
        if is_final {
            return Step::ReleaseFinalizer;
        }
        return match pod {
            Some(_) => Step::Teardown(Trigger::Deleting),
            None if current.is_none() || current == Some(Phase::Pending) && !drain_needed(run) => {
                Step::ReleaseFinalizer
            }
            None => Step::PodLost,
        };
    }

    if !has_finalizer {
        return Step::AddFinalizer;
    }
    if is_final {
        if crate::retention::ttl(run, now) == crate::retention::Ttl::Expired {
            return Step::Expire;
        }
        return Step::CleanUp;
    }
    let Some(pod) = pod else {
        return match current {
            None | Some(Phase::Pending)
                if run
                    .status
                    .as_ref()
                    .and_then(|s| s.pod_name.as_ref())
                    .is_none() =>
            {
                Step::CreatePod
            }
            _ => Step::PodLost,
        };
    };
    if current == Some(Phase::Draining) {
        // A teardown already began (e.g. the operator restarted mid-drain): finish it.
        return Step::Teardown(resume_trigger(run, pod));
    }
    if pod.deleting {
        return Step::Teardown(Trigger::PodDeleting);
    }
    if let WorkloadState::Terminated { exit_code } = pod.workload {
        return Step::Teardown(Trigger::WorkloadFinished { exit_code });
    }
    if run.spec.stop {
        return Step::Teardown(Trigger::Stop);
    }
    let deadline_left = match deadline(run) {
        Some(when) if now >= when => return Step::Teardown(Trigger::Deadline),
        Some(when) => Duration::try_from(now.duration_until(when)).ok(),
        None => None,
    };
    let pull_left = match pull_verdict(pod, now, settings) {
        PullVerdict::Fatal(message) => return Step::Teardown(Trigger::ImagePullFailed { message }),
        PullVerdict::Retrying { left } => left,
        PullVerdict::Clear => None,
    };
    // Look again at the deadline or when the image-pull timeout passes, whichever comes first.
    let requeue = match (deadline_left, pull_left) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Step::Track { requeue }
}

/// Whether anything could have been written that a drain would owe (a pod ever ran).
/// Whether a deleting run whose pod is gone still owes its read-back paths an outcome: it
/// declares paths and its pod may have run — the operator saw it start, or created it and
/// never saw what became of it (it was down while the pod ran). Only a run whose pod was never
/// created may be let go of without a word; the others are reported lost (docs/contract.md §4).
fn drain_needed(run: &SandboxRun) -> bool {
    !run.spec.read_back_paths().is_empty()
        && run
            .status
            .as_ref()
            .is_some_and(|s| s.start_time.is_some() || s.pod_name.is_some())
}

fn resume_trigger(run: &SandboxRun, pod: &PodView) -> Trigger {
    if let WorkloadState::Terminated { exit_code } = pod.workload {
        return Trigger::WorkloadFinished { exit_code };
    }
    if condition_true(run, condition::WORKLOAD_FINISHED) {
        return Trigger::WorkloadFinished {
            exit_code: run.status.as_ref().and_then(|s| s.exit_code).unwrap_or(-1),
        };
    }
    if let Some(message) = image_pull_failed_message(run) {
        return Trigger::ImagePullFailed { message };
    }
    match run.status.as_ref().and_then(ready_false_reason) {
        Some(REASON_DEADLINE_EXCEEDED) => return Trigger::Deadline,
        Some(REASON_POD_DELETED) => return Trigger::PodDeleting,
        _ => {}
    }
    if run.spec.stop {
        Trigger::Stop
    } else {
        Trigger::Deadline
    }
}

/// The kubelet's words when the run is being (or was) torn down because its image could not be
/// pulled: the message of its Ready=False condition with reason [`REASON_IMAGE_PULL_FAILED`].
fn image_pull_failed_message(run: &SandboxRun) -> Option<String> {
    image_pull_failure(run.status.as_ref()?)
}

/// Whether the run's condition `type_` is True.
pub fn condition_true(run: &SandboxRun, type_: &str) -> bool {
    run.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == "True")
    })
}

/// Sets a condition, keeping its lastTransitionTime when the status does not change.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status_text = if status { "True" } else { "False" };
    set_condition_raw(
        conditions,
        type_,
        status_text,
        reason,
        message.into(),
        generation,
        now,
    )
}

/// Sets a condition to Unknown (e.g. Drained while draining).
pub fn set_condition_unknown(
    conditions: &mut Vec<Condition>,
    type_: &str,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: Timestamp,
) {
    set_condition_raw(
        conditions,
        type_,
        "Unknown",
        reason,
        message.into(),
        generation,
        now,
    )
}

fn set_condition_raw(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) {
    let transition = conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    conditions.retain(|c| c.type_ != type_);
    conditions.push(Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time: transition,
    });
    conditions.sort_by_key(|c| condition_order(&c.type_));
}

/// Removes condition `type_` (Complete and Failed are absent rather than False, like a Job's).
pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|c| c.type_ != type_);
}

fn condition_order(t: &str) -> usize {
    [
        condition::READY,
        condition::WORKLOAD_FINISHED,
        condition::DRAINED,
        condition::COMPLETE,
        condition::FAILED,
    ]
    .iter()
    .position(|x| *x == t)
    .unwrap_or(usize::MAX)
}

/// The status of a run whose pod is being tracked (Pending or Running).
pub fn tracked_status(
    run: &SandboxRun,
    pod_name: &str,
    pod: &PodView,
    now: Timestamp,
) -> SandboxRunStatus {
    let mut status = run.status.clone().unwrap_or_default();
    let generation = run.metadata.generation;
    status.observed_generation = generation;
    status.pod_name = Some(pod_name.to_string());
    let running = pod.workload == WorkloadState::Running && pod.holder_running;
    if running {
        status.phase = Some(Phase::Running);
        if status.start_time.is_none() {
            status.start_time = Some(Time(pod.started_at.unwrap_or(now)));
        }
        status.message = Some(if run.spec.is_long_lived() {
            "long-lived sandbox running; set spec.stop to tear it down".to_string()
        } else {
            "workload running".to_string()
        });
        set_condition(
            &mut status.conditions,
            condition::READY,
            true,
            REASON_POD_RUNNING,
            "",
            generation,
            now,
        );
    } else {
        status.phase = Some(Phase::Pending);
        let (reason, message) = match &pod.problem {
            Some(p) => (p.reason(), p.message().to_string()),
            None => (REASON_POD_PENDING, "waiting for the pod to run".to_string()),
        };
        status.message = Some(message.clone());
        set_condition(
            &mut status.conditions,
            condition::READY,
            false,
            reason,
            message,
            generation,
            now,
        );
    }
    ensure_pending_entries(run, &mut status);
    status
}

/// The note of the PodStuck Event to publish when the pod's `problem` is a cause Ready (in the
/// status `before` this reconcile) did not already name: `<reason>: <message>`. None when there
/// is no problem or Ready already says exactly this, so each distinct cause is told once.
pub fn newly_stuck(before: &SandboxRunStatus, problem: Option<&PodProblem>) -> Option<String> {
    let problem = problem?;
    let told = before.conditions.iter().any(|c| {
        c.type_ == condition::READY
            && c.status == "False"
            && c.reason == problem.reason()
            && c.message == problem.message()
    });
    (!told).then(|| format!("{}: {}", problem.reason(), problem.message()))
}

/// Makes sure every declared path has a status entry (Pending until drained).
pub fn ensure_pending_entries(run: &SandboxRun, status: &mut SandboxRunStatus) {
    for p in run.spec.read_back_paths() {
        if !status.read_back.iter().any(|e| e.path == p.path) {
            status.read_back.push(ReadBackStatus {
                path: p.path.clone(),
                ..Default::default()
            });
        }
    }
    let order: Vec<&str> = run
        .spec
        .read_back_paths()
        .iter()
        .map(|p| p.path.as_str())
        .collect();
    status
        .read_back
        .retain(|e| order.contains(&e.path.as_str()));
    status
        .read_back
        .sort_by_key(|e| order.iter().position(|p| *p == e.path));
}

/// Most bytes of the workload's termination message kept in `status.workload.message`: the
/// kubelet's own bound on a termination message (4 KiB), kept again here so that a status write
/// never grows with whatever a pod reports.
pub const MAX_WORKLOAD_MESSAGE_BYTES: usize = 4096;

/// How the workload container of `pod` terminated, None while it has not. Read from its current
/// state, else from its last terminated state (the pod never restarts it: restartPolicy Never).
/// The message is cut to [`MAX_WORKLOAD_MESSAGE_BYTES`] on a character boundary.
pub fn workload_termination(pod: &Pod) -> Option<WorkloadTermination> {
    let cs = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == WORKLOAD_CONTAINER)?;
    let t = cs
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| cs.last_state.as_ref()?.terminated.as_ref())?;
    fn text(s: &Option<String>) -> Option<&str> {
        s.as_deref().filter(|s| !s.is_empty())
    }
    Some(WorkloadTermination {
        exit_code: t.exit_code,
        signal: t.signal,
        reason: text(&t.reason).map(str::to_string),
        message: text(&t.message).map(|m| cut(m, MAX_WORKLOAD_MESSAGE_BYTES)),
        started_at: t.started_at.clone(),
        finished_at: t.finished_at.clone(),
    })
}

/// The status at the start of teardown. `workload` is how the workload container terminated
/// ([`workload_termination`] of the pod, read before the pod is deleted); it is recorded in
/// `status.workload` whatever the trigger, and an earlier record is never cleared.
pub fn draining_status(
    run: &SandboxRun,
    trigger: &Trigger,
    workload: Option<WorkloadTermination>,
    now: Timestamp,
) -> SandboxRunStatus {
    let mut status = run.status.clone().unwrap_or_default();
    let generation = run.metadata.generation;
    status.observed_generation = generation;
    status.phase = Some(Phase::Draining);
    status.message = Some(format!(
        "tearing down: {}; draining read-back paths",
        trigger.describe()
    ));
    if workload.is_some() {
        status.workload = workload;
    }
    if let Trigger::WorkloadFinished { exit_code } = trigger {
        status.exit_code = Some(*exit_code);
        let reason = if *exit_code == 0 {
            "Completed"
        } else {
            "Error"
        };
        // The kubelet's reason when it says more than the exit code does (OOMKilled, …).
        let detail = status
            .workload
            .as_ref()
            .and_then(|w| w.reason.as_deref())
            .filter(|r| !matches!(*r, "Completed" | "Error"))
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        set_condition(
            &mut status.conditions,
            condition::WORKLOAD_FINISHED,
            true,
            reason,
            format!("workload exited with code {exit_code}{detail}"),
            generation,
            now,
        );
    }
    // A run torn down because its image cannot be pulled keeps Ready=False/ImagePullFailed with
    // the kubelet's words: finished_status fails the run on it, and a teardown resumed after a
    // restart finds its trigger there.
    // A deadline and a pod deleted by someone else are recorded in Ready's reason too: they fail
    // the run (finished_status reads them there), and a resumed teardown finds its trigger again.
    let (ready_reason, ready_message) = match trigger {
        Trigger::ImagePullFailed { message } => (REASON_IMAGE_PULL_FAILED, message.clone()),
        Trigger::Deadline => (REASON_DEADLINE_EXCEEDED, trigger.describe()),
        Trigger::PodDeleting => (REASON_POD_DELETED, trigger.describe()),
        _ => ("TearingDown", trigger.describe()),
    };
    set_condition(
        &mut status.conditions,
        condition::READY,
        false,
        ready_reason,
        ready_message,
        generation,
        now,
    );
    set_condition_unknown(
        &mut status.conditions,
        condition::DRAINED,
        "Draining",
        "draining read-back paths",
        generation,
        now,
    );
    ensure_pending_entries(run, &mut status);
    status
}

/// The status once every path has an outcome: the final phase and the Drained, Complete/Failed and
/// Ready conditions (see [`failure_reason`] and docs/user-guide.md "Lifecycle").
pub fn finished_status(
    run: &SandboxRun,
    status: SandboxRunStatus,
    now: Timestamp,
) -> SandboxRunStatus {
    end_status(run, status, false, now)
}

/// What the end of a run says about it, read from its status before the final conditions are
/// written: the inputs of the final phase and of [`failure_reason`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ending {
    /// The final phase.
    pub phase: Phase,
    /// The workload container terminated (WorkloadFinished=True).
    pub workload_finished: bool,
    /// Its exit code, when it did.
    pub exit_code: Option<i32>,
    /// The workload never started because an image could not be pulled.
    pub image_pull_failed: bool,
    /// The pod vanished before teardown drained it ([`pod_lost_status`]).
    pub pod_vanished: bool,
    /// The teardown was triggered by `spec.activeDeadlineSeconds`.
    pub deadline: bool,
    /// The teardown was triggered by someone else deleting or evicting the pod (the run itself
    /// was not being deleted).
    pub pod_deleted: bool,
    /// Some path failed.
    pub any_failed: bool,
}

/// The Failed condition's reason for an ending, None when the run ended successfully (then
/// Complete=True). The first cause that applies, in this order:
///
/// - phase `Succeeded` → None (a failed optional path shows only in Drained=False);
/// - phase `Failed`: [`REASON_IMAGE_PULL_FAILED`], [`REASON_WORKLOAD_FAILED`] (non-zero exit),
///   [`REASON_POD_LOST`] (the pod vanished before teardown), else [`REASON_CONDITION_DRAIN_FAILED`] (a
///   `required` path failed);
/// - phase `Stopped`: [`REASON_DEADLINE_EXCEEDED`], [`REASON_POD_DELETED`], then
///   [`REASON_CONDITION_DRAIN_FAILED`] when any path failed, else None (`spec.stop` or deletion, drained).
pub fn failure_reason(e: &Ending) -> Option<&'static str> {
    match e.phase {
        Phase::Succeeded => None,
        Phase::Stopped => {
            if e.deadline {
                Some(REASON_DEADLINE_EXCEEDED)
            } else if e.pod_deleted {
                Some(REASON_POD_DELETED)
            } else if e.any_failed {
                Some(REASON_CONDITION_DRAIN_FAILED)
            } else {
                None
            }
        }
        // Failed (and, defensively, any phase that is not final: never a success).
        _ => Some(if e.image_pull_failed {
            REASON_IMAGE_PULL_FAILED
        } else if e.workload_finished && e.exit_code != Some(0) {
            REASON_WORKLOAD_FAILED
        } else if e.pod_vanished {
            REASON_POD_LOST
        } else {
            REASON_CONDITION_DRAIN_FAILED
        }),
    }
}

/// The reason of Ready when it is False.
fn ready_false_reason(status: &SandboxRunStatus) -> Option<&str> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::READY && c.status == "False")
        .map(|c| c.reason.as_str())
}

/// [`finished_status`]; `pod_vanished` when the pod was gone before teardown drained it
/// ([`pod_lost_status`]).
fn end_status(
    run: &SandboxRun,
    mut status: SandboxRunStatus,
    pod_vanished: bool,
    now: Timestamp,
) -> SandboxRunStatus {
    let generation = run.metadata.generation;
    let failed: Vec<&ReadBackStatus> = status
        .read_back
        .iter()
        .filter(|e| e.phase == ReadBackPhase::Failed)
        .collect();
    let required_failed = run
        .spec
        .read_back_paths()
        .iter()
        .filter(|p| p.required)
        .any(|p| failed.iter().any(|e| e.path == p.path));
    let any_failed = !failed.is_empty();
    if failed.is_empty() {
        let capped = status
            .read_back
            .iter()
            .filter(|e| e.phase == ReadBackPhase::Capped)
            .count();
        let msg = if capped > 0 {
            format!(
                "every path drained; {capped} capped (dropped members are listed in the manifest)"
            )
        } else {
            "every read-back path drained".to_string()
        };
        set_condition(
            &mut status.conditions,
            condition::DRAINED,
            true,
            "Drained",
            msg,
            generation,
            now,
        );
    } else {
        let which: Vec<&str> = failed.iter().map(|e| e.path.as_str()).collect();
        set_condition(
            &mut status.conditions,
            condition::DRAINED,
            false,
            REASON_CONDITION_DRAIN_FAILED,
            format!(
                "drain failed for {}; see the sandbox_runfiles_drain_failed Events",
                which.join(", ")
            ),
            generation,
            now,
        );
    }
    let finished = condition_true_in(&status, condition::WORKLOAD_FINISHED);
    // The workload never started because an image could not be pulled (Ready=False with reason
    // ImagePullFailed, kept by draining_status): the run failed, and the kubelet's words say why.
    let pull_failed = !finished && status.start_time.is_none() && status.exit_code.is_none();
    let pull_failed = pull_failed.then(|| image_pull_failure(&status)).flatten();
    // How teardown began, recorded in Ready's reason by draining_status (read before Ready says
    // the run ended below).
    let ready_reason = ready_false_reason(&status);
    let deadline = !finished && ready_reason == Some(REASON_DEADLINE_EXCEEDED);
    let pod_deleted = !finished
        && ready_reason == Some(REASON_POD_DELETED)
        && run.metadata.deletion_timestamp.is_none();
    let pod_lost = pod_vanished && !finished;
    let phase = if finished {
        if status.exit_code == Some(0) && !required_failed {
            Phase::Succeeded
        } else {
            Phase::Failed
        }
    } else if required_failed || pull_failed.is_some() || pod_lost {
        Phase::Failed
    } else {
        Phase::Stopped
    };
    let why = match (phase, required_failed) {
        (Phase::Succeeded, _) => {
            "workload succeeded and its read-back paths are stored".to_string()
        }
        _ if pull_failed.is_some() => format!(
            "the workload never started: its image could not be pulled: {}",
            pull_failed.as_deref().unwrap_or_default()
        ),
        _ if pod_lost => POD_GONE.to_string(),
        (Phase::Failed, false) if finished => {
            format!(
                "workload failed with exit code {}",
                status.exit_code.unwrap_or(-1)
            )
        }
        (_, true) => "a required read-back path could not be drained".to_string(),
        (Phase::Failed, false) => status
            .message
            .clone()
            .unwrap_or_else(|| "run failed".to_string()),
        _ => {
            let cause = if deadline {
                "run stopped: activeDeadlineSeconds passed"
            } else if pod_deleted {
                "run stopped: the pod was deleted or evicted"
            } else {
                "run stopped"
            };
            let drains = if any_failed {
                "a read-back path could not be drained (see the Drained condition)"
            } else {
                "read-back paths drained"
            };
            format!("{cause}; {drains}")
        }
    };
    let ending = Ending {
        phase,
        workload_finished: finished,
        exit_code: status.exit_code,
        image_pull_failed: pull_failed.is_some(),
        pod_vanished,
        deadline,
        pod_deleted,
        any_failed,
    };
    status.phase = Some(phase);
    status.message = Some(why.clone());
    status.completion_time = Some(Time(now));
    status.observed_generation = generation;
    match failure_reason(&ending) {
        None => {
            set_condition(
                &mut status.conditions,
                condition::COMPLETE,
                true,
                crate::events::phase_reason(phase),
                why,
                generation,
                now,
            );
            remove_condition(&mut status.conditions, condition::FAILED);
        }
        Some(reason) => {
            set_condition(
                &mut status.conditions,
                condition::FAILED,
                true,
                reason,
                why,
                generation,
                now,
            );
            remove_condition(&mut status.conditions, condition::COMPLETE);
        }
    }
    // Ready says the run ended, except when the pod never ran because of its image: Ready keeps
    // ImagePullFailed and the kubelet's words.
    if pull_failed.is_none() {
        set_condition(
            &mut status.conditions,
            condition::READY,
            false,
            REASON_RUN_ENDED,
            format!("the run ended ({phase:?}); its pod is deleted"),
            generation,
            now,
        );
    } else if let Some(ready) = status
        .conditions
        .iter_mut()
        .find(|c| c.type_ == condition::READY)
    {
        ready.observed_generation = generation;
    }
    status
}

fn condition_true_in(status: &SandboxRunStatus, type_: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// The kubelet's words when Ready=False says the image could not be pulled.
fn image_pull_failure(status: &SandboxRunStatus) -> Option<String> {
    status
        .conditions
        .iter()
        .find(|c| {
            c.type_ == condition::READY
                && c.status == "False"
                && c.reason == REASON_IMAGE_PULL_FAILED
        })
        .map(|c| c.message.clone())
}

/// The status when the pod vanished before teardown: every undrained path is a failure, never an
/// empty set (ADR-143 §4), and the run failed (Failed=True, reason [`REASON_POD_LOST`]) unless
/// its workload had already finished and every required path had drained.
///
/// `committed` holds the status entries of paths whose manifest the store already has (an
/// operator that committed a path and died before recording it): such a path was drained, and
/// keeps that outcome instead of being marked Failed (docs/contract.md §4).
pub fn pod_lost_status(
    run: &SandboxRun,
    committed: &[ReadBackStatus],
    now: Timestamp,
) -> SandboxRunStatus {
    let mut status = run.status.clone().unwrap_or_default();
    ensure_pending_entries(run, &mut status);
    for e in status
        .read_back
        .iter_mut()
        .filter(|e| e.phase == ReadBackPhase::Pending)
    {
        match committed.iter().find(|c| c.path == e.path) {
            Some(c) => *e = c.clone(),
            None => {
                e.phase = ReadBackPhase::Failed;
                e.message = Some(POD_GONE.to_string());
            }
        }
    }
    let generation = run.metadata.generation;
    set_condition(
        &mut status.conditions,
        condition::READY,
        false,
        "PodGone",
        POD_GONE,
        generation,
        now,
    );
    status.message = Some(POD_GONE.to_string());
    end_status(run, status, true, now)
}

/// The Event that opens a teardown: (Warning?, reason, note). An image that cannot be pulled is
/// a Warning with reason [`REASON_IMAGE_PULL_FAILED`] and the kubelet's words (the run fails on
/// it, possibly without any Track Event having said so); every other trigger is a Normal
/// `TearingDown`.
pub fn teardown_event(trigger: &Trigger) -> (bool, &'static str, String) {
    match trigger {
        Trigger::ImagePullFailed { message } => (
            true,
            REASON_IMAGE_PULL_FAILED,
            format!("{message}; the workload never started, the run fails without draining"),
        ),
        _ => (
            false,
            "TearingDown",
            format!("{}; draining", trigger.describe()),
        ),
    }
}

/// The status entry of a declared path whose workload never started: it wrote nothing, so
/// nothing is drained (`Empty`, no exec, no object), and the message says why.
pub fn never_started_entry(path: &str, trigger: &Trigger) -> ReadBackStatus {
    let message = match trigger {
        Trigger::ImagePullFailed { .. } => NEVER_STARTED_IMAGE_PULL,
        _ => "the workload never started, so it wrote nothing",
    };
    ReadBackStatus {
        path: path.to_string(),
        phase: ReadBackPhase::Empty,
        message: Some(message.to_string()),
        ..Default::default()
    }
}

/// The message of a path whose workload never started because its image could not be pulled.
pub const NEVER_STARTED_IMAGE_PULL: &str =
    "the workload never started because its image could not be pulled, so it wrote nothing; nothing was drained";

/// Event reason of a failed drain (ADR-143 §4, see docs/contract.md); `kubectl describe sbr`
/// shows it.
pub const REASON_DRAIN_FAILED: &str = "sandbox_runfiles_drain_failed";
/// Event reason of a drain that hit its cap.
pub const REASON_CAPPED: &str = "sandbox_runfiles_readback_capped";
/// Event reason of a teardown whose every path drained (Drained or Empty).
pub const REASON_DRAINED: &str = "Drained";

/// Longest Event note we write: the Events API refuses a note over 1 KiB; this leaves room.
pub const EVENT_NOTE_LIMIT: usize = 1000;
/// Longest description of one path in a drain summary, so that one long failure message cannot
/// hide every other path.
const SUMMARY_PART_LIMIT: usize = 300;
/// Room kept for the "N more path(s) elided" tail while paths are added.
const SUMMARY_ELISION_RESERVE: usize = 64;

/// One Event that tells the outcome of every path of a teardown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainSummary {
    /// Warning when a path failed or was capped, else Normal.
    pub warning: bool,
    /// [`REASON_DRAIN_FAILED`] when any path failed (ADR-143 requires that reason for a failed
    /// drain), else [`REASON_CAPPED`] when any path was capped, else [`REASON_DRAINED`].
    pub reason: &'static str,
    /// Every path's phase, members, bytes, dropped members and message, most severe first;
    /// at most [`EVENT_NOTE_LIMIT`] bytes, saying how many paths did not fit.
    pub note: String,
}

/// Summarizes the outcome of every path in ONE Event.
///
/// kube-runtime's `Recorder` folds Events with the same type, reason, action and object into one
/// series that keeps the FIRST note, so one Event per path showed a single path in `kubectl
/// describe` (issue #17). Returns None when the run declares no path.
pub fn drain_summary(entries: &[ReadBackStatus]) -> Option<DrainSummary> {
    if entries.is_empty() {
        return None;
    }
    let severity = |p: ReadBackPhase| match p {
        ReadBackPhase::Failed => 0,
        ReadBackPhase::Capped => 1,
        ReadBackPhase::Pending => 2,
        ReadBackPhase::Drained => 3,
        ReadBackPhase::Empty => 4,
    };
    let any = |p: ReadBackPhase| entries.iter().any(|e| e.phase == p);
    let (warning, reason) = if any(ReadBackPhase::Failed) {
        (true, REASON_DRAIN_FAILED)
    } else if any(ReadBackPhase::Capped) {
        (true, REASON_CAPPED)
    } else {
        (false, REASON_DRAINED)
    };
    let mut ordered: Vec<&ReadBackStatus> = entries.iter().collect();
    ordered.sort_by_key(|e| severity(e.phase));

    let mut counts: Vec<String> = Vec::new();
    for phase in [
        ReadBackPhase::Failed,
        ReadBackPhase::Capped,
        ReadBackPhase::Pending,
        ReadBackPhase::Drained,
        ReadBackPhase::Empty,
    ] {
        let n = entries.iter().filter(|e| e.phase == phase).count();
        if n > 0 {
            counts.push(format!("{n} {phase:?}"));
        }
    }
    let mut note = format!("{} path(s): {}. ", entries.len(), counts.join(", "));
    let parts: Vec<String> = ordered
        .iter()
        .map(|e| cut(&describe_entry(e), SUMMARY_PART_LIMIT))
        .collect();
    let mut shown = 0;
    for (i, part) in parts.iter().enumerate() {
        let sep = if shown == 0 { "" } else { "; " };
        let reserve = if i + 1 < parts.len() {
            SUMMARY_ELISION_RESERVE
        } else {
            0
        };
        if note.len() + sep.len() + part.len() + reserve > EVENT_NOTE_LIMIT {
            break;
        }
        note.push_str(sep);
        note.push_str(part);
        shown += 1;
    }
    if shown < parts.len() {
        note.push_str(&format!(
            "{}{} more path(s) elided, see status.readBack",
            if shown == 0 { "" } else { "; " },
            parts.len() - shown
        ));
    }
    Some(DrainSummary {
        warning,
        reason,
        note: cut(&note, EVENT_NOTE_LIMIT),
    })
}

/// One path in words: `/out: Capped, 2 member(s), 716800 byte(s), 1 member(s) dropped: …`.
fn describe_entry(e: &ReadBackStatus) -> String {
    let mut out = format!(
        "{}: {:?}, {} member(s), {} byte(s)",
        e.path, e.phase, e.members, e.bytes
    );
    if e.dropped_members > 0 {
        out.push_str(&format!(", {} member(s) dropped", e.dropped_members));
    }
    if e.rejected_members > 0 {
        out.push_str(&format!(", {} member(s) rejected", e.rejected_members));
    }
    if e.phase == ReadBackPhase::Failed {
        out.push_str(&format!(", after {} attempt(s)", e.attempts));
    }
    match e.message.as_deref() {
        Some(m) if !m.is_empty() => {
            out.push_str(": ");
            out.push_str(m);
        }
        _ if e.phase == ReadBackPhase::Failed => out.push_str(": no detail"),
        _ => {}
    }
    out
}

/// `text` cut to at most `limit` bytes on a character boundary, ending in `…` when cut.
fn cut(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let ellipsis = "…";
    let mut end = limit.saturating_sub(ellipsis.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{ellipsis}", &text[..end])
}

/// Why the drain of a path failed when the pod was gone before teardown.
pub const POD_GONE: &str =
    "the pod was gone before teardown (deleted or evicted); its emptyDirs went with it and nothing could be drained";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ReadBack, ReadBackPath, SandboxRunSpec};
    use k8s_openapi::api::core::v1::{
        ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
        PodStatus,
    };

    fn now() -> Timestamp {
        "2026-11-30T12:00:00Z".parse().unwrap()
    }

    fn run_with(paths: &[(&str, bool)]) -> SandboxRun {
        let mut r = SandboxRun::new(
            "demo",
            SandboxRunSpec {
                image: Some("img".into()),
                command: Some(vec!["true".into()]),
                user: Some("1000".into()),
                read_back: Some(ReadBack {
                    paths: paths
                        .iter()
                        .map(|(p, req)| ReadBackPath {
                            path: p.to_string(),
                            required: *req,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        r.metadata.uid = Some("u1".into());
        r.metadata.namespace = Some("ns".into());
        r.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
        r.metadata.creation_timestamp = Some(Time(now()));
        r
    }

    fn running() -> PodView {
        PodView {
            deleting: false,
            holder_running: true,
            workload: WorkloadState::Running,
            started_at: Some(now()),
            pending_since: Some(now()),
            problem: None,
        }
    }

    fn settings() -> DecideSettings {
        DecideSettings::default()
    }

    fn with_phase(mut r: SandboxRun, p: Phase) -> SandboxRun {
        let mut s = r.status.take().unwrap_or_default();
        s.phase = Some(p);
        s.pod_name = Some("demo-sbr".into());
        s.start_time = Some(Time(now()));
        r.status = Some(s);
        r
    }

    #[test]
    fn new_run_gets_the_finalizer_first_then_a_pod() {
        let mut r = run_with(&[("/out", false)]);
        r.metadata.finalizers = None;
        assert_eq!(decide(&r, None, now(), &settings()), Step::AddFinalizer);
        let r = run_with(&[("/out", false)]);
        assert_eq!(decide(&r, None, now(), &settings()), Step::CreatePod);
    }

    #[test]
    fn a_finished_run_expires_after_its_ttl_and_its_deletion_goes_through_the_finalizer() {
        let mut r = with_phase(run_with(&[("/out", false)]), Phase::Succeeded);
        r.spec.ttl_seconds_after_finished = Some(10);
        if let Some(s) = r.status.as_mut() {
            s.completion_time = Some(Time(now()));
            set_condition(
                &mut s.conditions,
                condition::COMPLETE,
                true,
                "Succeeded",
                "",
                Some(1),
                now(),
            );
        }
        let at = |secs: i64| {
            now()
                .checked_add(jiff::SignedDuration::from_secs(secs))
                .unwrap()
        };
        assert_eq!(decide(&r, None, at(9), &settings()), Step::CleanUp);
        assert_eq!(decide(&r, None, at(10), &settings()), Step::Expire);
        // Once deleted, the normal finalizer path runs (never a second delete).
        r.metadata.deletion_timestamp = Some(Time(at(10)));
        assert_eq!(
            decide(&r, None, at(11), &settings()),
            Step::ReleaseFinalizer
        );
        // Without a TTL a finished run stays.
        r.metadata.deletion_timestamp = None;
        r.spec.ttl_seconds_after_finished = None;
        assert_eq!(decide(&r, None, at(1_000_000), &settings()), Step::CleanUp);
    }

    #[test]
    fn workload_exit_starts_teardown_with_its_code() {
        let r = with_phase(run_with(&[("/out", false)]), Phase::Running);
        let mut pod = running();
        pod.workload = WorkloadState::Terminated { exit_code: 3 };
        assert_eq!(
            decide(&r, Some(&pod), now(), &settings()),
            Step::Teardown(Trigger::WorkloadFinished { exit_code: 3 })
        );
    }

    #[test]
    fn stop_deadline_and_deletion_start_teardown() {
        let mut r = with_phase(run_with(&[("/out", false)]), Phase::Running);
        r.spec.stop = true;
        assert_eq!(
            decide(&r, Some(&running()), now(), &settings()),
            Step::Teardown(Trigger::Stop)
        );

        let mut r = with_phase(run_with(&[("/out", false)]), Phase::Running);
        r.spec.active_deadline_seconds = Some(60);
        assert_eq!(
            decide(&r, Some(&running()), now(), &settings()),
            Step::Track {
                requeue: Some(Duration::from_secs(60))
            }
        );
        let later = now()
            .checked_add(jiff::SignedDuration::from_secs(61))
            .unwrap();
        assert_eq!(
            decide(&r, Some(&running()), later, &settings()),
            Step::Teardown(Trigger::Deadline)
        );

        let mut r = with_phase(run_with(&[("/out", false)]), Phase::Running);
        r.metadata.deletion_timestamp = Some(Time(now()));
        assert_eq!(
            decide(&r, Some(&running()), now(), &settings()),
            Step::Teardown(Trigger::Deleting)
        );
    }

    #[test]
    fn pod_deleted_by_someone_else_is_drained_in_its_grace_window() {
        let r = with_phase(run_with(&[("/out", false)]), Phase::Running);
        let mut pod = running();
        pod.deleting = true;
        assert_eq!(
            decide(&r, Some(&pod), now(), &settings()),
            Step::Teardown(Trigger::PodDeleting)
        );
    }

    #[test]
    fn pod_gone_before_teardown_is_a_loss_never_an_empty_set() {
        let r = with_phase(
            run_with(&[("/out", true), ("/logs", false)]),
            Phase::Running,
        );
        assert_eq!(decide(&r, None, now(), &settings()), Step::PodLost);
        let s = pod_lost_status(&r, &[], now());
        assert_eq!(s.phase, Some(Phase::Failed));
        assert!(s
            .read_back
            .iter()
            .all(|e| e.phase == ReadBackPhase::Failed && e.message.is_some()));
        let drained = s
            .conditions
            .iter()
            .find(|c| c.type_ == condition::DRAINED)
            .unwrap();
        assert_eq!(
            (drained.status.as_str(), drained.reason.as_str()),
            ("False", "DrainFailed")
        );
    }

    #[test]
    fn restart_mid_drain_resumes_teardown() {
        let mut r = with_phase(run_with(&[("/out", false)]), Phase::Draining);
        r.spec.stop = true;
        assert_eq!(
            decide(&r, Some(&running()), now(), &settings()),
            Step::Teardown(Trigger::Stop)
        );
    }

    #[test]
    fn deletion_of_a_finished_run_releases_and_skip_drain_is_honoured() {
        let mut r = with_phase(run_with(&[("/out", false)]), Phase::Succeeded);
        r.metadata.deletion_timestamp = Some(Time(now()));
        assert_eq!(decide(&r, None, now(), &settings()), Step::ReleaseFinalizer);
        let mut r = with_phase(run_with(&[("/out", false)]), Phase::Running);
        r.metadata.deletion_timestamp = Some(Time(now()));
        r.metadata.annotations =
            Some([(SKIP_DRAIN_ANNOTATION.to_string(), "true".to_string())].into());
        assert_eq!(
            decide(&r, Some(&running()), now(), &settings()),
            Step::SkipDrain
        );
    }

    /// A pod whose workload container is in `state` (and `last` as its last state).
    fn pod_with_workload(
        state: k8s_openapi::api::core::v1::ContainerState,
        last: Option<k8s_openapi::api::core::v1::ContainerState>,
    ) -> Pod {
        Pod {
            status: Some(PodStatus {
                container_statuses: Some(vec![
                    ContainerStatus {
                        name: HOLDER_CONTAINER.into(),
                        state: Some(ContainerState {
                            running: Some(ContainerStateRunning::default()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    ContainerStatus {
                        name: WORKLOAD_CONTAINER.into(),
                        state: Some(state),
                        last_state: last,
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn oom_killed(message: &str) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 137,
                signal: Some(9),
                reason: Some("OOMKilled".into()),
                message: Some(message.into()),
                started_at: Some(Time("2026-11-30T11:59:00Z".parse().unwrap())),
                finished_at: Some(Time(now())),
                container_id: Some("containerd://abc".into()),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn workload_termination_is_copied_from_the_pod_and_bounded() {
        let w =
            workload_termination(&pod_with_workload(oom_killed("out of memory\n"), None)).unwrap();
        assert_eq!(
            w,
            WorkloadTermination {
                exit_code: 137,
                signal: Some(9),
                reason: Some("OOMKilled".into()),
                message: Some("out of memory\n".into()),
                started_at: Some(Time("2026-11-30T11:59:00Z".parse().unwrap())),
                finished_at: Some(Time(now())),
            }
        );

        // A long message (the log tail, multi-byte characters) is cut on a char boundary.
        let long = "é".repeat(3000); // 6000 bytes
        let w = workload_termination(&pod_with_workload(oom_killed(&long), None)).unwrap();
        let m = w.message.unwrap();
        assert!(m.len() <= MAX_WORKLOAD_MESSAGE_BYTES, "{} bytes", m.len());
        assert!(m.len() > MAX_WORKLOAD_MESSAGE_BYTES - 8, "cut too short");
        assert!(m.ends_with('…') && m.starts_with("éé"));
        // Empty strings are absent, not "".
        let w = workload_termination(&pod_with_workload(oom_killed(""), None)).unwrap();
        assert_eq!(w.message, None);

        // Still running: nothing to record. Waiting after a terminated run: the last state.
        let running = ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        };
        assert_eq!(
            workload_termination(&pod_with_workload(running, None)),
            None
        );
        let waiting = ContainerState {
            waiting: Some(ContainerStateWaiting::default()),
            ..Default::default()
        };
        let w = workload_termination(&pod_with_workload(waiting, Some(oom_killed("x"))));
        assert_eq!(w.map(|w| w.exit_code), Some(137));
        assert_eq!(workload_termination(&Pod::default()), None);
    }

    #[test]
    fn workload_evidence_survives_every_later_status_write() {
        let r = run_with(&[("/out", true)]);
        let w = workload_termination(&pod_with_workload(oom_killed("killed"), None));
        let t = Trigger::WorkloadFinished { exit_code: 137 };
        let mut s = draining_status(&r, &t, w.clone(), now());
        assert_eq!(s.workload, w);
        let finished = s
            .conditions
            .iter()
            .find(|c| c.type_ == condition::WORKLOAD_FINISHED)
            .unwrap();
        assert_eq!(
            finished.message,
            "workload exited with code 137 (OOMKilled)"
        );

        // The drain outcome and the final status keep it.
        s.read_back[0].phase = ReadBackPhase::Drained;
        let done = finished_status(&r, s.clone(), now());
        assert_eq!(done.workload, w);
        let mut r = r;
        r.status = Some(done);
        // Writes built from the run's status afterwards keep it too.
        assert_eq!(pod_lost_status(&r, &[], now()).workload, w);
        assert_eq!(
            tracked_status(&r, "demo-sbr", &running(), now()).workload,
            w
        );
        // A teardown that sees no terminated workload never clears an earlier record.
        assert_eq!(
            draining_status(&r, &Trigger::Deleting, None, now()).workload,
            w
        );

        // The wire shape: camelCase under status.workload.
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["workload"]["exitCode"], 137);
        assert_eq!(json["workload"]["signal"], 9);
        assert_eq!(json["workload"]["reason"], "OOMKilled");
        assert_eq!(json["workload"]["message"], "killed");
        assert_eq!(json["workload"]["startedAt"], "2026-11-30T11:59:00Z");
        assert_eq!(json["workload"]["finishedAt"], "2026-11-30T12:00:00Z");
    }

    #[test]
    fn final_phase_follows_exit_code_and_required_paths() {
        let r = run_with(&[("/out", true), ("/logs", false)]);
        let t = Trigger::WorkloadFinished { exit_code: 0 };
        let mut s = draining_status(&r, &t, None, now());
        s.read_back[0].phase = ReadBackPhase::Drained;
        s.read_back[1].phase = ReadBackPhase::Failed;
        let done = finished_status(&r, s.clone(), now());
        assert_eq!(
            done.phase,
            Some(Phase::Succeeded),
            "optional path failure keeps success"
        );
        let drained = done
            .conditions
            .iter()
            .find(|c| c.type_ == condition::DRAINED)
            .unwrap();
        assert_eq!(drained.status, "False");
        s.read_back[0].phase = ReadBackPhase::Failed;
        assert_eq!(finished_status(&r, s, now()).phase, Some(Phase::Failed));

        let t = Trigger::WorkloadFinished { exit_code: 1 };
        let mut s = draining_status(&r, &t, None, now());
        s.read_back
            .iter_mut()
            .for_each(|e| e.phase = ReadBackPhase::Empty);
        assert_eq!(finished_status(&r, s, now()).phase, Some(Phase::Failed));

        let mut s = draining_status(&r, &Trigger::Stop, None, now());
        s.start_time = Some(Time(now()));
        s.read_back
            .iter_mut()
            .for_each(|e| e.phase = ReadBackPhase::Capped);
        let done = finished_status(&r, s, now());
        assert_eq!(done.phase, Some(Phase::Stopped));
        assert!(done
            .conditions
            .iter()
            .any(|c| c.type_ == condition::COMPLETE && c.status == "True"));
    }

    #[test]
    fn pod_view_reads_workload_and_holder_separately() {
        let cs = |name: &str, terminated: Option<i32>| ContainerStatus {
            name: name.into(),
            state: Some(match terminated {
                Some(code) => ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: code,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                None => ContainerState {
                    running: Some(ContainerStateRunning::default()),
                    ..Default::default()
                },
            }),
            ..Default::default()
        };
        let pod = Pod {
            status: Some(PodStatus {
                container_statuses: Some(vec![cs("workload", Some(7)), cs("holder", None)]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = PodView::of(&pod);
        assert_eq!(v.workload, WorkloadState::Terminated { exit_code: 7 });
        assert!(v.holder_running);
    }

    #[test]
    fn a_container_the_kubelet_cannot_create_is_a_stuck_pod_and_told_once() {
        let mut pod = pulling_pod("CreateContainerConfigError", "secret \"creds\" not found");
        let v = PodView::of(&pod);
        let problem = PodProblem::Stuck {
            reason: "CreateContainerConfigError",
            message: "container workload: secret \"creds\" not found".into(),
        };
        assert_eq!(v.problem, Some(problem.clone()));
        let r = pending(run_with(&[("/out", false)]));
        let s = tracked_status(&r, "demo-sbr", &v, now());
        let ready = s
            .conditions
            .iter()
            .find(|c| c.type_ == condition::READY)
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "CreateContainerConfigError")
        );
        assert_eq!(ready.message, problem.message());
        assert_eq!(s.message.as_deref(), Some(problem.message()));
        // Told once: the Event is due before Ready says it, not after.
        let before = r.status.clone().unwrap_or_default();
        assert_eq!(
            newly_stuck(&before, v.problem.as_ref()).as_deref(),
            Some("CreateContainerConfigError: container workload: secret \"creds\" not found")
        );
        assert_eq!(newly_stuck(&s, v.problem.as_ref()), None);
        assert_eq!(newly_stuck(&s, None), None);
        // A different cause is told again.
        let unschedulable = PodProblem::Unschedulable("0/2 nodes are available".into());
        assert_eq!(
            newly_stuck(&s, Some(&unschedulable)).as_deref(),
            Some("Unschedulable: 0/2 nodes are available")
        );
        // An image-pull problem of the same pod is still reported as such (it wins).
        if let Some(st) = pod.status.as_mut() {
            if let Some(cs) = st.container_statuses.as_mut() {
                cs.push(ContainerStatus {
                    name: "extra".into(),
                    state: Some(ContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some("ImagePullBackOff".into()),
                            message: Some("back-off".into()),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
            }
        }
        assert_eq!(
            PodView::of(&pod).problem.map(|p| p.reason()),
            Some(REASON_IMAGE_PULL_FAILED)
        );
    }

    #[test]
    fn condition_transition_time_is_kept_while_status_is_unchanged() {
        let mut c = Vec::new();
        set_condition(&mut c, condition::READY, true, "A", "", None, now());
        let later = now()
            .checked_add(jiff::SignedDuration::from_secs(5))
            .unwrap();
        set_condition(&mut c, condition::READY, true, "B", "", None, later);
        assert_eq!(c[0].last_transition_time.0, now());
        set_condition(&mut c, condition::READY, false, "C", "", None, later);
        assert_eq!(c[0].last_transition_time.0, later);
        assert_eq!(c.len(), 1);
    }

    const NOT_FOUND: &str = "rpc error: code = NotFound desc = failed to pull and unpack image \"localhost:15000/nope:1\": failed to resolve image: localhost:15000/nope:1: not found";
    const REFUSED: &str = "rpc error: code = Unknown desc = failed to pull and unpack image \"localhost:15000/img:1\": failed to resolve reference \"localhost:15000/img:1\": failed to do request: Head \"http://localhost:15000/v2/img/manifests/1\": dial tcp 127.0.0.1:15000: connect: connection refused";

    fn at(secs: i64) -> Timestamp {
        now()
            .checked_add(jiff::SignedDuration::from_secs(secs))
            .unwrap()
    }

    /// A pod whose workload waits with `reason`/`message`, its holder running, accepted by the
    /// kubelet at `now()`.
    fn pulling_pod(reason: &str, message: &str) -> Pod {
        let waiting = ContainerStatus {
            name: "workload".into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.into()),
                    message: Some(message.into()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let holder = ContainerStatus {
            name: "holder".into(),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }),
            ..Default::default()
        };
        Pod {
            status: Some(PodStatus {
                start_time: Some(Time(now())),
                container_statuses: Some(vec![holder, waiting]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pending(r: SandboxRun) -> SandboxRun {
        let mut r = with_phase(r, Phase::Pending);
        if let Some(s) = r.status.as_mut() {
            s.start_time = None;
        }
        r
    }

    #[test]
    fn a_registry_that_says_not_found_fails_the_pull_at_once() {
        assert!(image_pull_is_definitive("ErrImagePull", NOT_FOUND));
        let backoff =
            format!("Back-off pulling image \"localhost:15000/nope:1\": ErrImagePull: {NOT_FOUND}");
        assert!(image_pull_is_definitive("ImagePullBackOff", &backoff));
        assert!(image_pull_is_definitive(
            "ErrImagePull",
            "failed to resolve image: localhost:15000/nope:1: not found"
        ));
        assert!(image_pull_is_definitive(
            "ErrImagePull",
            "reading manifest 1 in localhost:15000/nope: manifest unknown"
        ));
        assert!(image_pull_is_definitive("InvalidImageName", ""));
        assert!(image_pull_is_definitive("ErrImageNeverPull", ""));
        assert!(!image_pull_is_definitive("ErrImagePull", REFUSED));
        assert!(!image_pull_is_definitive("ImagePullBackOff", REFUSED));
        assert!(!image_pull_is_definitive("ContainerCreating", NOT_FOUND));

        // Seen on the pod: the run is torn down at once, with the kubelet's words.
        let r = pending(run_with(&[("/out", false)]));
        for (reason, message) in [
            ("ErrImagePull", NOT_FOUND),
            ("ImagePullBackOff", backoff.as_str()),
        ] {
            let view = PodView::of(&pulling_pod(reason, message));
            assert!(
                matches!(
                    view.problem,
                    Some(PodProblem::ImagePull { fatal: true, .. })
                ),
                "{view:?}"
            );
            match decide(&r, Some(&view), now(), &settings()) {
                Step::Teardown(Trigger::ImagePullFailed { message }) => {
                    assert!(message.contains("container workload"), "{message}");
                    assert!(message.contains(reason), "{message}");
                    assert!(message.contains("code = NotFound"), "{message}");
                }
                other => panic!("{reason}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_transient_pull_error_fails_the_run_only_after_the_image_pull_timeout() {
        let r = pending(run_with(&[("/out", false)]));
        let view = PodView::of(&pulling_pod("ImagePullBackOff", REFUSED));
        assert_eq!(view.pending_since, Some(now()));
        let s = DecideSettings {
            image_pull_timeout: Duration::from_secs(300),
        };
        // Before the timeout: tracked, and looked at again when it passes.
        assert_eq!(
            decide(&r, Some(&view), now(), &s),
            Step::Track {
                requeue: Some(Duration::from_secs(300))
            }
        );
        assert_eq!(
            decide(&r, Some(&view), at(299), &s),
            Step::Track {
                requeue: Some(Duration::from_secs(1))
            }
        );
        // After it: fatal, saying why.
        match decide(&r, Some(&view), at(300), &s) {
            Step::Teardown(Trigger::ImagePullFailed { message }) => {
                assert!(message.contains("connection refused"), "{message}");
                assert!(message.contains("--image-pull-timeout is 5m"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // The deadline still wins the requeue when it comes first.
        let mut r2 = r.clone();
        r2.spec.active_deadline_seconds = Some(60);
        assert_eq!(
            decide(&r2, Some(&view), now(), &s),
            Step::Track {
                requeue: Some(Duration::from_secs(60))
            }
        );
        // Without status.startTime the clock runs from the pod's creation.
        let mut pod = pulling_pod("ErrImagePull", REFUSED);
        if let Some(st) = pod.status.as_mut() {
            st.start_time = None;
        }
        pod.metadata.creation_timestamp = Some(Time(at(-400)));
        let view = PodView::of(&pod);
        assert!(matches!(
            decide(&r, Some(&view), now(), &s),
            Step::Teardown(Trigger::ImagePullFailed { .. })
        ));
        // A pod that is simply starting (no pull error) is never judged.
        let mut starting = running();
        starting.workload = WorkloadState::NotStarted;
        starting.holder_running = false;
        assert_eq!(
            decide(&r, Some(&starting), at(3600), &s),
            Step::Track { requeue: None }
        );
    }

    #[test]
    fn an_image_that_cannot_be_pulled_fails_the_run_and_drains_nothing() {
        let r = pending(run_with(&[("/out", true), ("/logs", false)]));
        let message = format!("container workload: ErrImagePull: {NOT_FOUND}");
        let trigger = Trigger::ImagePullFailed {
            message: message.clone(),
        };
        let mut s = draining_status(&r, &trigger, None, now());
        for e in s.read_back.iter_mut() {
            *e = never_started_entry(&e.path, &trigger);
        }
        assert!(s.read_back.iter().all(|e| e.phase == ReadBackPhase::Empty
            && e.object.is_none()
            && e.message.as_deref() == Some(NEVER_STARTED_IMAGE_PULL)));
        assert!(NEVER_STARTED_IMAGE_PULL
            .contains("never started because its image could not be pulled"));

        // A teardown resumed after a restart finds its trigger again.
        let mut resumed = r.clone();
        resumed.status = Some(s.clone());
        assert_eq!(
            decide(&resumed, Some(&running()), now(), &settings()),
            Step::Teardown(trigger.clone())
        );

        let done = finished_status(&r, s, now());
        assert_eq!(done.phase, Some(Phase::Failed));
        let why = done.message.clone().unwrap_or_default();
        assert!(why.contains("image could not be pulled"), "{why}");
        assert!(why.contains(&message), "the kubelet's words: {why}");
        let cond = |t: &str| done.conditions.iter().find(|c| c.type_ == t).unwrap();
        assert_eq!(
            (
                cond(condition::READY).status.as_str(),
                cond(condition::READY).reason.as_str()
            ),
            ("False", REASON_IMAGE_PULL_FAILED)
        );
        assert_eq!(cond(condition::READY).message, message);
        assert_eq!(
            (
                cond(condition::FAILED).status.as_str(),
                cond(condition::FAILED).reason.as_str()
            ),
            ("True", REASON_IMAGE_PULL_FAILED)
        );
        assert!(cond(condition::FAILED).message.contains(NOT_FOUND));
        assert!(!done
            .conditions
            .iter()
            .any(|c| c.type_ == condition::COMPLETE));
        assert_eq!(cond(condition::DRAINED).status, "True");

        // The teardown opens with a Warning that names the reason and keeps the kubelet's words.
        let (warning, reason, note) = teardown_event(&trigger);
        assert!(warning);
        assert_eq!(reason, REASON_IMAGE_PULL_FAILED);
        assert!(note.contains(NOT_FOUND), "{note}");
        assert_eq!(teardown_event(&Trigger::Stop).1, "TearingDown");

        // Any other teardown of a run that never started keeps the plain words.
        let plain = never_started_entry("/out", &Trigger::Stop);
        assert_eq!(plain.phase, ReadBackPhase::Empty);
        assert!(!plain.message.unwrap_or_default().contains("image"));
    }

    fn entry(path: &str, phase: ReadBackPhase, message: Option<&str>) -> ReadBackStatus {
        ReadBackStatus {
            path: path.into(),
            phase,
            members: 2,
            bytes: 30,
            attempts: 1,
            message: message.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn one_drain_event_shows_every_path() {
        let s = drain_summary(&[
            entry("/out", ReadBackPhase::Drained, None),
            entry(
                "/logs",
                ReadBackPhase::Empty,
                Some("the workload wrote nothing at this path"),
            ),
        ])
        .unwrap();
        assert_eq!((s.warning, s.reason), (false, REASON_DRAINED));
        assert!(
            s.note.starts_with("2 path(s): 1 Drained, 1 Empty. "),
            "{}",
            s.note
        );
        assert!(
            s.note.contains("/out: Drained, 2 member(s), 30 byte(s)"),
            "{}",
            s.note
        );
        assert!(
            s.note
                .contains("/logs: Empty, 2 member(s), 30 byte(s): the workload wrote nothing"),
            "{}",
            s.note
        );
        assert_eq!(drain_summary(&[]), None);
    }

    #[test]
    fn a_failed_path_wins_the_reason_and_every_path_stays_visible() {
        let mut capped = entry(
            "/cap",
            ReadBackPhase::Capped,
            Some("cap of 1 bytes reached"),
        );
        capped.dropped_members = 1;
        let mut failed = entry("/b", ReadBackPhase::Failed, Some("drain timeout"));
        failed.attempts = 3;
        let s = drain_summary(&[
            entry("/a", ReadBackPhase::Drained, None),
            capped.clone(),
            failed,
            entry("/c", ReadBackPhase::Failed, None),
        ])
        .unwrap();
        assert_eq!((s.warning, s.reason), (true, REASON_DRAIN_FAILED));
        assert_eq!(s.reason, "sandbox_runfiles_drain_failed");
        for want in [
            "/b: Failed, 2 member(s), 30 byte(s), after 3 attempt(s): drain timeout",
            "/c: Failed, 2 member(s), 30 byte(s), after 1 attempt(s): no detail",
            "/cap: Capped, 2 member(s), 30 byte(s), 1 member(s) dropped: cap of 1 bytes reached",
            "/a: Drained",
        ] {
            assert!(s.note.contains(want), "{want:?} missing from {}", s.note);
        }
        // Most severe first.
        let pos = |p: &str| s.note.find(p).unwrap();
        assert!(
            pos("/b:") < pos("/cap:") && pos("/cap:") < pos("/a:"),
            "{}",
            s.note
        );

        // Capped and nothing failed: the capped reason, still a Warning.
        let s = drain_summary(&[entry("/a", ReadBackPhase::Drained, None), capped]).unwrap();
        assert_eq!((s.warning, s.reason), (true, REASON_CAPPED));
        assert!(s.note.contains("1 member(s) dropped"), "{}", s.note);
    }

    #[test]
    fn a_long_drain_summary_stays_under_the_note_limit_and_says_what_it_elided() {
        let long = "x".repeat(5000);
        let entries: Vec<ReadBackStatus> = (0..16)
            .map(|i| entry(&format!("/p{i:02}"), ReadBackPhase::Failed, Some(&long)))
            .collect();
        let s = drain_summary(&entries).unwrap();
        assert!(s.note.len() <= EVENT_NOTE_LIMIT, "{}", s.note.len());
        assert!(s.note.len() < 1024);
        assert!(s.note.starts_with("16 path(s): 16 Failed. "), "{}", s.note);
        // One long message does not hide the others: each path's part is cut.
        assert!(
            s.note.contains("/p00: Failed") && s.note.contains("/p01: Failed"),
            "{}",
            s.note
        );
        let shown = (0..16)
            .filter(|i| s.note.contains(&format!("/p{i:02}:")))
            .count();
        assert!(shown < 16);
        assert!(
            s.note.ends_with(&format!(
                "{} more path(s) elided, see status.readBack",
                16 - shown
            )),
            "{}",
            s.note
        );
        // Multi-byte text is cut on a character boundary.
        let wide = "é".repeat(2000);
        let s = drain_summary(&[entry("/w", ReadBackPhase::Failed, Some(&wide))]).unwrap();
        assert!(s.note.len() <= EVENT_NOTE_LIMIT);
        assert!(s.note.ends_with('…'), "{}", s.note);
    }

    /// (status, reason) of condition `t`, None when absent.
    fn cond_of(s: &SandboxRunStatus, t: &str) -> Option<(String, String)> {
        s.conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| (c.status.clone(), c.reason.clone()))
    }

    fn pair(status: &str, reason: &str) -> Option<(String, String)> {
        Some((status.to_string(), reason.to_string()))
    }

    /// Drains every path of a draining status with `phase`.
    fn drain_all(mut s: SandboxRunStatus, phase: ReadBackPhase) -> SandboxRunStatus {
        s.read_back.iter_mut().for_each(|e| e.phase = phase);
        s
    }

    /// Exactly one of Complete/Failed is True, the other absent; every condition carries the
    /// run's generation; Ready is False.
    fn assert_one_ending(s: &SandboxRunStatus) {
        let complete = cond_of(s, condition::COMPLETE);
        let failed = cond_of(s, condition::FAILED);
        assert!(
            complete.is_some() != failed.is_some(),
            "exactly one of Complete/Failed: {:?}",
            s.conditions
        );
        assert!(complete.or(failed).is_some_and(|(st, _)| st == "True"));
        assert!(
            s.conditions
                .iter()
                .all(|c| c.observed_generation == Some(3)),
            "{:?}",
            s.conditions
        );
        assert_eq!(
            cond_of(s, condition::READY).map(|(st, _)| st),
            Some("False".to_string())
        );
    }

    fn with_generation(mut r: SandboxRun) -> SandboxRun {
        r.metadata.generation = Some(3);
        r
    }

    #[test]
    fn a_succeeded_run_is_complete_and_not_failed() {
        let r = with_generation(with_phase(run_with(&[("/out", true)]), Phase::Running));
        let t = Trigger::WorkloadFinished { exit_code: 0 };
        let s = drain_all(draining_status(&r, &t, None, now()), ReadBackPhase::Drained);
        let done = finished_status(&r, s, now());
        assert_eq!(done.phase, Some(Phase::Succeeded));
        assert_one_ending(&done);
        assert_eq!(
            cond_of(&done, condition::COMPLETE),
            pair("True", "Succeeded")
        );
        assert_eq!(cond_of(&done, condition::FAILED), None);
        assert_eq!(
            cond_of(&done, condition::READY),
            pair("False", REASON_RUN_ENDED)
        );
        assert_eq!(cond_of(&done, condition::DRAINED), pair("True", "Drained"));
    }

    #[test]
    fn a_failed_workload_is_failed_with_workload_failed_and_never_complete() {
        let r = with_generation(with_phase(run_with(&[("/out", true)]), Phase::Running));
        let t = Trigger::WorkloadFinished { exit_code: 2 };
        let s = drain_all(draining_status(&r, &t, None, now()), ReadBackPhase::Drained);
        let done = finished_status(&r, s, now());
        assert_eq!(done.phase, Some(Phase::Failed));
        assert_one_ending(&done);
        assert_eq!(
            cond_of(&done, condition::FAILED),
            pair("True", REASON_WORKLOAD_FAILED)
        );
        assert_eq!(cond_of(&done, condition::COMPLETE), None);
        assert_eq!(
            cond_of(&done, condition::READY),
            pair("False", REASON_RUN_ENDED)
        );
    }

    #[test]
    fn a_required_path_that_fails_after_success_is_failed_with_drain_failed() {
        let r = with_generation(with_phase(run_with(&[("/out", true)]), Phase::Running));
        let t = Trigger::WorkloadFinished { exit_code: 0 };
        let s = drain_all(draining_status(&r, &t, None, now()), ReadBackPhase::Failed);
        let done = finished_status(&r, s, now());
        assert_eq!(done.phase, Some(Phase::Failed));
        assert_one_ending(&done);
        assert_eq!(
            cond_of(&done, condition::FAILED),
            pair("True", REASON_CONDITION_DRAIN_FAILED)
        );
    }

    #[test]
    fn a_stop_or_deletion_whose_drains_succeed_is_complete() {
        for trigger in [Trigger::Stop, Trigger::Deleting] {
            let mut r = with_generation(with_phase(run_with(&[("/out", false)]), Phase::Running));
            r.spec.stop = trigger == Trigger::Stop;
            let s = drain_all(
                draining_status(&r, &trigger, None, now()),
                ReadBackPhase::Drained,
            );
            let done = finished_status(&r, s, now());
            assert_eq!(done.phase, Some(Phase::Stopped), "{trigger:?}");
            assert_one_ending(&done);
            assert_eq!(
                cond_of(&done, condition::COMPLETE),
                pair("True", "Stopped"),
                "{trigger:?}"
            );
            assert_eq!(cond_of(&done, condition::FAILED), None, "{trigger:?}");
        }
    }

    #[test]
    fn a_stop_whose_drain_fails_is_failed_with_drain_failed() {
        // An optional path: the phase stays Stopped, but the run did not end well.
        let mut r = with_generation(with_phase(run_with(&[("/out", false)]), Phase::Running));
        r.spec.stop = true;
        let s = drain_all(
            draining_status(&r, &Trigger::Stop, None, now()),
            ReadBackPhase::Failed,
        );
        let done = finished_status(&r, s, now());
        assert_eq!(done.phase, Some(Phase::Stopped));
        assert_one_ending(&done);
        assert_eq!(
            cond_of(&done, condition::FAILED),
            pair("True", REASON_CONDITION_DRAIN_FAILED)
        );
        assert_eq!(cond_of(&done, condition::COMPLETE), None);
        assert_eq!(
            cond_of(&done, condition::DRAINED),
            pair("False", REASON_CONDITION_DRAIN_FAILED)
        );
    }

    #[test]
    fn a_deadline_is_failed_with_deadline_exceeded_even_when_drained() {
        let r = with_generation(with_phase(run_with(&[("/out", false)]), Phase::Running));
        let draining = draining_status(&r, &Trigger::Deadline, None, now());
        // The trigger is recorded where a restarted operator finds it again.
        assert_eq!(
            cond_of(&draining, condition::READY),
            pair("False", REASON_DEADLINE_EXCEEDED)
        );
        let mut resumed = r.clone();
        resumed.status = Some(draining.clone());
        assert_eq!(
            decide(&resumed, Some(&running()), now(), &settings()),
            Step::Teardown(Trigger::Deadline)
        );
        let done = finished_status(&r, drain_all(draining, ReadBackPhase::Drained), now());
        assert_eq!(done.phase, Some(Phase::Stopped));
        assert_one_ending(&done);
        assert_eq!(
            cond_of(&done, condition::FAILED),
            pair("True", REASON_DEADLINE_EXCEEDED)
        );
        assert_eq!(cond_of(&done, condition::COMPLETE), None);
        assert!(done
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("activeDeadlineSeconds"));
    }

    #[test]
    fn a_pod_deleted_by_someone_else_is_failed_with_pod_deleted() {
        let r = with_generation(with_phase(run_with(&[("/out", false)]), Phase::Running));
        let s = drain_all(
            draining_status(&r, &Trigger::PodDeleting, None, now()),
            ReadBackPhase::Drained,
        );
        let done = finished_status(&r, s.clone(), now());
        assert_eq!(done.phase, Some(Phase::Stopped));
        assert_one_ending(&done);
        assert_eq!(
            cond_of(&done, condition::FAILED),
            pair("True", REASON_POD_DELETED)
        );
        // The same teardown of a run that is itself being deleted is the user's deletion.
        let mut deleted = r.clone();
        deleted.metadata.deletion_timestamp = Some(Time(now()));
        let done = finished_status(&deleted, s, now());
        assert_eq!(cond_of(&done, condition::COMPLETE), pair("True", "Stopped"));
        assert_eq!(cond_of(&done, condition::FAILED), None);
    }

    #[test]
    fn an_image_pull_failure_is_failed_with_image_pull_failed() {
        let r = with_generation(pending(run_with(&[("/out", true)])));
        let trigger = Trigger::ImagePullFailed {
            message: "container workload: ErrImagePull: not found".into(),
        };
        let mut s = draining_status(&r, &trigger, None, now());
        for e in s.read_back.iter_mut() {
            *e = never_started_entry(&e.path, &trigger);
        }
        let done = finished_status(&r, s, now());
        assert_eq!(done.phase, Some(Phase::Failed));
        assert_one_ending(&done);
        assert_eq!(
            cond_of(&done, condition::FAILED),
            pair("True", REASON_IMAGE_PULL_FAILED)
        );
        assert_eq!(cond_of(&done, condition::COMPLETE), None);
        // Ready keeps the reason the pod never ran.
        assert_eq!(
            cond_of(&done, condition::READY),
            pair("False", REASON_IMAGE_PULL_FAILED)
        );
    }

    #[test]
    fn a_path_committed_before_the_pod_was_lost_keeps_its_committed_outcome() {
        // An operator committed /out's manifest and died before recording it; the pod is gone
        // when its successor looks. /out was drained: it is not a loss. /logs was not.
        let r = with_generation(with_phase(
            run_with(&[("/out", true), ("/logs", false)]),
            Phase::Running,
        ));
        let committed = ReadBackStatus {
            path: "/out".into(),
            phase: ReadBackPhase::Drained,
            bytes: 3,
            members: 1,
            object: Some("file:///s/ns/r/u/00-out.tar".into()),
            manifest: Some("file:///s/ns/r/u/00-out.manifest.json".into()),
            attempts: 1,
            ..Default::default()
        };
        let done = pod_lost_status(&r, std::slice::from_ref(&committed), now());
        let out = done
            .read_back
            .iter()
            .find(|e| e.path == "/out")
            .expect("/out");
        assert_eq!(out, &committed);
        let logs = done
            .read_back
            .iter()
            .find(|e| e.path == "/logs")
            .expect("/logs");
        assert_eq!(logs.phase, ReadBackPhase::Failed);
        assert_eq!(logs.message.as_deref(), Some(POD_GONE));
        // The required path was drained: the run is not failed for a lost required path... but
        // the pod is still gone, which the run's ending says.
        assert_eq!(done.message.as_deref(), Some(POD_GONE));
        // Without the committed entry, both paths are losses (as before).
        let lost = pod_lost_status(&r, &[], now());
        assert!(lost
            .read_back
            .iter()
            .all(|e| e.phase == ReadBackPhase::Failed));
    }

    #[test]
    fn a_run_deleted_while_the_operator_was_down_is_not_released_without_a_word() {
        // The operator created the pod (status: Pending, podName) and was down while the pod
        // ran and went away; the run was deleted meanwhile. No startTime was ever seen, but the
        // pod may have run: the paths are reported lost (Failed + Event), not let go of silently.
        let mut r = with_phase(run_with(&[("/out", true)]), Phase::Pending);
        r.metadata.deletion_timestamp = Some(Time(now()));
        if let Some(s) = r.status.as_mut() {
            s.start_time = None;
            s.pod_name = Some("job-sbr".into());
        }
        assert_eq!(decide(&r, None, now(), &settings()), Step::PodLost);
        // A pod never created (no podName): nothing can have run, the finalizer goes at once.
        if let Some(s) = r.status.as_mut() {
            s.pod_name = None;
        }
        assert_eq!(decide(&r, None, now(), &settings()), Step::ReleaseFinalizer);
        // Without declared paths there is nothing to report either.
        let mut r = with_phase(run_with(&[]), Phase::Pending);
        r.metadata.deletion_timestamp = Some(Time(now()));
        if let Some(s) = r.status.as_mut() {
            s.pod_name = Some("job-sbr".into());
        }
        assert_eq!(decide(&r, None, now(), &settings()), Step::ReleaseFinalizer);
    }

    #[test]
    fn a_lost_pod_is_failed_with_pod_lost() {
        let r = with_generation(with_phase(
            run_with(&[("/out", true), ("/logs", false)]),
            Phase::Running,
        ));
        let done = pod_lost_status(&r, &[], now());
        assert_eq!(done.phase, Some(Phase::Failed));
        assert_one_ending(&done);
        assert_eq!(
            cond_of(&done, condition::FAILED),
            pair("True", REASON_POD_LOST)
        );
        assert_eq!(cond_of(&done, condition::COMPLETE), None);
        assert_eq!(done.message.as_deref(), Some(POD_GONE));

        // Also with no path at all, and while a deadline teardown was draining.
        let r = with_generation(with_phase(run_with(&[]), Phase::Running));
        let done = pod_lost_status(&r, &[], now());
        assert_eq!(
            cond_of(&done, condition::FAILED),
            pair("True", REASON_POD_LOST)
        );
        let mut r = with_generation(with_phase(run_with(&[("/out", false)]), Phase::Running));
        r.status = Some(draining_status(&r, &Trigger::Deadline, None, now()));
        let done = pod_lost_status(&r, &[], now());
        assert_eq!(
            cond_of(&done, condition::FAILED),
            pair("True", REASON_POD_LOST)
        );
    }

    #[test]
    fn a_workload_that_succeeded_before_its_pod_was_lost_keeps_its_drained_outcome() {
        let r = with_generation(with_phase(run_with(&[("/out", true)]), Phase::Running));
        let t = Trigger::WorkloadFinished { exit_code: 0 };
        let mut r2 = r.clone();
        r2.status = Some(drain_all(
            draining_status(&r, &t, None, now()),
            ReadBackPhase::Drained,
        ));
        let done = pod_lost_status(&r2, &[], now());
        assert_eq!(done.phase, Some(Phase::Succeeded));
        assert_one_ending(&done);
        assert_eq!(
            cond_of(&done, condition::COMPLETE),
            pair("True", "Succeeded")
        );
        // A required path still pending when the pod vanished: the pod's loss is why.
        let mut r3 = r.clone();
        r3.status = Some(draining_status(&r, &t, None, now()));
        let done = pod_lost_status(&r3, &[], now());
        assert_eq!(done.phase, Some(Phase::Failed));
        assert_eq!(
            cond_of(&done, condition::FAILED),
            pair("True", REASON_POD_LOST)
        );
    }

    #[test]
    fn failure_reason_names_the_first_cause() {
        let base = Ending {
            phase: Phase::Failed,
            workload_finished: true,
            exit_code: Some(1),
            image_pull_failed: false,
            pod_vanished: false,
            deadline: false,
            pod_deleted: false,
            any_failed: true,
        };
        assert_eq!(failure_reason(&base), Some(REASON_WORKLOAD_FAILED));
        let ok_exit = Ending {
            exit_code: Some(0),
            ..base
        };
        assert_eq!(
            failure_reason(&ok_exit),
            Some(REASON_CONDITION_DRAIN_FAILED)
        );
        assert_eq!(
            failure_reason(&Ending {
                pod_vanished: true,
                ..ok_exit
            }),
            Some(REASON_POD_LOST)
        );
        let stopped = Ending {
            phase: Phase::Stopped,
            workload_finished: false,
            exit_code: None,
            any_failed: false,
            ..base
        };
        assert_eq!(failure_reason(&stopped), None);
        assert_eq!(
            failure_reason(&Ending {
                deadline: true,
                any_failed: true,
                ..stopped
            }),
            Some(REASON_DEADLINE_EXCEEDED)
        );
        assert_eq!(
            failure_reason(&Ending {
                phase: Phase::Succeeded,
                any_failed: true,
                ..ok_exit
            }),
            None,
            "an optional path failure keeps a success"
        );
    }
}
