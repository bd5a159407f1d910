//! One reconcile, stage by stage, with one `now`: observe (the pod: [`observe`]; the rest it
//! reads: [`prepare`]) → decide → plan → act (through [`drive`], which plans each answer's
//! follow-up). The steps whose plan needs a read first — creating the pod (the store verdict,
//! namespace labels, image pre-flight, Kueue flavors), reporting a lost pod (the live run and
//! the store) — read it through [`prepare`] / [`observe`] here, then plan; nothing here decides
//! what a read means, and every write goes through [`drive`]: once per reconcile, the plan of
//! its step (or of the stage that took its place: the ignored queue's word, the Kueue gate's
//! hold, a parked attempt's restore, the warm claim; or, before any step, the plan that says why
//! there is none), and besides only a Kueue Workload's finish or first effects, carried out
//! before the step that follows them. [`in_flight`] is a reconcile of its own.

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tracing::{info, warn};

use super::decide::{self, Preflight};
use super::drive;
use super::observe::{self, Observation, Observed};
use super::plan::{self, Inputs, Plan, Requeue, StepPlan, IN_FLIGHT_REQUEUE, LOOK_AGAIN_MARGIN};
use super::prepare::{Made, MadeRun};
use super::{act, kueue_gate, prepare, warm};
use crate::api::SandboxRun;
use crate::controller::context::Context;
use crate::controller::drains::{checkpoint, teardown};
use crate::controller::error::ControllerError;
use crate::egress::verdict::verdict;
use crate::identity::RunId;

/// What a reconcile did: its step's metric label (None: the run's pod name is taken, or its
/// template cannot make it: no step was decided) and when to look again.
pub(crate) struct Reconciled {
    /// The step's label ([`decide::Step::as_str`]).
    pub step: Option<&'static str>,
    /// When to look again.
    pub requeue: Requeue,
}

impl Reconciled {
    fn after(step: &'static str, requeue: Requeue) -> Reconciled {
        Reconciled {
            step: Some(step),
            requeue,
        }
    }
}

/// Reconciles `run` once at `now`.
pub(crate) async fn reconcile(
    ctx: &Arc<Context>,
    run: &Arc<SandboxRun>,
    now: Timestamp,
) -> Result<Reconciled, ControllerError> {
    let (observation, made, resolved) = match observed(ctx, run, now).await? {
        Ok(observed) => observed,
        Err(early) => {
            return Ok(Reconciled {
                step: None,
                requeue: early.carry_out(ctx, run, now).await?,
            })
        }
    };
    let step = decide::decide(made.merged(), observation.view.as_ref(), now, &ctx.decide);
    let (made, step) = match finalized(ctx, made, step, &observation, now).await? {
        Ok(first) => first,
        Err(requeue) => return Ok(Reconciled::after("add_finalizer", requeue)),
    };
    let run = made.merged();
    let rights_unverified = unverified_rights(ctx, &made, &step);
    let label = step.as_str();
    info!(run = %observation.id.name, namespace = %observation.id.namespace, step = label, "reconcile");
    let proxy_pods = ctx.egress_proxy.addresses();
    let inputs = Inputs {
        run,
        pod_name: &observation.pod_name,
        pod: observation.view.as_ref(),
        now,
        pod_settings: &ctx.pod,
        rules: &ctx.admission.rules,
        rights_unverified: rights_unverified.as_deref(),
        last_create_attempt: ctx.last_create_attempt(run),
        default_retention: ctx.lifecycle.default_retention,
        settle: ctx.lifecycle.settle,
        proxy_pods: &proxy_pods,
    };
    let verified = rights_unverified.is_none();
    let queue = prepare::queue_view(ctx, run, &step).await?;
    let staged = (step, queue.as_ref());
    let stages = through_stages(ctx, &made, staged, &inputs, verified, &observation, now);
    let next = match stages.await? {
        Through::Go(step) => {
            let read = (resolved, queue.as_ref());
            planned(ctx, run, (step, &inputs), read, &observation, now).await?
        }
        Through::Carry(plan) => Next::Carry(plan, observation.pod.as_ref()),
        Through::Claim(plan) => Next::Carry(plan, None),
        Through::Held(requeue) => Next::Requeue(requeue),
    };
    // The one act of the reconcile: its plan carried out, on the run (or on the live run a lost
    // pod is reported on).
    let requeue = next.carry_out(ctx, run, &observation.pod_name, now).await?;
    Ok(Reconciled::after(label, requeue))
}

/// What a reconcile's step leaves act to do.
enum Next<'a> {
    /// Carry this plan out on the run (`related`: its Events' related pod).
    Carry(Box<Plan>, Option<&'a Pod>),
    /// Carry this plan out on this run (the live run a lost pod is reported on).
    OnLive(Arc<SandboxRun>, Box<Plan>),
    /// Nothing (a job started, a read that says to wait): look again then.
    Requeue(Requeue),
}

impl Next<'_> {
    /// Its plan carried out for `run` and its pod `pod_name`: when to look again.
    async fn carry_out(
        self,
        ctx: &Context,
        run: &SandboxRun,
        pod_name: &str,
        now: Timestamp,
    ) -> Result<Requeue, ControllerError> {
        match self {
            Next::Carry(plan, related) => {
                drive::carry_out(ctx, run, pod_name, related, *plan, now).await
            }
            Next::OnLive(live, plan) => {
                drive::carry_out(ctx, &live, pod_name, None, *plan, now).await
            }
            Next::Requeue(requeue) => Ok(requeue),
        }
    }
}

/// The plan of `step`, with what it needs read first ([`prepare`]): a teardown or a checkpoint
/// is started in the drain pool instead.
async fn planned<'a>(
    ctx: &Arc<Context>,
    run: &Arc<SandboxRun>,
    (step, inputs): (decide::Step, &Inputs<'_>),
    (resolved, queue): (bool, Option<&prepare::QueueView>),
    observation: &'a Observation,
    now: Timestamp,
) -> Result<Next<'a>, ControllerError> {
    Ok(match plan::plan_step(step, inputs) {
        StepPlan::Carry(plan) => Next::Carry(plan, observation.pod.as_ref()),
        StepPlan::CreatePod(pod) => {
            let plan = create_pod(ctx, run, *pod, (resolved, queue), now).await?;
            Next::Carry(Box::new(plan), None)
        }
        StepPlan::RecordPodLost => match record_pod_lost(ctx, run, observation, now).await? {
            Ok((live, plan)) => Next::OnLive(live, Box::new(plan)),
            Err(requeue) => Next::Requeue(requeue),
        },
        StepPlan::Checkpoint => {
            checkpoint::start(ctx, (run, &observation.id));
            Next::Requeue(Requeue::After(IN_FLIGHT_REQUEUE))
        }
        StepPlan::Teardown(trigger) => {
            Next::Requeue(start_teardown(ctx, (run, &observation.id), trigger))
        }
    })
}

/// The run's pod observed and the run it reconciles made ([`prepare::made_run`]; `resolved`: its
/// template was read now), or — a pod with its name it does not own, a template that cannot make it —
/// the plan that says so, for the reconcile to carry out before any step.
async fn observed(
    ctx: &Arc<Context>,
    run: &Arc<SandboxRun>,
    now: Timestamp,
) -> Result<Result<(Observation, MadeRun, bool), Early>, ControllerError> {
    let observation = match observe::observe(ctx.seal_check(), &ctx.memory.events, run, now).await?
    {
        Observed::Run(observation) => observation,
        // A pod with our name that the run does not own is not ours to drain or delete.
        Observed::NameTaken { observation, other } => {
            let plan = plan::name_conflict(run, &observation.pod_name);
            return Ok(Err(Early {
                observation,
                related: Some(other),
                plan,
            }));
        }
    };
    match prepare::made_run(ctx, run, &observation).await? {
        Made::Run { run, resolved } => Ok(Ok((observation, run, resolved))),
        Made::Unusable(message) => {
            let plan = plan::template_unusable(run, &message, now);
            Ok(Err(Early {
                observation,
                related: None,
                plan,
            }))
        }
    }
}

/// A reconcile that stops before its step: the plan that says why (`related`: the pod its
/// Events name, when not the run's own observed one).
struct Early {
    observation: Observation,
    related: Option<Box<Pod>>,
    plan: Plan,
}

impl Early {
    /// Its plan carried out: when to look again.
    async fn carry_out(
        self,
        ctx: &Context,
        run: &SandboxRun,
        now: Timestamp,
    ) -> Result<Requeue, ControllerError> {
        let seen = &self.observation;
        let related = self.related.as_deref().or(seen.pod.as_ref());
        drive::carry_out(ctx, run, &seen.pod_name, related, self.plan, now).await
    }
}

/// Starts the run's teardown in the drain pool; one that waits for a slot is looked at again
/// after the quiet window.
fn start_teardown(
    ctx: &Arc<Context>,
    (run, id): (&Arc<SandboxRun>, &RunId),
    trigger: decide::Trigger,
) -> Requeue {
    teardown::start(ctx, (run, id), trigger);
    match ctx.in_flight.drains.position(&id.uid) {
        Some(_) => Requeue::After(ctx.lifecycle.settle + LOOK_AGAIN_MARGIN),
        None => Requeue::After(IN_FLIGHT_REQUEUE),
    }
}

/// A run without the operator's finalizer gets it first ([`act::add_finalizer`]), then its
/// first step in the same reconcile, decided on the run the patch stored and on what this
/// reconcile read (the pod, the template): no second reconcile reads them again, and a warm
/// claim or a pod follows the finalizer without a watch round trip (docs/contract.md "A new
/// run's finalizer and first step in one reconcile"). Err: the finalizer was added (or the run
/// is gone, or the patch stored more than the finalizer) and the run is looked at again when it
/// changes.
async fn finalized(
    ctx: &Context,
    made: MadeRun,
    step: decide::Step,
    observation: &Observation,
    now: Timestamp,
) -> Result<Result<(MadeRun, decide::Step), Requeue>, ControllerError> {
    if step != decide::Step::AddFinalizer {
        return Ok(Ok((made, step)));
    }
    let Some(stored) = act::add_finalizer(ctx, made.merged()).await? else {
        return Ok(Err(Requeue::AwaitChange));
    };
    let Some(made) = made.finalized(&stored) else {
        return Ok(Err(Requeue::AwaitChange));
    };
    let step = decide::decide(made.merged(), observation.view.as_ref(), now, &ctx.decide);
    Ok(Ok((made, step)))
}

/// Why the run may not get a pod until an admission verifies its author's rights, when `step`
/// would create it. The stamp covers the run's own spec (what its author wrote), not its
/// template's merge.
fn unverified_rights(ctx: &Context, made: &MadeRun, step: &decide::Step) -> Option<String> {
    let authored = made.authored();
    matches!(step, decide::Step::CreatePod)
        .then(|| crate::policy::stamp::unverified_rights(authored, &ctx.admission.rights))
        .flatten()
}

/// The stages between decide and plan: Kueue's queue ([`through_kueue`], on the run's Kueue
/// view `queue`), then a warm pool's claim ([`warm::through_pool`]).
async fn through_stages(
    ctx: &Arc<Context>,
    made: &MadeRun,
    (step, queue): (decide::Step, Option<&prepare::QueueView>),
    inputs: &Inputs<'_>,
    rights_verified: bool,
    observation: &Observation,
    now: Timestamp,
) -> Result<Through, ControllerError> {
    let run = made.merged();
    let step = match queue {
        Some(queue) => {
            match through_kueue(ctx, run, (step, queue), inputs, observation, now).await? {
                Through::Go(step) => step,
                held => return Ok(held),
            }
        }
        None => match kueue_gate::ignored_queue(run, &step, now).filter(|_| !ctx.lifecycle.kueue) {
            Some(plan) => return Ok(Through::Carry(Box::new(plan))),
            None => step,
        },
    };
    // A parked attempt's restore, then its start (docs/contract.md "Pause, resume and fork").
    if let (decide::Step::TrackPod { .. }, Some(pod)) = (&step, observation.pod.as_ref()) {
        if let Some(due) = plan::restore_step(run, pod) {
            return Ok(Through::Carry(Box::new(plan::restore_plan(due))));
        }
    }
    let claim = (step, queue);
    Ok(
        match warm::through_pool(ctx, made, claim, inputs, rights_verified, now).await? {
            warm::Warm::Go(step) => Through::Go(step),
            warm::Warm::Claim(plan) => Through::Claim(plan),
            warm::Warm::Done(requeue) => Through::Held(requeue),
        },
    )
}

/// What the stages between decide and plan left to do.
enum Through {
    /// Go on with this step.
    Go(decide::Step),
    /// Carry out this plan instead of the step's (the ignored queue's word, the run held, its
    /// Workload created, a parked attempt's restore): its Events name the observed pod.
    Carry(Box<Plan>),
    /// Carry out this warm claim (or cold start) instead of the step's: it names no pod of the
    /// run's.
    Claim(Box<Plan>),
    /// Nothing: look again then.
    Held(Requeue),
}

/// The queue stage of a run in a Kueue queue ([`kueue_gate`]; `run --kueue`), on what
/// [`prepare::queue_view`] read of its Workload: the Workload to create (the pod the run would
/// get, at the priority it names) when it has none, then what the gate says is carried out, or
/// the step handed back.
async fn through_kueue(
    ctx: &Arc<Context>,
    run: &Arc<SandboxRun>,
    (step, queue): (decide::Step, &prepare::QueueView),
    inputs: &Inputs<'_>,
    observation: &Observation,
    now: Timestamp,
) -> Result<Through, ControllerError> {
    let pod_name = observation.pod_name.as_str();
    let state = &queue.state;
    let mut to_create = None;
    if *state == crate::kueue::QueueState::Absent && matches!(step, decide::Step::CreatePod) {
        // The Workload asks for the pod the run would get; a run that would get none (refused,
        // held) is planned as without Kueue.
        match plan::plan_step(decide::Step::CreatePod, inputs) {
            StepPlan::CreatePod(pod) => {
                let name = match crate::kueue::gate::queueing(run) {
                    crate::kueue::gate::Queueing::In(queue) => queue,
                    _ => "",
                };
                to_create = Some(crate::kueue::build(
                    &observation.id,
                    name,
                    &pod,
                    queue.priority.as_ref(),
                ));
            }
            StepPlan::Carry(plan) => return Ok(Through::Carry(plan)),
            _ => return Ok(Through::Go(step)),
        }
    }
    let queued = kueue_gate::QueueInputs {
        state,
        workload: queue.workload.as_ref(),
        to_create,
        has_pod: observation.view.is_some(),
        pod_ready: observation
            .pod
            .as_ref()
            .is_some_and(crate::kueue::gate::pods_ready),
    };
    match kueue_gate::gate(run, step, queued, now) {
        kueue_gate::Gate::Step(step) => Ok(Through::Go(step)),
        kueue_gate::Gate::Hold(plan) => Ok(Through::Carry(plan)),
        // The Workload's finish (or its first effects) is a step of its own, carried out before
        // the run's.
        kueue_gate::Gate::PatchThen(patch, step) => {
            let finish = plan::Plan {
                effects: vec![plan::Effect::PatchWorkloadStatus(patch)],
                ..plan::Plan::wait(Requeue::AwaitChange)
            };
            drive::carry_out(ctx, run, pod_name, observation.pod.as_ref(), finish, now).await?;
            Ok(Through::Go(step))
        }
        kueue_gate::Gate::EffectsThen(effects, step) => {
            let first = plan::Plan {
                effects,
                ..plan::Plan::wait(Requeue::AwaitChange)
            };
            drive::carry_out(ctx, run, pod_name, observation.pod.as_ref(), first, now).await?;
            Ok(Through::Go(step))
        }
    }
}

/// Reconciles `run` while its teardown is in flight: a teardown that runs owns the run (its end
/// wakes it, docs/contract.md "A run's next step follows its drain"; [`IN_FLIGHT_REQUEUE`] is
/// the backstop); one that waits for a slot is served
/// first once its pod is being deleted or evicted, and its wait is announced past the quiet
/// window (docs/contract.md "Fair drain slots").
pub(crate) async fn in_flight(
    ctx: &Context,
    (run, id): (&SandboxRun, &RunId),
    now: Timestamp,
) -> Result<Requeue, ControllerError> {
    let uid = &id.uid;
    let Some(queued) = ctx.in_flight.drains.queued(uid) else {
        return Ok(Requeue::After(IN_FLIGHT_REQUEUE));
    };
    let pod = observe::own_pod(ctx.seal_check(), run).await?;
    if !queued.position.urgent
        && pod
            .as_ref()
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
    {
        info!(run = %run.name_any(), "its pod is being deleted: its teardown is served first");
        ctx.in_flight.drains.make_urgent(uid);
    }
    // Read again: the place changed if it was made urgent.
    let Some(queued) = ctx.in_flight.drains.queued(uid) else {
        return Ok(Requeue::After(IN_FLIGHT_REQUEUE));
    };
    let plan = plan::queued(&queued, ctx.lifecycle.settle);
    let announces = !plan.events.is_empty();
    let pod_name = crate::identity::current_pod_name(run);
    let requeue = drive::carry_out(ctx, run, &pod_name, pod.as_ref(), plan, now).await?;
    if announces {
        ctx.in_flight.drains.mark_announced(uid);
    }
    Ok(requeue)
}

/// The plan that creates the run's pod: what its creation depends on read first
/// ([`prepare::for_creation`]: its store, its namespace's labels, the pre-flight of its image,
/// its Kueue flavors), then the plan made from it ([`plan::creation`]). `resolved`: the run's
/// template was read in this reconcile, and the status that records it is written before the
/// pod is created.
async fn create_pod(
    ctx: &Context,
    run: &SandboxRun,
    pod: Pod,
    (resolved, queue): (bool, Option<&prepare::QueueView>),
    now: Timestamp,
) -> Result<Plan, ControllerError> {
    let facts = prepare::for_creation(ctx, run, &pod, queue, true).await?;
    match &facts.preflight {
        Preflight::Proceed => {}
        Preflight::ProceedUnverified { message } => {
            warn!(run = %run.name_any(), %message, "image not verified; creating the pod anyway");
        }
        Preflight::Unresolvable { message, .. } => {
            warn!(run = %run.name_any(), %message, "image does not resolve; the run fails");
        }
    }
    let judged = (
        verdict(run, &ctx.pod.egress),
        ctx.pod.namespace_policies.as_slice(),
    );
    let plan = plan::creation(run, pod, facts, judged, now);
    Ok(if resolved {
        plan::recording_template(plan, run)
    } else {
        plan
    })
}

/// The plan that reports the run's undrained paths lost, on the live run (returned with it: see
/// [`decide::pod_lost_holds`]) and with the paths whose manifest the store already has; or when
/// to look again.
async fn record_pod_lost(
    ctx: &Context,
    run: &Arc<SandboxRun>,
    observation: &Observation,
    now: Timestamp,
) -> Result<Result<(Arc<SandboxRun>, Plan), Requeue>, ControllerError> {
    let Some(live) = prepare::live_run(ctx, observation).await? else {
        return Ok(Err(Requeue::AwaitChange));
    };
    if !decide::pod_lost_holds(run, &live, now, &ctx.decide) {
        return Ok(Err(Requeue::After(LOOK_AGAIN_MARGIN)));
    }
    // The live run's own identity: a run re-created under the name has its own stored files.
    let id = RunId::of(&live)?;
    let committed = prepare::committed_entries(ctx, (&id, &live)).await;
    let plan = plan::record_pod_lost(&live, &committed, ctx.lifecycle.default_retention, now);
    Ok(Ok((live, plan)))
}
