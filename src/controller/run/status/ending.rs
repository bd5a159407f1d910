//! The status of a run that ends: Draining while its paths drain, then its final phase, the
//! `Complete`/`Failed` conditions with the first cause, and `Drained` (docs/contract.md).

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::super::decide::Trigger;
use super::entries::ensure_pending_entries;
use crate::api::{
    Phase, ReadBackPhase, ReadBackStatus, SandboxRun, SandboxRunStatus, WorkloadTermination,
};
use crate::controller::conditions::{
    self, condition_true, ready_false_reason, remove_condition, set_condition,
    set_condition_unknown, start_failure, StartFailure, REASON_CONDITION_DRAIN_FAILED,
    REASON_DEADLINE_EXCEEDED, REASON_POD_DELETED, REASON_POD_LOST, REASON_RUN_ENDED,
    REASON_WORKLOAD_FAILED,
};
use crate::controller::events;

/// The status at the start of teardown. `workload` is how the workload container terminated
/// ([`workload_termination`] of the pod, read before the pod is deleted); it is recorded in
/// `status.workload` whatever the trigger, and an earlier record is never cleared.
pub(crate) fn draining_status(
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
            conditions::WORKLOAD_FINISHED,
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
        Trigger::ImagePullFailed { .. } | Trigger::EgressGateFailed { .. } => trigger
            .start_failure()
            .map(|(failure, message)| (failure.reason(), message.to_string()))
            .unwrap_or_default(),
        Trigger::Deadline => (REASON_DEADLINE_EXCEEDED, trigger.describe()),
        Trigger::PodDeleting => (REASON_POD_DELETED, trigger.describe()),
        Trigger::Preempted { .. } => (conditions::REASON_PREEMPTED, trigger.describe()),
        _ => (conditions::REASON_TEARING_DOWN, trigger.describe()),
    };
    set_condition(
        &mut status.conditions,
        conditions::READY,
        false,
        ready_reason,
        ready_message,
        generation,
        now,
    );
    set_condition_unknown(
        &mut status.conditions,
        conditions::DRAINED,
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
pub(crate) fn finished_status(
    run: &SandboxRun,
    status: SandboxRunStatus,
    now: Timestamp,
) -> SandboxRunStatus {
    end_status(run, status, false, now)
}

/// What the end of a run says about it, read from its status before the final conditions are
/// written: the inputs of the final phase and of [`failure_reason`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ending {
    /// The final phase.
    pub phase: Phase,
    /// The workload container terminated (WorkloadFinished=True).
    pub workload_finished: bool,
    /// Its exit code, when it did.
    pub exit_code: Option<i32>,
    /// The workload never started, and why (an image could not be pulled, the egress gate).
    pub start_failed: Option<StartFailure>,
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
/// - phase `Failed`: the [`StartFailure`]'s reason (`ImagePullFailed`, `EgressNotEnforced`),
///   [`REASON_WORKLOAD_FAILED`] (non-zero exit),
///   [`REASON_POD_LOST`] (the pod vanished before teardown), else [`REASON_CONDITION_DRAIN_FAILED`] (a
///   `required` path failed);
/// - phase `Stopped`: [`REASON_DEADLINE_EXCEEDED`], [`REASON_POD_DELETED`], then
///   [`REASON_CONDITION_DRAIN_FAILED`] when any path failed, else None (`spec.stop` or deletion, drained).
pub(crate) fn failure_reason(e: &Ending) -> Option<&'static str> {
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
        _ => Some(if let Some(failure) = e.start_failed {
            failure.reason()
        } else if e.workload_finished && e.exit_code != Some(0) {
            REASON_WORKLOAD_FAILED
        } else if e.pod_vanished {
            REASON_POD_LOST
        } else {
            REASON_CONDITION_DRAIN_FAILED
        }),
    }
}

/// [`finished_status`]; `pod_vanished` when the pod was gone before teardown drained it
/// ([`pod_lost_status`]).
pub(super) fn end_status(
    run: &SandboxRun,
    mut status: SandboxRunStatus,
    pod_vanished: bool,
    now: Timestamp,
) -> SandboxRunStatus {
    let generation = run.metadata.generation;
    let required_failed = set_drained(run, &mut status, now);
    let (ending, pull_failed) = ending_of(run, &status, pod_vanished, required_failed);
    let why = ending_message(&ending, &status, required_failed, pull_failed.as_deref());
    let pull_failed = ending.start_failed;
    let phase = ending.phase;
    status.phase = Some(phase);
    status.message = Some(why.clone());
    status.completion_time = Some(Time(now));
    // status.duration, for `kubectl get sbr -o wide`: from the pod's start, else the run's creation.
    let began = status
        .start_time
        .as_ref()
        .or(run.metadata.creation_timestamp.as_ref())
        .map(|t| t.0);
    status.duration = began.map(|b| crate::units::short_duration(now.duration_since(b)));
    status.observed_generation = generation;
    set_ending_conditions(
        &mut status,
        &ending,
        why,
        pull_failed.is_some(),
        generation,
        now,
    );
    status
}

/// Sets Drained from the outcome of every path; whether a `required` path failed.
pub(super) fn set_drained(run: &SandboxRun, status: &mut SandboxRunStatus, now: Timestamp) -> bool {
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
        let mut msg = if capped > 0 {
            format!(
                "every path drained; {capped} capped (dropped members are listed in the manifest)"
            )
        } else {
            "every read-back path drained".to_string()
        };
        let changed: u64 = status.read_back.iter().map(|e| e.changed_members).sum();
        if changed > 0 {
            msg.push_str(&format!(
                "; {changed} stored file(s) changed while read (listed in the manifests' changed)"
            ));
        }
        set_condition(
            &mut status.conditions,
            conditions::DRAINED,
            true,
            "Drained",
            msg,
            generation,
            now,
        );
    } else {
        let which: Vec<&str> = failed.iter().map(|e| e.path.as_str()).collect();
        let msg = format!(
            "drain failed for {}; see the sandbox_runfiles_drain_failed Events",
            which.join(", ")
        );
        set_condition(
            &mut status.conditions,
            conditions::DRAINED,
            false,
            REASON_CONDITION_DRAIN_FAILED,
            msg,
            generation,
            now,
        );
    }
    required_failed
}

/// What the end says about the run, read from its status before the final conditions are
/// written, and the kubelet's words when the workload never started because an image could not
/// be pulled.
pub(super) fn ending_of(
    run: &SandboxRun,
    status: &SandboxRunStatus,
    pod_vanished: bool,
    required_failed: bool,
) -> (Ending, Option<String>) {
    let finished = condition_true(Some(status), conditions::WORKLOAD_FINISHED);
    // The workload never started because an image could not be pulled (Ready=False with reason
    // ImagePullFailed, kept by draining_status): the run failed, and the kubelet's words say why.
    let pull_failed = !finished && status.start_time.is_none() && status.exit_code.is_none();
    let never_started = pull_failed.then(|| start_failure(status)).flatten();
    let start_failed = never_started.as_ref().map(|(failure, _)| *failure);
    let pull_failed = never_started.map(|(failure, message)| {
        format!(
            "the workload never started: {}: {message}",
            failure.because()
        )
    });
    // How teardown began, recorded in Ready's reason by draining_status (read before Ready says
    // the run ended).
    let ready_reason = ready_false_reason(status);
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
    let ending = Ending {
        phase,
        workload_finished: finished,
        exit_code: status.exit_code,
        start_failed,
        pod_vanished,
        deadline,
        pod_deleted,
        any_failed: status
            .read_back
            .iter()
            .any(|e| e.phase == ReadBackPhase::Failed),
    };
    (ending, pull_failed)
}

/// The final `status.message`: why the run ended as it did.
pub(super) fn ending_message(
    e: &Ending,
    status: &SandboxRunStatus,
    required_failed: bool,
    pull_failed: Option<&str>,
) -> String {
    let pod_lost = e.pod_vanished && !e.workload_finished;
    match (e.phase, required_failed) {
        (Phase::Succeeded, _) => succeeded_message(status),
        _ if pull_failed.is_some() => pull_failed.unwrap_or_default().to_string(),
        _ if pod_lost => POD_GONE.to_string(),
        (Phase::Failed, false) if e.workload_finished => {
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
            let cause = if e.deadline {
                "run stopped: activeDeadlineSeconds passed"
            } else if e.pod_deleted {
                "run stopped: the pod was deleted or evicted"
            } else {
                "run stopped"
            };
            let drains = if e.any_failed {
                "a read-back path could not be drained (see the Drained condition)"
            } else {
                "read-back paths drained"
            };
            format!("{cause}; {drains}")
        }
    }
}

/// The final message of a `Succeeded` run: what became of its files. An optional path that
/// failed keeps the success (docs/contract.md) but is said here, next to `Drained=False` and the
/// `sandbox_runfiles_drain_failed` Event, never hidden behind "stored".
fn succeeded_message(status: &SandboxRunStatus) -> String {
    let total = status.read_back.len();
    let failed = status
        .read_back
        .iter()
        .filter(|e| e.phase == ReadBackPhase::Failed)
        .count();
    if total == 0 {
        return "workload succeeded (it declares no read-back paths)".to_string();
    }
    if failed == 0 {
        return "workload succeeded and its read-back paths are stored".to_string();
    }
    format!(
        "workload succeeded; {failed} of {total} read-back paths failed to drain \
         (see the sandbox_runfiles_drain_failed Event)"
    )
}

/// Sets Complete or Failed (exactly one, [`failure_reason`]) and Ready once the run ended.
pub(super) fn set_ending_conditions(
    status: &mut SandboxRunStatus,
    ending: &Ending,
    why: String,
    pull_failed: bool,
    generation: Option<i64>,
    now: Timestamp,
) {
    let phase = ending.phase;
    match failure_reason(ending) {
        None => {
            set_condition(
                &mut status.conditions,
                conditions::COMPLETE,
                true,
                events::phase_reason(phase),
                why,
                generation,
                now,
            );
            remove_condition(&mut status.conditions, conditions::FAILED);
        }
        Some(reason) => {
            set_condition(
                &mut status.conditions,
                conditions::FAILED,
                true,
                reason,
                why,
                generation,
                now,
            );
            remove_condition(&mut status.conditions, conditions::COMPLETE);
        }
    }
    // Ready says the run ended, except when the pod never ran because of its image: Ready keeps
    // ImagePullFailed and the kubelet's words.
    if !pull_failed {
        set_condition(
            &mut status.conditions,
            conditions::READY,
            false,
            REASON_RUN_ENDED,
            format!("the run ended ({}); its pod is deleted", phase.as_str()),
            generation,
            now,
        );
    } else if let Some(ready) = status
        .conditions
        .iter_mut()
        .find(|c| c.type_ == conditions::READY)
    {
        ready.observed_generation = generation;
    }
}

/// Why the drain of a path failed when the pod was gone before teardown.
pub(crate) const POD_GONE: &str =
    "the pod was gone before teardown (deleted or evicted); its emptyDirs went with it and nothing could be drained";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::conditions::REASON_IMAGE_PULL_FAILED;

    use super::super::lost::*;
    use crate::controller::events::teardown_event;
    use crate::controller::pod_view::workload_termination;
    use crate::controller::run::decide::{decide, Step};
    use crate::controller::run::status::*;
    use crate::controller::testkit::fixtures::*;

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
            .find(|c| c.type_ == conditions::WORKLOAD_FINISHED)
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
            .find(|c| c.type_ == conditions::DRAINED)
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
            .any(|c| c.type_ == conditions::COMPLETE && c.status == "True"));
    }

    #[test]
    fn a_success_whose_optional_path_failed_says_the_files_were_not_stored() {
        let r = run_with(&[("/out", true), ("/logs", false)]);
        let t = Trigger::WorkloadFinished { exit_code: 0 };
        let mut s = draining_status(&r, &t, None, now());
        s.read_back[0].phase = ReadBackPhase::Drained;
        s.read_back[1].phase = ReadBackPhase::Failed;
        let done = finished_status(&r, s, now());
        assert_eq!(done.phase, Some(Phase::Succeeded));
        let want = "workload succeeded; 1 of 2 read-back paths failed to drain \
                    (see the sandbox_runfiles_drain_failed Event)";
        assert_eq!(done.message.as_deref(), Some(want));
        let complete = done
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::COMPLETE)
            .expect("Complete");
        assert_eq!(
            complete.message, want,
            "the Complete condition and the Event"
        );
        assert!(!want.contains("are stored"));

        // Every path drained: the files are stored, and the message says so.
        let mut s = draining_status(&r, &t, None, now());
        s.read_back
            .iter_mut()
            .for_each(|e| e.phase = ReadBackPhase::Drained);
        assert_eq!(
            finished_status(&r, s, now()).message.as_deref(),
            Some("workload succeeded and its read-back paths are stored")
        );
    }

    #[test]
    fn a_run_with_no_read_back_paths_is_never_told_its_paths_are_stored() {
        let r = run_with(&[]);
        let t = Trigger::WorkloadFinished { exit_code: 0 };
        let done = finished_status(&r, draining_status(&r, &t, None, now()), now());
        assert_eq!(done.phase, Some(Phase::Succeeded));
        let message = done.message.unwrap_or_default();
        assert!(!message.contains("stored"), "{message}");
        assert_eq!(
            message,
            "workload succeeded (it declares no read-back paths)"
        );
    }

    #[test]
    fn the_drained_condition_counts_changed_members_without_failing_the_run() {
        let r = run_with(&[("/out", true), ("/logs", false)]);
        let t = Trigger::WorkloadFinished { exit_code: 0 };
        let mut s = draining_status(&r, &t, None, now());
        s.read_back
            .iter_mut()
            .for_each(|e| e.phase = ReadBackPhase::Drained);
        s.read_back[0].changed_members = 2;
        let done = finished_status(&r, s, now());
        assert_eq!(done.phase, Some(Phase::Succeeded));
        let drained = done
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::DRAINED)
            .expect("Drained");
        assert_eq!(drained.status, "True");
        assert!(
            drained
                .message
                .contains("2 stored file(s) changed while read"),
            "{}",
            drained.message
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
                cond(conditions::READY).status.as_str(),
                cond(conditions::READY).reason.as_str()
            ),
            ("False", REASON_IMAGE_PULL_FAILED)
        );
        assert_eq!(cond(conditions::READY).message, message);
        assert_eq!(
            (
                cond(conditions::FAILED).status.as_str(),
                cond(conditions::FAILED).reason.as_str()
            ),
            ("True", REASON_IMAGE_PULL_FAILED)
        );
        assert!(cond(conditions::FAILED).message.contains(NOT_FOUND));
        assert!(!done
            .conditions
            .iter()
            .any(|c| c.type_ == conditions::COMPLETE));
        assert_eq!(cond(conditions::DRAINED).status, "True");

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

    #[test]
    fn a_succeeded_run_is_complete_and_not_failed() {
        let r = with_generation(with_phase(run_with(&[("/out", true)]), Phase::Running));
        let t = Trigger::WorkloadFinished { exit_code: 0 };
        let s = drain_all(draining_status(&r, &t, None, now()), ReadBackPhase::Drained);
        let done = finished_status(&r, s, now());
        assert_eq!(done.phase, Some(Phase::Succeeded));
        assert_one_ending(&done);
        assert_eq!(
            cond_of(&done, conditions::COMPLETE),
            pair("True", "Succeeded")
        );
        assert_eq!(cond_of(&done, conditions::FAILED), None);
        assert_eq!(
            cond_of(&done, conditions::READY),
            pair("False", REASON_RUN_ENDED)
        );
        assert_eq!(cond_of(&done, conditions::DRAINED), pair("True", "Drained"));
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
            cond_of(&done, conditions::FAILED),
            pair("True", REASON_WORKLOAD_FAILED)
        );
        assert_eq!(cond_of(&done, conditions::COMPLETE), None);
        assert_eq!(
            cond_of(&done, conditions::READY),
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
            cond_of(&done, conditions::FAILED),
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
                cond_of(&done, conditions::COMPLETE),
                pair("True", "Stopped"),
                "{trigger:?}"
            );
            assert_eq!(cond_of(&done, conditions::FAILED), None, "{trigger:?}");
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
            cond_of(&done, conditions::FAILED),
            pair("True", REASON_CONDITION_DRAIN_FAILED)
        );
        assert_eq!(cond_of(&done, conditions::COMPLETE), None);
        assert_eq!(
            cond_of(&done, conditions::DRAINED),
            pair("False", REASON_CONDITION_DRAIN_FAILED)
        );
    }

    #[test]
    fn a_deadline_is_failed_with_deadline_exceeded_even_when_drained() {
        let r = with_generation(with_phase(run_with(&[("/out", false)]), Phase::Running));
        let draining = draining_status(&r, &Trigger::Deadline, None, now());
        // The trigger is recorded where a restarted operator finds it again.
        assert_eq!(
            cond_of(&draining, conditions::READY),
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
            cond_of(&done, conditions::FAILED),
            pair("True", REASON_DEADLINE_EXCEEDED)
        );
        assert_eq!(cond_of(&done, conditions::COMPLETE), None);
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
            cond_of(&done, conditions::FAILED),
            pair("True", REASON_POD_DELETED)
        );
        // The same teardown of a run that is itself being deleted is the user's deletion.
        let mut deleted = r.clone();
        deleted.metadata.deletion_timestamp = Some(Time(now()));
        let done = finished_status(&deleted, s, now());
        assert_eq!(
            cond_of(&done, conditions::COMPLETE),
            pair("True", "Stopped")
        );
        assert_eq!(cond_of(&done, conditions::FAILED), None);
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
            cond_of(&done, conditions::FAILED),
            pair("True", REASON_IMAGE_PULL_FAILED)
        );
        assert_eq!(cond_of(&done, conditions::COMPLETE), None);
        // Ready keeps the reason the pod never ran.
        assert_eq!(
            cond_of(&done, conditions::READY),
            pair("False", REASON_IMAGE_PULL_FAILED)
        );
    }

    #[test]
    fn failure_reason_names_the_first_cause() {
        let base = Ending {
            phase: Phase::Failed,
            workload_finished: true,
            exit_code: Some(1),
            start_failed: None,
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
