//! Carries a plan out to its end: [`act`] does the plan's effects until one answers, the answer's
//! follow-up is planned by [`plan::after`] (pure) with the reconcile's one `now`, and so on until
//! a plan is done.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tracing::warn;

use super::act::{self, Carried};
use super::plan::{self, AfterInputs, Answer, Plan, Requeue, LOOK_AGAIN_MARGIN};
use crate::api::SandboxRun;
use crate::controller::context::Context;
use crate::controller::error::ControllerError;

/// Carries out `plan` and the plans that follow from what the world answers; returns when to
/// look again. `pod`: as observed, the related object of the first plan's Events (the
/// follow-up of a creation names the created pod).
pub(crate) async fn carry_out(
    ctx: &Context,
    run: &SandboxRun,
    pod_name: &str,
    pod: Option<&Pod>,
    plan: Plan,
    now: Timestamp,
) -> Result<Requeue, ControllerError> {
    let inputs = AfterInputs {
        run,
        pod_name,
        settle: ctx.lifecycle.settle,
        drain_timeout_seconds: ctx.drain_timeout_seconds(run),
        now,
    };
    let mut plan = plan;
    let mut answered: Option<Answer> = None;
    loop {
        let related = match &answered {
            None => pod,
            Some(answer) => answer.created_pod(),
        };
        let (answer, rest, requeue) =
            match act::carry_out(ctx, run, pod_name, related, plan).await? {
                Carried::Done(requeue) => return Ok(requeue),
                Carried::Answer {
                    answer,
                    rest,
                    requeue,
                } => (answer, rest, requeue),
            };
        plan = plan::after(&answer, rest, requeue, &inputs);
        log_refusal(run, pod_name, &answer, &plan);
        answered = Some(answer);
    }
}

/// A refused pod is logged with when it is tried again.
fn log_refusal(run: &SandboxRun, pod_name: &str, answer: &Answer, plan: &Plan) {
    if let (Answer::PodRefused { code, message }, Requeue::After(retry)) = (answer, plan.requeue) {
        warn!(run = %run.name_any(), pod = %pod_name, code, apiserver = %message,
            retry_seconds = retry.saturating_sub(LOOK_AGAIN_MARGIN).as_secs(),
            "pod creation refused by the apiserver");
    }
}
