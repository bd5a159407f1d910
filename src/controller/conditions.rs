//! The conditions of a run's status: their types, their reasons, and the one way to set, remove
//! and read them (docs/user-guide.md "Lifecycle"). Pure: no client, no clock (`now` is an
//! argument).

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::SandboxRunStatus;

// Condition types written on every run.

/// The pod runs (both containers started).
pub(crate) const READY: &str = "Ready";
/// Ready=False while a run with `spec.retryPolicy` waits for its next attempt.
pub(crate) const REASON_RETRYING: &str = "Retrying";
/// Ready=False while `spec.suspend` holds the run without a pod.
pub(crate) const REASON_SUSPENDED: &str = "Suspended";
/// Ready=False while Kueue keeps the run without a pod (docs/user-guide.md "Queueing with
/// Kueue"), and the reason of [`QUEUED`] while it does.
pub(crate) const REASON_QUEUED: &str = "Queued";
/// Ready=False while a run Kueue evicted (preempted) drains and stops.
pub(crate) const REASON_PREEMPTED: &str = "Preempted";
/// A run in a Kueue queue: True while its Workload waits for quota (reason: Kueue's), False
/// once admitted (reason `Admitted`).
pub(crate) const QUEUED: &str = "Queued";
/// A queued run whose `kueue.x-k8s.io/queue-name` or `kueue.x-k8s.io/priority-class` label was
/// edited after its Workload was made: True while the labels disagree with what it was queued
/// with (the edit is not followed), False once they agree again (docs/contract.md "A queued run
/// keeps the queue and priority it was queued with").
pub(crate) const LABEL_EDIT_IGNORED: &str = crate::kueue::LABEL_EDIT_IGNORED;
/// The workload container terminated (batch runs).
pub(crate) const WORKLOAD_FINISHED: &str = "WorkloadFinished";
/// Every declared path has a final drain outcome, none failed.
pub(crate) const DRAINED: &str = "Drained";
/// The run ended successfully (batch/v1 Job semantics): phase `Succeeded`, or `Stopped` by
/// `spec.stop` or deletion with no path `Failed`. Absent otherwise
/// (`kubectl wait --for=condition=Complete`).
pub(crate) const COMPLETE: &str = "Complete";
/// The run ended in failure: phase `Failed`, a run stopped by its deadline or by its pod's
/// deletion/eviction, or a stopped run with a path `Failed`. The reason says which
/// ([`super::run::status::failure_reason`]). Absent otherwise (`kubectl wait --for=condition=Failed`).
/// Exactly one of Complete and Failed is True once the run has a final phase.
pub(crate) const FAILED: &str = "Failed";

/// Failed reason: the batch workload exited non-zero.
pub(crate) const REASON_WORKLOAD_FAILED: &str = "WorkloadFailed";
/// Failed reason (and Ready=False reason while draining): `spec.activeDeadlineSeconds` passed.
pub(crate) const REASON_DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
/// Failed reason (and Drained=False reason): a read-back path could not be drained.
pub(crate) const REASON_CONDITION_DRAIN_FAILED: &str = "DrainFailed";
/// Failed reason: the pod vanished before teardown could drain it.
pub(crate) const REASON_POD_LOST: &str = "PodLost";
/// Failed reason (and Ready=False reason while draining): someone else deleted or evicted the pod
/// before the workload finished.
pub(crate) const REASON_POD_DELETED: &str = "PodDeleted";
/// Ready=False reason while the pod is created or starting and nothing is known to block it.
pub(crate) const REASON_POD_PENDING: &str = "PodPending";
/// Ready=True reason: both containers run.
pub(crate) const REASON_POD_RUNNING: &str = "PodRunning";
/// Ready=False reason right after the pod was created.
pub(crate) const REASON_POD_CREATED: &str = "PodCreated";
/// Ready=False reason: the pod cannot be built from the spec.
pub(crate) const REASON_INVALID_SPEC: &str = "InvalidSpec";
/// Ready=False: the run uses what its author's rights must cover and no admission verified them
/// (docs/contract.md "A run uses only its author's rights"); no pod.
pub(crate) const REASON_RIGHTS_UNVERIFIED: &str = "RightsUnverified";
/// Ready=False reason while teardown drains, started by the workload's exit, `spec.stop` or the
/// run's deletion (a deadline, a pod deleted by someone else and a preemption have their own).
pub(crate) const REASON_TEARING_DOWN: &str = "TearingDown";
/// Ready=False reason: the pod vanished before teardown (briefly, before [`REASON_RUN_ENDED`]).
pub(crate) const REASON_POD_GONE: &str = "PodGone";
/// Ready=False reason once the run has a final phase (except [`REASON_IMAGE_PULL_FAILED`], which
/// Ready keeps: the pod never ran and the kubelet's words say why).
pub(crate) const REASON_RUN_ENDED: &str = "RunEnded";

/// Ready=False reason while the scheduler cannot place the pod.
pub(crate) const REASON_UNSCHEDULABLE: &str = "Unschedulable";

/// Ready=False reason (and Event reason): the apiserver refused to create the run's pod.
pub(crate) const REASON_POD_CREATE_FAILED: &str = "PodCreateFailed";

/// Event and condition reason of a run whose image cannot be pulled.
pub(crate) const REASON_IMAGE_PULL_FAILED: &str = "ImagePullFailed";

/// Event and condition reason of a run whose egress gate never saw its NetworkPolicy in force
/// (docs/contract.md "A filtered run never has an unfiltered instant").
pub(crate) const REASON_EGRESS_NOT_ENFORCED: &str = "EgressNotEnforced";

/// Why a pod never started its workload, so the run fails without draining.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StartFailure {
    /// An image cannot be pulled.
    ImagePull,
    /// The egress gate never saw the run's NetworkPolicy in force.
    EgressGate,
}

impl StartFailure {
    /// Ready's reason, the Failed condition's and the Event's.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            StartFailure::ImagePull => REASON_IMAGE_PULL_FAILED,
            StartFailure::EgressGate => REASON_EGRESS_NOT_ENFORCED,
        }
    }

    /// Completes "the workload never started because …".
    pub(crate) fn because(self) -> &'static str {
        match self {
            StartFailure::ImagePull => "its image could not be pulled",
            StartFailure::EgressGate => "its egress policy was not seen in force",
        }
    }

    fn of_reason(reason: &str) -> Option<StartFailure> {
        [StartFailure::ImagePull, StartFailure::EgressGate]
            .into_iter()
            .find(|f| f.reason() == reason)
    }
}

/// Event and condition reason (Ready=False, Failed=True) of a run whose image the pre-flight
/// (`run --preflight-images`) found missing from its registry: its pod is never created
/// (docs/contract.md ADR-006 §5).
pub(crate) const REASON_IMAGE_UNRESOLVABLE: &str = "ImageUnresolvable";

/// Sets a condition, keeping its lastTransitionTime when the status does not change.
pub(crate) fn set_condition(
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
pub(crate) fn set_condition_unknown(
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
pub(crate) fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|c| c.type_ != type_);
}

fn condition_order(t: &str) -> usize {
    [READY, WORKLOAD_FINISHED, DRAINED, COMPLETE, FAILED]
        .iter()
        .position(|x| *x == t)
        .unwrap_or(usize::MAX)
}

/// The reason of Ready when it is False.
pub(crate) fn ready_false_reason(status: &SandboxRunStatus) -> Option<&str> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == READY && c.status == "False")
        .map(|c| c.reason.as_str())
}

/// Whether condition `type_` of `status` is True (`None`: a run with no status yet, never).
pub(crate) fn condition_true(status: Option<&SandboxRunStatus>, type_: &str) -> bool {
    status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == "True")
    })
}

/// Why the workload never started and the words that say so, when Ready=False says it (an image
/// that could not be pulled, an egress gate that gave up).
pub(crate) fn start_failure(status: &SandboxRunStatus) -> Option<(StartFailure, String)> {
    status
        .conditions
        .iter()
        .filter(|c| c.type_ == READY && c.status == "False")
        .find_map(|c| StartFailure::of_reason(&c.reason).map(|f| (f, c.message.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::conditions;
    use crate::controller::testkit::fixtures::*;

    #[test]
    fn condition_transition_time_is_kept_while_status_is_unchanged() {
        let mut c = Vec::new();
        set_condition(&mut c, conditions::READY, true, "A", "", None, now());
        let later = now()
            .checked_add(jiff::SignedDuration::from_secs(5))
            .unwrap();
        set_condition(&mut c, conditions::READY, true, "B", "", None, later);
        assert_eq!(c[0].last_transition_time.0, now());
        set_condition(&mut c, conditions::READY, false, "C", "", None, later);
        assert_eq!(c[0].last_transition_time.0, later);
        assert_eq!(c.len(), 1);
    }
}
