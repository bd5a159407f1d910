//! The follow-up of an effect whose outcome is the world's answer ([`Answer`]): act stops at
//! such an effect and [`after`] plans what comes next, with the reconcile's one `now`.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use super::create::{pod_created, pod_refused};
use super::finish::{purged, Purge};
use super::model::{Effect, NotPurged, Plan, Requeue};
use crate::api::SandboxRun;

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
        /// The count, or why not.
        result: Result<usize, NotPurged>,
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
