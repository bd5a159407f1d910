//! The queue stage of a run in a Kueue queue (docs/user-guide.md "Queueing with Kueue"): between
//! decide and plan, what the run's Workload ([`crate::kueue::QueueState`]) makes of the step.
//! Pure: the pipeline reads the Workload (observe) and carries the plans out (act).
//!
//! - No pod yet and not admitted: the run is held — Pending, `Queued=True` with Kueue's reason
//!   and words, Ready=False `Queued` — and its Workload is created when there is none, or, when
//!   Kueue evicted it and its pod is gone, its admission is cleared so Kueue queues it again.
//! - Admitted: `Queued=False Admitted` is written first, then the pod is created as for any run.
//! - Evicted while its pod runs (a preemption): the run is torn down as `spec.suspend` would
//!   (drained, an attempt that never counts), and waits for Kueue again.
//! - Ended: its Workload is marked Finished, so Kueue releases its quota.

use jiff::Timestamp;

use super::conditions::{self, set_condition};
use super::decide::{Step, Trigger};
use super::plan::{Effect, Plan, Requeue};
use crate::api::{Phase, SandboxRun};
use crate::kueue::QueueState;

/// How long a held run waits before it looks at its Workload again should no watch event come.
pub(crate) const HELD_LOOK_AGAIN: std::time::Duration = std::time::Duration::from_secs(30);

/// What the queue makes of a step.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Gate {
    /// Go on with this step (the decided one, or a teardown Kueue's eviction asks for).
    Step(Step),
    /// Carry out this plan instead of the step.
    Hold(Box<Plan>),
    /// Mark the Workload Finished (the patch), then go on with the step.
    FinishThen(Box<serde_json::Value>, Step),
}

/// The inputs of [`gate`] beyond the run and the step.
pub(crate) struct QueueInputs<'a> {
    /// What the Workload says.
    pub state: &'a QueueState,
    /// The Workload as read (None: absent).
    pub workload: Option<&'a serde_json::Value>,
    /// The Workload to create when it is absent (built from the pod the run would get).
    pub to_create: Option<serde_json::Value>,
    /// Whether the run's pod exists.
    pub has_pod: bool,
}

/// Which Kueue queue decides for a run (docs/contract.md "Quota cannot be edited away").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Queueing<'a> {
    /// Not in Kueue: nothing recorded, no label.
    Not,
    /// In this LocalQueue: the one recorded (the label agrees), or the label's before the run
    /// was queued.
    In(&'a str),
    /// Queued once (recorded in `status.queue`), and the live label now says otherwise: the run
    /// is held, never started, until the label is put back; its Workload still decides
    /// everything else.
    Disagrees {
        /// The queue recorded.
        recorded: &'a str,
        /// The live label.
        label: Option<&'a str>,
    },
}

/// Which queue decides for `run`: what the operator recorded when it made the run's Workload,
/// never the live label alone (a tenant can edit labels).
pub(crate) fn queueing(run: &SandboxRun) -> Queueing<'_> {
    let label = crate::kueue::queue_of(run);
    let recorded = run.status.as_ref().and_then(|s| s.queue.as_deref());
    match (recorded, label) {
        (None, None) => Queueing::Not,
        (None, Some(label)) => Queueing::In(label),
        (Some(recorded), Some(label)) if recorded == label => Queueing::In(label),
        (Some(recorded), label) => Queueing::Disagrees { recorded, label },
    }
}

/// What the queue makes of `step` for `run`.
pub(crate) fn gate(run: &SandboxRun, step: Step, q: QueueInputs<'_>, now: Timestamp) -> Gate {
    let phase = run.status.as_ref().and_then(|s| s.phase);
    if phase.is_some_and(Phase::is_final) {
        return match (q.state, q.workload) {
            (QueueState::Finished | QueueState::Absent | QueueState::Foreign, _) | (_, None) => {
                Gate::Step(step)
            }
            (_, Some(w)) => {
                let succeeded = phase == Some(Phase::Succeeded);
                let words = run
                    .status
                    .as_ref()
                    .and_then(|s| s.message.clone())
                    .unwrap_or_default();
                let patch = crate::kueue::finished_patch(w, succeeded, &words, now);
                Gate::FinishThen(Box::new(patch), step)
            }
        };
    }
    if q.has_pod {
        return match (q.state, step) {
            (QueueState::Evicted { message, .. }, Step::TrackPod { .. } | Step::Checkpoint) => {
                Gate::Step(Step::Teardown(Trigger::Preempted {
                    message: message.clone(),
                }))
            }
            (_, step) => Gate::Step(step),
        };
    }
    if !matches!(step, Step::CreatePod) {
        return Gate::Step(step);
    }
    let queue = match queueing(run) {
        Queueing::In(queue) => Some(queue),
        // Never a pod on a label edited after the run was queued, admitted or not.
        Queueing::Disagrees { recorded, label } => {
            return Gate::Hold(Box::new(held(
                run,
                QUEUE_LABEL_CHANGED,
                &label_changed(recorded, label),
                now,
            )))
        }
        // The pipeline asks only for a run in a queue; a label read otherwise is not recorded.
        Queueing::Not => None,
    };
    match (before_pod(run, step, q, now), queue) {
        (Gate::Hold(plan), Some(queue)) => Gate::Hold(Box::new(recording(run, *plan, queue))),
        (gate, _) => gate,
    }
}

/// What the Workload's state makes of a run that would get its pod now.
fn before_pod(run: &SandboxRun, step: Step, q: QueueInputs<'_>, now: Timestamp) -> Gate {
    match q.state {
        QueueState::Admitted { cluster_queue } => admitted(run, step, cluster_queue, now),
        QueueState::Absent => {
            let mut plan = held(
                run,
                "Created",
                "its Workload was created; waiting for Kueue",
                now,
            );
            if let Some(w) = q.to_create {
                plan.effects.insert(0, Effect::CreateWorkload(Box::new(w)));
            }
            Gate::Hold(Box::new(plan))
        }
        QueueState::Foreign => Gate::Hold(Box::new(held(
            run,
            "WorkloadNameTaken",
            "a Workload with this run's Workload name exists and is not this run's; delete it or rename the run",
            now,
        ))),
        QueueState::Pending { reason, message } => Gate::Hold(Box::new(held(run, reason, message, now))),
        QueueState::Evicted {
            reason,
            message,
            admitted,
        } => {
            let mut plan = held(run, reason, message, now);
            if let (true, Some(w)) = (*admitted, q.workload) {
                let patch = crate::kueue::requeue_patch(w, now);
                plan.effects.push(Effect::PatchWorkloadStatus(Box::new(patch)));
            }
            Gate::Hold(Box::new(plan))
        }
        // A run whose Workload finished never gets a pod again (it ended: see above).
        QueueState::Finished => Gate::Hold(Box::new(Plan::wait(Requeue::AwaitChange))),
    }
}

/// `plan`, recording `queue` in `status.queue` when the run does not say it yet: written before
/// the plan's effects (the Workload's creation among them), so from then on the recorded queue
/// decides, not the label (docs/contract.md "Quota cannot be edited away"). A run queued by an
/// operator that did not record it is recorded on its next hold.
fn recording(run: &SandboxRun, mut plan: Plan, queue: &str) -> Plan {
    let recorded = run.status.as_ref().and_then(|s| s.queue.as_deref());
    if recorded == Some(queue) {
        return plan;
    }
    let mut status = plan
        .status
        .take()
        .unwrap_or_else(|| run.status.clone().unwrap_or_default());
    status.queue = Some(queue.to_string());
    plan.status = Some(status);
    plan
}

/// The `Queued` reason of a run whose queue label was edited after it was queued.
pub(crate) const QUEUE_LABEL_CHANGED: &str = "QueueLabelChanged";

/// In words: the label says `label`, the run was queued in `recorded`.
fn label_changed(recorded: &str, label: Option<&str>) -> String {
    let queued = format!("the run was queued in LocalQueue {recorded:?}");
    let now = label.map_or_else(|| "removed".to_string(), |l| format!("changed to {l:?}"));
    format!(
        "{queued} and its label {} was {now}; no pod is started until the label is put back (docs/contract.md \"Quota cannot be edited away\")",
        crate::kueue::QUEUE_LABEL
    )
}

/// Admitted: `Queued=False Admitted` first (its own write; the next reconcile creates the pod),
/// or the pod now when that is written.
fn admitted(run: &SandboxRun, step: Step, cluster_queue: &str, now: Timestamp) -> Gate {
    let said = run.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == conditions::QUEUED && c.status == "False" && c.reason == "Admitted")
    });
    if said {
        return Gate::Step(step);
    }
    let mut status = run.status.clone().unwrap_or_default();
    set_condition(
        &mut status.conditions,
        conditions::QUEUED,
        false,
        "Admitted",
        format!("admitted by Kueue to ClusterQueue {cluster_queue}"),
        run.metadata.generation,
        now,
    );
    Gate::Hold(Box::new(Plan {
        events: Vec::new(),
        status: Some(status),
        effects: Vec::new(),
        requeue: Requeue::After(std::time::Duration::from_millis(200)),
    }))
}

/// The plan of a held run: Pending, `Queued=True` with Kueue's `reason` and words, Ready=False
/// `Queued`; nothing written when that is what the run says already.
fn held(run: &SandboxRun, reason: &str, message: &str, now: Timestamp) -> Plan {
    let reason = if reason.is_empty() { "Pending" } else { reason };
    let words = if message.is_empty() {
        "waiting for quota".to_string()
    } else {
        message.to_string()
    };
    let text = format!("queued in Kueue ({reason}): {words}");
    let same = run.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == conditions::QUEUED
                && c.status == "True"
                && c.reason == reason
                && c.message == text
        })
    });
    let look_again = Requeue::After(HELD_LOOK_AGAIN);
    if same {
        return Plan::wait(look_again);
    }
    let mut status = run.status.clone().unwrap_or_default();
    let generation = run.metadata.generation;
    status.phase = Some(Phase::Pending);
    status.observed_generation = generation;
    status.message = Some(text.clone());
    set_condition(
        &mut status.conditions,
        conditions::QUEUED,
        true,
        reason,
        text.clone(),
        generation,
        now,
    );
    set_condition(
        &mut status.conditions,
        conditions::READY,
        false,
        conditions::REASON_QUEUED,
        text,
        generation,
        now,
    );
    super::status::ensure_pending_entries(run, &mut status);
    Plan {
        events: Vec::new(),
        status: Some(status),
        effects: Vec::new(),
        requeue: look_again,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::{cond_of, now, pair, run_with, with_phase};
    use serde_json::json;

    fn inputs<'a>(state: &'a QueueState, has_pod: bool) -> QueueInputs<'a> {
        QueueInputs {
            state,
            workload: None,
            to_create: Some(json!({"metadata": {"name": "w"}})),
            has_pod,
        }
    }

    fn pending() -> QueueState {
        QueueState::Pending {
            reason: "Pending".into(),
            message: "couldn't assign flavors to pod set main: insufficient unused quota".into(),
        }
    }

    #[test]
    fn a_queued_run_gets_no_pod_until_admitted_and_its_workload_is_made_once() {
        let run = run_with(&[("/out", false)]);
        // No Workload yet: created, and the run held Pending with Queued=True.
        let Gate::Hold(plan) = gate(
            &run,
            Step::CreatePod,
            inputs(&QueueState::Absent, false),
            now(),
        ) else {
            panic!("held");
        };
        assert!(matches!(
            plan.effects.first(),
            Some(Effect::CreateWorkload(_))
        ));
        assert!(!plan
            .effects
            .iter()
            .any(|e| matches!(e, Effect::CreatePod(_))));
        // Waiting for quota: Kueue's reason and words, no pod, no new Workload.
        let state = pending();
        let Gate::Hold(plan) = gate(&run, Step::CreatePod, inputs(&state, false), now()) else {
            panic!("held");
        };
        assert!(plan.effects.is_empty(), "{:?}", plan.effects);
        let status = plan.status.clone().unwrap();
        assert_eq!(status.phase, Some(Phase::Pending));
        assert_eq!(
            cond_of(&status, conditions::QUEUED),
            pair("True", "Pending")
        );
        assert_eq!(cond_of(&status, conditions::READY), pair("False", "Queued"));
        assert!(status
            .message
            .unwrap()
            .contains("insufficient unused quota"));
        // Told once: the same words again write nothing.
        let mut told = run.clone();
        told.status = plan.status;
        let Gate::Hold(again) = gate(&told, Step::CreatePod, inputs(&state, false), now()) else {
            panic!("held");
        };
        assert!(again.status.is_none());
        // Admitted: Queued=False first, then the pod.
        let admitted = QueueState::Admitted {
            cluster_queue: "cq".into(),
        };
        let Gate::Hold(flip) = gate(&told, Step::CreatePod, inputs(&admitted, false), now()) else {
            panic!("Queued=False is written first");
        };
        let mut flipped = told.clone();
        flipped.status = flip.status;
        assert_eq!(
            cond_of(flipped.status.as_ref().unwrap(), conditions::QUEUED),
            pair("False", "Admitted")
        );
        assert_eq!(
            gate(&flipped, Step::CreatePod, inputs(&admitted, false), now()),
            Gate::Step(Step::CreatePod)
        );
        // A Workload of that name that is not the run's is never used.
        let Gate::Hold(foreign) = gate(
            &run,
            Step::CreatePod,
            inputs(&QueueState::Foreign, false),
            now(),
        ) else {
            panic!("held");
        };
        assert!(foreign.effects.is_empty());
    }

    #[test]
    fn an_eviction_drains_the_running_pod_then_requeues_the_workload_and_an_end_finishes_it() {
        let run = run_with(&[("/out", false)]);
        let evicted = QueueState::Evicted {
            reason: "Preempted".into(),
            message: "to accommodate a higher priority workload".into(),
            admitted: true,
        };
        let step = gate(
            &run,
            Step::TrackPod { requeue: None },
            inputs(&evicted, true),
            now(),
        );
        assert!(
            matches!(&step, Gate::Step(Step::Teardown(Trigger::Preempted { message })) if message.contains("higher priority")),
            "{step:?}"
        );
        // Its pod gone (the attempt ended): the admission is cleared so Kueue queues it again.
        let w = json!({"metadata": {"resourceVersion": "7", "generation": 1},
            "status": {"conditions": [{"type": "Evicted", "status": "True", "reason": "Preempted"}],
                       "admission": {"clusterQueue": "cq"}}});
        let q = QueueInputs {
            workload: Some(&w),
            ..inputs(&evicted, false)
        };
        let Gate::Hold(plan) = gate(&run, Step::CreatePod, q, now()) else {
            panic!("held");
        };
        assert!(
            matches!(plan.effects.as_slice(), [Effect::PatchWorkloadStatus(p)] if p["status"]["admission"].is_null())
        );
        // The run ended: its Workload is marked Finished, then the step goes on.
        let ended = with_phase(run.clone(), Phase::Succeeded);
        let admitted = QueueState::Admitted {
            cluster_queue: "cq".into(),
        };
        let q = QueueInputs {
            workload: Some(&w),
            ..inputs(&admitted, false)
        };
        let done = gate(&ended, Step::ReleaseFinalizer, q, now());
        assert!(
            matches!(&done, Gate::FinishThen(p, Step::ReleaseFinalizer) if p["status"]["conditions"].to_string().contains("Finished")),
            "{done:?}"
        );
        assert_eq!(
            gate(
                &ended,
                Step::ReleaseFinalizer,
                inputs(&QueueState::Finished, false),
                now()
            ),
            Gate::Step(Step::ReleaseFinalizer)
        );
    }

    fn labelled(run: &mut SandboxRun, queue: Option<&str>) {
        let labels = run.metadata.labels.get_or_insert_with(Default::default);
        labels.remove(crate::kueue::QUEUE_LABEL);
        if let Some(queue) = queue {
            labels.insert(crate::kueue::QUEUE_LABEL.into(), queue.into());
        }
    }

    #[test]
    fn the_queue_is_recorded_before_the_workload_is_made() {
        let mut run = run_with(&[("/out", false)]);
        labelled(&mut run, Some("lq"));
        let Gate::Hold(plan) = gate(
            &run,
            Step::CreatePod,
            inputs(&QueueState::Absent, false),
            now(),
        ) else {
            panic!("held");
        };
        assert!(matches!(
            plan.effects.first(),
            Some(Effect::CreateWorkload(_))
        ));
        assert_eq!(plan.status.unwrap().queue.as_deref(), Some("lq"));
    }

    #[test]
    fn a_queued_run_whose_queue_label_is_removed_or_changed_never_gets_its_pod() {
        let mut run = run_with(&[("/out", false)]);
        labelled(&mut run, Some("lq"));
        let Gate::Hold(plan) = gate(
            &run,
            Step::CreatePod,
            inputs(&QueueState::Absent, false),
            now(),
        ) else {
            panic!("held");
        };
        run.status = plan.status;
        let admitted = QueueState::Admitted {
            cluster_queue: "cq".into(),
        };
        for label in [None, Some("free")] {
            let mut edited = run.clone();
            labelled(&mut edited, label);
            assert!(matches!(
                queueing(&edited),
                Queueing::Disagrees { recorded: "lq", .. }
            ));
            for state in [pending(), admitted.clone(), QueueState::Absent] {
                let Gate::Hold(held) = gate(&edited, Step::CreatePod, inputs(&state, false), now())
                else {
                    panic!("held on {state:?}");
                };
                assert!(held.effects.is_empty(), "{:?}", held.effects);
                let status = held.status.expect("told");
                assert_eq!(
                    cond_of(&status, conditions::QUEUED),
                    pair("True", QUEUE_LABEL_CHANGED)
                );
            }
        }
        // Queued by an operator that did not record the queue: recorded on its next hold.
        let mut legacy = run.clone();
        if let Some(s) = legacy.status.as_mut() {
            s.queue = None;
        }
        let Gate::Hold(plan) = gate(&legacy, Step::CreatePod, inputs(&pending(), false), now())
        else {
            panic!("held");
        };
        assert_eq!(plan.status.unwrap().queue.as_deref(), Some("lq"));
        // Put back: the recorded queue decides again.
        assert_eq!(queueing(&run), Queueing::In("lq"));
    }
}
