//! Every Event reason the operator writes, in one table (docs/user-guide.md "Troubleshooting").
//!
//! Reasons are CamelCase like the rest of Kubernetes, except the two names the contract fixes
//! ([`DRAIN_FAILED`], [`CAPPED`]; docs/contract.md §4). Each is an explicit constant, never the
//! `Debug` text of an enum, so renaming a Rust variant cannot rename an Event.
//!
//! Also the Events themselves, as the plan stage wants them published ([`PlannedEvent`]): the
//! one summary of a teardown's paths ([`drain_summary`]), the opening and ending of a teardown,
//! and the one [`POD_STUCK`] Event per distinct cause ([`stuck_event`]). Pure.

use super::conditions::{self, condition_true};
use super::pod_view::PodProblem;
use super::run::decide::Trigger;
use crate::api::{Phase, ReadBackPhase, ReadBackStatus, SandboxRunStatus};
pub(crate) use crate::text::cut;

/// The pod `<run>-sbr` was created for a run already reported (refused before, or queued); a fresh
/// run's pod is not announced, its name is in the status (docs/contract.md "A quiet lifecycle").
pub(crate) const POD_CREATED: &str = conditions::REASON_POD_CREATED;
/// The apiserver refused the pod (quota, Pod Security, a webhook, RBAC); retried with back-off.
pub(crate) const POD_CREATE_FAILED: &str = conditions::REASON_POD_CREATE_FAILED;
/// The pod exists and cannot start; the note names the cause.
pub(crate) const POD_STUCK: &str = "PodStuck";
/// The pod runs, after a PodStuck had said what held it (a start without a problem is in the
/// status only).
pub(crate) const RUNNING: &str = "Running";
/// Teardown began, and its paths have not all drained within [`super::run::plan::SETTLE`] (or the
/// teardown begins with a Warning).
pub(crate) const TEARING_DOWN: &str = "TearingDown";
/// The teardown has waited for a drain slot past the quiet window; the note gives its place in
/// the queue (docs/contract.md "Fair drain slots").
pub(crate) const DRAIN_QUEUED: &str = "DrainQueued";
/// The reason of a drain summary where every path drained (none failed or capped). Never an
/// Event of its own: that summary is told in the note of the Event announcing the end.
pub(crate) const DRAINED: &str = "Drained";
/// docs/contract.md §4: a path could not be drained (the contract fixes this name).
pub(crate) const DRAIN_FAILED: &str = "sandbox_runfiles_drain_failed";
/// A path hit its cap (the contract fixes this name).
pub(crate) const CAPPED: &str = "sandbox_runfiles_readback_capped";
/// No path failed or was capped, and a path stored files that changed while the packer read them
/// (zero-padded or cut): a Warning, so a changed file never passes for a clean one
/// (docs/contract.md, "A changed file is never stored as a clean one").
pub(crate) const READ_BACK_CHANGED: &str = "ReadBackChanged";
/// Final phase `Succeeded`.
pub(crate) const SUCCEEDED: &str = "Succeeded";
/// Final phase `Failed`.
pub(crate) const FAILED: &str = "Failed";
/// Final phase `Stopped`.
pub(crate) const STOPPED: &str = "Stopped";
/// The pod cannot be built from the spec.
pub(crate) const INVALID_SPEC: &str = conditions::REASON_INVALID_SPEC;
/// The run's author's rights were not verified by an admission: no pod.
pub(crate) const RIGHTS_UNVERIFIED: &str = conditions::REASON_RIGHTS_UNVERIFIED;
/// An attempt of a run with `spec.retryPolicy` ended and another follows (docs/user-guide.md
/// "Retries").
pub(crate) const ATTEMPT_FAILED: &str = "AttemptFailed";
/// `spec.suspend` holds the run without a pod.
pub(crate) const SUSPENDED: &str = conditions::REASON_SUSPENDED;
/// A checkpoint of a running sandbox was taken (`spec.checkpoint`).
pub(crate) const CHECKPOINTED: &str = "Checkpointed";
/// A checkpoint was refused: the run has its `--max-checkpoints`.
pub(crate) const CHECKPOINT_REFUSED: &str = "CheckpointRefused";
/// The image can never be pulled: the run fails.
pub(crate) const IMAGE_PULL_FAILED: &str = conditions::REASON_IMAGE_PULL_FAILED;
/// The egress gate never saw the run's NetworkPolicy in force: the run fails, its workload never
/// started.
pub(crate) const EGRESS_NOT_ENFORCED: &str = conditions::REASON_EGRESS_NOT_ENFORCED;
/// The pre-flight found the image missing from its registry: the run fails without a pod.
pub(crate) const IMAGE_UNRESOLVABLE: &str = conditions::REASON_IMAGE_UNRESOLVABLE;
/// The pre-flight could not tell whether the image resolves (timeout, 5xx, connection refused,
/// auth): the pod is created anyway and the kubelet has the last word.
pub(crate) const IMAGE_UNVERIFIED: &str = "ImageUnverified";
/// The skip-drain annotation released the finalizer.
pub(crate) const DRAIN_SKIPPED: &str = "DrainSkipped";
/// A pod with the run's pod name exists and is not the run's.
pub(crate) const POD_NAME_CONFLICT: &str = "PodNameConflict";

/// `ttlSecondsAfterFinished` passed: the operator deleted the run.
pub(crate) const TTL_EXPIRED: &str = "TTLExpired";
/// `retention: Delete`: the run's stored files were deleted.
pub(crate) const ARCHIVES_DELETED: &str = "ArchivesDeleted";
/// `retention: Delete`: the store refused a delete; retried.
pub(crate) const ARCHIVE_DELETE_FAILED: &str = "ArchiveDeleteFailed";
/// `retention: Delete`: the delete kept failing past the bound; the run was released.
pub(crate) const ARCHIVE_DELETE_ABANDONED: &str = "ArchiveDeleteAbandoned";

/// The run's NetworkPolicy is in place; the note says what it lets out and who enforces it.
pub(crate) const EGRESS_POLICY_APPLIED: &str = "EgressPolicyApplied";
/// The run restricts egress and NetworkPolicy is declared unenforced (`--network-policy`): a
/// Warning Event, and the Ready reason of a run that does not start (`unenforced-refuse`).
pub(crate) const EGRESS_POLICY_UNENFORCED: &str = "EgressPolicyUnenforced";

/// The run's store cannot be used (docs/contract.md "A store per namespace"): a Warning Event,
/// and the Ready reason of a run whose pod is not created until it can.
pub(crate) const STORE_UNUSABLE: &str = "StoreUnusable";

/// The run's template cannot make its spec (docs/contract.md "Templates": it does not exist, or
/// the run sets a field it locks): a Warning Event, and the Ready reason of a run whose pod is
/// not created until it can.
pub(crate) const TEMPLATE_UNUSABLE: &str = "TemplateUnusable";

/// A run labelled for a Kueue queue while the operator runs without `--kueue`
/// (docs/contract.md "A queue label the operator does not honour is said, not ignored"): a
/// Warning Event, and the `Queued=False` reason `KueueDisabled`; the run runs unqueued.
pub(crate) const QUEUE_IGNORED: &str = "QueueIgnored";
/// A queued run's queue or priority-class label edited after its Workload was made
/// (docs/contract.md "A queued run keeps the queue and priority it was queued with"): a Warning
/// Event, once per edit; the run stays in the queue and at the priority it was queued with.
pub(crate) const QUEUE_LABEL_EDIT_IGNORED: &str = "QueueLabelEditIgnored";

/// An attempt's read-back paths were restored from an earlier attempt's files before its
/// workload started (docs/user-guide.md "Pause, resume and fork").
pub(crate) const WORKSPACE_RESTORED: &str = "WorkspaceRestored";
/// An attempt's read-back paths could not be restored (the store, a file that is not its
/// manifest's, the exec): its workload is never started and the attempt fails; the
/// `WorkspaceRestored` condition is False with this reason.
pub(crate) const RESTORE_FAILED: &str = "RestoreFailed";
#[cfg(test)]
/// The two reasons whose spelling the contract fixes (not CamelCase).
pub(crate) const CONTRACT_REASONS: [&str; 2] = [DRAIN_FAILED, CAPPED];

#[cfg(test)]
/// Every Event reason the operator writes.
pub(crate) const ALL: &[&str] = &[
    POD_CREATED,
    POD_CREATE_FAILED,
    POD_STUCK,
    RUNNING,
    TEARING_DOWN,
    DRAIN_QUEUED,
    DRAIN_FAILED,
    CAPPED,
    READ_BACK_CHANGED,
    SUCCEEDED,
    FAILED,
    STOPPED,
    INVALID_SPEC,
    IMAGE_PULL_FAILED,
    EGRESS_NOT_ENFORCED,
    IMAGE_UNRESOLVABLE,
    IMAGE_UNVERIFIED,
    DRAIN_SKIPPED,
    POD_NAME_CONFLICT,
    TTL_EXPIRED,
    ARCHIVES_DELETED,
    ARCHIVE_DELETE_FAILED,
    ARCHIVE_DELETE_ABANDONED,
    EGRESS_POLICY_APPLIED,
    EGRESS_POLICY_UNENFORCED,
    STORE_UNUSABLE,
    TEMPLATE_UNUSABLE,
    QUEUE_IGNORED,
    QUEUE_LABEL_EDIT_IGNORED,
    RIGHTS_UNVERIFIED,
    ATTEMPT_FAILED,
    SUSPENDED,
    CHECKPOINTED,
    CHECKPOINT_REFUSED,
    WORKSPACE_RESTORED,
    RESTORE_FAILED,
];

/// The reason of the Event that announces a final phase.
pub(crate) fn phase_reason(phase: Phase) -> &'static str {
    match phase {
        Phase::Succeeded => SUCCEEDED,
        Phase::Stopped => STOPPED,
        // Failed, and defensively any phase that is not final.
        _ => FAILED,
    }
}

/// The Event that announces how a run ended: (Warning?, reason). Its type follows the Failed
/// condition (batch/v1 Job semantics, docs/user-guide.md "Lifecycle"), not the phase: a run
/// `Stopped` by the user whose drain failed, or stopped by its deadline, ended badly and says so
/// with a Warning.
pub(crate) fn ending_event(status: &SandboxRunStatus) -> (bool, &'static str) {
    let failed = condition_true(Some(status), conditions::FAILED);
    let phase = status.phase.unwrap_or(Phase::Failed);
    (failed || phase == Phase::Failed, phase_reason(phase))
}

/// An Event a stage plans: [`super::run::act`] publishes it about the run, with the run's pod as
/// `related` (the Events API's `related`, kube's `secondary`) when `about_pod`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PlannedEvent {
    /// Warning, else Normal.
    pub warning: bool,
    /// One of [`ALL`].
    pub reason: &'static str,
    /// What happened, in words (cut to [`EVENT_NOTE_LIMIT`] when published).
    pub note: String,
    /// The Events API's `action`.
    pub action: &'static str,
    /// Whether the Event names the pod as `related`.
    pub about_pod: bool,
}

impl PlannedEvent {
    /// A Normal Event.
    pub(crate) fn normal(
        reason: &'static str,
        note: impl Into<String>,
        action: &'static str,
    ) -> Self {
        PlannedEvent {
            warning: false,
            reason,
            note: note.into(),
            action,
            about_pod: false,
        }
    }

    /// A Warning Event.
    pub(crate) fn warning(
        reason: &'static str,
        note: impl Into<String>,
        action: &'static str,
    ) -> Self {
        PlannedEvent {
            warning: true,
            ..PlannedEvent::normal(reason, note, action)
        }
    }

    /// The same Event, naming the pod as `related`.
    pub(crate) fn about_pod(mut self) -> Self {
        self.about_pod = true;
        self
    }
}

/// The [`POD_STUCK`] Event to publish when the pod's `problem` is a cause Ready did not already
/// name ([`newly_stuck`]). Its action is the cause: the Recorder folds Events that share type,
/// reason and action into one series that keeps the FIRST note, so a second cause under one
/// action would be hidden behind the first.
pub(crate) fn stuck_event(
    before: &SandboxRunStatus,
    problem: Option<&PodProblem>,
) -> Option<PlannedEvent> {
    let note = newly_stuck(before, problem)?;
    let problem = problem?;
    Some(PlannedEvent::warning(POD_STUCK, note, problem.reason()).about_pod())
}

/// The note of the PodStuck Event to publish when the pod's `problem` is a cause Ready (in the
/// status `before` this reconcile) did not already name: `<reason>: <message>`. None when there
/// is no problem or Ready already says exactly this, so each distinct cause is told once.
pub(crate) fn newly_stuck(
    before: &SandboxRunStatus,
    problem: Option<&PodProblem>,
) -> Option<String> {
    let problem = problem?;
    let told = before.conditions.iter().any(|c| {
        c.type_ == conditions::READY
            && c.status == "False"
            && c.reason == problem.reason()
            && c.message == problem.message()
    });
    (!told).then(|| format!("{}: {}", problem.reason(), problem.message()))
}

/// The Event that opens a teardown: (Warning?, reason, note). An image that cannot be pulled is
/// a Warning with reason [`IMAGE_PULL_FAILED`] and the kubelet's words (the run fails on
/// it, possibly without any Track Event having said so); every other trigger is a Normal
/// `TearingDown`.
pub(crate) fn teardown_event(trigger: &Trigger) -> (bool, &'static str, String) {
    match trigger {
        Trigger::ImagePullFailed { message } => (true, IMAGE_PULL_FAILED, never_started(message)),
        Trigger::EgressGateFailed { message } => {
            (true, EGRESS_NOT_ENFORCED, never_started(message))
        }
        _ => (
            false,
            TEARING_DOWN,
            format!("{}; draining", trigger.describe()),
        ),
    }
}

/// The note of a teardown whose workload never started.
fn never_started(message: &str) -> String {
    format!("{message}; the workload never started, the run fails without draining")
}

/// Longest Event note we write: the Events API refuses a note over 1 KiB; this leaves room.
pub(crate) const EVENT_NOTE_LIMIT: usize = 1000;
/// Longest description of one path in a drain summary, so that one long failure message cannot
/// hide every other path.
const SUMMARY_PART_LIMIT: usize = 300;
/// Room kept for the "N more path(s) elided" tail while paths are added.
const SUMMARY_ELISION_RESERVE: usize = 64;

/// One Event that tells the outcome of every path of a teardown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DrainSummary {
    /// Warning when a path failed, was capped or stored changed files, else Normal.
    pub warning: bool,
    /// [`DRAIN_FAILED`] when any path failed (the contract requires that reason for a failed
    /// drain), else [`CAPPED`] when any path was capped, else [`READ_BACK_CHANGED`] when a path
    /// stored changed files, else [`DRAINED`].
    pub reason: &'static str,
    /// Every path's phase, members, bytes, dropped members and message, most severe first;
    /// at most [`EVENT_NOTE_LIMIT`] bytes, saying how many paths did not fit.
    pub note: String,
}

impl DrainSummary {
    /// The summary as an Event with `action`.
    pub(crate) fn into_event(self, action: &'static str) -> PlannedEvent {
        PlannedEvent {
            warning: self.warning,
            reason: self.reason,
            note: self.note,
            action,
            about_pod: false,
        }
    }
}

/// Summarizes the outcome of every path in ONE Event.
///
/// kube-runtime's `Recorder` folds Events with the same type, reason, action and object into one
/// series that keeps the FIRST note, so one Event per path showed a single path in `kubectl
/// describe` (issue #17). Returns None when the run declares no path.
pub(crate) fn drain_summary(entries: &[ReadBackStatus]) -> Option<DrainSummary> {
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
        (true, DRAIN_FAILED)
    } else if any(ReadBackPhase::Capped) {
        (true, CAPPED)
    } else if entries.iter().any(|e| e.changed_members > 0) {
        (true, READ_BACK_CHANGED)
    } else {
        (false, DRAINED)
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
            counts.push(format!("{n} {}", phase.as_str()));
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
        "{}: {}, {} member(s), {} byte(s)",
        e.path,
        e.phase.as_str(),
        e.members,
        e.bytes
    );
    if e.dropped_members > 0 {
        out.push_str(&format!(", {} member(s) dropped", e.dropped_members));
    }
    if e.rejected_members > 0 {
        out.push_str(&format!(", {} member(s) rejected", e.rejected_members));
    }
    if e.changed_members > 0 {
        out.push_str(&format!(
            ", {} member(s) changed while read",
            e.changed_members
        ));
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

#[cfg(test)]
/// CamelCase: an ASCII upper-case letter, then ASCII letters and digits only.
pub(crate) fn is_camel_case(reason: &str) -> bool {
    let mut chars = reason.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase()) && chars.all(|c| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SandboxRun;
    use crate::controller::run::status::{draining_status, finished_status};
    use jiff::Timestamp;

    #[test]
    fn every_reason_is_camel_case_except_the_two_the_contract_fixes() {
        for reason in ALL {
            assert!(
                is_camel_case(reason) != CONTRACT_REASONS.contains(reason),
                "{reason}"
            );
            // The Events API refuses a reason over 128 characters.
            assert!(reason.len() <= 128, "{reason}");
        }
        assert_eq!(
            CONTRACT_REASONS,
            [
                "sandbox_runfiles_drain_failed",
                "sandbox_runfiles_readback_capped"
            ]
        );
        let mut unique = ALL.to_vec();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ALL.len(), "a reason is listed twice");
        assert!(is_camel_case("PodCreateFailed"));
        for bad in ["podCreated", "Pod_Created", "Pod Created", "", "Stopped!"] {
            assert!(!is_camel_case(bad), "{bad}");
        }
    }

    #[test]
    fn phases_have_explicit_reasons() {
        assert_eq!(phase_reason(Phase::Succeeded), "Succeeded");
        assert_eq!(phase_reason(Phase::Failed), "Failed");
        assert_eq!(phase_reason(Phase::Stopped), "Stopped");
        assert_eq!(phase_reason(Phase::Draining), "Failed");
    }

    /// The troubleshooting table of the user guide explains every reason the operator writes.
    #[test]
    fn the_user_guide_troubleshooting_table_lists_every_reason() {
        let guide = include_str!("../../docs/user-guide.md");
        let table = guide
            .split("| Event reason | Type |")
            .nth(1)
            .expect("docs/user-guide.md has the Event reason table");
        for reason in ALL {
            assert!(
                table.contains(&format!("`{reason}`")),
                "docs/user-guide.md's Event table does not explain {reason}"
            );
        }
    }

    fn stopped_run(required: bool) -> SandboxRun {
        crate::testkit::sandbox_run("demo")
            .read_back_required(&[("/out", required)])
            .edit(|spec| spec.stop = true)
            .generation(1)
            .build()
    }

    fn ended(run: &SandboxRun, trigger: Trigger, phase: ReadBackPhase) -> SandboxRunStatus {
        let now: Timestamp = "2026-11-30T12:00:00Z".parse().unwrap();
        let mut s = draining_status(run, &trigger, None, now);
        s.read_back.iter_mut().for_each(|e| e.phase = phase);
        finished_status(run, s, now)
    }

    #[test]
    fn the_ending_event_is_a_warning_exactly_when_the_run_failed() {
        // Stopped by the user, the drain of an optional path failed: phase Stopped, Failed=True.
        let s = ended(&stopped_run(false), Trigger::Stop, ReadBackPhase::Failed);
        assert_eq!(s.phase, Some(Phase::Stopped));
        assert_eq!(ending_event(&s), (true, STOPPED));
        // Stopped by the user, drained: Complete, Normal.
        let s = ended(&stopped_run(false), Trigger::Stop, ReadBackPhase::Drained);
        assert_eq!(ending_event(&s), (false, STOPPED));
        // Stopped by the deadline: Failed=True (DeadlineExceeded), a Warning though drained.
        let s = ended(
            &stopped_run(false),
            Trigger::Deadline,
            ReadBackPhase::Drained,
        );
        assert_eq!(s.phase, Some(Phase::Stopped));
        assert_eq!(ending_event(&s), (true, STOPPED));
        // A workload that failed, and one that succeeded.
        let s = ended(
            &stopped_run(false),
            Trigger::WorkloadFinished { exit_code: 1 },
            ReadBackPhase::Drained,
        );
        assert_eq!(ending_event(&s), (true, FAILED));
        let s = ended(
            &stopped_run(true),
            Trigger::WorkloadFinished { exit_code: 0 },
            ReadBackPhase::Drained,
        );
        assert_eq!(ending_event(&s), (false, SUCCEEDED));
    }
}

#[cfg(test)]
mod summary_tests {
    use super::*;
    use crate::controller::testkit::fixtures::*;

    #[test]
    fn a_changed_member_makes_the_summary_a_warning() {
        let mut changed = entry("/out", ReadBackPhase::Drained, None);
        changed.changed_members = 2;
        let s =
            drain_summary(&[changed.clone(), entry("/logs", ReadBackPhase::Empty, None)]).unwrap();
        assert_eq!((s.warning, s.reason), (true, READ_BACK_CHANGED));
        assert!(
            s.note.contains("2 member(s) changed while read"),
            "{}",
            s.note
        );
        // The contract's reasons win; the note still says it.
        let capped = entry("/big", ReadBackPhase::Capped, None);
        let s = drain_summary(&[changed, capped]).unwrap();
        assert_eq!((s.warning, s.reason), (true, CAPPED));
        assert!(
            s.note.contains("2 member(s) changed while read"),
            "{}",
            s.note
        );
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
        assert_eq!((s.warning, s.reason), (false, DRAINED));
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
        assert_eq!((s.warning, s.reason), (true, DRAIN_FAILED));
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
        assert_eq!((s.warning, s.reason), (true, CAPPED));
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
}
