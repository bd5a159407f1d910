//! Decide: the one pure choice of what a run needs next ([`Step`]), from the run, the facts of
//! its pod ([`PodView`]), the time and the operator's settings. No client, no clock: `now` is an
//! argument, so every transition is unit tested. What a step writes and publishes is planned in
//! [`super::plan`]; this module only chooses.

use std::ops::Not;
use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;

use super::retention;
use crate::api::{Phase, SandboxRun, FINALIZER, SKIP_DRAIN_ANNOTATION};
use crate::controller::conditions::{
    self, condition_true, ready_false_reason, start_failure, StartFailure,
    REASON_DEADLINE_EXCEEDED, REASON_POD_DELETED,
};
use crate::controller::pod_view::{PodProblem, PodView, WorkloadState};
use crate::registry::Resolution;
use crate::units::short_duration;

/// Why a run is being torn down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Trigger {
    /// The workload container exited.
    WorkloadFinished {
        /// Its exit code.
        exit_code: i32,
    },
    /// `spec.stop` was set.
    Stop,
    /// `spec.suspend` was set on a run whose pod exists: drain, delete the pod, wait.
    Suspend,
    /// Kueue evicted the run's Workload (e.g. to preempt it for a run of higher priority):
    /// drain, delete the pod, wait until Kueue admits it again (docs/user-guide.md "Queueing
    /// with Kueue").
    Preempted {
        /// Kueue's words.
        message: String,
    },
    /// `spec.activeDeadlineSeconds` passed.
    Deadline,
    /// The run is being deleted (the finalizer holds it).
    Deleting,
    /// The pod is being deleted or evicted by someone else (or by foreground cascading deletion):
    /// drain at once, inside the holder's grace window.
    PodDeleting,
    /// An image of the pod cannot be pulled and retrying will not help (see
    /// [`crate::controller::pod_view::image_pull_is_definitive`] and [`DecideSettings::image_pull_timeout`]): the workload
    /// never started, the run fails with reason [`crate::controller::conditions::REASON_IMAGE_PULL_FAILED`].
    ImagePullFailed {
        /// The kubelet's words (`container <name>: <reason>: <message>`).
        message: String,
    },
    /// The egress gate gave up: the run's NetworkPolicy was never seen in force, so the workload
    /// never started; the run fails with reason
    /// [`crate::controller::conditions::REASON_EGRESS_NOT_ENFORCED`].
    EgressGateFailed {
        /// The gate's words (its termination message).
        message: String,
    },
}

impl Trigger {
    /// Whether the teardown is served before the others (docs/contract.md "Fair drain slots"):
    /// the pod is being deleted or evicted, and its emptyDirs vanish when its grace period ends.
    pub(crate) fn is_urgent(&self) -> bool {
        matches!(self, Trigger::PodDeleting)
    }

    /// Words for status messages and Events.
    pub(crate) fn describe(&self) -> String {
        match self {
            Trigger::WorkloadFinished { exit_code } => {
                format!("workload exited with code {exit_code}")
            }
            Trigger::Stop => "spec.stop was set".to_string(),
            Trigger::Suspend => "spec.suspend was set".to_string(),
            Trigger::Preempted { message } => format!("evicted by Kueue ({message})"),
            Trigger::Deadline => "activeDeadlineSeconds passed".to_string(),
            Trigger::Deleting => "the run is being deleted".to_string(),
            Trigger::PodDeleting => "the pod is being deleted or evicted".to_string(),
            Trigger::ImagePullFailed { message } => {
                format!("the image could not be pulled ({message})")
            }
            Trigger::EgressGateFailed { message } => {
                format!("the egress gate gave up ({message})")
            }
        }
    }

    /// Why the workload never started, and the words, when this trigger says so.
    pub(crate) fn start_failure(&self) -> Option<(StartFailure, &str)> {
        match self {
            Trigger::ImagePullFailed { message } => Some((StartFailure::ImagePull, message)),
            Trigger::EgressGateFailed { message } => Some((StartFailure::EgressGate, message)),
            _ => None,
        }
    }

    fn of_start_failure(failure: StartFailure, message: String) -> Trigger {
        match failure {
            StartFailure::ImagePull => Trigger::ImagePullFailed { message },
            StartFailure::EgressGate => Trigger::EgressGateFailed { message },
        }
    }
}

/// Operator-wide inputs to [`decide`] that come from `run` flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DecideSettings {
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

/// What an image-pull problem of the pod means at `now`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PullVerdict {
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
pub(crate) fn pull_verdict(
    pod: &PodView,
    now: Timestamp,
    settings: &DecideSettings,
) -> PullVerdict {
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
            short_duration(lasted),
            short_duration(timeout)
        ))
    } else {
        PullVerdict::Retrying {
            left: timeout
                .checked_sub(lasted)
                .and_then(|d| Duration::try_from(d).ok()),
        }
    }
}

/// What the pre-flight resolution of a run's image (`run --preflight-images`, read by the
/// prepare stage before the pod is created) means for that pod (docs/contract.md ADR-006 §5): only a
/// definitive "does not exist" keeps it from being created.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Preflight {
    /// The registry has the manifest (or no pre-flight was asked): create the pod.
    #[default]
    Proceed,
    /// The registry could not be asked or gave no clear answer (timeout, 5xx, connection
    /// refused, auth): create the pod anyway (the kubelet may still pull it) and warn.
    ProceedUnverified {
        /// Why, with the hint.
        message: String,
    },
    /// The registry says the manifest or repository does not exist: fail the run, no pod.
    Unresolvable {
        /// What the registry said.
        message: String,
        /// What to do about it.
        hint: String,
    },
}

/// Judges the pre-flight `resolution` of `image` (the verdicts of admission's image check, the
/// same words and hints).
pub(crate) fn preflight(image: &str, resolution: &Resolution) -> Preflight {
    match crate::policy::resolvable::finding(resolution, image) {
        None => Preflight::Proceed,
        Some(f) if f.is_fail() => Preflight::Unresolvable {
            message: f.message,
            hint: f.hint,
        },
        Some(f) => Preflight::ProceedUnverified {
            message: format!(
                "{}; the pod is created anyway (hint: {})",
                f.message, f.hint
            ),
        },
    }
}

/// The next step for a run.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Step {
    /// Put the finalizer on the run before anything exists that would need draining.
    AddFinalizer,
    /// The run is gone or going and owes nothing: release the finalizer.
    ReleaseFinalizer,
    /// `sandbox.iterion.io/skip-drain` asks to release the finalizer at once (recorded).
    SkipDrain,
    /// Create the pod.
    CreatePod,
    /// Reflect the pod in status; look again after `requeue` (e.g. at the deadline).
    TrackPod {
        /// When to look again without a watch event.
        requeue: Option<Duration>,
    },
    /// Tear down: drain every path not drained yet, then finish the run.
    Teardown(Trigger),
    /// The pod vanished before teardown: report every undrained path as lost.
    RecordPodLost,
    /// The run is over: make sure its pod is gone (and release the finalizer when deleting).
    DeleteFinishedPod,
    /// The run finished `spec.ttlSecondsAfterFinished` ago: delete it (through the finalizer).
    DeleteExpiredRun,
    /// `spec.suspend` holds the run without a pod: say so (once), create nothing.
    Suspended,
    /// `spec.checkpoint` asks the running sandbox's paths to be drained now, without stopping it.
    Checkpoint,
    /// An attempt ended and the next one waits out its backoff (`spec.retryPolicy`): look again
    /// after `left`.
    AwaitRetry {
        /// What is left of the backoff.
        left: Duration,
    },
}

impl Step {
    /// The step's `step` label on `sandboxrun_reconciles_total` and
    /// `sandboxrun_reconcile_duration_seconds` (docs/operations.md "Metrics"). Written out, never
    /// the `Debug` text, so renaming a variant cannot rename a label.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Step::AddFinalizer => "add_finalizer",
            Step::ReleaseFinalizer => "release_finalizer",
            Step::SkipDrain => "skip_drain",
            Step::CreatePod => "create_pod",
            Step::TrackPod { .. } => "track",
            Step::Teardown(_) => "teardown",
            Step::RecordPodLost => "pod_lost",
            Step::DeleteFinishedPod => "clean_up",
            Step::DeleteExpiredRun => "expire",
            Step::AwaitRetry { .. } => "await_retry",
            Step::Suspended => "suspended",
            Step::Checkpoint => "checkpoint",
        }
    }
}

fn phase(run: &SandboxRun) -> Option<Phase> {
    run.status.as_ref().and_then(|s| s.phase)
}

/// When the run's deadline passes, if it has one.
pub(crate) fn deadline(run: &SandboxRun) -> Option<Timestamp> {
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
pub(crate) fn decide(
    run: &SandboxRun,
    pod: Option<&PodView>,
    now: Timestamp,
    settings: &DecideSettings,
) -> Step {
    let has_finalizer = run.finalizers().iter().any(|f| f == FINALIZER);
    if run.metadata.deletion_timestamp.is_some() {
        return while_deleted(run, pod, has_finalizer);
    }
    if !has_finalizer {
        return Step::AddFinalizer;
    }
    if phase(run).is_some_and(Phase::is_final) {
        if retention::ttl(run, now) == retention::Ttl::Expired {
            return Step::DeleteExpiredRun;
        }
        return Step::DeleteFinishedPod;
    }
    match pod {
        Some(pod) => with_pod(run, pod, now, settings),
        None => without_pod(run, now),
    }
}

/// The next step of a run being deleted.
fn while_deleted(run: &SandboxRun, pod: Option<&PodView>, has_finalizer: bool) -> Step {
    let current = phase(run);
    if !has_finalizer {
        return Step::DeleteFinishedPod;
    }
    if run
        .annotations()
        .get(SKIP_DRAIN_ANNOTATION)
        .map(String::as_str)
        == Some("true")
    {
        return Step::SkipDrain;
    }
    if current.is_some_and(Phase::is_final) {
        return Step::ReleaseFinalizer;
    }
    match pod {
        Some(_) => Step::Teardown(Trigger::Deleting),
        None if (current.is_none() || current == Some(Phase::Pending)) && !drain_needed(run) => {
            Step::ReleaseFinalizer
        }
        None => Step::RecordPodLost,
    }
}

/// The next step of a live, unfinished run that has no pod: create it, unless it had one.
fn without_pod(run: &SandboxRun, now: Timestamp) -> Step {
    if run.spec.suspend && run.spec.stop.not() && pod_not_expected(run) {
        return Step::Suspended;
    }
    let next_attempt = run
        .status
        .as_ref()
        .and_then(|s| s.next_attempt_time.as_ref())
        .map(|t| t.0);
    if let Some(at) = next_attempt.filter(|at| *at > now) {
        let left = Duration::try_from(now.duration_until(at)).unwrap_or(Duration::ZERO);
        return Step::AwaitRetry { left };
    }
    match phase(run) {
        None | Some(Phase::Pending)
            if run
                .status
                .as_ref()
                .and_then(|s| s.pod_name.as_ref())
                .is_none() =>
        {
            Step::CreatePod
        }
        _ => Step::RecordPodLost,
    }
}

/// Whether a run without a pod is not owed one by a pod it had (it never had one, or its last
/// attempt ended): a suspended run creates none then; a run whose pod vanished is still lost.
fn pod_not_expected(run: &SandboxRun) -> bool {
    run.status.as_ref().is_none_or(|s| s.pod_name.is_none())
}

/// The next step of a live, unfinished run whose pod exists: tear down when something ended it,
/// else track it and look again at the deadline or when the image-pull timeout passes.
fn with_pod(run: &SandboxRun, pod: &PodView, now: Timestamp, settings: &DecideSettings) -> Step {
    if phase(run) == Some(Phase::Draining) {
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
    if run.spec.suspend {
        return Step::Teardown(Trigger::Suspend);
    }
    let deadline_left = match deadline(run) {
        Some(when) if now >= when => return Step::Teardown(Trigger::Deadline),
        Some(when) => Duration::try_from(now.duration_until(when)).ok(),
        None => None,
    };
    if pod.workload == WorkloadState::Running
        && pod.holder_running
        && run.checkpoint_due().is_some()
    {
        return Step::Checkpoint;
    }
    if let Some(PodProblem::EgressGate(message)) = &pod.problem {
        return Step::Teardown(Trigger::EgressGateFailed {
            message: message.clone(),
        });
    }
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
    Step::TrackPod { requeue }
}

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
    if condition_true(run.status.as_ref(), conditions::WORKLOAD_FINISHED) {
        return Trigger::WorkloadFinished {
            exit_code: run.status.as_ref().and_then(|s| s.exit_code).unwrap_or(-1),
        };
    }
    if let Some((failure, message)) = run.status.as_ref().and_then(start_failure) {
        return Trigger::of_start_failure(failure, message);
    }
    match run.status.as_ref().and_then(ready_false_reason) {
        Some(conditions::REASON_PREEMPTED) => {
            return Trigger::Preempted {
                message: run
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.iter().find(|c| c.type_ == conditions::READY))
                    .map(|c| c.message.clone())
                    .unwrap_or_default(),
            }
        }
        Some(REASON_DEADLINE_EXCEEDED) => return Trigger::Deadline,
        Some(REASON_POD_DELETED) => return Trigger::PodDeleting,
        _ => {}
    }
    if run.spec.stop {
        Trigger::Stop
    } else if run.spec.suspend {
        Trigger::Suspend
    } else {
        Trigger::Deadline
    }
}

/// Whether [`Step::RecordPodLost`], decided on the watch cache's copy of the run, holds for the
/// live run too. The pod is read live but the run comes from the watch cache, which can lag
/// behind this operator's own last status write: a teardown that recorded its drain, then
/// deleted the pod, is reconciled again (the pod's deletion) with the pre-teardown run, and
/// deciding "pod lost" on that stale copy would overwrite the recorded drain outcome with "the
/// pod was gone". An unchanged run (the same resourceVersion, never a missing one: docs/contract.md
/// "A write always names its object") is the same decision; any other is decided again.
pub(crate) fn pod_lost_holds(
    cached: &SandboxRun,
    live: &SandboxRun,
    now: Timestamp,
    settings: &DecideSettings,
) -> bool {
    let seen = crate::identity::resource_version(cached);
    let unchanged = seen.is_ok() && crate::identity::resource_version(live) == seen;
    unchanged || decide(live, None, now, settings) == Step::RecordPodLost
}

/// The run as the decision must see it, given the uids of the runs whose pod this replica
/// created and has not reported yet (`remembered`, docs/contract.md "A quiet lifecycle"): such a
/// run gets its pod's name in its status (in memory only), so a pod that vanished before it was
/// reported makes the run lost ([`Step::RecordPodLost`]), never given a second pod. A run that
/// has a phase was reported: it is forgotten.
pub(crate) fn with_unreported_pod(
    run: std::sync::Arc<SandboxRun>,
    remembered: &mut std::collections::HashSet<String>,
) -> std::sync::Arc<SandboxRun> {
    let Some(uid) = run.metadata.uid.as_deref() else {
        return run;
    };
    if phase(&run).is_some() {
        remembered.remove(uid);
        return run;
    }
    if !remembered.contains(uid) {
        return run;
    }
    let pod_name = crate::identity::current_pod_name(&run);
    let mut seen = (*run).clone();
    let status = seen.status.get_or_insert_with(Default::default);
    if status.pod_name.is_none() {
        status.pod_name = Some(pod_name);
    }
    std::sync::Arc::new(seen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::conditions::set_condition;
    use crate::controller::pod_view::image_pull_is_definitive;
    use crate::controller::testkit::fixtures::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    /// Every step, for the label test below: a new variant fails to compile here until added.
    fn every_step() -> Vec<Step> {
        let all = vec![
            Step::AddFinalizer,
            Step::ReleaseFinalizer,
            Step::SkipDrain,
            Step::CreatePod,
            Step::TrackPod { requeue: None },
            Step::Teardown(Trigger::Stop),
            Step::RecordPodLost,
            Step::DeleteFinishedPod,
            Step::DeleteExpiredRun,
            Step::AwaitRetry {
                left: Duration::ZERO,
            },
            Step::Suspended,
            Step::Checkpoint,
        ];
        for step in &all {
            match step {
                Step::AddFinalizer
                | Step::ReleaseFinalizer
                | Step::SkipDrain
                | Step::CreatePod
                | Step::TrackPod { .. }
                | Step::Teardown(_)
                | Step::RecordPodLost
                | Step::DeleteFinishedPod
                | Step::DeleteExpiredRun
                | Step::AwaitRetry { .. }
                | Step::Suspended
                | Step::Checkpoint => {}
            }
        }
        all
    }

    #[test]
    fn docs_operations_lists_every_step_label() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let row = doc
            .lines()
            .find(|l| l.starts_with("| `sandboxrun_reconciles_total`"))
            .expect("the sandboxrun_reconciles_total row");
        for step in every_step() {
            let label = step.as_str();
            assert!(
                row.split(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                    .any(|w| w == label),
                "docs/operations.md's step labels miss {label}: {row}"
            );
        }
    }

    #[test]
    fn only_a_definitive_miss_keeps_the_pod_from_being_created() {
        let image = "localhost:5000/team/app:v2";
        assert_eq!(
            preflight(image, &Resolution::Resolvable),
            Preflight::Proceed
        );
        match preflight(
            image,
            &Resolution::NotFound("localhost:5000 answered 404".into()),
        ) {
            Preflight::Unresolvable { message, hint } => {
                assert!(message.contains(image), "{message}");
                assert!(message.contains("answered 404"), "{message}");
                assert!(hint.contains("push the image"), "{hint}");
            }
            other => panic!("a 404 must fail the run: {other:?}"),
        }
        for transient in [
            "registry localhost:5000 did not answer within 5s",
            "cannot connect to the registry: connection refused",
            "unexpected registry answer 503 Service Unavailable",
            "localhost:5000 refused access (401 Unauthorized); a private repository needs a pull secret",
        ] {
            match preflight(image, &Resolution::Unknown(transient.into())) {
                Preflight::ProceedUnverified { message } => {
                    assert!(message.contains(transient), "{message}");
                    assert!(message.contains("created anyway"), "{message}");
                }
                other => panic!("{transient} must not fail the run: {other:?}"),
            }
        }
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
                conditions::COMPLETE,
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
        assert_eq!(
            decide(&r, None, at(9), &settings()),
            Step::DeleteFinishedPod
        );
        assert_eq!(
            decide(&r, None, at(10), &settings()),
            Step::DeleteExpiredRun
        );
        // Once deleted, the normal finalizer path runs (never a second delete).
        r.metadata.deletion_timestamp = Some(Time(at(10)));
        assert_eq!(
            decide(&r, None, at(11), &settings()),
            Step::ReleaseFinalizer
        );
        // Without a TTL a finished run stays.
        r.metadata.deletion_timestamp = None;
        r.spec.ttl_seconds_after_finished = None;
        assert_eq!(
            decide(&r, None, at(1_000_000), &settings()),
            Step::DeleteFinishedPod
        );
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
            Step::TrackPod {
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
    fn a_suspended_run_gets_no_pod_a_running_one_is_stopped_and_a_retry_waits_its_backoff() {
        // Suspended before its pod exists: nothing is created.
        let mut r = run_with(&[("/out", false)]);
        r.spec.suspend = true;
        assert_eq!(decide(&r, None, now(), &settings()), Step::Suspended);
        // Suspended while running: its pod is stopped with its files drained.
        let mut r = with_phase(run_with(&[("/out", false)]), Phase::Running);
        r.spec.suspend = true;
        assert_eq!(
            decide(&r, Some(&running()), now(), &settings()),
            Step::Teardown(Trigger::Suspend)
        );
        // A pod that vanished is still lost, suspended or not.
        r.status.get_or_insert_with(Default::default).pod_name = Some("job-sbr".into());
        assert_eq!(decide(&r, None, now(), &settings()), Step::RecordPodLost);
        // Resumed after an attempt ended: the next pod is created, after its backoff.
        let mut r = with_phase(run_with(&[("/out", false)]), Phase::Pending);
        let later = now()
            .checked_add(jiff::SignedDuration::from_secs(30))
            .unwrap();
        let s = r.status.get_or_insert_with(Default::default);
        s.next_attempt_time = Some(Time(later));
        s.pod_name = None;
        assert_eq!(
            decide(&r, None, now(), &settings()),
            Step::AwaitRetry {
                left: Duration::from_secs(30)
            }
        );
        assert_eq!(decide(&r, None, later, &settings()), Step::CreatePod);
    }

    #[test]
    fn a_run_without_a_resource_version_is_never_taken_for_unchanged() {
        let cached = with_phase(run_with(&[("/out", false)]), Phase::Running);
        assert_eq!(
            decide(&cached, None, now(), &settings()),
            Step::RecordPodLost
        );
        let mut live = with_phase(run_with(&[("/out", false)]), Phase::Succeeded);
        live.status.get_or_insert_with(Default::default).read_back =
            vec![entry("/out", crate::api::ReadBackPhase::Drained, None)];
        assert_ne!(decide(&live, None, now(), &settings()), Step::RecordPodLost);
        // Read at the same resourceVersion: the same run, the same decision.
        let read_at = |r: &SandboxRun, rv: Option<&str>| {
            let mut r = r.clone();
            r.metadata.resource_version = rv.map(Into::into);
            r
        };
        let same = (read_at(&cached, Some("5")), read_at(&live, Some("5")));
        assert!(pod_lost_holds(&same.0, &same.1, now(), &settings()));
        // Without one (or an empty one) nothing says it is the same run: the live run is decided
        // again, and its recorded drain is not overwritten with "the pod was gone".
        for rv in [None, Some("")] {
            let unknown = (read_at(&cached, rv), read_at(&live, rv));
            assert!(
                !pod_lost_holds(&unknown.0, &unknown.1, now(), &settings()),
                "{rv:?}"
            );
        }
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
    fn a_failed_egress_gate_fails_the_run_without_draining() {
        use crate::controller::run::status::{
            draining_status, finished_status, never_started_entry,
        };
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateTerminated, ContainerStatus,
        };
        let words = "egress gate: 10.0.0.1:10250 was still reachable after 60s (300 attempts)";
        let gate = |exit_code: i32| ContainerStatus {
            name: crate::inpod::gate::GATE_CONTAINER.into(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code,
                    message: Some(format!("{words}\n")),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut pod = pulling_pod("PodInitializing", "");
        let r = pending(run_with(&[("/out", true)]));
        // A gate that opened is no problem.
        pod.status.as_mut().unwrap().init_container_statuses = Some(vec![gate(0)]);
        assert_eq!(PodView::of(&pod).problem, None);
        assert!(matches!(
            decide(&r, Some(&PodView::of(&pod)), now(), &settings()),
            Step::TrackPod { .. }
        ));
        // One that gave up fails the run at once, with its words.
        pod.status.as_mut().unwrap().init_container_statuses = Some(vec![gate(1)]);
        let view = PodView::of(&pod);
        assert_eq!(
            view.problem,
            Some(PodProblem::EgressGate(words.to_string()))
        );
        let trigger = match decide(&r, Some(&view), now(), &settings()) {
            Step::Teardown(t @ Trigger::EgressGateFailed { .. }) => t,
            other => panic!("{other:?}"),
        };
        let mut s = draining_status(&r, &trigger, None, now());
        for e in s.read_back.iter_mut() {
            *e = never_started_entry(&e.path, &trigger);
            assert_eq!(e.phase, crate::api::ReadBackPhase::Empty);
        }
        // A teardown resumed after a restart finds the same trigger in the status.
        let mut resumed = r.clone();
        resumed.status = Some(s.clone());
        assert_eq!(resume_trigger(&resumed, &view), trigger);
        let done = finished_status(&r, s, now());
        assert_eq!(done.phase, Some(Phase::Failed));
        let failed = done
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::FAILED)
            .unwrap();
        assert_eq!(failed.reason, conditions::REASON_EGRESS_NOT_ENFORCED);
        let message = done.message.unwrap_or_default();
        assert!(
            message.contains("egress policy was not seen in force"),
            "{message}"
        );
        assert!(message.contains(words), "{message}");
        let (warning, reason, _) = crate::controller::events::teardown_event(&trigger);
        assert!(warning);
        assert_eq!(reason, "EgressNotEnforced");
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
            Step::TrackPod {
                requeue: Some(Duration::from_secs(300))
            }
        );
        assert_eq!(
            decide(&r, Some(&view), at(299), &s),
            Step::TrackPod {
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
            Step::TrackPod {
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
            Step::TrackPod { requeue: None }
        );
    }

    #[test]
    fn a_pod_that_vanishes_before_it_was_reported_makes_the_run_lost_not_a_second_pod() {
        let mut fresh = run_with(&[("/out", true)]);
        fresh.status = None;
        fresh.metadata.uid = Some("u1".into());
        let fresh = std::sync::Arc::new(fresh);
        let mut remembered = std::collections::HashSet::new();
        // Nothing remembered: a run with no status and no pod gets its pod.
        let seen = with_unreported_pod(fresh.clone(), &mut remembered);
        assert_eq!(decide(&seen, None, now(), &settings()), Step::CreatePod);
        // This replica created it and has not reported it: its pod vanished, the run is lost.
        remembered.insert("u1".to_string());
        let seen = with_unreported_pod(fresh.clone(), &mut remembered);
        assert_eq!(
            seen.status.as_ref().and_then(|s| s.pod_name.as_deref()),
            Some("demo-sbr")
        );
        assert_eq!(decide(&seen, None, now(), &settings()), Step::RecordPodLost);
        assert!(fresh.status.is_none(), "the cached run itself is untouched");
        // Deleted meanwhile: reported lost too, not released without a word.
        let mut deleted = (*fresh).clone();
        deleted.metadata.deletion_timestamp = Some(Time(now()));
        let seen = with_unreported_pod(std::sync::Arc::new(deleted), &mut remembered);
        assert_eq!(decide(&seen, None, now(), &settings()), Step::RecordPodLost);
        // Once the run has a phase it was reported: forgotten.
        let reported = std::sync::Arc::new(with_phase((*fresh).clone(), Phase::Running));
        let _ = with_unreported_pod(reported, &mut remembered);
        assert!(remembered.is_empty());
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
        assert_eq!(decide(&r, None, now(), &settings()), Step::RecordPodLost);
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
}
