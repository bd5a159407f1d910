//! Every Event reason the operator writes, in one table (docs/user-guide.md "Troubleshooting").
//!
//! Reasons are CamelCase like the rest of Kubernetes, except the two names ADR-143 fixes
//! ([`DRAIN_FAILED`], [`CAPPED`]; docs/contract.md §4). Each is an explicit constant, never the
//! `Debug` text of an enum, so renaming a Rust variant cannot rename an Event.

use crate::api::{Phase, SandboxRunStatus};
use crate::reconcile::condition;

/// The pod `<run>-sbr` was created.
pub const POD_CREATED: &str = crate::reconcile::REASON_POD_CREATED;
/// The apiserver refused the pod (quota, Pod Security, a webhook, RBAC); retried with back-off.
pub const POD_CREATE_FAILED: &str = crate::startup::REASON_POD_CREATE_FAILED;
/// The pod exists and cannot start; the note names the cause.
pub const POD_STUCK: &str = crate::startup::REASON_POD_STUCK;
/// The pod runs.
pub const RUNNING: &str = "Running";
/// Teardown began.
pub const TEARING_DOWN: &str = "TearingDown";
/// Every path of a teardown drained (none failed or capped).
pub const DRAINED: &str = crate::reconcile::REASON_DRAINED;
/// ADR-143 §4: a path could not be drained (the contract fixes this name).
pub const DRAIN_FAILED: &str = crate::reconcile::REASON_DRAIN_FAILED;
/// A path hit its cap (the contract fixes this name).
pub const CAPPED: &str = crate::reconcile::REASON_CAPPED;
/// Final phase `Succeeded`.
pub const SUCCEEDED: &str = "Succeeded";
/// Final phase `Failed`.
pub const FAILED: &str = "Failed";
/// Final phase `Stopped`.
pub const STOPPED: &str = "Stopped";
/// The pod cannot be built from the spec.
pub const INVALID_SPEC: &str = crate::reconcile::REASON_INVALID_SPEC;
/// The image can never be pulled: the run fails.
pub const IMAGE_PULL_FAILED: &str = crate::reconcile::REASON_IMAGE_PULL_FAILED;
/// The skip-drain annotation released the finalizer.
pub const DRAIN_SKIPPED: &str = "DrainSkipped";
/// A pod with the run's pod name exists and is not the run's.
pub const POD_NAME_CONFLICT: &str = "PodNameConflict";

/// `ttlSecondsAfterFinished` passed: the operator deleted the run.
pub const TTL_EXPIRED: &str = crate::retention::REASON_TTL_EXPIRED;
/// `retention: Delete`: the run's stored files were deleted.
pub const ARCHIVES_DELETED: &str = crate::retention::REASON_ARCHIVES_DELETED;
/// `retention: Delete`: the store refused a delete; retried.
pub const ARCHIVE_DELETE_FAILED: &str = crate::retention::REASON_ARCHIVE_DELETE_FAILED;
/// `retention: Delete`: the delete kept failing past the bound; the run was released.
pub const ARCHIVE_DELETE_ABANDONED: &str = crate::retention::REASON_ARCHIVE_DELETE_ABANDONED;

/// The run's NetworkPolicy is in place; the note says what it lets out and who enforces it.
pub const EGRESS_POLICY_APPLIED: &str = crate::egress::apply::REASON_EGRESS_POLICY_APPLIED;
/// The run restricts egress and NetworkPolicy is declared unenforced (`--network-policy`).
pub const EGRESS_POLICY_UNENFORCED: &str = crate::egress::apply::REASON_EGRESS_POLICY_UNENFORCED;

/// The two reasons whose spelling the contract fixes (not CamelCase).
pub const CONTRACT_REASONS: [&str; 2] = [DRAIN_FAILED, CAPPED];

/// Every Event reason the operator writes.
pub const ALL: &[&str] = &[
    POD_CREATED,
    POD_CREATE_FAILED,
    POD_STUCK,
    RUNNING,
    TEARING_DOWN,
    DRAINED,
    DRAIN_FAILED,
    CAPPED,
    SUCCEEDED,
    FAILED,
    STOPPED,
    INVALID_SPEC,
    IMAGE_PULL_FAILED,
    DRAIN_SKIPPED,
    POD_NAME_CONFLICT,
    TTL_EXPIRED,
    ARCHIVES_DELETED,
    ARCHIVE_DELETE_FAILED,
    ARCHIVE_DELETE_ABANDONED,
    EGRESS_POLICY_APPLIED,
    EGRESS_POLICY_UNENFORCED,
];

/// The reason of the Event that announces a final phase.
pub fn phase_reason(phase: Phase) -> &'static str {
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
pub fn ending_event(status: &SandboxRunStatus) -> (bool, &'static str) {
    let failed = status
        .conditions
        .iter()
        .any(|c| c.type_ == condition::FAILED && c.status == "True");
    let phase = status.phase.unwrap_or(Phase::Failed);
    (failed || phase == Phase::Failed, phase_reason(phase))
}

/// CamelCase: an ASCII upper-case letter, then ASCII letters and digits only.
pub fn is_camel_case(reason: &str) -> bool {
    let mut chars = reason.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase()) && chars.all(|c| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ReadBack, ReadBackPath, ReadBackPhase, SandboxRun, SandboxRunSpec};
    use crate::reconcile::{draining_status, finished_status, Trigger};
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
        let guide = include_str!("../docs/user-guide.md");
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
        let mut r = SandboxRun::new(
            "demo",
            SandboxRunSpec {
                stop: true,
                read_back: Some(ReadBack {
                    paths: vec![ReadBackPath {
                        path: "/out".into(),
                        required,
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        r.metadata.generation = Some(1);
        r
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
