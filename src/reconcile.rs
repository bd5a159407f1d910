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
    Phase, ReadBackPhase, ReadBackStatus, SandboxRun, SandboxRunStatus, FINALIZER,
    SKIP_DRAIN_ANNOTATION,
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
    /// The run reached a final phase (`kubectl wait --for=condition=Complete`).
    pub const COMPLETE: &str = "Complete";
}

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
    /// The image cannot be pulled; `fatal` when retrying cannot help (an invalid name).
    ImagePull {
        /// Retrying cannot help.
        fatal: bool,
        /// The kubelet's words.
        message: String,
    },
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
        for cs in statuses.into_iter().flatten() {
            if let Some(waiting) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) {
                let reason = waiting.reason.as_deref().unwrap_or_default();
                let fatal = matches!(reason, "InvalidImageName" | "ErrImageNeverPull");
                if fatal || matches!(reason, "ErrImagePull" | "ImagePullBackOff") {
                    problem = Some(PodProblem::ImagePull {
                        fatal,
                        message: format!(
                            "container {}: {reason}: {}",
                            cs.name,
                            waiting.message.as_deref().unwrap_or_default()
                        ),
                    });
                }
            }
        }
        PodView {
            deleting: pod.metadata.deletion_timestamp.is_some(),
            holder_running,
            workload,
            started_at: status.and_then(|s| s.start_time.as_ref()).map(|t| t.0),
            problem,
        }
    }
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

/// Decides the next step from the run, its pod (if any) and the time.
pub fn decide(run: &SandboxRun, pod: Option<&PodView>, now: Timestamp) -> Step {
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
    if let Some(when) = deadline(run) {
        if now >= when {
            return Step::Teardown(Trigger::Deadline);
        }
        if matches!(pod.problem, Some(PodProblem::ImagePull { fatal: true, .. })) {
            return Step::Teardown(Trigger::Stop);
        }
        let left = now.duration_until(when);
        return Step::Track {
            requeue: Duration::try_from(left).ok(),
        };
    }
    if matches!(pod.problem, Some(PodProblem::ImagePull { fatal: true, .. })) {
        return Step::Teardown(Trigger::Stop);
    }
    Step::Track { requeue: None }
}

/// Whether anything could have been written that a drain would owe (a pod ever ran).
fn drain_needed(run: &SandboxRun) -> bool {
    !run.spec.read_back_paths().is_empty()
        && run
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .is_some()
}

fn resume_trigger(run: &SandboxRun, pod: &PodView) -> Trigger {
    match pod.workload {
        WorkloadState::Terminated { exit_code } => Trigger::WorkloadFinished { exit_code },
        _ if condition_true(run, condition::WORKLOAD_FINISHED) => Trigger::WorkloadFinished {
            exit_code: run.status.as_ref().and_then(|s| s.exit_code).unwrap_or(-1),
        },
        _ if run.spec.stop => Trigger::Stop,
        _ => Trigger::Deadline,
    }
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

fn condition_order(t: &str) -> usize {
    [
        condition::READY,
        condition::WORKLOAD_FINISHED,
        condition::DRAINED,
        condition::COMPLETE,
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
            "PodRunning",
            "",
            generation,
            now,
        );
    } else {
        status.phase = Some(Phase::Pending);
        let (reason, message) = match &pod.problem {
            Some(PodProblem::Unschedulable(m)) => ("Unschedulable", m.clone()),
            Some(PodProblem::ImagePull { message, .. }) => ("ImagePullFailed", message.clone()),
            None => ("PodPending", "waiting for the pod to run".to_string()),
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

/// The status at the start of teardown.
pub fn draining_status(run: &SandboxRun, trigger: &Trigger, now: Timestamp) -> SandboxRunStatus {
    let mut status = run.status.clone().unwrap_or_default();
    let generation = run.metadata.generation;
    status.observed_generation = generation;
    status.phase = Some(Phase::Draining);
    status.message = Some(format!(
        "tearing down: {}; draining read-back paths",
        trigger.describe()
    ));
    if let Trigger::WorkloadFinished { exit_code } = trigger {
        status.exit_code = Some(*exit_code);
        let reason = if *exit_code == 0 {
            "Completed"
        } else {
            "Error"
        };
        set_condition(
            &mut status.conditions,
            condition::WORKLOAD_FINISHED,
            true,
            reason,
            format!("workload exited with code {exit_code}"),
            generation,
            now,
        );
    }
    set_condition(
        &mut status.conditions,
        condition::READY,
        false,
        "TearingDown",
        trigger.describe(),
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

/// The status once every path has an outcome: the final phase and the Drained/Complete conditions.
pub fn finished_status(
    run: &SandboxRun,
    mut status: SandboxRunStatus,
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
            "DrainFailed",
            format!(
                "drain failed for {}; see the sandbox_runfiles_drain_failed Events",
                which.join(", ")
            ),
            generation,
            now,
        );
    }
    let finished = condition_true_in(&status, condition::WORKLOAD_FINISHED);
    let phase = if finished {
        if status.exit_code == Some(0) && !required_failed {
            Phase::Succeeded
        } else {
            Phase::Failed
        }
    } else if required_failed
        || status.start_time.is_none() && status.exit_code.is_none() && pod_problem_failed(&status)
    {
        Phase::Failed
    } else {
        Phase::Stopped
    };
    let why = match (phase, required_failed) {
        (Phase::Succeeded, _) => {
            "workload succeeded and its read-back paths are stored".to_string()
        }
        (_, true) => "a required read-back path could not be drained".to_string(),
        (Phase::Failed, false) if finished => {
            format!(
                "workload failed with exit code {}",
                status.exit_code.unwrap_or(-1)
            )
        }
        (Phase::Failed, false) => status
            .message
            .clone()
            .unwrap_or_else(|| "run failed".to_string()),
        _ => "run stopped; read-back paths drained".to_string(),
    };
    status.phase = Some(phase);
    status.message = Some(why.clone());
    status.completion_time = Some(Time(now));
    status.observed_generation = generation;
    set_condition(
        &mut status.conditions,
        condition::COMPLETE,
        true,
        &format!("{phase:?}"),
        why,
        generation,
        now,
    );
    status
}

fn condition_true_in(status: &SandboxRunStatus, type_: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

fn pod_problem_failed(status: &SandboxRunStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == condition::READY && c.reason == "ImagePullFailed")
}

/// The status when the pod vanished before teardown: every undrained path is a failure, never an
/// empty set (ADR-143 §4), and the run failed.
pub fn pod_lost_status(run: &SandboxRun, now: Timestamp) -> SandboxRunStatus {
    let mut status = run.status.clone().unwrap_or_default();
    ensure_pending_entries(run, &mut status);
    for e in status
        .read_back
        .iter_mut()
        .filter(|e| e.phase == ReadBackPhase::Pending)
    {
        e.phase = ReadBackPhase::Failed;
        e.message = Some(POD_GONE.to_string());
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
    let mut status = finished_status(run, status, now);
    if status.phase != Some(Phase::Failed)
        && !condition_true_in(&status, condition::WORKLOAD_FINISHED)
    {
        status.phase = Some(Phase::Failed);
        status.message = Some(POD_GONE.to_string());
        set_condition(
            &mut status.conditions,
            condition::COMPLETE,
            true,
            "Failed",
            POD_GONE,
            generation,
            now,
        );
    }
    status
}

/// Why the drain of a path failed when the pod was gone before teardown.
pub const POD_GONE: &str =
    "the pod was gone before teardown (deleted or evicted); its emptyDirs went with it and nothing could be drained";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ReadBack, ReadBackPath, SandboxRunSpec};
    use k8s_openapi::api::core::v1::{
        ContainerStateRunning, ContainerStateTerminated, ContainerStatus, PodStatus,
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
            problem: None,
        }
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
        assert_eq!(decide(&r, None, now()), Step::AddFinalizer);
        let r = run_with(&[("/out", false)]);
        assert_eq!(decide(&r, None, now()), Step::CreatePod);
    }

    #[test]
    fn workload_exit_starts_teardown_with_its_code() {
        let r = with_phase(run_with(&[("/out", false)]), Phase::Running);
        let mut pod = running();
        pod.workload = WorkloadState::Terminated { exit_code: 3 };
        assert_eq!(
            decide(&r, Some(&pod), now()),
            Step::Teardown(Trigger::WorkloadFinished { exit_code: 3 })
        );
    }

    #[test]
    fn stop_deadline_and_deletion_start_teardown() {
        let mut r = with_phase(run_with(&[("/out", false)]), Phase::Running);
        r.spec.stop = true;
        assert_eq!(
            decide(&r, Some(&running()), now()),
            Step::Teardown(Trigger::Stop)
        );

        let mut r = with_phase(run_with(&[("/out", false)]), Phase::Running);
        r.spec.active_deadline_seconds = Some(60);
        assert_eq!(
            decide(&r, Some(&running()), now()),
            Step::Track {
                requeue: Some(Duration::from_secs(60))
            }
        );
        let later = now()
            .checked_add(jiff::SignedDuration::from_secs(61))
            .unwrap();
        assert_eq!(
            decide(&r, Some(&running()), later),
            Step::Teardown(Trigger::Deadline)
        );

        let mut r = with_phase(run_with(&[("/out", false)]), Phase::Running);
        r.metadata.deletion_timestamp = Some(Time(now()));
        assert_eq!(
            decide(&r, Some(&running()), now()),
            Step::Teardown(Trigger::Deleting)
        );
    }

    #[test]
    fn pod_deleted_by_someone_else_is_drained_in_its_grace_window() {
        let r = with_phase(run_with(&[("/out", false)]), Phase::Running);
        let mut pod = running();
        pod.deleting = true;
        assert_eq!(
            decide(&r, Some(&pod), now()),
            Step::Teardown(Trigger::PodDeleting)
        );
    }

    #[test]
    fn pod_gone_before_teardown_is_a_loss_never_an_empty_set() {
        let r = with_phase(
            run_with(&[("/out", true), ("/logs", false)]),
            Phase::Running,
        );
        assert_eq!(decide(&r, None, now()), Step::PodLost);
        let s = pod_lost_status(&r, now());
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
            decide(&r, Some(&running()), now()),
            Step::Teardown(Trigger::Stop)
        );
    }

    #[test]
    fn deletion_of_a_finished_run_releases_and_skip_drain_is_honoured() {
        let mut r = with_phase(run_with(&[("/out", false)]), Phase::Succeeded);
        r.metadata.deletion_timestamp = Some(Time(now()));
        assert_eq!(decide(&r, None, now()), Step::ReleaseFinalizer);
        let mut r = with_phase(run_with(&[("/out", false)]), Phase::Running);
        r.metadata.deletion_timestamp = Some(Time(now()));
        r.metadata.annotations =
            Some([(SKIP_DRAIN_ANNOTATION.to_string(), "true".to_string())].into());
        assert_eq!(decide(&r, Some(&running()), now()), Step::SkipDrain);
    }

    #[test]
    fn final_phase_follows_exit_code_and_required_paths() {
        let r = run_with(&[("/out", true), ("/logs", false)]);
        let t = Trigger::WorkloadFinished { exit_code: 0 };
        let mut s = draining_status(&r, &t, now());
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
        let mut s = draining_status(&r, &t, now());
        s.read_back
            .iter_mut()
            .for_each(|e| e.phase = ReadBackPhase::Empty);
        assert_eq!(finished_status(&r, s, now()).phase, Some(Phase::Failed));

        let mut s = draining_status(&r, &Trigger::Stop, now());
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
}
