//! The status of a run before its end: tracked from its pod (Pending, Running), and the one
//! "Pending + Ready=False" of a run that is not running yet, with why.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::super::conditions::{self, set_condition, REASON_POD_PENDING, REASON_POD_RUNNING};
use super::super::observe::{PodView, WorkloadState};
use super::entries::ensure_pending_entries;
use crate::api::{Phase, SandboxRun, SandboxRunStatus};

/// The status of a run whose pod is being tracked (Pending or Running).
pub(crate) fn tracked_status(
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
            conditions::READY,
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
            conditions::READY,
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

/// The status of a run that is not running yet, with why: phase `Pending`, the message, and
/// Ready=False with `reason` (the one home of "Pending + Ready=False", docs/contract.md).
pub(crate) fn pending_status(
    run: &SandboxRun,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> SandboxRunStatus {
    let mut status = run.status.clone().unwrap_or_default();
    set_pending(run, &mut status, reason, message, now);
    status
}

/// Makes `status` say the run is not running yet ([`pending_status`]), keeping what else it holds.
pub(crate) fn set_pending(
    run: &SandboxRun,
    status: &mut SandboxRunStatus,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    status.observed_generation = run.metadata.generation;
    status.phase = Some(Phase::Pending);
    status.message = Some(message.to_string());
    set_condition(
        &mut status.conditions,
        conditions::READY,
        false,
        reason,
        message,
        run.metadata.generation,
        now,
    );
}
