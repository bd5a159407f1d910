//! The queue stage of a run in a Kueue queue (docs/user-guide.md "Queueing with Kueue"): between
//! decide and plan, what the run's Workload ([`crate::kueue::QueueState`]) makes of the step.
//! Pure: the pipeline reads the Workload (observe) and carries the plans out (act). What the
//! Workload means is Kueue's ([`crate::kueue::gate`]: its answers in its own words); this is the
//! adapter that maps those answers onto the run's steps, plans and conditions.
//!
//! - No pod yet and not admitted: the run is held — Pending, `Queued=True` with Kueue's reason
//!   and words, Ready=False `Queued` — and its Workload is created when there is none, or, when
//!   Kueue evicted it and its pod is gone, its admission is cleared so Kueue queues it again.
//! - Admitted: `Queued=False Admitted` is written first, then the pod is created as for any run;
//!   once it exists, its Workload's PodsReady says whether it is ready (Kueue's
//!   `waitForPodsReady` evicts a Workload not ready in time: that eviction is handled as a
//!   preemption, below).
//! - Evicted while its pod runs (a preemption): the run is torn down as `spec.suspend` would
//!   (drained, an attempt that never counts), and waits for Kueue again.
//! - Ended: its Workload is marked Finished, so Kueue releases its quota.

use jiff::Timestamp;

use super::decide::{Step, Trigger};
use super::plan::{Effect, Plan, Requeue};
use crate::api::{Phase, SandboxRun};
use crate::controller::conditions::{self, set_condition};
use crate::kueue::gate::{BeforePod, Queueing, Running, WorkloadEdit};
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
    /// Patch the Workload's status (Finished; PodsReady), then go on with the step.
    PatchThen(Box<serde_json::Value>, Step),
    /// Carry out these effects on the Workload, then go on with the step.
    EffectsThen(Vec<Effect>, Step),
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
    /// Whether that pod is ready ([`crate::kueue::gate::pods_ready`]).
    pub pod_ready: bool,
}

/// What the queue makes of `step` for `run`.
pub(crate) fn gate(run: &SandboxRun, step: Step, q: QueueInputs<'_>, now: Timestamp) -> Gate {
    let phase = run.status.as_ref().and_then(|s| s.phase);
    if phase.is_some_and(Phase::is_final) {
        let succeeded = phase == Some(Phase::Succeeded);
        let words = run
            .status
            .as_ref()
            .and_then(|s| s.message.clone())
            .unwrap_or_default();
        return match crate::kueue::gate::finished(q.state, q.workload, succeeded, &words, now) {
            Some(patch) => Gate::PatchThen(Box::new(patch), step),
            None => Gate::Step(step),
        };
    }
    // Said first, in the hold's own write (docs/contract.md "A queued run keeps the queue and
    // priority it was queued with").
    let said = edit_said(run, &step, &q, now);
    if q.has_pod {
        if let Some(plan) = said {
            return Gate::Hold(Box::new(plan));
        }
        if !matches!(step, Step::TrackPod { .. } | Step::Checkpoint) {
            return Gate::Step(step);
        }
        // Evicted while running: a preemption. Admitted and running: PodsReady says whether its
        // pod is ready, as Kueue's own integrations say it (docs/contract.md "A queued run's
        // Workload says when its pod is ready").
        return match crate::kueue::gate::running(q.state, q.workload, q.pod_ready, now) {
            Running::Preempted(message) => {
                Gate::Step(Step::Teardown(Trigger::Preempted { message }))
            }
            Running::PodsReady(patch) => Gate::PatchThen(Box::new(patch), step),
            Running::Go => Gate::Step(step),
        };
    }
    if matches!(step, Step::Suspended) {
        let effects: Vec<Effect> = crate::kueue::gate::suspended(q.state, q.workload, now)
            .into_iter()
            .map(effect)
            .collect();
        return match effects.is_empty() {
            true => Gate::Step(step),
            false => Gate::EffectsThen(effects, step),
        };
    }
    if !matches!(step, Step::CreatePod) {
        return Gate::Step(step);
    }
    match (to_create_pod(run, step, q, now), said) {
        (gate, None) => gate,
        (Gate::Hold(mut plan), Some(said)) => {
            super::kueue_edits::join(&mut plan, said, run.metadata.generation, now);
            Gate::Hold(plan)
        }
        (_, Some(said)) => Gate::Hold(Box::new(said)),
    }
}

/// What the queue makes of a run that would get its pod now.
fn to_create_pod(run: &SandboxRun, step: Step, q: QueueInputs<'_>, now: Timestamp) -> Gate {
    let resumed = crate::kueue::gate::resumed(q.state, q.workload).map(effect);
    let queue = match crate::kueue::gate::queueing(run) {
        Queueing::In(queue) => Some(queue),
        // Never a pod on a label edited after the run was queued, admitted or not.
        Queueing::Disagrees { recorded, label } => {
            return Gate::Hold(Box::new(held(
                run,
                crate::kueue::gate::QUEUE_LABEL_CHANGED,
                &crate::kueue::gate::label_changed(recorded, label),
                now,
            )))
        }
        // The pipeline asks only for a run in a queue; a label read otherwise is not recorded.
        Queueing::Not => None,
    };
    let gate = match (before_pod(run, step, q, now), queue) {
        (Gate::Hold(plan), Some(queue)) => Gate::Hold(Box::new(recording(run, *plan, queue))),
        (gate, _) => gate,
    };
    match (gate, resumed) {
        (Gate::Hold(mut plan), Some(effect)) => {
            plan.effects.push(effect);
            Gate::Hold(plan)
        }
        (gate, _) => gate,
    }
}

/// A queued run whose Kueue labels were edited after its Workload was made, while it waits or
/// runs (docs/contract.md "A queued run keeps the queue and priority it was queued with"): the
/// edit is said — a condition and a Warning Event ([`super::kueue_edits`]) — before the step goes
/// on, on the next reconcile; the Workload is not touched.
fn edit_said(run: &SandboxRun, step: &Step, q: &QueueInputs<'_>, now: Timestamp) -> Option<Plan> {
    let waits_or_runs = matches!(
        step,
        Step::CreatePod | Step::TrackPod { .. } | Step::Checkpoint
    );
    let owned = crate::kueue::gate::owned(q.state);
    let workload = q.workload.filter(|_| waits_or_runs && owned)?;
    super::kueue_edits::ignored_edit(run, workload, now)
}

/// What the Workload's state makes of a run that would get its pod now
/// ([`crate::kueue::gate::before_pod`]), as the run's plan.
fn before_pod(run: &SandboxRun, step: Step, q: QueueInputs<'_>, now: Timestamp) -> Gate {
    match crate::kueue::gate::before_pod(q.state, q.workload, q.to_create, now) {
        BeforePod::Admitted { cluster_queue } => admitted(run, step, cluster_queue, now),
        BeforePod::Held {
            reason,
            message,
            edits,
        } => {
            let mut plan = held(run, reason, message, now);
            plan.effects.extend(edits.into_iter().map(effect));
            Gate::Hold(Box::new(plan))
        }
        // A run whose Workload finished never gets a pod again (it ended: see above).
        BeforePod::Finished => Gate::Hold(Box::new(Plan::wait(Requeue::AwaitChange))),
    }
}

/// A Workload edit Kueue's answer carries, as the effect act carries out.
fn effect(edit: WorkloadEdit) -> Effect {
    match edit {
        WorkloadEdit::Create(w) => Effect::CreateWorkload(Box::new(w)),
        WorkloadEdit::Patch(patch) => Effect::PatchWorkload(Box::new(patch)),
        WorkloadEdit::PatchStatus(patch) => Effect::PatchWorkloadStatus(Box::new(patch)),
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

/// The `Queued=False` reason of a run labelled for a Kueue queue while the operator runs
/// without `--kueue`.
pub(crate) const KUEUE_DISABLED: &str = "KueueDisabled";

/// A run labelled for a Kueue queue that would get its pod while the operator runs without
/// `--kueue` (docs/contract.md "A queue label the operator does not honour is said, not
/// ignored"): before its pod, `Queued=False KueueDisabled` and a Warning Event `QueueIgnored`,
/// once; the next reconcile creates the pod. It runs unqueued rather than held: without
/// `--kueue` no run is counted against any quota, and a hold would guard nothing (the label is
/// the tenant's to remove) while stranding runs on clusters without Kueue. None: nothing to say.
pub(crate) fn ignored_queue(run: &SandboxRun, step: &Step, now: Timestamp) -> Option<Plan> {
    if !matches!(step, Step::CreatePod) {
        return None;
    }
    let queue = crate::kueue::queue_of(run)?;
    let said = run.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == conditions::QUEUED && c.reason == KUEUE_DISABLED)
    });
    if said {
        return None;
    }
    let words = format!(
        "the run is labelled {}={queue:?} but the operator runs without --kueue: it runs unqueued, counted against no Kueue quota",
        crate::kueue::QUEUE_LABEL
    );
    let mut status = run.status.clone().unwrap_or_default();
    set_condition(
        &mut status.conditions,
        conditions::QUEUED,
        false,
        KUEUE_DISABLED,
        words.clone(),
        run.metadata.generation,
        now,
    );
    Some(Plan {
        events: vec![crate::controller::events::PlannedEvent::warning(
            crate::controller::events::QUEUE_IGNORED,
            words,
            "Queue",
        )],
        status: Some(status),
        effects: Vec::new(),
        requeue: Requeue::After(std::time::Duration::from_millis(200)),
    })
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
    use crate::controller::testkit::fixtures::{cond_of, now, pair, run_with, with_phase};
    use crate::kueue::gate::{queueing, QUEUE_LABEL_CHANGED};
    use serde_json::json;

    fn inputs<'a>(state: &'a QueueState, has_pod: bool) -> QueueInputs<'a> {
        QueueInputs {
            state,
            workload: None,
            to_create: Some(json!({"metadata": {"name": "w"}})),
            has_pod,
            pod_ready: false,
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
            matches!(&done, Gate::PatchThen(p, Step::ReleaseFinalizer) if p["status"]["conditions"].to_string().contains("Finished")),
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

    fn pods_ready_of(patch: &serde_json::Value) -> (String, String) {
        let conditions = patch["status"]["conditions"]
            .as_array()
            .expect("conditions");
        let c = conditions
            .iter()
            .find(|c| c["type"] == "PodsReady")
            .expect("PodsReady");
        (c["status"].to_string(), c["reason"].to_string())
    }

    #[test]
    fn an_admitted_runs_workload_says_pods_ready_once_its_pod_is_ready_and_not_before() {
        let run = run_with(&[("/out", false)]);
        let admitted = QueueState::Admitted {
            cluster_queue: "cq".into(),
        };
        let w = json!({"metadata": {"resourceVersion": "7", "generation": 1},
            "status": {"conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                {"type": "Admitted", "status": "True", "reason": "Admitted"}],
                "admission": {"clusterQueue": "cq"}}});
        let step = Step::TrackPod { requeue: None };
        // Its pod exists, not ready yet: PodsReady=False WaitForStart, then the step goes on.
        let q = QueueInputs {
            workload: Some(&w),
            ..inputs(&admitted, true)
        };
        let Gate::PatchThen(patch, Step::TrackPod { .. }) = gate(&run, step.clone(), q, now())
        else {
            panic!("PodsReady=False is written, then the step goes on");
        };
        assert_eq!(
            pods_ready_of(&patch),
            ("\"False\"".into(), "\"WaitForStart\"".into())
        );
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        // Ready: PodsReady=True Started (without it, waitForPodsReady evicts the run).
        let q = QueueInputs {
            workload: Some(&w),
            pod_ready: true,
            ..inputs(&admitted, true)
        };
        let Gate::PatchThen(patch, Step::TrackPod { .. }) = gate(&run, step.clone(), q, now())
        else {
            panic!("PodsReady=True is written, then the step goes on");
        };
        assert_eq!(
            pods_ready_of(&patch),
            ("\"True\"".into(), "\"Started\"".into())
        );
        // Said already: nothing more is written.
        let mut said = w.clone();
        said["status"]["conditions"] = patch["status"]["conditions"].clone();
        let q = QueueInputs {
            workload: Some(&said),
            pod_ready: true,
            ..inputs(&admitted, true)
        };
        assert_eq!(
            gate(&run, step, q, now()),
            Gate::Step(Step::TrackPod { requeue: None })
        );
    }

    #[test]
    fn a_run_evicted_for_the_pods_ready_timeout_is_drained_like_a_preemption_and_queued_again() {
        let run = run_with(&[("/out", false)]);
        let evicted = QueueState::Evicted {
            reason: "PodsReadyTimeout".into(),
            message: "Exceeded the PodsReady timeout team/job-sbr".into(),
            admitted: true,
        };
        let step = gate(
            &run,
            Step::TrackPod { requeue: None },
            inputs(&evicted, true),
            now(),
        );
        assert!(
            matches!(&step, Gate::Step(Step::Teardown(Trigger::Preempted { message })) if message.contains("PodsReady timeout")),
            "{step:?}"
        );
        let w = json!({"metadata": {"resourceVersion": "7", "generation": 1},
            "status": {"conditions": [
                {"type": "Evicted", "status": "True", "reason": "PodsReadyTimeout",
                 "message": "Exceeded the PodsReady timeout team/job-sbr"},
                {"type": "PodsReady", "status": "True", "reason": "Started"}],
                "admission": {"clusterQueue": "cq"}}});
        let q = QueueInputs {
            workload: Some(&w),
            ..inputs(&evicted, false)
        };
        let Gate::Hold(plan) = gate(&run, Step::CreatePod, q, now()) else {
            panic!("held");
        };
        let [Effect::PatchWorkloadStatus(patch)] = plan.effects.as_slice() else {
            panic!("the admission is cleared: {:?}", plan.effects);
        };
        assert!(patch["status"]["admission"].is_null());
        // As Kueue's jobframework: Requeued=False PodsReadyTimeout (Kueue requeues it after its
        // backoff), and its next admission waits for its pod from the start.
        let conditions = patch["status"]["conditions"]
            .as_array()
            .expect("conditions");
        let of = |t: &str| {
            let c = conditions.iter().find(|c| c["type"] == t).expect(t);
            (c["status"].clone(), c["reason"].clone())
        };
        assert_eq!(of("Requeued"), (json!("False"), json!("PodsReadyTimeout")));
        assert_eq!(of("PodsReady"), (json!("False"), json!("WaitForStart")));
    }

    #[test]
    fn a_run_labelled_for_a_queue_without_kueue_is_told_so_loudly_and_runs_unqueued() {
        let mut run = run_with(&[("/out", false)]);
        labelled(&mut run, None);
        assert!(
            ignored_queue(&run, &Step::CreatePod, now()).is_none(),
            "no label"
        );
        labelled(&mut run, Some("lq"));
        let plan = ignored_queue(&run, &Step::CreatePod, now()).expect("said");
        assert!(plan.effects.is_empty(), "no pod in the same plan");
        let [event] = plan.events.as_slice() else {
            panic!("one Event: {:?}", plan.events);
        };
        assert!(event.warning && event.reason == crate::controller::events::QUEUE_IGNORED);
        assert!(event.note.contains("--kueue"), "{}", event.note);
        let mut told = run.clone();
        told.status = plan.status;
        assert_eq!(
            cond_of(told.status.as_ref().unwrap(), conditions::QUEUED),
            pair("False", KUEUE_DISABLED)
        );
        // Said once: the pod is created on the next reconcile.
        assert!(ignored_queue(&told, &Step::CreatePod, now()).is_none());
        assert!(ignored_queue(&run, &Step::TrackPod { requeue: None }, now()).is_none());
    }

    #[test]
    fn a_suspended_queued_run_deactivates_its_workload_frees_its_quota_and_resumes_it() {
        let run = run_with(&[("/out", false)]);
        let admitted = QueueState::Admitted {
            cluster_queue: "cq".into(),
        };
        let w = json!({"metadata": {"resourceVersion": "7", "generation": 1},
            "spec": {"active": true},
            "status": {"conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                {"type": "Admitted", "status": "True", "reason": "Admitted"}],
                "admission": {"clusterQueue": "cq"}}});
        // Suspended, its pod gone: the Workload is deactivated, then the step goes on.
        let q = QueueInputs {
            workload: Some(&w),
            ..inputs(&admitted, false)
        };
        let Gate::EffectsThen(effects, Step::Suspended) = gate(&run, Step::Suspended, q, now())
        else {
            panic!("the Workload is deactivated first");
        };
        assert!(
            matches!(effects.as_slice(), [Effect::PatchWorkload(p)] if p["spec"]["active"] == false),
            "{effects:?}"
        );
        // Kueue evicted it for that: its admission is cleared, its quota freed.
        let mut inactive = w.clone();
        inactive["spec"]["active"] = json!(false);
        inactive["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "Evicted", "status": "True", "reason": "Deactivated"}));
        let evicted = QueueState::Evicted {
            reason: "Deactivated".into(),
            message: "The workload is deactivated".into(),
            admitted: true,
        };
        let q = QueueInputs {
            workload: Some(&inactive),
            ..inputs(&evicted, false)
        };
        let Gate::EffectsThen(effects, Step::Suspended) = gate(&run, Step::Suspended, q, now())
        else {
            panic!("the admission is cleared");
        };
        assert!(
            matches!(effects.as_slice(), [Effect::PatchWorkloadStatus(p)] if p["status"]["admission"].is_null()),
            "{effects:?}"
        );
        // Freed: nothing more while it stays suspended.
        let freed = QueueState::Evicted {
            reason: "Deactivated".into(),
            message: "The workload is deactivated".into(),
            admitted: false,
        };
        let q = QueueInputs {
            workload: Some(&inactive),
            ..inputs(&freed, false)
        };
        assert_eq!(
            gate(&run, Step::Suspended, q, now()),
            Gate::Step(Step::Suspended)
        );
        // Resumed: held, its Workload active again so Kueue queues it.
        let q = QueueInputs {
            workload: Some(&inactive),
            ..inputs(&freed, false)
        };
        let Gate::Hold(plan) = gate(&run, Step::CreatePod, q, now()) else {
            panic!("held until Kueue admits it again");
        };
        assert!(
            plan.effects
                .iter()
                .any(|e| matches!(e, Effect::PatchWorkload(p) if p["spec"]["active"] == true)),
            "{:?}",
            plan.effects
        );
        assert!(!plan
            .effects
            .iter()
            .any(|e| matches!(e, Effect::CreatePod(_))));
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

    /// A run queued in "lq", its pod running, its Workload admitted at WorkloadPriorityClass
    /// "low".
    fn queued_at_low() -> (SandboxRun, serde_json::Value) {
        let mut run = run_with(&[("/out", false)]);
        labelled(&mut run, Some("lq"));
        prioritised(&mut run, Some("low"));
        run.status.get_or_insert_with(Default::default).queue = Some("lq".into());
        let w = json!({"metadata": {"resourceVersion": "7", "generation": 1},
            "spec": {"queueName": "lq", "priority": 10, "priorityClassRef":
                {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "low"}},
            "status": {"conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                {"type": "Admitted", "status": "True", "reason": "Admitted"},
                {"type": "PodsReady", "status": "True", "reason": "Started"}],
                "admission": {"clusterQueue": "cq"}}});
        (run, w)
    }

    fn prioritised(run: &mut SandboxRun, class: Option<&str>) {
        let labels = run.metadata.labels.get_or_insert_with(Default::default);
        labels.remove(crate::kueue::PRIORITY_LABEL);
        if let Some(class) = class {
            labels.insert(crate::kueue::PRIORITY_LABEL.into(), class.into());
        }
    }

    /// The gate on a running admitted run: the hold that says an edit, or None (the step went
    /// on).
    fn said_while_running(run: &SandboxRun, w: &serde_json::Value) -> Option<Plan> {
        let admitted = QueueState::Admitted {
            cluster_queue: "cq".into(),
        };
        let q = QueueInputs {
            workload: Some(w),
            pod_ready: true,
            ..inputs(&admitted, true)
        };
        match gate(run, Step::TrackPod { requeue: None }, q, now()) {
            Gate::Hold(plan) => Some(*plan),
            Gate::Step(Step::TrackPod { .. }) => None,
            other => panic!("the step goes on or the edit is said: {other:?}"),
        }
    }

    fn edit_event(plan: &Plan) -> &crate::controller::events::PlannedEvent {
        let [event] = plan.events.as_slice() else {
            panic!("one Event: {:?}", plan.events);
        };
        assert!(event.warning, "{event:?}");
        assert_eq!(
            event.reason,
            crate::controller::events::QUEUE_LABEL_EDIT_IGNORED
        );
        event
    }

    #[test]
    fn an_admitted_runs_priority_or_queue_label_edit_is_said_once_and_not_followed() {
        let (run, w) = queued_at_low();
        assert_eq!(
            said_while_running(&run, &w),
            None,
            "as queued: nothing said"
        );
        // Its priority label edited while it runs: said, the Workload not touched.
        let mut edited = run.clone();
        prioritised(&mut edited, Some("high"));
        let plan = said_while_running(&edited, &w).expect("said");
        assert!(plan.effects.is_empty(), "{:?}", plan.effects);
        let note = &edit_event(&plan).note;
        assert!(
            note.contains("\"high\"") && note.contains("\"low\""),
            "{note}"
        );
        let status = plan.status.expect("a condition");
        assert_eq!(
            cond_of(&status, conditions::LABEL_EDIT_IGNORED),
            pair(
                "True",
                super::super::kueue_edits::REASON_PRIORITY_LABEL_CHANGED
            )
        );
        // Said once: the step goes on.
        edited.status = Some(status);
        assert_eq!(said_while_running(&edited, &w), None);
        // Its queue label edited too: said again, the queue first.
        labelled(&mut edited, Some("free"));
        let plan = said_while_running(&edited, &w).expect("said again");
        assert!(edit_event(&plan).note.contains("\"free\""));
        let status = plan.status.expect("a condition");
        assert_eq!(
            cond_of(&status, conditions::LABEL_EDIT_IGNORED),
            pair(
                "True",
                super::super::kueue_edits::REASON_QUEUE_LABEL_CHANGED
            )
        );
        // Put back: False, without an Event.
        edited.status = Some(status);
        labelled(&mut edited, Some("lq"));
        prioritised(&mut edited, Some("low"));
        let plan = said_while_running(&edited, &w).expect("the condition turns False");
        assert!(plan.events.is_empty(), "{:?}", plan.events);
        let status = plan.status.expect("a condition");
        assert_eq!(
            cond_of(&status, conditions::LABEL_EDIT_IGNORED),
            pair("False", super::super::kueue_edits::REASON_LABELS_AS_QUEUED)
        );
        edited.status = Some(status);
        assert_eq!(said_while_running(&edited, &w), None);
    }

    #[test]
    fn a_priority_label_added_to_a_run_queued_without_one_is_said_not_followed() {
        let (mut run, mut w) = queued_at_low();
        prioritised(&mut run, None);
        w["spec"]
            .as_object_mut()
            .unwrap()
            .remove("priorityClassRef");
        assert_eq!(said_while_running(&run, &w), None);
        prioritised(&mut run, Some("high"));
        let plan = said_while_running(&run, &w).expect("said");
        assert!(edit_event(&plan).note.contains("no priority class"));
        // A Workload at a pod PriorityClass: the label does not decide it (as for Kueue's Jobs).
        w["spec"]["priorityClassRef"] = json!({"group": "scheduling.k8s.io",
            "kind": "PriorityClass", "name": "batch"});
        assert_eq!(said_while_running(&run, &w), None);
    }

    #[test]
    fn a_waiting_runs_queue_label_edit_is_said_in_the_holds_own_write() {
        let (run, mut w) = queued_at_low();
        w["status"] = json!({"conditions": [
            {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "no quota"}]});
        let mut edited = run.clone();
        labelled(&mut edited, None);
        let pending = pending();
        let q = QueueInputs {
            workload: Some(&w),
            ..inputs(&pending, false)
        };
        let Gate::Hold(plan) = gate(&edited, Step::CreatePod, q, now()) else {
            panic!("held");
        };
        assert!(plan.effects.is_empty(), "{:?}", plan.effects);
        edit_event(&plan);
        let status = plan.status.expect("told");
        assert_eq!(
            cond_of(&status, conditions::QUEUED),
            pair("True", QUEUE_LABEL_CHANGED)
        );
        assert_eq!(
            cond_of(&status, conditions::LABEL_EDIT_IGNORED),
            pair(
                "True",
                super::super::kueue_edits::REASON_QUEUE_LABEL_CHANGED
            )
        );
    }

    /// An ended run marks its own Workload Finished, Failed when it failed, with its words; a
    /// Workload of its name it does not own, or none, is never written.
    #[test]
    fn an_ended_runs_workload_is_finished_with_its_outcome_and_one_it_does_not_own_never() {
        let mut ended = with_phase(run_with(&[("/out", false)]), Phase::Failed);
        ended.status.as_mut().expect("status").message =
            Some("workload failed with exit code 3".into());
        let w = json!({"metadata": {"resourceVersion": "7", "generation": 1},
            "status": {"conditions": [{"type": "Admitted", "status": "True", "reason": "Admitted"}],
                       "admission": {"clusterQueue": "cq"}}});
        let admitted = QueueState::Admitted {
            cluster_queue: "cq".into(),
        };
        let q = QueueInputs {
            workload: Some(&w),
            ..inputs(&admitted, false)
        };
        let Gate::PatchThen(patch, Step::ReleaseFinalizer) =
            gate(&ended, Step::ReleaseFinalizer, q, now())
        else {
            panic!("a finished patch, then the step");
        };
        let finished = patch["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Finished"))
            .cloned()
            .expect("Finished");
        assert_eq!(finished["status"], "True", "{finished}");
        assert_eq!(finished["reason"], "Failed", "{finished}");
        assert_eq!(
            finished["message"], "workload failed with exit code 3",
            "{finished}"
        );
        assert_eq!(patch["metadata"]["resourceVersion"], "7", "{patch}");
        for state in [QueueState::Foreign, QueueState::Absent] {
            let q = QueueInputs {
                workload: Some(&w),
                ..inputs(&state, false)
            };
            assert_eq!(
                gate(&ended, Step::ReleaseFinalizer, q, now()),
                Gate::Step(Step::ReleaseFinalizer),
                "{state:?}"
            );
        }
        assert_eq!(
            gate(
                &ended,
                Step::ReleaseFinalizer,
                inputs(&admitted, false),
                now()
            ),
            Gate::Step(Step::ReleaseFinalizer),
            "no Workload read: nothing to patch"
        );
    }
}
