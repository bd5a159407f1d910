//! Tracking a run's pod: its status from the pod (Pending, Running), the Events of a pod that
//! runs or is stuck, and when to look again.

use std::time::Duration;

use jiff::Timestamp;

use super::super::events::{self, stuck_event, PlannedEvent};
use super::super::observe::{pending_for, pending_recheck, PodView, WorkloadState};
use super::super::status::tracked_status;
use super::create::{pod_created_event, unreported};
use super::model::{Plan, Requeue, LOOK_AGAIN_MARGIN};
use crate::api::{Phase, SandboxRun};

pub(super) fn track_pod(
    run: &SandboxRun,
    pod_name: &str,
    pod: Option<&PodView>,
    requeue: Option<Duration>,
    now: Timestamp,
    settle: Duration,
) -> Plan {
    let absent = PodView {
        deleting: false,
        holder_running: false,
        workload: WorkloadState::NotStarted,
        started_at: None,
        pending_since: None,
        problem: None,
    };
    let view = pod.unwrap_or(&absent);
    let status = tracked_status(run, pod_name, view, now);
    let before = run.status.clone().unwrap_or_default();
    // A fresh run's pod starting without a problem is not reported before `settle` has passed:
    // a pod that runs within it is written once, Running (docs/contract.md "A quiet lifecycle").
    let starting_for = pending_for(view, now).unwrap_or(Duration::ZERO);
    if unreported(run)
        && pod.is_some()
        && status.phase == Some(Phase::Pending)
        && view.problem.is_none()
        && starting_for < settle
    {
        let left = settle.saturating_sub(starting_for) + LOOK_AGAIN_MARGIN;
        return Plan::wait(Requeue::After(requeue.map_or(left, |r| r.min(left))));
    }
    // One PodStuck Event per distinct cause (Ready's reason and message), not one per reconcile.
    let mut events: Vec<PlannedEvent> = stuck_event(&before, view.problem.as_ref())
        .into_iter()
        .collect();
    // The pod's creation is told when the run is first reported Pending (its pod did not run
    // at once); its running is told only after that Pending was.
    if before.phase.is_none() && status.phase == Some(Phase::Pending) && pod.is_some() {
        events.push(pod_created_event(pod_name));
    }
    if before.phase == Some(Phase::Pending) && status.phase == Some(Phase::Running) {
        events.push(
            PlannedEvent::normal(
                events::RUNNING,
                format!("pod {pod_name} is running"),
                "Track",
            )
            .about_pod(),
        );
    }
    // A pod that has not started is looked at again even if nothing changes on it (a missing
    // volume changes nothing in its status).
    let requeue = match (requeue, pending_recheck(view, now)) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Plan {
        events,
        status: (status != before).then_some(status),
        effects: Vec::new(),
        requeue: match requeue {
            Some(d) => Requeue::After(d + LOOK_AGAIN_MARGIN),
            None => Requeue::AwaitChange,
        },
    }
}
