//! A queued run's Kueue labels edited after its Workload was made (docs/contract.md "A queued
//! run keeps the queue and priority it was queued with"). Kueue's own Job integration lets the
//! queue change only before admission and carries a priority class change to the Workload; the
//! operator is stricter and says so: once the Workload is made, neither label is followed — the
//! queue recorded in `status.queue` and the priority class the Workload was made with stay — and
//! an edit is not silent: the run gets `LabelEditIgnored=True` and a Warning Event
//! `QueueLabelEditIgnored`, once per edit. The webhook refuses such edits (rule `queue-label`);
//! this is what the operator does on its own when the webhook was absent or bypassed. Pure.

use jiff::Timestamp;

use super::plan::{Plan, Requeue};
use crate::api::SandboxRun;
use crate::controller::conditions::{self, set_condition};
use crate::controller::events::{PlannedEvent, QUEUE_LABEL_EDIT_IGNORED};
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::controller::testkit::fixtures::{cond_of, now, pair, run_with};

    /// A run queued in LocalQueue `queued`, whose labels now say `queue` and `priority`.
    fn labelled(queued: &str, queue: Option<&str>, priority: Option<&str>) -> SandboxRun {
        let mut r = run_with(&[("/out", true)]);
        let mut labels = BTreeMap::new();
        if let Some(q) = queue {
            labels.insert(QUEUE_LABEL.to_string(), q.to_string());
        }
        if let Some(p) = priority {
            labels.insert(PRIORITY_LABEL.to_string(), p.to_string());
        }
        r.metadata.labels = Some(labels);
        r.status.get_or_insert_with(Default::default).queue = Some(queued.to_string());
        r
    }

    fn workload(priority: Option<(&str, &str)>) -> serde_json::Value {
        match priority {
            Some((kind, name)) => {
                json!({"spec": {"priorityClassRef": {"kind": kind, "name": name}}})
            }
            None => json!({"spec": {}}),
        }
    }

    #[test]
    fn a_queue_label_edited_after_queuing_is_said_once_and_not_followed() {
        let r = labelled("team-a", Some("team-b"), None);
        let plan = ignored_edit(&r, &workload(None), now()).expect("said");
        let status = plan.status.expect("status");
        assert_eq!(
            cond_of(&status, conditions::LABEL_EDIT_IGNORED),
            pair("True", REASON_QUEUE_LABEL_CHANGED)
        );
        assert_eq!(status.queue.as_deref(), Some("team-a"), "the queue stays");
        assert_eq!(plan.events.len(), 1);
        assert!(plan.events[0].warning && plan.events[0].reason == QUEUE_LABEL_EDIT_IGNORED);
        // Said: the same edit is not said again.
        let mut told = r.clone();
        told.status = Some(status);
        assert!(ignored_edit(&told, &workload(None), now()).is_none());
    }

    #[test]
    fn labels_put_back_clear_the_condition_without_an_event() {
        let edited = labelled("team-a", Some("team-b"), None);
        let said = ignored_edit(&edited, &workload(None), now()).expect("said");
        let mut back = labelled("team-a", Some("team-a"), None);
        back.status = said.status;
        let plan = ignored_edit(&back, &workload(None), now()).expect("cleared");
        assert!(plan.events.is_empty());
        assert_eq!(
            cond_of(
                plan.status.as_ref().expect("status"),
                conditions::LABEL_EDIT_IGNORED
            ),
            pair("False", REASON_LABELS_AS_QUEUED)
        );
        // Never said, nothing to say.
        assert!(ignored_edit(
            &labelled("team-a", Some("team-a"), None),
            &workload(None),
            now()
        )
        .is_none());
    }

    #[test]
    fn a_priority_label_edit_is_said_only_when_the_label_names_the_workloads_priority() {
        let w = workload(Some(("WorkloadPriorityClass", "low")));
        let plan = ignored_edit(&labelled("q", Some("q"), Some("high")), &w, now()).expect("said");
        assert_eq!(
            cond_of(
                plan.status.as_ref().expect("status"),
                conditions::LABEL_EDIT_IGNORED
            ),
            pair("True", REASON_PRIORITY_LABEL_CHANGED)
        );
        assert!(ignored_edit(&labelled("q", Some("q"), Some("low")), &w, now()).is_none());
        // A priority from a pod PriorityClass is not the label's to name.
        let pod_class = workload(Some(("PriorityClass", "system")));
        assert!(ignored_edit(&labelled("q", Some("q"), Some("high")), &pod_class, now()).is_none());
    }

    #[test]
    fn an_edit_said_with_a_hold_is_one_write_with_both() {
        let r = labelled("team-a", Some("team-b"), None);
        let said = ignored_edit(&r, &workload(None), now()).expect("said");
        let mut hold = Plan::wait(Requeue::AwaitChange);
        hold.status = Some(r.status.clone().unwrap_or_default());
        join(&mut hold, said, r.metadata.generation, now());
        assert_eq!(hold.events.len(), 1);
        assert_eq!(
            cond_of(
                hold.status.as_ref().expect("status"),
                conditions::LABEL_EDIT_IGNORED
            ),
            pair("True", REASON_QUEUE_LABEL_CHANGED)
        );
    }
}
