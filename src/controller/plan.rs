//! Plan: from the chosen [`Step`] and what was observed to what the act stage must do — the
//! status to write, the Events to publish and the effects (finalizers, the pod, the drain, the
//! stored files), in order. Pure: no client, no clock (`now` is an argument), so every step's
//! outcome is unit tested here; [`super::act`] only carries a plan out.
//!
//! A plan is carried out in one order: its Events first, then its status, then its effects.
//! Steps whose outcome depends on what the apiserver answers are planned in two halves: creating
//! the pod ([`StepPlan::CreatePod`], then [`pod_created`] or [`pod_refused`]), reporting a lost
//! pod (the live run and the committed manifests are read first, then [`record_pod_lost`]), and
//! the teardown ([`teardown`] before the drains, [`teardown_end`] after them).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::conditions::{self, REASON_INVALID_SPEC, REASON_POD_CREATED};
use super::decide::{Preflight, Step, Trigger};
use super::events::{self, drain_summary, stuck_event, teardown_event, PlannedEvent};
use super::observe::{
    drain_settled, pending_for, pending_recheck, undrained_paths, PodView, WorkloadState,
};
use super::refusals;
use super::retention::{self, Ttl};
use super::status::{
    draining_status, ensure_pending_entries, finished_status, image_unresolvable_status,
    never_started_entry, pending_status, pod_lost_status, tracked_status, workload_termination,
};
use crate::api::{
    Phase, ReadBackPhase, ReadBackStatus, Retention, SandboxRun, SandboxRunStatus, FINALIZER,
};
use crate::caps::CapSettings;
use crate::egress::verdict::{EgressVerdict, Refusal};
use crate::pod::{self, PodSettings};
use k8s_openapi::api::networking::v1::NetworkPolicy;

/// How long after a time the run is looked at again, so the decision sees that time passed.
pub(crate) const LOOK_AGAIN_MARGIN: Duration = Duration::from_millis(200);
/// How often a run whose drain is in flight is looked at again (a safety net: the drain's own
/// status writes wake it when it ends).
pub(crate) const IN_FLIGHT_REQUEUE: Duration = Duration::from_secs(30);
/// How long a prompt run's passing states may last unreported by default (`run --quiet-window`,
/// docs/contract.md "A quiet lifecycle"): a fresh run's pod that runs within it is never reported
/// `Pending` (no status write, no `PodCreated` Event), and a teardown whose paths all drain
/// within it is never reported `Draining` (no `TearingDown` Event): such a run is written when it
/// runs and when it ends. A state that outlasts it is reported then, with its Event; a problem
/// is reported at once.
pub const SETTLE: Duration = Duration::from_secs(2);
/// How often a run whose pod name is taken by a pod it does not own is looked at again.
pub(crate) const NAME_CONFLICT_REQUEUE: Duration = Duration::from_secs(60);

/// When the run is reconciled again without a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requeue {
    /// Only on a change of the run or its pod.
    AwaitChange,
    /// After this long (or earlier on a change).
    After(Duration),
}

impl Requeue {
    /// The controller's action.
    pub(crate) fn into_action(self) -> kube::runtime::controller::Action {
        match self {
            Requeue::AwaitChange => kube::runtime::controller::Action::await_change(),
            Requeue::After(d) => kube::runtime::controller::Action::requeue(d),
        }
    }
}

/// Something the act stage does besides writing status and publishing Events.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Put [`FINALIZER`] on the run.
    AddFinalizer,
    /// Take [`FINALIZER`] off the run.
    RemoveFinalizer,
    /// Delete the run's pod; `at_once`: with no grace period (nothing in it is owed any more),
    /// else the holder's grace period (set from the drain timeout) applies.
    DeletePod {
        /// No grace period.
        at_once: bool,
    },
    /// Tell the holder's preStop hook the drain is done, so the pod stops at once.
    MarkDrained,
    /// Delete the run whose TTL passed (preconditioned on its uid), then publish this Event.
    DeleteExpiredRun(PlannedEvent),
    /// Delete every stored file of the run (`retention: Delete`). A delete that must be retried
    /// ends the plan there: the effects after it wait for a later reconcile.
    PurgeStoredFiles,
    /// Remember that the apiserver refused the run's pod now (the creation back-off).
    RecordCreateAttempt(Timestamp),
    /// Forget the run's refused creation attempts.
    ForgetCreateAttempts,
    /// Remember that this replica created the run's pod and has not reported it yet (the pod
    /// name is not in the status before [`SETTLE`]): should the pod vanish before it is
    /// reported, the run is reported lost, never given a second pod without a word.
    RememberUnreportedPod,
    /// Publish this Event now (after the effects before it, e.g. once a policy is applied).
    Publish(PlannedEvent),
    /// Apply the run's NetworkPolicy (server-side apply) before its pod exists: a policy the
    /// apiserver refuses is an error, and the pod is not created without it.
    ApplyNetworkPolicy(Box<NetworkPolicy>),
    /// Create the run's pod; what the apiserver answers ([`Answer`]) is planned by [`after`].
    CreatePod(Box<Pod>),
}

/// What one reconcile writes, publishes and does, in that order.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The Events to publish, first, in order.
    pub events: Vec<PlannedEvent>,
    /// The status to write next (server-side apply); None: nothing to write.
    pub status: Option<SandboxRunStatus>,
    /// Then these, in order.
    pub effects: Vec<Effect>,
    /// When to look again.
    pub requeue: Requeue,
}

impl Plan {
    /// A plan that only waits.
    pub fn wait(requeue: Requeue) -> Plan {
        Plan {
            events: Vec::new(),
            status: None,
            effects: Vec::new(),
            requeue,
        }
    }
}

/// The plan of a step, or the I/O it needs first.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum StepPlan {
    /// Carry this out.
    Carry(Box<Plan>),
    /// Pre-flight this pod's image, then plan its creation with [`create`].
    CreatePod(Box<Pod>),
    /// Start the teardown in the drain pool (unless one is in flight); look again after
    /// [`IN_FLIGHT_REQUEUE`].
    Teardown(Trigger),
    /// Read the live run and the committed manifests; then plan with [`record_pod_lost`].
    RecordPodLost,
}

/// What the plan of a step is made from, besides the step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Inputs<'a> {
    /// The run (as the watch cache has it).
    pub run: &'a SandboxRun,
    /// The name of its pod.
    pub pod_name: &'a str,
    /// The facts of its pod; None when it has none.
    pub pod: Option<&'a PodView>,
    /// Now.
    pub now: Timestamp,
    /// The pod builder's settings.
    pub pod_settings: &'a PodSettings,
    /// When this process last tried to create the run's pod and was refused.
    pub last_create_attempt: Option<Timestamp>,
    /// What deleting a run does to its stored files when its spec does not say.
    pub default_retention: Retention,
    /// How long a passing state may last unreported ([`SETTLE`] by default).
    pub settle: Duration,
}

/// Plans `step`.
pub(crate) fn plan_step(step: Step, inputs: &Inputs<'_>) -> StepPlan {
    let run = inputs.run;
    let pod_exists = inputs.pod.is_some();
    let retention = retention::retention(run, inputs.default_retention);
    let plan = match step {
        Step::AddFinalizer => Plan {
            effects: vec![Effect::AddFinalizer],
            ..Plan::wait(Requeue::AwaitChange)
        },
        Step::CreatePod => return create_pod(run, inputs),
        Step::TrackPod { requeue } => track_pod(
            run,
            inputs.pod_name,
            inputs.pod,
            requeue,
            inputs.now,
            inputs.settle,
        ),
        Step::Teardown(trigger) => return StepPlan::Teardown(trigger),
        Step::RecordPodLost => return StepPlan::RecordPodLost,
        Step::DeleteFinishedPod => delete_finished_pod(run, inputs.pod, inputs.now),
        Step::DeleteExpiredRun => Plan {
            effects: vec![Effect::DeleteExpiredRun(expired_event(run, retention))],
            ..Plan::wait(Requeue::AwaitChange)
        },
        Step::ReleaseFinalizer => {
            let mut effects = vec![Effect::ForgetCreateAttempts];
            if pod_exists {
                effects.push(Effect::DeletePod { at_once: true });
            }
            if retention == Retention::Delete {
                effects.push(Effect::PurgeStoredFiles);
            }
            effects.push(Effect::RemoveFinalizer);
            Plan {
                effects,
                ..Plan::wait(Requeue::AwaitChange)
            }
        }
        Step::SkipDrain => skip_drain(run, pod_exists, retention),
    };
    StepPlan::Carry(Box::new(plan))
}

/// A pod with the run's pod name exists and the run does not own it: say so, touch nothing.
pub(crate) fn name_conflict(run: &SandboxRun, pod_name: &str) -> Plan {
    let msg = format!(
        "a pod named {pod_name} exists and is not owned by this run; delete it or rename the run"
    );
    let mut status = run.status.clone().unwrap_or_default();
    status.message = Some(msg.clone());
    Plan {
        events: vec![
            PlannedEvent::warning(events::POD_NAME_CONFLICT, msg, "Reconcile").about_pod(),
        ],
        status: Some(status),
        effects: Vec::new(),
        requeue: Requeue::After(NAME_CONFLICT_REQUEUE),
    }
}

fn create_pod(run: &SandboxRun, inputs: &Inputs<'_>) -> StepPlan {
    let now = inputs.now;
    // The apiserver refused this run's pod before: wait out the back-off (a watch event, such as
    // our own status write, must not turn it into a hot loop).
    if let Some(wait) = refusals::create_retry_wait(run, inputs.last_create_attempt, now) {
        return StepPlan::Carry(Box::new(Plan::wait(Requeue::After(
            wait + LOOK_AGAIN_MARGIN,
        ))));
    }
    match pod::build_pod(run, inputs.pod_settings) {
        Ok(pod) => StepPlan::CreatePod(Box::new(pod)),
        // A malformed run is recorded and awaited (a spec change wakes it), not retried hot.
        Err(e) => {
            let msg = format!("cannot build the pod: {e}");
            let mut events = Vec::new();
            if run.status.as_ref().and_then(|s| s.message.as_deref()) != Some(msg.as_str()) {
                events.push(PlannedEvent::warning(
                    events::INVALID_SPEC,
                    msg.clone(),
                    "CreatePod",
                ));
            }
            StepPlan::Carry(Box::new(Plan {
                events,
                status: Some(pending_status(run, REASON_INVALID_SPEC, &msg, now)),
                effects: Vec::new(),
                requeue: Requeue::AwaitChange,
            }))
        }
    }
}

/// The pod is created (`created`), or already existed (the apiserver answered 409).
pub(crate) fn pod_created(
    run: &SandboxRun,
    pod_name: &str,
    created: bool,
    settle: Duration,
    now: Timestamp,
) -> Plan {
    // A fresh run's pod is reported Pending only if it is still starting after `settle`
    // ([`track_pod`]): a pod that runs at once is written once, Running.
    if created && unreported(run) && !settle.is_zero() {
        return Plan {
            effects: vec![Effect::ForgetCreateAttempts, Effect::RememberUnreportedPod],
            ..Plan::wait(Requeue::After(settle + LOOK_AGAIN_MARGIN))
        };
    }
    let mut status = pending_status(run, REASON_POD_CREATED, "waiting for the pod to run", now);
    status.pod_name = Some(pod_name.to_string());
    ensure_pending_entries(run, &mut status);
    let (events, effects) = if created {
        (
            vec![pod_created_event(pod_name)],
            vec![Effect::ForgetCreateAttempts],
        )
    } else {
        (Vec::new(), Vec::new())
    };
    Plan {
        events,
        status: Some(status),
        effects,
        requeue: Requeue::AwaitChange,
    }
}

/// Whether nothing was ever reported about the run: it has no phase yet.
fn unreported(run: &SandboxRun) -> bool {
    run.status.as_ref().and_then(|s| s.phase).is_none()
}

fn pod_created_event(pod_name: &str) -> PlannedEvent {
    PlannedEvent::normal(
        events::POD_CREATED,
        format!("created pod {pod_name}"),
        "CreatePod",
    )
    .about_pod()
}

/// The `Events API` action of the egress Events.
const EGRESS_ACTION: &str = "ApplyEgressPolicy";

/// Creating the run's `pod`, once the pre-flight judged its image (`preflight`, docs/contract.md
/// ADR-006 §5) and the run's egress was judged (`egress`, docs/contract.md "ADR-006 network
/// rules: validated and enforced"): a run whose image does not exist gets no pod and no
/// NetworkPolicy and fails at once; a run whose egress cannot be enforced is refused (no pod);
/// otherwise its NetworkPolicy is applied first, so the pod never runs unfiltered, then the pod
/// is created and the apiserver's answer planned by [`after`].
pub(crate) fn create(
    run: &SandboxRun,
    pod: Pod,
    preflight: Preflight,
    egress: EgressVerdict,
    now: Timestamp,
) -> Plan {
    let unverified = match preflight {
        Preflight::Proceed => None,
        Preflight::ProceedUnverified { message } => Some(image_unverified(&message)),
        Preflight::Unresolvable { message, hint } => {
            return image_unresolvable(run, &message, &hint, now)
        }
    };
    let mut effects = Vec::new();
    match egress {
        EgressVerdict::Open => {}
        EgressVerdict::Refuse { refusal, message } => {
            return egress_refused(run, refusal, &message, now)
        }
        EgressVerdict::Apply {
            policy,
            note,
            unenforced,
        } => {
            if let Some(warning) = unenforced {
                effects.push(Effect::Publish(PlannedEvent::warning(
                    events::EGRESS_POLICY_UNENFORCED,
                    warning,
                    EGRESS_ACTION,
                )));
            }
            effects.push(Effect::ApplyNetworkPolicy(policy));
            effects.push(Effect::Publish(PlannedEvent::normal(
                events::EGRESS_POLICY_APPLIED,
                note,
                EGRESS_ACTION,
            )));
        }
    }
    effects.extend(unverified.map(Effect::Publish));
    effects.push(Effect::CreatePod(Box::new(pod)));
    Plan {
        effects,
        ..Plan::wait(Requeue::AwaitChange)
    }
}

/// The run's egress cannot be enforced: it does not start; its status and a Warning say why,
/// once (a run that already says exactly this is left as it is, until its spec changes).
fn egress_refused(run: &SandboxRun, refusal: Refusal, message: &str, now: Timestamp) -> Plan {
    if run.status.as_ref().and_then(|s| s.message.as_deref()) == Some(message) {
        return Plan::wait(Requeue::AwaitChange);
    }
    let (event_reason, reason) = match refusal {
        Refusal::InvalidSpec => (events::INVALID_SPEC, REASON_INVALID_SPEC),
        Refusal::Unenforced => (
            events::EGRESS_POLICY_UNENFORCED,
            events::EGRESS_POLICY_UNENFORCED,
        ),
    };
    Plan {
        events: vec![PlannedEvent::warning(event_reason, message, EGRESS_ACTION)],
        status: Some(pending_status(run, reason, message, now)),
        effects: Vec::new(),
        requeue: Requeue::AwaitChange,
    }
}

/// What the world answered an effect whose follow-up is planned by [`after`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Answer {
    /// The pod was created (as the apiserver returned it).
    PodCreated(Box<Pod>),
    /// A pod with its name already exists (409).
    PodExists,
    /// The apiserver refused the pod (quota, Pod Security, a webhook, RBAC: see
    /// [`refusals::is_refusal`]).
    PodRefused {
        /// The HTTP status.
        code: u16,
        /// The apiserver's words.
        message: String,
    },
    /// The run's stored files under `location` were deleted (how many objects) or not (why).
    FilesPurged {
        /// The count, or the store's words.
        result: Result<usize, String>,
        /// Where (for the Event).
        location: String,
    },
}

impl Answer {
    /// The pod the follow-up's Events name as `related`: the one just created.
    pub(crate) fn created_pod(&self) -> Option<&Pod> {
        match self {
            Answer::PodCreated(pod) => Some(pod),
            _ => None,
        }
    }
}

/// What the follow-up of an [`Answer`] is planned from, besides the answer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AfterInputs<'a> {
    /// The run.
    pub run: &'a SandboxRun,
    /// The name of its pod.
    pub pod_name: &'a str,
    /// How long a passing state may last unreported ([`SETTLE`] by default).
    pub settle: Duration,
    /// The run's drain timeout: the bound of a failing delete of its stored files.
    pub drain_timeout_seconds: i64,
    /// The reconcile's `now`.
    pub now: Timestamp,
}

/// The plan that follows `answer`: `rest` are the effects of the plan that were left when the
/// answer came, `requeue` its requeue. A delete of the stored files that must be retried drops
/// `rest` (the finalizer stays) and looks again after the back-off.
pub(crate) fn after(
    answer: &Answer,
    rest: Vec<Effect>,
    requeue: Requeue,
    inputs: &AfterInputs<'_>,
) -> Plan {
    let (run, now) = (inputs.run, inputs.now);
    let mut plan = match answer {
        Answer::PodCreated(_) => pod_created(run, inputs.pod_name, true, inputs.settle, now),
        Answer::PodExists => pod_created(run, inputs.pod_name, false, inputs.settle, now),
        Answer::PodRefused { message, .. } => pod_refused(run, message, now),
        Answer::FilesPurged { result, location } => {
            let (event, purge) = purged(
                run,
                result.clone(),
                location,
                inputs.drain_timeout_seconds,
                now,
            );
            return match purge {
                Purge::Done => Plan {
                    events: vec![event],
                    status: None,
                    effects: rest,
                    requeue,
                },
                Purge::RetryAfter(pause) => Plan {
                    events: vec![event],
                    ..Plan::wait(Requeue::After(pause))
                },
            };
        }
    };
    plan.effects.extend(rest);
    plan
}

/// The pre-flight found the run's image missing from its registry (docs/contract.md ADR-006 §5):
/// no pod is created; the run fails at once with reason `ImageUnresolvable`, a Warning Event
/// and the final status both carrying the registry's words and the hint.
pub(crate) fn image_unresolvable(
    run: &SandboxRun,
    message: &str,
    hint: &str,
    now: Timestamp,
) -> Plan {
    let words = format!("{message}; the pod was not created (hint: {hint})");
    Plan {
        events: vec![PlannedEvent::warning(
            events::IMAGE_UNRESOLVABLE,
            words.clone(),
            "Preflight",
        )],
        status: Some(image_unresolvable_status(run, &words, now)),
        effects: vec![Effect::ForgetCreateAttempts],
        requeue: Requeue::AwaitChange,
    }
}

/// The pre-flight could not tell whether the run's image resolves: the pod is created anyway
/// (the kubelet may still pull it), and this Warning says the image was not verified.
pub(crate) fn image_unverified(message: &str) -> PlannedEvent {
    PlannedEvent::warning(events::IMAGE_UNVERIFIED, message, "Preflight")
}

/// The apiserver refused the pod (quota, Pod Security, a webhook, RBAC): say so where the user
/// looks, and try again after a back-off rather than every 10 s.
pub(crate) fn pod_refused(run: &SandboxRun, message: &str, now: Timestamp) -> Plan {
    let status = refusals::refused_status(run, message, now);
    let note = status.message.clone().unwrap_or_default();
    let since = refusals::refused_since_in(&status, run.metadata.generation).unwrap_or(now);
    let retry = refusals::retry_delay(since, now);
    Plan {
        events: vec![PlannedEvent::warning(
            events::POD_CREATE_FAILED,
            note,
            "CreatePod",
        )],
        status: Some(status),
        effects: vec![Effect::RecordCreateAttempt(now)],
        requeue: Requeue::After(retry + LOOK_AGAIN_MARGIN),
    }
}

fn track_pod(
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

fn delete_finished_pod(run: &SandboxRun, pod: Option<&PodView>, now: Timestamp) -> Plan {
    let settled = drain_settled(run);
    let deleting = run.metadata.deletion_timestamp.is_some();
    let mut effects = Vec::new();
    // A pod already being deleted is left to its grace period unless its drain is settled.
    if pod.is_some_and(|p| !p.deleting || settled) {
        effects.push(Effect::DeletePod { at_once: settled });
    }
    if deleting && run.finalizers().iter().any(|f| f == FINALIZER) {
        effects.push(Effect::RemoveFinalizer);
    }
    let requeue = match retention::ttl(run, now) {
        // At the exact time the TTL passes (a little after, so the decision sees it passed).
        Ttl::Wait(d) if !deleting => Requeue::After(d + LOOK_AGAIN_MARGIN),
        _ => Requeue::AwaitChange,
    };
    Plan {
        effects,
        ..Plan::wait(requeue)
    }
}

fn skip_drain(run: &SandboxRun, pod_exists: bool, retention: Retention) -> Plan {
    let undrained = undrained_paths(run);
    let mut note = if undrained.is_empty() {
        "sandbox.iterion.io/skip-drain=true: finalizer released without draining".to_string()
    } else {
        format!(
            "sandbox.iterion.io/skip-drain=true: finalizer released; NOT drained: {}",
            undrained.join(", ")
        )
    };
    if retention == Retention::Delete {
        note.push_str("; retention: Delete skipped too, stored files are kept");
    }
    let mut effects = Vec::new();
    if pod_exists {
        effects.push(Effect::DeletePod { at_once: true });
    }
    effects.push(Effect::RemoveFinalizer);
    Plan {
        events: vec![PlannedEvent::warning(events::DRAIN_SKIPPED, note, "Delete").about_pod()],
        status: None,
        effects,
        requeue: Requeue::AwaitChange,
    }
}

/// The Event published once a run whose `spec.ttlSecondsAfterFinished` passed is deleted. The
/// delete only sets the deletion timestamp: the finalizer path runs as for any deletion
/// (docs/contract.md).
fn expired_event(run: &SandboxRun, retention: Retention) -> PlannedEvent {
    let ttl = run.spec.ttl_seconds_after_finished.unwrap_or_default();
    let kept = match retention {
        Retention::Retain => "its stored files are kept",
        Retention::Delete => "its stored files are deleted (retention: Delete)",
    };
    PlannedEvent::normal(
        events::TTL_EXPIRED,
        format!("finished more than ttlSecondsAfterFinished={ttl}s ago: deleted the run; {kept}"),
        "Expire",
    )
}

/// The pod vanished before teardown: every undrained path is reported lost, unless the store
/// has its committed manifest (`committed`, docs/contract.md §4). A deleted run with retention
/// Retain is released here; with Delete, the next reconcile (woken by this final status) deletes
/// the stored files first ([`Step::ReleaseFinalizer`]).
pub(crate) fn record_pod_lost(
    run: &SandboxRun,
    committed: &[ReadBackStatus],
    default_retention: Retention,
    now: Timestamp,
) -> Plan {
    let status = pod_lost_status(run, committed, now);
    let was_failed = |path: &str| {
        run.status.as_ref().is_some_and(|s| {
            s.read_back
                .iter()
                .any(|e| e.path == path && e.phase == ReadBackPhase::Failed)
        })
    };
    let newly_failed = status
        .read_back
        .iter()
        .any(|e| e.phase == ReadBackPhase::Failed && !was_failed(&e.path));
    // One Event for every path (a series of per-path Events shows only the first).
    let events = if newly_failed {
        drain_summary(&status.read_back)
            .map(|s| s.into_event("PodLost"))
            .into_iter()
            .collect()
    } else {
        Vec::new()
    };
    let mut effects = Vec::new();
    if run.metadata.deletion_timestamp.is_some()
        && retention::retention(run, default_retention) == Retention::Retain
    {
        effects.push(Effect::RemoveFinalizer);
    }
    Plan {
        events,
        status: Some(status),
        effects,
        requeue: Requeue::AwaitChange,
    }
}

/// What a teardown does before and during its drains.
#[derive(Clone, Debug, PartialEq)]
pub struct TeardownPlan {
    /// The opening: its Event (not when resumed) and the Draining status, written when the
    /// teardown begins or a resumed one learned how the workload ended.
    pub opening: Plan,
    /// Whether the opening waits [`SETTLE`]: a teardown that begins with a Normal Event is
    /// reported `Draining` only if its paths have not all drained by then (the opening is then
    /// written with the outcomes had so far); a Warning (a failed image pull) is told at once.
    pub opening_waits: bool,
    /// The status the drains record their outcomes in.
    pub status: SandboxRunStatus,
    /// Time left for the drains: the deadline runs from the start of teardown (the
    /// Drained=Unknown transition), so a restart mid-drain does not grant a fresh timeout.
    pub drain_left: Duration,
    /// The paths still owed an outcome, in declaration order.
    pub paths: Vec<PathPlan>,
    /// The holder container runs (so the drains can exec into it).
    pub holder_running: bool,
}

/// One path a teardown owes an outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct PathPlan {
    /// Its entry in `status.readBack`.
    pub entry: usize,
    /// Its index among the declared paths (its object keys).
    pub index: usize,
    /// The declared path.
    pub path: String,
    /// How its outcome is had.
    pub work: PathWork,
}

/// How a path's outcome is had.
#[derive(Clone, Debug, PartialEq)]
pub enum PathWork {
    /// Known without draining: record it.
    Record(ReadBackStatus),
    /// Drain it from the holder.
    Drain {
        /// Its cap (the path's `sizeLimit` within the operator's caps).
        cap_bytes: u64,
        /// Attempts already made (a resumed teardown).
        previous_attempts: u32,
        /// Where the holder mounts the path: the packer's argument (read from the pod, so a pod
        /// built by an older operator is drained where its holder sees the path).
        holder_path: String,
    },
}

/// The message of a path that cannot be drained because the holder is not running.
pub(crate) const HOLDER_NOT_RUNNING: &str = "the holder container is not running, so the path cannot be read (exec into a stopped container is impossible)";

/// Plans a teardown begun (or resumed) at `now` with `trigger`, for the run's `pod` (None: gone).
/// Each path still Pending gets its outcome from what is known: a workload that never started
/// wrote nothing (`Empty`), a holder that is not running cannot be read (`Failed`), else the path
/// is drained within `drain_timeout_seconds` of the teardown's start.
pub fn teardown(
    run: &SandboxRun,
    pod: Option<&Pod>,
    trigger: &Trigger,
    caps: &CapSettings,
    drain_timeout_seconds: i64,
    now: Timestamp,
) -> TeardownPlan {
    // Read before the pod is deleted: the evidence must outlive it.
    let workload = pod.and_then(workload_termination);
    let (status, opening, opening_waits) =
        if run.status.as_ref().and_then(|s| s.phase) == Some(Phase::Draining) {
            // A teardown resumed after a restart, or begun before the workload exited.
            let mut s = run.status.clone().unwrap_or_default();
            ensure_pending_entries(run, &mut s);
            let learned = s.workload.is_none() && workload.is_some();
            if learned {
                s.workload = workload;
            }
            let opening = Plan {
                status: learned.then(|| s.clone()),
                ..Plan::wait(Requeue::AwaitChange)
            };
            (s, opening, false)
        } else {
            let s = draining_status(run, trigger, workload, now);
            let (warning, reason, note) = teardown_event(trigger);
            let event = PlannedEvent {
                warning,
                reason,
                note,
                action: "Teardown",
                about_pod: true,
            };
            let opening = Plan {
                events: vec![event],
                status: Some(s.clone()),
                ..Plan::wait(Requeue::AwaitChange)
            };
            (s, opening, !warning)
        };
    let began = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::DRAINED && c.status == "Unknown")
        .map(|c| c.last_transition_time.0)
        .unwrap_or(now);
    let left = jiff::SignedDuration::from_secs(drain_timeout_seconds)
        .checked_sub(now.duration_since(began))
        .unwrap_or_default();
    let drain_left = Duration::try_from(left).unwrap_or(Duration::ZERO);

    let view = pod.map(PodView::of);
    let holder_running = view.as_ref().is_some_and(|v| v.holder_running);
    let never_started = view
        .as_ref()
        .is_none_or(|v| v.workload == WorkloadState::NotStarted)
        && status.start_time.is_none();
    let holder = holder_running.then_some(pod).flatten();
    let paths = owed_paths(run, &status, trigger, never_started, holder, caps);
    TeardownPlan {
        opening,
        opening_waits,
        status,
        drain_left,
        paths,
        holder_running,
    }
}

/// The paths of `status` still Pending, each with how its outcome is had: a workload that never
/// started wrote nothing (`Empty`), a holder that is not running cannot be read (`Failed`), else
/// the path is drained within its cap. `running_holder` is the pod when its holder runs.
fn owed_paths(
    run: &SandboxRun,
    status: &SandboxRunStatus,
    trigger: &Trigger,
    never_started: bool,
    running_holder: Option<&Pod>,
    caps: &CapSettings,
) -> Vec<PathPlan> {
    let mut paths = Vec::new();
    for (index, declared) in run.spec.read_back_paths().iter().enumerate() {
        let Some(entry) = status
            .read_back
            .iter()
            .position(|e| e.path == declared.path)
        else {
            continue;
        };
        if status.read_back[entry].phase != ReadBackPhase::Pending {
            continue;
        }
        let work = if never_started {
            PathWork::Record(never_started_entry(&declared.path, trigger))
        } else if running_holder.is_none() {
            PathWork::Record(ReadBackStatus {
                path: declared.path.clone(),
                phase: ReadBackPhase::Failed,
                message: Some(HOLDER_NOT_RUNNING.to_string()),
                ..Default::default()
            })
        } else {
            let requested = declared
                .size_limit
                .as_ref()
                .and_then(|q| crate::units::quantity_to_bytes(q).ok());
            PathWork::Drain {
                cap_bytes: caps.effective(requested),
                previous_attempts: status.read_back[entry].attempts,
                holder_path: running_holder
                    .and_then(|pod| crate::pod::holder_mount(pod, index))
                    .unwrap_or_else(|| crate::inpod::holder::holder_path(&declared.path)),
            }
        };
        paths.push(PathPlan {
            entry,
            index,
            path: declared.path.clone(),
            work,
        });
    }
    paths
}

/// The end of a teardown once every path has an outcome in `status`: ONE Event for every path
/// (the Recorder folds Events with the same reason into a series that shows only the first note,
/// so one Event per path hid all but one, issue #17), the final status and the Event announcing
/// it (a Warning whenever the run ended badly, Failed=True, whatever its phase); then the holder
/// is told the drain is done, the pod deleted at once, and a deleted run released (with
/// retention Delete, after its stored files are deleted; a delete that fails is retried by the
/// next reconciles, [`Step::ReleaseFinalizer`]).
pub(crate) fn teardown_end(
    run: &SandboxRun,
    status: SandboxRunStatus,
    holder_running: bool,
    pod_exists: bool,
    default_retention: Retention,
    now: Timestamp,
) -> Plan {
    // A drain with a failed or capped path has its own Warning (the contract's reasons), as has
    // one that stored changed files (`ReadBackChanged`); a clean one is told in the Event that
    // announces the end, one Event for the whole teardown.
    let summary = drain_summary(&status.read_back);
    let status = finished_status(run, status, now);
    let mut note = status.message.clone().unwrap_or_default();
    let mut events = Vec::new();
    match summary {
        Some(s) if s.warning => events.push(s.into_event("Drain").about_pod()),
        Some(s) => note = format!("{note}. {}", s.note),
        None => {}
    }
    let (warning, reason) = events::ending_event(&status);
    events.push(PlannedEvent {
        warning,
        reason,
        note,
        action: "Teardown",
        about_pod: true,
    });
    let mut effects = Vec::new();
    if holder_running {
        effects.push(Effect::MarkDrained);
    }
    if pod_exists {
        effects.push(Effect::DeletePod { at_once: true });
    }
    if run.metadata.deletion_timestamp.is_some() {
        if retention::retention(run, default_retention) == Retention::Delete {
            effects.push(Effect::PurgeStoredFiles);
        }
        effects.push(Effect::RemoveFinalizer);
    }
    Plan {
        events,
        status: Some(status),
        effects,
        requeue: Requeue::AwaitChange,
    }
}

/// A teardown as its drains report (docs/contract.md "A quiet lifecycle"): what to write, and
/// when. The opening is written when the teardown begins, or, when it waits the quiet window,
/// once the window has passed with paths still draining (with the outcomes had by then); once
/// it is written each outcome is written as it is had, but the last, which goes with the end. A
/// drain that reports no outcome means this replica stops draining (lost lease, shutdown):
/// nothing more is recorded, so the next leader resumes from the store's commit point.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TeardownProgress {
    status: SandboxRunStatus,
    opening: Option<Plan>,
    owed: usize,
    stopped: bool,
}

impl TeardownProgress {
    /// The progress of `planned`'s drains, and the opening to write now (None: it waits out
    /// `settle`).
    pub(crate) fn begin(
        opening: Plan,
        opening_waits: bool,
        status: SandboxRunStatus,
        owed: usize,
        settle: Duration,
    ) -> (TeardownProgress, Option<Plan>) {
        let waits = opening_waits && !settle.is_zero();
        let progress = TeardownProgress {
            status,
            opening: None,
            owed,
            stopped: false,
        };
        if waits {
            (
                TeardownProgress {
                    opening: Some(opening),
                    ..progress
                },
                None,
            )
        } else {
            (progress, Some(opening))
        }
    }

    /// Whether the quiet window still matters: the opening is unwritten and draining goes on.
    pub(crate) fn waits_for_quiet_window(&self) -> bool {
        self.opening.is_some() && !self.stopped
    }

    /// The quiet window passed with paths still draining: the opening to write now, with the
    /// outcomes had so far.
    pub(crate) fn quiet_window_passed(&mut self) -> Option<Plan> {
        if self.stopped {
            return None;
        }
        let mut late = self.opening.take()?;
        late.status = Some(self.status.clone());
        Some(late)
    }

    /// One path's drain ended with `outcome` for status entry `entry` (None: this replica stops
    /// draining). Returns the status to write now, if any.
    pub(crate) fn outcome(
        &mut self,
        entry: usize,
        outcome: Option<ReadBackStatus>,
    ) -> Option<SandboxRunStatus> {
        self.owed = self.owed.saturating_sub(1);
        match outcome {
            Some(outcome) if !self.stopped => {
                if let Some(slot) = self.status.read_back.get_mut(entry) {
                    *slot = outcome;
                }
                (self.opening.is_none() && self.owed > 0).then(|| self.status.clone())
            }
            _ => {
                self.stopped = true;
                None
            }
        }
    }

    /// Every drain reported: the status the end is planned from ([`teardown_end`]); None when
    /// this replica stopped draining.
    pub(crate) fn finish(self) -> Option<SandboxRunStatus> {
        (!self.stopped).then_some(self.status)
    }
}

/// What a delete of the run's stored files leaves to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Purge {
    /// Nothing (more) to delete, or the retries ran out: release the finalizer.
    Done,
    /// The delete failed; try again after this long (the finalizer stays).
    RetryAfter(Duration),
}

/// What a delete of the run's stored files (everything under `location`) that deleted `result`
/// objects, or failed with `result`'s words, means at `now`: a failure is retried with back-off
/// until the run's drain timeout (`bound_seconds`) has passed since the later of the deletion and
/// the drain's end; then the files are left and the finalizer released (docs/contract.md
/// "Stored files when a run is deleted").
pub(crate) fn purged(
    run: &SandboxRun,
    result: Result<usize, String>,
    location: &str,
    bound_seconds: i64,
    now: Timestamp,
) -> (PlannedEvent, Purge) {
    let e = match result {
        Ok(count) => {
            return (
                PlannedEvent::normal(
                    events::ARCHIVES_DELETED,
                    format!("retention: Delete: deleted {count} stored objects (archives and manifests) under {location}"),
                    "Delete",
                ),
                Purge::Done,
            )
        }
        Err(e) => e,
    };
    let bound = Duration::from_secs(u64::try_from(bound_seconds).unwrap_or(0));
    let start = retention::purge_window_start(run, now);
    match retention::purge_retry_after(start, bound, now) {
        Some(pause) => (
            PlannedEvent::warning(
                events::ARCHIVE_DELETE_FAILED,
                format!("retention: Delete: could not delete the stored files under {location}: {e}; retrying in {}s (gives up {bound_seconds}s after deletion; annotate sandbox.iterion.io/skip-drain=true to release the run now)", pause.as_secs().max(1)),
                "Delete",
            ),
            Purge::RetryAfter(pause),
        ),
        None => (
            PlannedEvent::warning(
                events::ARCHIVE_DELETE_ABANDONED,
                format!("retention: Delete: gave up after {bound_seconds}s (the drain timeout): the stored files under {location} were NOT all deleted ({e}); the run is released, delete them by hand"),
                "Delete",
            ),
            Purge::Done,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::conditions::set_condition;
    use crate::controller::conditions::set_condition_unknown;
    use crate::controller::fixtures::*;
    use crate::controller::observe::PodProblem;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn inputs<'a>(
        run: &'a SandboxRun,
        pod: Option<&'a PodView>,
        settings: &'a PodSettings,
    ) -> Inputs<'a> {
        Inputs {
            run,
            pod_name: "demo-sbr",
            pod,
            now: now(),
            pod_settings: settings,
            last_create_attempt: None,
            settle: SETTLE,
            default_retention: Retention::Retain,
        }
    }

    fn later(secs: i64) -> Timestamp {
        now()
            .checked_add(jiff::SignedDuration::from_secs(secs))
            .unwrap()
    }

    /// A plan in one line: `events | status phase | effects | requeue`.
    fn line(plan: &Plan) -> String {
        let events: Vec<String> = plan
            .events
            .iter()
            .map(|e| {
                format!(
                    "{}{}/{}{}",
                    if e.warning { "!" } else { "" },
                    e.reason,
                    e.action,
                    if e.about_pod { "@pod" } else { "" }
                )
            })
            .collect();
        let status = plan
            .status
            .as_ref()
            .map(|s| s.phase.map(Phase::as_str).unwrap_or("no phase"))
            .unwrap_or("-");
        let effects: Vec<String> = plan
            .effects
            .iter()
            .map(|e| match e {
                Effect::DeleteExpiredRun(e) => format!("DeleteExpiredRun({})", e.reason),
                Effect::RecordCreateAttempt(_) => "RecordCreateAttempt".to_string(),
                other => format!("{other:?}"),
            })
            .collect();
        let requeue = match plan.requeue {
            Requeue::AwaitChange => "await".to_string(),
            Requeue::After(d) => format!("{d:?}"),
        };
        format!(
            "[{}] | {status} | [{}] | {requeue}",
            events.join(" "),
            effects.join(" ")
        )
    }

    fn step_line(plan: StepPlan) -> String {
        match plan {
            StepPlan::Carry(plan) => line(&plan),
            StepPlan::CreatePod(pod) => format!("create {}", pod.metadata.name.unwrap_or_default()),
            StepPlan::RecordPodLost => "read the live run and the store".to_string(),
            StepPlan::Teardown(trigger) => {
                format!("[] | - | [StartTeardown({trigger:?})] | {IN_FLIGHT_REQUEUE:?}")
            }
        }
    }

    #[test]
    fn an_unresolvable_image_fails_the_run_at_once_and_no_pod_is_ever_created() {
        use crate::controller::decide::decide;
        let r = with_generation(run_with(&[("/out", true), ("/logs", false)]));
        let pod_settings = PodSettings::default();
        // Before the pre-flight the step is to create the pod…
        assert!(step_line(plan_step(
            decide(&r, None, now(), &settings()),
            &inputs(&r, None, &pod_settings)
        ))
        .starts_with("create "));
        let plan = image_unresolvable(
            &r,
            "image `localhost:5000/app:nope` does not resolve: localhost:5000 answered 404",
            "push the image first",
            now(),
        );
        assert_eq!(
            line(&plan),
            "[!ImageUnresolvable/Preflight] | Failed | [ForgetCreateAttempts] | await"
        );
        let note = &plan.events[0].note;
        assert!(
            note.contains("answered 404") && note.contains("hint: push the image first"),
            "{note}"
        );
        let status = plan.status.clone().unwrap_or_default();
        assert_one_ending(&status);
        assert_eq!(
            cond_of(&status, conditions::FAILED),
            pair("True", "ImageUnresolvable")
        );
        assert_eq!(
            cond_of(&status, conditions::READY),
            pair("False", "ImageUnresolvable")
        );
        assert_eq!(status.message.as_deref(), Some(note.as_str()));
        // The workload never ran: every path is Empty, not a drain failure; Drained=True.
        assert_eq!(
            status
                .read_back
                .iter()
                .map(|e| (e.path.as_str(), e.phase))
                .collect::<Vec<_>>(),
            [
                ("/out", ReadBackPhase::Empty),
                ("/logs", ReadBackPhase::Empty)
            ]
        );
        assert_eq!(
            cond_of(&status, conditions::DRAINED),
            pair("True", "Drained")
        );
        assert_eq!(status.pod_name, None);
        assert!(status.completion_time.is_some());
        // …and after it, the run is over: nothing creates a pod again, deletion lets it go.
        let mut failed = r.clone();
        failed.status = Some(status);
        let next = decide(&failed, None, later(60), &settings());
        assert_eq!(next, Step::DeleteFinishedPod);
        assert_eq!(
            line(&delete_finished_pod(&failed, None, later(60))),
            "[] | - | [] | await"
        );
        let gone = deleting(failed);
        assert_eq!(
            decide(&gone, None, later(60), &settings()),
            Step::ReleaseFinalizer
        );
    }

    #[test]
    fn an_unverified_image_is_a_warning_about_the_run() {
        let e = image_unverified("cannot prove image `x` resolvable: the registry timed out");
        assert!(e.warning && !e.about_pod);
        assert_eq!((e.reason, e.action), ("ImageUnverified", "Preflight"));
        assert!(e.note.contains("timed out"));
    }

    fn deleting(mut r: SandboxRun) -> SandboxRun {
        r.metadata.deletion_timestamp = Some(Time(now()));
        r
    }

    fn retention(mut r: SandboxRun, retention: Retention) -> SandboxRun {
        if let Some(rb) = r.spec.read_back.as_mut() {
            rb.retention = Some(retention);
        }
        r
    }

    fn drained(mut r: SandboxRun) -> SandboxRun {
        let paths: Vec<String> = r
            .spec
            .read_back_paths()
            .iter()
            .map(|p| p.path.clone())
            .collect();
        if let Some(s) = r.status.as_mut() {
            s.read_back = paths
                .into_iter()
                .map(|path| ReadBackStatus {
                    path,
                    phase: ReadBackPhase::Drained,
                    ..Default::default()
                })
                .collect();
        }
        r
    }

    fn stuck() -> PodView {
        PodView {
            holder_running: false,
            workload: WorkloadState::NotStarted,
            problem: Some(PodProblem::Stuck {
                reason: "FailedMount",
                message: "configmap \"cfg\" not found".into(),
            }),
            ..running()
        }
    }

    fn pod_deleting() -> PodView {
        PodView {
            deleting: true,
            ..running()
        }
    }

    #[test]
    fn every_step_has_its_plan() {
        let settings = PodSettings::default();
        let out = || run_with(&[("/out", false), ("/logs", false)]);
        let mut no_finalizer = out();
        no_finalizer.metadata.finalizers = None;
        let mut bad_user = out();
        bad_user.spec.user = Some("root".into());
        let mut with_ttl = with_phase(out(), Phase::Succeeded);
        with_ttl.spec.ttl_seconds_after_finished = Some(30);
        if let Some(s) = with_ttl.status.as_mut() {
            s.completion_time = Some(Time(now()));
            set_condition(
                &mut s.conditions,
                conditions::COMPLETE,
                true,
                "Succeeded",
                "",
                None,
                now(),
            );
        }
        let mut half_drained = with_phase(out(), Phase::Running);
        if let Some(s) = half_drained.status.as_mut() {
            s.read_back = vec![ReadBackStatus {
                path: "/out".into(),
                phase: ReadBackPhase::Drained,
                ..Default::default()
            }];
        }
        let cases: Vec<(&str, Step, SandboxRun, Option<PodView>, &str)> = vec![
            (
                "a new run gets the finalizer",
                Step::AddFinalizer,
                no_finalizer,
                None,
                "[] | - | [AddFinalizer] | await",
            ),
            (
                "the pod is built and created",
                Step::CreatePod,
                out(),
                None,
                "create demo-sbr",
            ),
            (
                "a pod that cannot be built is recorded and awaited",
                Step::CreatePod,
                bad_user,
                None,
                "[!InvalidSpec/CreatePod] | Pending | [] | await",
            ),
            (
                "a running pod is reported once",
                Step::TrackPod { requeue: None },
                with_phase(out(), Phase::Pending),
                Some(running()),
                "[Running/Track@pod] | Running | [] | await",
            ),
            (
                "a running pod already reported writes nothing",
                Step::TrackPod {
                    requeue: Some(Duration::from_secs(60)),
                },
                {
                    let r = with_phase(out(), Phase::Running);
                    let mut r2 = r.clone();
                    r2.status = Some(tracked_status(&r, "demo-sbr", &running(), now()));
                    r2
                },
                Some(running()),
                "[] | - | [] | 60.2s",
            ),
            (
                "a stuck pod is told by its cause and looked at again",
                Step::TrackPod { requeue: None },
                with_phase(out(), Phase::Pending),
                Some(stuck()),
                "[!PodStuck/FailedMount@pod] | Pending | [] | 5.2s",
            ),
            (
                "a teardown goes to the drain pool",
                Step::Teardown(Trigger::Stop),
                with_phase(out(), Phase::Running),
                Some(running()),
                "[] | - | [StartTeardown(Stop)] | 30s",
            ),
            (
                "a lost pod needs the live run and the store first",
                Step::RecordPodLost,
                with_phase(out(), Phase::Running),
                None,
                "read the live run and the store",
            ),
            (
                "a finished run's pod is deleted at once once its paths are settled",
                Step::DeleteFinishedPod,
                drained(with_phase(out(), Phase::Succeeded)),
                Some(running()),
                "[] | - | [DeletePod { at_once: true }] | await",
            ),
            (
                "a finished run's unsettled pod is deleted with its grace period",
                Step::DeleteFinishedPod,
                half_drained.clone(),
                Some(running()),
                "[] | - | [DeletePod { at_once: false }] | await",
            ),
            (
                "a pod already being deleted is left to its grace period",
                Step::DeleteFinishedPod,
                half_drained,
                Some(pod_deleting()),
                "[] | - | [] | await",
            ),
            (
                "a finished run with a TTL is looked at again when it passes",
                Step::DeleteFinishedPod,
                with_ttl.clone(),
                None,
                "[] | - | [] | 30.2s",
            ),
            (
                "a deleted run that owes nothing is released",
                Step::DeleteFinishedPod,
                deleting(drained(with_phase(out(), Phase::Succeeded))),
                None,
                "[] | - | [RemoveFinalizer] | await",
            ),
            (
                "an expired run is deleted, then announced",
                Step::DeleteExpiredRun,
                with_ttl,
                None,
                "[] | - | [DeleteExpiredRun(TTLExpired)] | await",
            ),
            (
                "a deleted run is released, its pod deleted at once",
                Step::ReleaseFinalizer,
                deleting(with_phase(out(), Phase::Succeeded)),
                Some(running()),
                "[] | - | [ForgetCreateAttempts DeletePod { at_once: true } RemoveFinalizer] | await",
            ),
            (
                "with retention Delete its stored files go first",
                Step::ReleaseFinalizer,
                retention(deleting(with_phase(out(), Phase::Succeeded)), Retention::Delete),
                None,
                "[] | - | [ForgetCreateAttempts PurgeStoredFiles RemoveFinalizer] | await",
            ),
            (
                "skip-drain releases the run at once and says so",
                Step::SkipDrain,
                deleting(with_phase(out(), Phase::Running)),
                Some(running()),
                "[!DrainSkipped/Delete@pod] | - | [DeletePod { at_once: true } RemoveFinalizer] | await",
            ),
        ];
        for (name, step, run, pod, want) in cases {
            let got = step_line(plan_step(step, &inputs(&run, pod.as_ref(), &settings)));
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn an_invalid_spec_is_told_once_and_a_refused_pod_waits_out_its_back_off() {
        let settings = PodSettings::default();
        let mut r = run_with(&[("/out", false)]);
        r.spec.user = Some("root".into());
        let StepPlan::Carry(first) = plan_step(Step::CreatePod, &inputs(&r, None, &settings))
        else {
            panic!("an invalid spec is recorded");
        };
        r.status = first.status.clone();
        let again = step_line(plan_step(Step::CreatePod, &inputs(&r, None, &settings)));
        assert_eq!(again, "[] | Pending | [] | await", "told once");

        let r = run_with(&[("/out", false)]);
        let refused = pod_refused(&r, "exceeded quota", now());
        assert_eq!(
            line(&refused),
            "[!PodCreateFailed/CreatePod] | Pending | [RecordCreateAttempt] | 10.2s"
        );
        let mut r2 = r.clone();
        r2.status = refused.status;
        let mut waiting = inputs(&r2, None, &settings);
        waiting.last_create_attempt = Some(now());
        waiting.now = later(4);
        assert_eq!(
            step_line(plan_step(Step::CreatePod, &waiting)),
            "[] | - | [] | 6.2s"
        );
    }

    #[test]
    fn a_created_pod_is_announced_and_one_that_existed_is_not() {
        // A run already reported (here: its pod was refused before) is told at once.
        let r = with_phase(run_with(&[("/out", false)]), Phase::Pending);
        let created = pod_created(&r, "demo-sbr", true, SETTLE, now());
        assert_eq!(
            line(&created),
            "[PodCreated/CreatePod@pod] | Pending | [ForgetCreateAttempts] | await"
        );
        let status = created.status.unwrap_or_default();
        assert_eq!(status.pod_name.as_deref(), Some("demo-sbr"));
        assert_eq!(status.read_back.len(), 1, "every path is Pending");
        assert_eq!(
            line(&pod_created(&r, "demo-sbr", false, SETTLE, now())),
            "[] | Pending | [] | await"
        );
    }

    #[test]
    fn a_fresh_runs_pod_is_reported_only_if_it_has_not_run_within_the_settle_time() {
        let fresh = run_with(&[("/out", false)]);
        // Created: nothing written, remembered, looked at again when SETTLE has passed.
        assert_eq!(
            line(&pod_created(&fresh, "demo-sbr", true, SETTLE, now())),
            "[] | - | [ForgetCreateAttempts RememberUnreportedPod] | 2.2s"
        );
        let starting = |since: i64| PodView {
            holder_running: false,
            workload: WorkloadState::NotStarted,
            started_at: None,
            pending_since: Some(later(-since)),
            ..running()
        };
        // Just created and starting: still quiet, looked at again at the end of SETTLE.
        let quiet = track_pod(&fresh, "demo-sbr", Some(&starting(0)), None, now(), SETTLE);
        assert_eq!(line(&quiet), "[] | - | [] | 2.2s");
        // Running within SETTLE: one write, Running, and no Event (nothing to notice).
        let ran = track_pod(&fresh, "demo-sbr", Some(&running()), None, now(), SETTLE);
        assert_eq!(line(&ran), "[] | Running | [] | await");
        assert_eq!(
            ran.status.and_then(|s| s.pod_name).as_deref(),
            Some("demo-sbr")
        );
        // Still starting after SETTLE: reported Pending, and the pod's creation told then.
        let slow = track_pod(&fresh, "demo-sbr", Some(&starting(3)), None, now(), SETTLE);
        assert_eq!(
            line(&slow),
            "[PodCreated/CreatePod@pod] | Pending | [] | 5.2s"
        );
        // ...and its running told after that Pending.
        let pending = with_phase(fresh.clone(), Phase::Pending);
        assert_eq!(
            line(&track_pod(
                &pending,
                "demo-sbr",
                Some(&running()),
                None,
                now(),
                SETTLE
            )),
            "[Running/Track@pod] | Running | [] | await"
        );
        // A problem is reported at once, however young the pod.
        let stuck = PodView {
            problem: Some(PodProblem::Stuck {
                reason: "FailedMount",
                message: "configmap \"cfg\" not found".into(),
            }),
            ..starting(0)
        };
        assert_eq!(
            line(&track_pod(
                &fresh,
                "demo-sbr",
                Some(&stuck),
                None,
                now(),
                SETTLE
            )),
            "[!PodStuck/FailedMount@pod PodCreated/CreatePod@pod] | Pending | [] | 5.2s"
        );
    }

    #[test]
    fn a_name_taken_by_another_pod_is_told_and_looked_at_again() {
        let r = run_with(&[]);
        let plan = name_conflict(&r, "demo-sbr");
        assert_eq!(
            line(&plan),
            "[!PodNameConflict/Reconcile@pod] | no phase | [] | 60s"
        );
    }

    #[test]
    fn a_lost_pod_is_told_once_and_a_deleted_run_kept_by_retain_is_released() {
        let r = with_phase(run_with(&[("/out", true)]), Phase::Running);
        let plan = record_pod_lost(&r, &[], Retention::Retain, now());
        assert_eq!(
            line(&plan),
            "[!sandbox_runfiles_drain_failed/PodLost] | Failed | [] | await"
        );
        // Already reported: no second Event.
        let mut told = r.clone();
        told.status = plan.status;
        assert_eq!(
            line(&record_pod_lost(&told, &[], Retention::Retain, now())),
            "[] | Failed | [] | await"
        );
        // Deleted: Retain releases here, Delete leaves it to ReleaseFinalizer (files first).
        let gone = deleting(r);
        assert_eq!(
            line(&record_pod_lost(&gone, &[], Retention::Retain, now())),
            "[!sandbox_runfiles_drain_failed/PodLost] | Failed | [RemoveFinalizer] | await"
        );
        assert_eq!(
            line(&record_pod_lost(&gone, &[], Retention::Delete, now())),
            "[!sandbox_runfiles_drain_failed/PodLost] | Failed | [] | await"
        );
    }

    fn a_pod(holder: bool, workload_started: bool) -> Pod {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateRunning, ContainerStateWaiting, ContainerStatus,
            PodStatus,
        };
        let state = |running: bool| ContainerState {
            running: running.then(ContainerStateRunning::default),
            waiting: (!running).then(ContainerStateWaiting::default),
            ..Default::default()
        };
        Pod {
            status: Some(PodStatus {
                container_statuses: Some(vec![
                    ContainerStatus {
                        name: crate::pod::HOLDER_CONTAINER.into(),
                        state: Some(state(holder)),
                        ..Default::default()
                    },
                    ContainerStatus {
                        name: crate::pod::WORKLOAD_CONTAINER.into(),
                        state: Some(state(workload_started)),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn each_teardown_path_gets_its_outcome_and_the_deadline_runs_from_the_start() {
        let caps = CapSettings::default();
        let mut r = with_phase(
            run_with(&[("/out", false), ("/logs", false)]),
            Phase::Running,
        );
        r.spec.stop = true;
        let works = |plan: &TeardownPlan| -> Vec<String> {
            plan.paths
                .iter()
                .map(|p| match &p.work {
                    PathWork::Record(e) => format!("{} {}", p.path, e.phase.as_str()),
                    PathWork::Drain { .. } => format!("{} drain", p.path),
                })
                .collect()
        };
        // Begun now: opened with an Event and the Draining status; both paths drained.
        let pod = a_pod(true, true);
        let plan = teardown(&r, Some(&pod), &Trigger::Stop, &caps, 300, now());
        assert_eq!(
            line(&plan.opening),
            "[TearingDown/Teardown@pod] | Draining | [] | await"
        );
        assert_eq!(works(&plan), ["/out drain", "/logs drain"]);
        assert_eq!(plan.drain_left, Duration::from_secs(300));
        assert!(plan.holder_running);
        assert!(matches!(
            plan.paths[0].work,
            PathWork::Drain { cap_bytes, previous_attempts: 0, ref holder_path }
                if cap_bytes == caps.default_bytes && holder_path == "/sandboxrun-readback/out"
        ));
        // The holder is not running: the paths cannot be read.
        let plan = teardown(
            &r,
            Some(&a_pod(false, true)),
            &Trigger::Stop,
            &caps,
            300,
            now(),
        );
        assert_eq!(works(&plan), ["/out Failed", "/logs Failed"]);
        assert!(!plan.holder_running);
        // The workload never started (no pod, never seen running): nothing was written.
        let mut never = run_with(&[("/out", false)]);
        never.status = Some(SandboxRunStatus {
            phase: Some(Phase::Pending),
            ..Default::default()
        });
        let plan = teardown(
            &never,
            Some(&a_pod(true, false)),
            &Trigger::Stop,
            &caps,
            300,
            now(),
        );
        assert_eq!(works(&plan), ["/out Empty"]);
        // Resumed 100 s into the drain, /out already drained: no Event, no write, 200 s left.
        let mut resumed = r.clone();
        if let Some(s) = resumed.status.as_mut() {
            s.phase = Some(Phase::Draining);
            s.read_back = vec![ReadBackStatus {
                path: "/out".into(),
                phase: ReadBackPhase::Drained,
                ..Default::default()
            }];
            set_condition_unknown(
                &mut s.conditions,
                conditions::DRAINED,
                "Draining",
                "",
                None,
                now(),
            );
        }
        let plan = teardown(&resumed, Some(&pod), &Trigger::Stop, &caps, 300, later(100));
        assert_eq!(line(&plan.opening), "[] | - | [] | await");
        assert_eq!(works(&plan), ["/logs drain"]);
        assert_eq!(plan.drain_left, Duration::from_secs(200));
        // Past the deadline: nothing left (the drains fail at once).
        let plan = teardown(&resumed, Some(&pod), &Trigger::Stop, &caps, 300, later(400));
        assert_eq!(plan.drain_left, Duration::ZERO);
    }

    #[test]
    fn a_teardown_ends_with_one_summary_the_final_status_and_the_release() {
        let r = with_phase(run_with(&[("/out", false)]), Phase::Running);
        let draining = drained(r.clone()).status.unwrap_or_default();
        assert_eq!(
            line(&teardown_end(
                &r,
                draining.clone(),
                true,
                true,
                Retention::Retain,
                now()
            )),
            "[Stopped/Teardown@pod] | Stopped | [MarkDrained DeletePod { at_once: true }] | await"
        );
        // A clean drain is told in the Event that announces the end, with every path.
        let end = teardown_end(&r, draining.clone(), true, true, Retention::Retain, now());
        assert!(
            end.events[0].note.starts_with(
                "run stopped; read-back paths drained. 1 path(s): 1 Drained. /out: Drained"
            ),
            "{}",
            end.events[0].note
        );
        let gone = deleting(r.clone());
        assert_eq!(
            line(&teardown_end(
                &gone,
                draining.clone(),
                false,
                false,
                Retention::Delete,
                now()
            )),
            "[Stopped/Teardown@pod] | Stopped | [PurgeStoredFiles RemoveFinalizer] | await"
        );
        let mut failed = draining;
        failed.read_back[0].phase = ReadBackPhase::Failed;
        assert_eq!(
            line(&teardown_end(&gone, failed, false, false, Retention::Retain, now())),
            "[!sandbox_runfiles_drain_failed/Drain@pod !Stopped/Teardown@pod] | Stopped | [RemoveFinalizer] | await"
        );
    }

    #[test]
    fn a_failed_delete_of_stored_files_is_retried_until_the_drain_timeout() {
        let r = deleting(with_phase(run_with(&[("/out", false)]), Phase::Succeeded));
        let (event, purge) = purged(&r, Ok(4), "file:///s/ns/demo/u1/", 300, now());
        assert_eq!(
            (event.reason, purge),
            (events::ARCHIVES_DELETED, Purge::Done)
        );
        assert!(
            event.note.contains("deleted 4 stored objects"),
            "{}",
            event.note
        );
        let (event, purge) = purged(&r, Err("denied".into()), "x/", 300, later(10));
        assert_eq!(
            (event.reason, purge),
            (
                events::ARCHIVE_DELETE_FAILED,
                Purge::RetryAfter(Duration::from_secs(5))
            )
        );
        let (event, purge) = purged(&r, Err("denied".into()), "x/", 300, later(300));
        assert_eq!(
            (event.reason, purge),
            (events::ARCHIVE_DELETE_ABANDONED, Purge::Done)
        );
        assert!(event.warning);
    }

    mod teardown_progress {
        use super::*;

        fn opening() -> Plan {
            Plan {
                events: vec![PlannedEvent::normal(
                    events::TEARING_DOWN,
                    "tearing down",
                    "Teardown",
                )],
                status: Some(status_with(&["/a", "/b", "/c"])),
                ..Plan::wait(Requeue::AwaitChange)
            }
        }

        fn status_with(paths: &[&str]) -> SandboxRunStatus {
            SandboxRunStatus {
                phase: Some(Phase::Draining),
                read_back: paths
                    .iter()
                    .map(|p| ReadBackStatus {
                        path: p.to_string(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }
        }

        fn drained(path: &str) -> Option<ReadBackStatus> {
            Some(ReadBackStatus {
                path: path.to_string(),
                phase: ReadBackPhase::Drained,
                ..Default::default()
            })
        }

        fn begin(waits: bool, settle: Duration) -> (TeardownProgress, Option<Plan>) {
            TeardownProgress::begin(
                opening(),
                waits,
                status_with(&["/a", "/b", "/c"]),
                3,
                settle,
            )
        }

        #[test]
        fn an_opening_that_does_not_wait_is_written_at_once_then_each_outcome_but_the_last() {
            let (mut p, now) = begin(false, SETTLE);
            assert_eq!(now, Some(opening()));
            assert!(!p.waits_for_quiet_window());
            let first = p.outcome(0, drained("/a")).expect("written at once");
            assert_eq!(first.read_back[0].phase, ReadBackPhase::Drained);
            assert!(p.outcome(2, drained("/c")).is_some());
            assert_eq!(
                p.outcome(1, drained("/b")),
                None,
                "the last goes with the end"
            );
            let end = p.finish().expect("not stopped");
            assert!(end
                .read_back
                .iter()
                .all(|e| e.phase == ReadBackPhase::Drained));
        }

        #[test]
        fn a_waiting_opening_is_written_only_when_the_quiet_window_passes_with_what_is_known() {
            let (mut p, now) = begin(true, SETTLE);
            assert_eq!(now, None);
            assert!(p.waits_for_quiet_window());
            assert_eq!(
                p.outcome(0, drained("/a")),
                None,
                "before the window: nothing"
            );
            let late = p.quiet_window_passed().expect("the opening, late");
            assert_eq!(late.events, opening().events);
            let status = late.status.expect("with the outcomes so far");
            assert_eq!(status.read_back[0].phase, ReadBackPhase::Drained);
            assert_eq!(status.read_back[1].phase, ReadBackPhase::Pending);
            assert!(!p.waits_for_quiet_window());
            assert_eq!(p.quiet_window_passed(), None, "written once");
            assert!(p.outcome(1, drained("/b")).is_some());
            assert_eq!(p.outcome(2, drained("/c")), None);
            assert!(p.finish().is_some());
        }

        #[test]
        fn a_teardown_that_drains_within_the_window_writes_nothing_before_its_end() {
            let (mut p, _) = begin(true, SETTLE);
            for (i, path) in ["/a", "/b", "/c"].iter().enumerate() {
                assert_eq!(p.outcome(i, drained(path)), None);
            }
            assert!(p.finish().is_some());
        }

        #[test]
        fn no_quiet_window_means_no_wait() {
            let (p, now) = begin(true, Duration::ZERO);
            assert!(now.is_some());
            assert!(!p.waits_for_quiet_window());
        }

        #[test]
        fn a_replica_that_stops_draining_records_nothing_more_and_plans_no_end() {
            let (mut p, _) = begin(true, SETTLE);
            assert_eq!(p.outcome(0, None), None);
            assert!(!p.waits_for_quiet_window());
            assert_eq!(p.quiet_window_passed(), None);
            assert_eq!(p.outcome(1, drained("/b")), None, "stopped: not recorded");
            assert_eq!(p.finish(), None);
        }
    }
}
