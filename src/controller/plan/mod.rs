//! Plan: from the chosen [`Step`] and what was observed to what the act stage must do — the
//! status to write, the Events to publish and the effects (finalizers, the pod, the drain, the
//! stored files), in order. Pure: no client, no clock (`now` is an argument), so every step's
//! outcome is unit tested here; [`super::act`] only carries a plan out.
//!
//! A plan is carried out in one order: its Events first, then its status, then its effects.
//! An effect whose outcome is the world's answer (creating the pod, deleting the stored files)
//! ends the carrying out with an [`Answer`], and [`after`] plans what follows. Steps that need a
//! read first are planned once it is had: creating the pod ([`StepPlan::CreatePod`]: the image
//! pre-flight, then [`create`]), reporting a lost pod (the live run and the committed manifests,
//! then [`record_pod_lost`]); the teardown is planned in the drain pool ([`teardown`] before the
//! drains, [`TeardownProgress`] as they report, [`teardown_end`] after them).
//!
//! By concept: [`create`](mod@create), [`track`], [`teardown`](mod@teardown), [`finish`] (after
//! the end), [`after`](mod@after) (the answers' follow-up).

mod after;
mod create;
mod finish;
mod teardown;
#[cfg(test)]
mod testing;
mod track;

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;

use super::decide::{Step, Trigger};
use super::events::{self, PlannedEvent};
use super::observe::PodView;
use super::retention;
use crate::api::SandboxRunStatus;
use crate::api::{Retention, SandboxRun};
use crate::pod::PodSettings;
use create::create_pod;
use finish::{delete_finished_pod, expired_event, skip_drain};
use track::track_pod;

pub(crate) use after::{after, AfterInputs, Answer};
pub(crate) use create::create;
pub(crate) use finish::record_pod_lost;
pub(crate) use teardown::{
    teardown, teardown_end, PathPlan, PathWork, TeardownPlan, TeardownProgress,
};

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
pub(crate) const SETTLE: Duration = Duration::from_secs(2);

/// How often a run whose pod name is taken by a pod it does not own is looked at again.
pub(crate) const NAME_CONFLICT_REQUEUE: Duration = Duration::from_secs(60);

/// When the run is reconciled again without a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Requeue {
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
pub(crate) enum Effect {
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
pub(crate) struct Plan {
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
    pub(crate) fn wait(requeue: Requeue) -> Plan {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Phase, ReadBackPhase, ReadBackStatus, Retention, SandboxRun};
    use crate::controller::conditions;
    use crate::controller::conditions::set_condition;
    use crate::controller::decide::{Step, Trigger};

    use crate::controller::fixtures::*;

    use crate::controller::observe::PodView;
    use crate::controller::plan::testing::*;

    use crate::controller::status::*;
    use crate::pod::PodSettings;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::time::Duration;

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
    fn a_name_taken_by_another_pod_is_told_and_looked_at_again() {
        let r = run_with(&[]);
        let plan = name_conflict(&r, "demo-sbr");
        assert_eq!(
            line(&plan),
            "[!PodNameConflict/Reconcile@pod] | no phase | [] | 60s"
        );
    }
}
