//! Tracking a run's pod: its status from the pod (Pending, Running), the Events of a pod that
//! runs or is stuck, and when to look again.

use std::time::Duration;

use jiff::Timestamp;

use super::super::status::tracked_status;
use super::create::unreported;
use super::model::{Effect, Plan, Requeue, LOOK_AGAIN_MARGIN};
use crate::api::{Phase, SandboxRun, SandboxRunStatus};
use crate::controller::conditions::{ready_false_reason, REASON_POD_CREATED, REASON_POD_PENDING};
use crate::controller::events::{self, stuck_event, PlannedEvent};
use crate::controller::pod_view::{pending_for, pending_recheck, PodView, WorkloadState};
use crate::egress::settings::EgressSettings;

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
        host_ip: None,
        gate_waiting: false,
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
    // A start's passing states are in the status only (the pod's name, Pending, Running): Events
    // tell its problems, and that the pod runs once a problem was told (docs/contract.md "A
    // quiet lifecycle").
    if status.phase == Some(Phase::Running) && told_a_problem(&before) {
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

/// Whether the run was last reported Pending for a problem of its pod (Ready's reason is neither
/// a pod being created nor one starting), so that its running is news.
fn told_a_problem(before: &SandboxRunStatus) -> bool {
    before.phase == Some(Phase::Pending)
        && ready_false_reason(before)
            .is_some_and(|r| r != REASON_POD_PENDING && r != REASON_POD_CREATED)
}

/// While the pod's egress gate waits, the run's NetworkPolicy with what the gate needs denied
/// (docs/contract.md "A filtered run never has an unfiltered instant"): its node's address once
/// known, when the gate probes the node (a denylist, an allowlist of a range holding it, would
/// keep the gate shut), and the egress proxy's pods at `proxy`, whose canary the gate of a run
/// anchored on the proxy probes (a range holding them would keep it shut). Applied on each look
/// while the gate waits (server-side apply of the same object changes nothing); None once it
/// opened, or when there is nothing to add.
pub(super) fn gate_policy(
    run: &SandboxRun,
    pod: Option<&PodView>,
    egress: &EgressSettings,
    proxy: &[std::net::IpAddr],
) -> Option<Effect> {
    let pod = pod.filter(|p| p.gate_waiting && !p.deleting)?;
    let policy =
        crate::egress::policy::policy_while_gated(run, egress, pod.host_ip, proxy).ok()??;
    Some(Effect::ApplyNetworkPolicy(Box::new(policy)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{NetworkMode, NetworkPolicy};
    use crate::controller::testkit::fixtures::{run_with, running};

    /// Every address the policy's ranges except.
    fn excepted_of(policy: k8s_openapi::api::networking::v1::NetworkPolicy) -> Vec<String> {
        policy
            .spec
            .and_then(|s| s.egress)
            .unwrap_or_default()
            .into_iter()
            .flat_map(|r| r.to.unwrap_or_default())
            .filter_map(|p| p.ip_block)
            .flat_map(|b| b.except.unwrap_or_default())
            .collect()
    }

    #[test]
    fn a_waiting_gate_on_a_known_node_gets_the_policy_that_denies_that_node() {
        let mut run = run_with(&[("/out", false)]);
        run.spec.network = Some(NetworkPolicy {
            mode: NetworkMode::Denylist,
            rules: vec!["192.0.2.0/24".to_string()],
        });
        // The wide denylist (a narrow one allows no range the node could be carved from).
        let egress = EgressSettings {
            denylist_wide: true,
            ..EgressSettings::default()
        };
        let node = "10.1.2.3";
        let waiting = PodView {
            host_ip: node.parse().ok(),
            gate_waiting: true,
            ..running()
        };
        let Some(Effect::ApplyNetworkPolicy(policy)) =
            gate_policy(&run, Some(&waiting), &egress, &[])
        else {
            panic!("a waiting gate on a known node gets its policy");
        };
        let excepted = excepted_of(*policy);
        assert!(excepted.contains(&format!("{node}/32")), "{excepted:?}");
        // Not before the node is known, not once the gate opened, not for a pod being deleted,
        // not for an open run.
        let unscheduled = PodView {
            host_ip: None,
            ..waiting.clone()
        };
        let opened = PodView {
            gate_waiting: false,
            ..waiting.clone()
        };
        let deleting = PodView {
            deleting: true,
            ..waiting.clone()
        };
        for pod in [&unscheduled, &opened, &deleting] {
            assert_eq!(gate_policy(&run, Some(pod), &egress, &[]), None, "{pod:?}");
        }
        assert_eq!(gate_policy(&run, None, &egress, &[]), None);
        let open = run_with(&[("/out", false)]);
        assert_eq!(gate_policy(&open, Some(&waiting), &egress, &[]), None);
        // The proxy's pods are denied as soon as they are known, node or not (the canary's
        // probe does not wait for scheduling); not once the gate opened.
        let proxy = ["10.244.0.7".parse().unwrap()];
        let Some(Effect::ApplyNetworkPolicy(policy)) =
            gate_policy(&run, Some(&unscheduled), &egress, &proxy)
        else {
            panic!("a waiting gate gets the policy that denies the proxy's pods");
        };
        let excepted = excepted_of(*policy);
        assert!(
            excepted.contains(&"10.244.0.7/32".to_string()),
            "{excepted:?}"
        );
        assert_eq!(gate_policy(&run, Some(&opened), &egress, &proxy), None);
    }
}
