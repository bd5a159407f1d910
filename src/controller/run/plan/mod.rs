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
mod attempt;
mod checkpoint;
pub(crate) mod claim;
mod create;
mod finish;
mod fork;
mod model;
mod queued;
mod restore;
mod teardown;
#[cfg(test)]
pub(crate) mod testing;
mod track;

use super::decide::Step;
use super::retention;
use crate::api::{Retention, SandboxRun};
use crate::controller::events::{self, PlannedEvent};
use create::create_pod;
use finish::{delete_finished_pod, expired_event, skip_drain};
use track::{gate_policy, track_pod};

pub(crate) use after::{after, AfterInputs, Answer};
pub(crate) use attempt::attempt_end;
pub(crate) use checkpoint::{
    checkpoint_number, checkpoint_paths, checkpoint_recorded, checkpoint_refused,
};
/// The status a refused pod create leaves (the GitOps fixtures build one from it).
#[cfg(test)]
pub(crate) use create::pod_refused;
pub(crate) use create::{creation, egress_effects, refused_by_namespace_policies, shaped_pod};
pub(crate) use create::{recording_template, template_unusable};
pub(crate) use finish::record_pod_lost;
pub(crate) use fork::{bind as bind_fork, manifest_is, Bound, Generation, Source as RestoreSource};
pub(crate) use model::{
    CreationFacts, Effect, Inputs, NotPurged, Plan, PurgeTarget, Requeue, StepPlan,
    IN_FLIGHT_REQUEUE, LOOK_AGAIN_MARGIN, NAME_CONFLICT_REQUEUE, SETTLE,
};
pub(crate) use queued::queued;
#[cfg(test)]
pub(crate) use restore::parked_if_due;
pub(crate) use restore::{
    plan_of as restore_plan, restore_recorded, restore_source, restore_step, NotHanded, NotRestored,
};
/// The end of a run's teardown (the GitOps fixtures build one from it).
#[cfg(test)]
pub(crate) use teardown::teardown_end;
pub(crate) use teardown::{
    teardown, without_store, PathPlan, PathWork, TeardownPlan, TeardownProgress,
};

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
        Step::TrackPod { requeue } => {
            let mut plan = track_pod(
                run,
                inputs.pod_name,
                inputs.pod,
                requeue,
                inputs.now,
                inputs.settle,
            );
            let egress = &inputs.pod_settings.egress;
            plan.effects
                .extend(gate_policy(run, inputs.pod, egress, inputs.proxy_pods));
            plan
        }
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
        Step::AwaitRetry { left } => Plan::wait(Requeue::After(left)),
        Step::Suspended => attempt::suspended(run, inputs.now),
        Step::Checkpoint => return StepPlan::Checkpoint,
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
    use crate::controller::run::decide::{Step, Trigger};

    use crate::controller::testkit::fixtures::*;

    use crate::controller::pod_view::PodView;
    use crate::controller::run::plan::testing::*;

    use crate::controller::run::status::*;
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
                "a running pod is reported once, in the status",
                Step::TrackPod { requeue: None },
                with_phase(out(), Phase::Pending),
                Some(running()),
                "[] | Running | [] | await",
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
