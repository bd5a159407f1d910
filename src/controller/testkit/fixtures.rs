//! Runs, pods and statuses the unit tests of the controller's stages share.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{Phase, ReadBackPhase, ReadBackStatus, SandboxRun, SandboxRunStatus, FINALIZER};
use crate::controller::conditions;
use crate::controller::pod_view::{PodView, WorkloadState};
use crate::controller::run::decide::DecideSettings;
use crate::pod::{HOLDER_CONTAINER, WORKLOAD_CONTAINER};

pub(crate) fn now() -> Timestamp {
    "2026-11-30T12:00:00Z".parse().unwrap()
}

/// The run `demo` of namespace `ns` (uid `u1`, created [`now`], the finalizer on) running `true`
/// from `img` as uid 1000 and reading back each `(path, required)`.
pub(crate) fn run_with(paths: &[(&str, bool)]) -> SandboxRun {
    crate::testkit::sandbox_run("demo")
        .namespace("ns")
        .uid("u1")
        .finalizers(&[FINALIZER])
        .created(now())
        .edit(|spec| {
            spec.image = Some("img".into());
            spec.command = Some(vec!["true".into()]);
            spec.user = Some("1000".into());
        })
        .read_back_required(paths)
        .build()
}

pub(crate) fn running() -> PodView {
    PodView {
        deleting: false,
        holder_running: true,
        workload: WorkloadState::Running,
        started_at: Some(now()),
        pending_since: Some(now()),
        problem: None,
        host_ip: None,
        gate_waiting: false,
    }
}

pub(crate) fn settings() -> DecideSettings {
    DecideSettings::default()
}

pub(crate) fn with_phase(mut r: SandboxRun, p: Phase) -> SandboxRun {
    let mut s = r.status.take().unwrap_or_default();
    s.phase = Some(p);
    s.pod_name = Some("demo-sbr".into());
    s.start_time = Some(Time(now()));
    r.status = Some(s);
    r
}

/// A pod whose workload container is in `state` (and `last` as its last state).
pub(crate) fn pod_with_workload(
    state: k8s_openapi::api::core::v1::ContainerState,
    last: Option<k8s_openapi::api::core::v1::ContainerState>,
) -> Pod {
    Pod {
        status: Some(PodStatus {
            container_statuses: Some(vec![
                ContainerStatus {
                    name: HOLDER_CONTAINER.into(),
                    state: Some(ContainerState {
                        running: Some(ContainerStateRunning::default()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ContainerStatus {
                    name: WORKLOAD_CONTAINER.into(),
                    state: Some(state),
                    last_state: last,
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn oom_killed(message: &str) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: 137,
            signal: Some(9),
            reason: Some("OOMKilled".into()),
            message: Some(message.into()),
            started_at: Some(Time("2026-11-30T11:59:00Z".parse().unwrap())),
            finished_at: Some(Time(now())),
            container_id: Some("containerd://abc".into()),
        }),
        ..Default::default()
    }
}

pub(crate) fn at(secs: i64) -> Timestamp {
    now()
        .checked_add(jiff::SignedDuration::from_secs(secs))
        .unwrap()
}

/// A pod whose workload waits with `reason`/`message`, its holder running, accepted by the
/// kubelet at `now()`.
pub(crate) fn pulling_pod(reason: &str, message: &str) -> Pod {
    let waiting = ContainerStatus {
        name: "workload".into(),
        state: Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message: Some(message.into()),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let holder = ContainerStatus {
        name: "holder".into(),
        state: Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        }),
        ..Default::default()
    };
    Pod {
        status: Some(PodStatus {
            start_time: Some(Time(now())),
            container_statuses: Some(vec![holder, waiting]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn pending(r: SandboxRun) -> SandboxRun {
    let mut r = with_phase(r, Phase::Pending);
    if let Some(s) = r.status.as_mut() {
        s.start_time = None;
    }
    r
}

pub(crate) fn entry(path: &str, phase: ReadBackPhase, message: Option<&str>) -> ReadBackStatus {
    ReadBackStatus {
        path: path.into(),
        phase,
        members: 2,
        bytes: 30,
        attempts: 1,
        message: message.map(str::to_string),
        ..Default::default()
    }
}

/// (status, reason) of condition `t`, None when absent.
pub(crate) fn cond_of(s: &SandboxRunStatus, t: &str) -> Option<(String, String)> {
    s.conditions
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

pub(crate) fn pair(status: &str, reason: &str) -> Option<(String, String)> {
    Some((status.to_string(), reason.to_string()))
}

/// Drains every path of a draining status with `phase`.
pub(crate) fn drain_all(mut s: SandboxRunStatus, phase: ReadBackPhase) -> SandboxRunStatus {
    s.read_back.iter_mut().for_each(|e| e.phase = phase);
    s
}

/// Exactly one of Complete/Failed is True, the other absent; every condition carries the
/// run's generation; Ready is False.
pub(crate) fn assert_one_ending(s: &SandboxRunStatus) {
    let complete = cond_of(s, conditions::COMPLETE);
    let failed = cond_of(s, conditions::FAILED);
    assert!(
        complete.is_some() != failed.is_some(),
        "exactly one of Complete/Failed: {:?}",
        s.conditions
    );
    assert!(complete.or(failed).is_some_and(|(st, _)| st == "True"));
    assert!(
        s.conditions
            .iter()
            .all(|c| c.observed_generation == Some(3)),
        "{:?}",
        s.conditions
    );
    assert_eq!(
        cond_of(s, conditions::READY).map(|(st, _)| st),
        Some("False".to_string())
    );
}

pub(crate) fn with_generation(mut r: SandboxRun) -> SandboxRun {
    r.metadata.generation = Some(3);
    r
}

/// A registry that answered "not found" (definitive).
pub(crate) const NOT_FOUND: &str = "rpc error: code = NotFound desc = failed to pull and unpack image \"localhost:15000/nope:1\": failed to resolve image: localhost:15000/nope:1: not found";
/// A registry that could not be reached (retryable).
pub(crate) const REFUSED: &str = "rpc error: code = Unknown desc = failed to pull and unpack image \"localhost:15000/img:1\": failed to resolve reference \"localhost:15000/img:1\": failed to do request: Head \"http://localhost:15000/v2/img/manifests/1\": dial tcp 127.0.0.1:15000: connect: connection refused";

/// `pod` serving `run`'s read-back slots as the operator builds them (docs/contract.md "A
/// read-back slot is made once"): each slot's emptyDir, mounted by the workload at its path and
/// by the holder below its own root.
pub(crate) fn with_slots(mut pod: Pod, run: &SandboxRun) -> Pod {
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    let paths = run.spec.read_back_paths().iter().map(|p| p.path.as_str());
    let slots = crate::pod::ReadBackSlot::of(paths);
    let container = |name: &str, mounts| Container {
        name: name.to_string(),
        volume_mounts: Some(mounts),
        ..Container::default()
    };
    pod.spec = Some(PodSpec {
        volumes: Some(slots.iter().map(|s| s.pod_volume()).collect()),
        containers: vec![
            container(
                WORKLOAD_CONTAINER,
                slots.iter().map(|s| s.workload_mount()).collect(),
            ),
            container(
                HOLDER_CONTAINER,
                slots.iter().map(|s| s.holder_volume_mount()).collect(),
            ),
        ],
        ..PodSpec::default()
    });
    pod
}
