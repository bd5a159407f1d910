//! A queued run's Kueue labels edited after its Workload was made (docs/contract.md "A queued
//! run keeps the queue and priority it was queued with"). Kueue's own Job integration lets the
//! queue change only before admission and carries a priority class change to the Workload; the
//! operator is stricter and says so: once the Workload is made, neither label is followed — the
//! queue recorded in `status.queue` and the priority class the Workload was made with stay — and
//! an edit is not silent: the run gets `LabelEditIgnored=True` and a Warning Event
//! `QueueLabelEditIgnored`, once per edit. The webhook refuses such edits (rule `queue-label`);
//! this is what the operator does on its own when the webhook was absent or bypassed. Pure.

use jiff::Timestamp;

use super::conditions::{self, set_condition};
use super::events::{PlannedEvent, QUEUE_LABEL_EDIT_IGNORED};
use super::plan::{Plan, Requeue};
use crate::api::SandboxRun;
use crate::kueue::{PRIORITY_LABEL, QUEUE_LABEL};

/// The reason of `LabelEditIgnored=True` when the queue label was edited.
pub(crate) const REASON_QUEUE_LABEL_CHANGED: &str = "QueueLabelChanged";
/// The reason of `LabelEditIgnored=True` when only the priority-class label was edited.
pub(crate) const REASON_PRIORITY_LABEL_CHANGED: &str = "PriorityLabelChanged";
/// The reason of `LabelEditIgnored=False` once the labels say again what the run was queued with.
pub(crate) const REASON_LABELS_AS_QUEUED: &str = "LabelsAsQueued";

/// Whether `workload`'s priority is the label's to name: none, or a WorkloadPriorityClass (one
/// from a pod PriorityClass is not, as for Kueue's Job integration).
fn label_decides_priority(workload: &serde_json::Value) -> bool {
    workload
        .pointer("/spec/priorityClassRef")
        .is_none_or(|class| class["kind"] == "WorkloadPriorityClass")
}

/// The WorkloadPriorityClass `workload` was made with, when it was.
fn queued_priority(workload: &serde_json::Value) -> Option<&str> {
    workload
        .pointer("/spec/priorityClassRef/name")
        .and_then(serde_json::Value::as_str)
        .filter(|n| !n.is_empty())
}

fn named(value: Option<&str>, none: &str) -> String {
    value.map_or_else(|| none.to_string(), |v| format!("{v:?}"))
}

/// What of `run`'s labels its Workload does not follow: the reason, and the words.
fn disagreement(run: &SandboxRun, workload: &serde_json::Value) -> Option<(&'static str, String)> {
    let mut parts = Vec::new();
    let mut reason = None;
    let recorded = run
        .status
        .as_ref()
        .and_then(|s| s.queue.as_deref())
        .filter(|q| !q.is_empty());
    let label = crate::kueue::queue_of(run);
    if let Some(recorded) = recorded.filter(|r| label != Some(*r)) {
        reason = Some(REASON_QUEUE_LABEL_CHANGED);
        parts.push(format!(
            "its label {QUEUE_LABEL} says {} but it was queued in LocalQueue {recorded:?} and stays there",
            named(label, "nothing")
        ));
    }
    let wanted = crate::kueue::priority_class_of(run);
    let queued = queued_priority(workload);
    if label_decides_priority(workload) && wanted != queued {
        reason = reason.or(Some(REASON_PRIORITY_LABEL_CHANGED));
        parts.push(format!(
            "its label {PRIORITY_LABEL} says {} but its Workload was made with {} and keeps it",
            named(wanted, "nothing"),
            named(queued, "no priority class")
        ));
    }
    let reason = reason?;
    Some((
        reason,
        format!(
            "{}: a queued run's queue and priority do not follow label edits; put the labels back (docs/contract.md \"A queued run keeps the queue and priority it was queued with\")",
            parts.join("; ")
        ),
    ))
}

/// The plan that says an ignored edit of `run`'s Kueue labels, `workload` being its own
/// Workload as read: `LabelEditIgnored=True` and a Warning Event when the labels newly disagree
/// with what the run was queued with (or disagree otherwise), `LabelEditIgnored=False` without
/// an Event once they agree again. None: nothing new to say.
pub(crate) fn ignored_edit(
    run: &SandboxRun,
    workload: &serde_json::Value,
    now: Timestamp,
) -> Option<Plan> {
    let current = run.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == conditions::LABEL_EDIT_IGNORED)
    });
    let said_true = current.is_some_and(|c| c.status == "True");
    let (status_true, reason, words) = match disagreement(run, workload) {
        Some((reason, words)) => {
            if current.is_some_and(|c| said_true && c.message == words) {
                return None;
            }
            (true, reason, words)
        }
        None if said_true => (
            false,
            REASON_LABELS_AS_QUEUED,
            "the run's Kueue labels say again what it was queued with".to_string(),
        ),
        None => return None,
    };
    let mut status = run.status.clone().unwrap_or_default();
    set_condition(
        &mut status.conditions,
        conditions::LABEL_EDIT_IGNORED,
        status_true,
        reason,
        words.clone(),
        run.metadata.generation,
        now,
    );
    let events = match status_true {
        true => vec![PlannedEvent::warning(
            QUEUE_LABEL_EDIT_IGNORED,
            words,
            "Queue",
        )],
        false => Vec::new(),
    };
    Some(Plan {
        events,
        status: Some(status),
        effects: Vec::new(),
        requeue: Requeue::After(std::time::Duration::from_millis(200)),
    })
}

/// `plan` (a hold's), saying also what `said` ([`ignored_edit`]) says: its condition and its
/// Event, in the same write.
pub(crate) fn join(plan: &mut Plan, said: Plan, generation: Option<i64>, now: Timestamp) {
    plan.events.extend(said.events);
    let Some(said) = said.status else {
        return;
    };
    let Some(status) = plan.status.as_mut() else {
        plan.status = Some(said);
        return;
    };
    let condition = said
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::LABEL_EDIT_IGNORED);
    if let Some(c) = condition {
        set_condition(
            &mut status.conditions,
            conditions::LABEL_EDIT_IGNORED,
            c.status == "True",
            &c.reason,
            c.message.clone(),
            generation,
            now,
        );
    }
}
