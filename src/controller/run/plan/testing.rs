//! Helpers of the plan tests: a plan in one line, runs in given states.

#![allow(dead_code)]

use crate::api::{Phase, ReadBackPhase, ReadBackStatus, Retention, SandboxRun};
use crate::controller::pod_view::PodProblem;
use crate::controller::pod_view::{PodView, WorkloadState};
use crate::controller::run::plan::*;
use crate::controller::testkit::fixtures::*;
use crate::pod::PodSettings;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub(crate) fn inputs<'a>(
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
        rules: default_rules(),
        rights_unverified: None,
        last_create_attempt: None,
        settle: SETTLE,
        proxy_pods: &[],
        default_retention: Retention::Retain,
    }
}

/// The rules of an operator started with default flags.
pub(crate) fn default_rules() -> &'static crate::policy::RuleSettings {
    static RULES: std::sync::LazyLock<crate::policy::RuleSettings> =
        std::sync::LazyLock::new(Default::default);
    &RULES
}

pub(crate) fn later(secs: i64) -> Timestamp {
    now()
        .checked_add(jiff::SignedDuration::from_secs(secs))
        .unwrap()
}

/// A plan in one line: `events | status phase | effects | requeue`.
pub(crate) fn line(plan: &Plan) -> String {
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
            Effect::DeleteStoredFiles(t) => format!("DeleteStoredFiles({})", t.location),
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

pub(crate) fn step_line(plan: StepPlan) -> String {
    match plan {
        StepPlan::Carry(plan) => line(&plan),
        StepPlan::CreatePod(pod) => format!("create {}", pod.metadata.name.unwrap_or_default()),
        StepPlan::RecordPodLost => "read the live run and the store".to_string(),
        StepPlan::Teardown(trigger) => {
            format!("[] | - | [StartTeardown({trigger:?})] | {IN_FLIGHT_REQUEUE:?}")
        }
        StepPlan::Checkpoint => format!("[] | - | [StartCheckpoint] | {IN_FLIGHT_REQUEUE:?}"),
    }
}

pub(crate) fn deleting(mut r: SandboxRun) -> SandboxRun {
    r.metadata.deletion_timestamp = Some(Time(now()));
    r
}

pub(crate) fn retention(mut r: SandboxRun, retention: Retention) -> SandboxRun {
    if let Some(rb) = r.spec.read_back.as_mut() {
        rb.retention = Some(retention);
    }
    r
}

pub(crate) fn drained(mut r: SandboxRun) -> SandboxRun {
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

pub(crate) fn stuck() -> PodView {
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

pub(crate) fn pod_deleting() -> PodView {
    PodView {
        deleting: true,
        ..running()
    }
}

pub(crate) fn a_pod(holder: bool, workload_started: bool) -> Pod {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateWaiting, ContainerStatus, PodStatus,
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
