//! The status of a run before its end: tracked from its pod (Pending, Running), and the one
//! "Pending + Ready=False" of a run that is not running yet, with why.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::entries::ensure_pending_entries;
use crate::api::{Phase, SandboxRun, SandboxRunStatus};
use crate::controller::conditions::{self, set_condition, REASON_POD_PENDING, REASON_POD_RUNNING};
use crate::controller::pod_view::{PodView, WorkloadState};

/// Every `Ready=False` reason of a `Pending` run that cannot start until someone acts (fixes the
/// spec, a referenced object, the store, the template, the cluster): the reasons this module and
/// the create plans write, and the kubelet's causes a stuck pod carries
/// (`pod_view::STUCK_CONTAINER_REASONS`, `pod_view::STUCK_EVENT_REASONS`). `PodPending` and
/// `PodCreated` (still starting) are not in it. The GitOps health checks of `deploy/gitops/` call
/// such a run Degraded / Failed by exactly this list (docs/gitops.md "Health checks"), and a test fails when they differ
/// (only tests read it: the operator writes each reason where it arises).
#[cfg(test)]
pub(crate) fn cannot_start_reasons() -> Vec<&'static str> {
    use crate::controller::conditions::{
        REASON_EGRESS_NOT_ENFORCED, REASON_IMAGE_PULL_FAILED, REASON_INVALID_SPEC,
        REASON_POD_CREATE_FAILED, REASON_RIGHTS_UNVERIFIED, REASON_UNSCHEDULABLE,
    };
    use crate::controller::events;
    use crate::controller::pod_view::{STUCK_CONTAINER_REASONS, STUCK_EVENT_REASONS};
    let operator = [
        REASON_POD_CREATE_FAILED,
        REASON_UNSCHEDULABLE,
        REASON_IMAGE_PULL_FAILED,
        REASON_EGRESS_NOT_ENFORCED,
        REASON_INVALID_SPEC,
        REASON_RIGHTS_UNVERIFIED,
        events::STORE_UNUSABLE,
        events::TEMPLATE_UNUSABLE,
        events::EGRESS_POLICY_UNENFORCED,
    ];
    operator
        .into_iter()
        .chain(STUCK_CONTAINER_REASONS.iter().copied())
        .chain(STUCK_EVENT_REASONS.iter().copied())
        .collect()
}

/// Every reason the `Ready` condition of a run can carry: [`cannot_start_reasons`], and those of
/// a run on its way (created, pending, running, queued by Kueue, suspended, waiting for its next
/// attempt), of its teardown (what started it) and of its end. The `Ready` reasons table of
/// docs/user-guide.md "Troubleshooting" lists exactly these, and a test fails when they differ
/// (only tests read it: the operator writes each reason where it arises).
#[cfg(test)]
pub(crate) fn ready_reasons() -> Vec<&'static str> {
    use crate::controller::conditions::{
        REASON_DEADLINE_EXCEEDED, REASON_IMAGE_UNRESOLVABLE, REASON_POD_CREATED,
        REASON_POD_DELETED, REASON_POD_GONE, REASON_PREEMPTED, REASON_QUEUED, REASON_RETRYING,
        REASON_RUN_ENDED, REASON_SUSPENDED, REASON_TEARING_DOWN,
    };
    let on_its_way = [
        REASON_POD_CREATED,
        REASON_POD_PENDING,
        REASON_POD_RUNNING,
        REASON_QUEUED,
        REASON_SUSPENDED,
        REASON_RETRYING,
        REASON_IMAGE_UNRESOLVABLE,
    ];
    let ending = [
        REASON_TEARING_DOWN,
        REASON_DEADLINE_EXCEEDED,
        REASON_POD_DELETED,
        REASON_PREEMPTED,
        REASON_POD_GONE,
        REASON_RUN_ENDED,
    ];
    cannot_start_reasons()
        .into_iter()
        .chain(on_its_way)
        .chain(ending)
        .collect()
}

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
    status.next_attempt_time = None;
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
