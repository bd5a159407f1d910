//! The status of a run that ends without a drain: its pod lost before teardown, a workload that
//! never started, an image that does not resolve.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::super::decide::Trigger;
use super::ending::{end_status, set_drained, POD_GONE};
use super::entries::ensure_pending_entries;
use crate::api::{Phase, ReadBackPhase, ReadBackStatus, SandboxRun, SandboxRunStatus};
use crate::controller::conditions::{
    self, remove_condition, set_condition, REASON_IMAGE_UNRESOLVABLE,
};

/// The status when the pod vanished before teardown: every undrained path is a failure, never an
/// empty set (docs/contract.md §4), and the run failed (Failed=True, reason [`REASON_POD_LOST`]) unless
/// its workload had already finished and every required path had drained.
///
/// `committed` holds the status entries of paths whose manifest the store already has (an
/// operator that committed a path and died before recording it): such a path was drained, and
/// keeps that outcome instead of being marked Failed (docs/contract.md §4).
pub(crate) fn pod_lost_status(
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
        conditions::READY,
        false,
        conditions::REASON_POD_GONE,
        POD_GONE,
        generation,
        now,
    );
    status.message = Some(POD_GONE.to_string());
    end_status(run, status, true, now)
}

/// The status entry of a declared path whose workload never started: it wrote nothing, so
/// nothing is drained (`Empty`, no exec, no object), and the message says why.
pub(crate) fn never_started_entry(path: &str, trigger: &Trigger) -> ReadBackStatus {
    let message = match trigger {
        Trigger::ImagePullFailed { .. } => NEVER_STARTED_IMAGE_PULL,
        Trigger::EgressGateFailed { .. } => NEVER_STARTED_EGRESS_GATE,
        _ => "the workload never started, so it wrote nothing",
    };
    ReadBackStatus {
        path: path.to_string(),
        phase: ReadBackPhase::Empty,
        message: Some(message.to_string()),
        ..Default::default()
    }
}

/// The final status of a run whose image the pre-flight (`run --preflight-images`) found missing
/// from its registry (docs/contract.md ADR-006 §5): its pod was never created, so the run fails
/// at once — phase `Failed`, `Failed=True` and `Ready=False` with reason
/// [`REASON_IMAGE_UNRESOLVABLE`] and `message` (the registry's words and the hint) — and every
/// declared path is `Empty` (the workload never ran, so it wrote nothing; never a drain failure).
pub(crate) fn image_unresolvable_status(
    run: &SandboxRun,
    message: &str,
    now: Timestamp,
) -> SandboxRunStatus {
    let mut status = run.status.clone().unwrap_or_default();
    let generation = run.metadata.generation;
    ensure_pending_entries(run, &mut status);
    for e in status
        .read_back
        .iter_mut()
        .filter(|e| e.phase == ReadBackPhase::Pending)
    {
        e.phase = ReadBackPhase::Empty;
        e.message = Some(NEVER_STARTED_UNRESOLVABLE.to_string());
    }
    set_drained(run, &mut status, now);
    status.observed_generation = generation;
    status.phase = Some(Phase::Failed);
    status.message = Some(message.to_string());
    status.completion_time = Some(Time(now));
    status.duration = run
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| crate::units::short_duration(now.duration_since(t.0)));
    for type_ in [conditions::FAILED, conditions::READY] {
        set_condition(
            &mut status.conditions,
            type_,
            type_ == conditions::FAILED,
            REASON_IMAGE_UNRESOLVABLE,
            message,
            generation,
            now,
        );
    }
    remove_condition(&mut status.conditions, conditions::COMPLETE);
    status
}

/// The message of a path whose workload never started because the pre-flight found its image
/// missing.
pub(crate) const NEVER_STARTED_UNRESOLVABLE: &str =
    "the workload never started because its image does not resolve, so it wrote nothing; nothing was drained";

/// The message of a path whose workload never started because its image could not be pulled.
pub(crate) const NEVER_STARTED_IMAGE_PULL: &str =
    "the workload never started because its image could not be pulled, so it wrote nothing; nothing was drained";

/// The message of a path whose workload never started because the egress gate gave up.
pub(crate) const NEVER_STARTED_EGRESS_GATE: &str =
    "the workload never started because its egress policy was not seen in force, so it wrote nothing; nothing was drained";

#[cfg(test)]
mod tests {
    use super::*;

    use crate::controller::conditions::*;
    use crate::controller::run::decide::{decide, Step};

    use crate::controller::testkit::fixtures::*;

    use crate::controller::run::status::*;

    #[test]
    fn pod_gone_before_teardown_is_a_loss_never_an_empty_set() {
        let r = with_phase(
            run_with(&[("/out", true), ("/logs", false)]),
            Phase::Running,
        );
        assert_eq!(decide(&r, None, now(), &settings()), Step::RecordPodLost);
        let s = pod_lost_status(&r, &[], now());
        assert_eq!(s.phase, Some(Phase::Failed));
        assert!(s
            .read_back
            .iter()
            .all(|e| e.phase == ReadBackPhase::Failed && e.message.is_some()));
        let drained = s
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::DRAINED)
            .unwrap();
        assert_eq!(
            (drained.status.as_str(), drained.reason.as_str()),
            ("False", "DrainFailed")
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
    fn a_lost_pod_is_failed_with_pod_lost() {
        let r = with_generation(with_phase(
            run_with(&[("/out", true), ("/logs", false)]),
            Phase::Running,
        ));
        let done = pod_lost_status(&r, &[], now());
        assert_eq!(done.phase, Some(Phase::Failed));
        assert_one_ending(&done);
        assert_eq!(
            cond_of(&done, conditions::FAILED),
            pair("True", REASON_POD_LOST)
        );
        assert_eq!(cond_of(&done, conditions::COMPLETE), None);
        assert_eq!(done.message.as_deref(), Some(POD_GONE));

        // Also with no path at all, and while a deadline teardown was draining.
        let r = with_generation(with_phase(run_with(&[]), Phase::Running));
        let done = pod_lost_status(&r, &[], now());
        assert_eq!(
            cond_of(&done, conditions::FAILED),
            pair("True", REASON_POD_LOST)
        );
        let mut r = with_generation(with_phase(run_with(&[("/out", false)]), Phase::Running));
        r.status = Some(draining_status(&r, &Trigger::Deadline, None, now()));
        let done = pod_lost_status(&r, &[], now());
        assert_eq!(
            cond_of(&done, conditions::FAILED),
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
            cond_of(&done, conditions::COMPLETE),
            pair("True", "Succeeded")
        );
        // A required path still pending when the pod vanished: the pod's loss is why.
        let mut r3 = r.clone();
        r3.status = Some(draining_status(&r, &t, None, now()));
        let done = pod_lost_status(&r3, &[], now());
        assert_eq!(done.phase, Some(Phase::Failed));
        assert_eq!(
            cond_of(&done, conditions::FAILED),
            pair("True", REASON_POD_LOST)
        );
    }
}
