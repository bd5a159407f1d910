//! The pod as a reconcile decides on it (pure vocabulary, no I/O): what the workload is doing
//! ([`WorkloadState`]), why a pod cannot start ([`PodProblem`]), the facts of one pod
//! ([`PodView::of`]), what its Warning Events say ([`stuck_from_events`]), when a Pending pod is
//! looked at again ([`pending_recheck`]), and the workload's termination record. The read stage
//! (`observe.rs`) reads the pod and its Events and makes these; decide, plan and status use them
//! without importing the reads.
//!
//! Why a pod cannot start is told in words `kubectl describe sbr` shows (docs/contract.md "No
//! run is silent"): a container the kubelet cannot create, an image it cannot pull, a pod the
//! scheduler cannot place, and volume trouble, which the kubelet reports only as an Event on the
//! pod (`FailedMount`), so a pod that stays Pending has its Warning Events read, bounded
//! ([`POD_EVENTS_LIMIT`]), every [`pending_recheck`].

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, Pod};

use super::conditions::{REASON_IMAGE_PULL_FAILED, REASON_UNSCHEDULABLE};
use crate::api::{ReadBackPhase, SandboxRun, WorkloadTermination};
use crate::pod::{HOLDER_CONTAINER, WORKLOAD_CONTAINER};

/// What the workload container is doing, as the pod reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WorkloadState {
    /// Not started (pod pending, image pulling, …).
    NotStarted,
    /// Running.
    Running,
    /// Exited.
    Terminated {
        /// Exit code.
        exit_code: i32,
    },
}

/// A reason the pod cannot make progress, worth telling the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PodProblem {
    /// The scheduler cannot place the pod (may resolve itself as the cluster changes).
    Unschedulable(String),
    /// An image cannot be pulled.
    ImagePull {
        /// Retrying cannot help, whatever the time: an invalid name, `imagePullPolicy: Never`
        /// without the image, or a registry that answered "not found"
        /// ([`image_pull_is_definitive`]). Any other pull error is retried by the kubelet and
        /// only becomes fatal once `DecideSettings::image_pull_timeout` (the decision's) has passed.
        fatal: bool,
        /// The kubelet's words (`container <name>: <reason>: <message>`).
        message: String,
    },
    /// The pod cannot start for another reason: a container the kubelet cannot create
    /// ([`STUCK_CONTAINER_REASONS`]) or a Warning Event on the pod such as
    /// `FailedMount` ([`STUCK_EVENT_REASONS`]).
    Stuck {
        /// The kubelet's reason (`CreateContainerConfigError`, `FailedMount`, …): Ready's reason.
        reason: &'static str,
        /// Its words (`container <name>: <message>` for a container).
        message: String,
    },
    /// The egress gate gave up: the run's NetworkPolicy was never seen in force (its words).
    EgressGate(String),
}

impl PodProblem {
    /// Ready's reason while the problem lasts.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            PodProblem::Unschedulable(_) => REASON_UNSCHEDULABLE,
            PodProblem::ImagePull { .. } => REASON_IMAGE_PULL_FAILED,
            PodProblem::Stuck { reason, .. } => reason,
            PodProblem::EgressGate(_) => super::conditions::REASON_EGRESS_NOT_ENFORCED,
        }
    }

    /// Its words, for Ready's message, `.status.message` and the PodStuck Event.
    pub(crate) fn message(&self) -> &str {
        match self {
            PodProblem::Unschedulable(m) | PodProblem::EgressGate(m) => m,
            PodProblem::ImagePull { message, .. } | PodProblem::Stuck { message, .. } => message,
        }
    }
}

/// Whether an image-pull error says retrying cannot help, at once.
///
/// `InvalidImageName` and `ErrImageNeverPull` never resolve themselves. `ErrImagePull` and
/// `ImagePullBackOff` are usually transient (registry down, network, rate limits, credentials
/// being rolled out), except when the registry answered that the image does not exist: the
/// kubelet's message then carries the CRI's `code = NotFound`, ends with `: not found`
/// (containerd: `failed to resolve image: <ref>: not found`), or says `manifest unknown` (the
/// distribution API's `MANIFEST_UNKNOWN`). The back-off state repeats the pull error in its
/// message (`Back-off pulling image "…": ErrImagePull: rpc error: code = NotFound …`), so both
/// states are judged alike.
pub(crate) fn image_pull_is_definitive(reason: &str, message: &str) -> bool {
    match reason {
        "InvalidImageName" | "ErrImageNeverPull" => true,
        "ErrImagePull" | "ImagePullBackOff" => {
            let m = message.trim_end();
            m.contains("code = NotFound")
                || m.ends_with(": not found")
                || m.to_ascii_lowercase().contains("manifest unknown")
        }
        _ => false,
    }
}

fn is_image_pull_reason(reason: &str) -> bool {
    matches!(
        reason,
        "InvalidImageName" | "ErrImageNeverPull" | "ErrImagePull" | "ImagePullBackOff"
    )
}

/// The facts of a pod the decision needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PodView {
    /// The pod has a deletionTimestamp.
    pub deleting: bool,
    /// The holder container is running (the drain can exec into it).
    pub holder_running: bool,
    /// The workload container's state.
    pub workload: WorkloadState,
    /// When the pod started running.
    pub started_at: Option<Timestamp>,
    /// Since when the pod has been trying to start: `status.startTime` (the kubelet accepted the
    /// pod; image pulls come after), else `metadata.creationTimestamp`. The clock of
    /// `DecideSettings::image_pull_timeout` (the decision's).
    pub pending_since: Option<Timestamp>,
    /// Something blocking the pod.
    pub problem: Option<PodProblem>,
    /// The address of the pod's node (`status.hostIP`), once the kubelet has it.
    pub host_ip: Option<std::net::IpAddr>,
    /// The pod has an egress gate that has not ended yet: the workload waits for the run's
    /// NetworkPolicy to be in force.
    pub gate_waiting: bool,
}

impl PodView {
    /// Reads the facts out of a pod.
    pub(crate) fn of(pod: &Pod) -> PodView {
        let status = pod.status.as_ref();
        let statuses = status.and_then(|s| s.container_statuses.as_ref());
        let state_of = |name: &str| -> Option<&ContainerState> {
            statuses?.iter().find(|c| c.name == name)?.state.as_ref()
        };
        let workload = match state_of(WORKLOAD_CONTAINER) {
            Some(s) if s.terminated.is_some() => WorkloadState::Terminated {
                exit_code: s.terminated.as_ref().map(|t| t.exit_code).unwrap_or(-1),
            },
            Some(s) if s.running.is_some() => WorkloadState::Running,
            _ => WorkloadState::NotStarted,
        };
        let holder_running = state_of(HOLDER_CONTAINER).is_some_and(|s| s.running.is_some());
        let mut problem = None;
        if let Some(cond) = status.and_then(|s| s.conditions.as_ref()).and_then(|c| {
            c.iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        }) {
            if cond.reason.as_deref() == Some("Unschedulable") {
                problem = Some(PodProblem::Unschedulable(
                    cond.message.clone().unwrap_or_default(),
                ));
            }
        }
        if let Some(p) = container_problem(statuses.map(Vec::as_slice).unwrap_or_default()) {
            problem = Some(p);
        }
        // The egress gate gave up: nothing else about this pod matters, it will never run.
        if let Some(words) = egress_gate_failure(status) {
            problem = Some(PodProblem::EgressGate(words));
        }
        PodView {
            deleting: pod.metadata.deletion_timestamp.is_some(),
            holder_running,
            workload,
            started_at: status.and_then(|s| s.start_time.as_ref()).map(|t| t.0),
            pending_since: status
                .and_then(|s| s.start_time.as_ref())
                .or(pod.metadata.creation_timestamp.as_ref())
                .map(|t| t.0),
            problem,
            host_ip: status
                .and_then(|s| s.host_ip.as_deref())
                .and_then(|ip| ip.parse().ok()),
            gate_waiting: gate_waiting(pod),
        }
    }
}

/// The problem the pod's containers are waiting on, if any: an image that cannot be pulled, else
/// a container the kubelet cannot create ([`STUCK_CONTAINER_REASONS`]). The workload's problem is
/// reported before the holder's: it is the one the user can fix, and the one that keeps the
/// workload from ever starting.
fn container_problem(statuses: &[ContainerStatus]) -> Option<PodProblem> {
    let mut pull_problems: Vec<(bool, PodProblem)> = Vec::new();
    let mut stuck: Vec<(bool, PodProblem)> = Vec::new();
    for cs in statuses {
        if let Some(waiting) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            let reason = waiting.reason.as_deref().unwrap_or_default();
            if let Some(reason) = known(reason, STUCK_CONTAINER_REASONS) {
                let message = waiting.message.as_deref().unwrap_or_default();
                stuck.push((
                    cs.name == WORKLOAD_CONTAINER,
                    PodProblem::Stuck {
                        reason,
                        message: format!("container {}: {message}", cs.name),
                    },
                ));
            }
            if is_image_pull_reason(reason) {
                let message = waiting.message.as_deref().unwrap_or_default();
                pull_problems.push((
                    cs.name == WORKLOAD_CONTAINER,
                    PodProblem::ImagePull {
                        fatal: image_pull_is_definitive(reason, message),
                        message: format!("container {}: {reason}: {message}", cs.name),
                    },
                ));
            }
        }
    }
    let mut problem = None;
    for found in [stuck, pull_problems] {
        if let Some((_, p)) = found
            .iter()
            .find(|(workload, _)| *workload)
            .or_else(|| found.first())
        {
            problem = Some(p.clone());
        }
    }
    problem
}

/// Whether `pod` has an egress gate that has not ended (no status yet, waiting or running).
pub(crate) fn gate_waiting(pod: &Pod) -> bool {
    let gate = crate::inpod::gate::GATE_CONTAINER;
    let declared = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.name == gate));
    let ended = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == gate))
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.terminated.is_some());
    declared && !ended
}

/// The egress gate's words when it exited non-zero (docs/contract.md "A filtered run never has an
/// unfiltered instant"): its termination message, else its exit code.
fn egress_gate_failure(status: Option<&k8s_openapi::api::core::v1::PodStatus>) -> Option<String> {
    let gate = status?
        .init_container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == crate::inpod::gate::GATE_CONTAINER)?;
    let ended = gate.state.as_ref()?.terminated.as_ref()?;
    if ended.exit_code == 0 {
        return None;
    }
    let words = ended.message.as_deref().map(str::trim).unwrap_or_default();
    Some(if words.is_empty() {
        format!("egress gate exited with code {}", ended.exit_code)
    } else {
        words.to_string()
    })
}

/// Container waiting reasons that mean a container cannot be created or started (image pulls
/// are [`PodProblem::ImagePull`]). `CreateContainerConfigError`: a referenced ConfigMap/Secret
/// key is missing; `CreateContainerError`, `RunContainerError`: the runtime refused it.
pub(crate) const STUCK_CONTAINER_REASONS: &[&str] = &[
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// Warning Event reasons on a Pending pod that mean it cannot start: `FailedMount` (a missing
/// ConfigMap, Secret or PVC; the kubelet reports it only as an Event), `FailedAttachVolume`,
/// `FailedCreatePodSandBox` (network or runtime set-up).
pub(crate) const STUCK_EVENT_REASONS: &[&str] = &[
    "FailedMount",
    "FailedAttachVolume",
    "FailedCreatePodSandBox",
];

/// At most this many of a pod's Warning Events are read per look.
pub(crate) const POD_EVENTS_LIMIT: u32 = 50;
/// A pod Pending for less than this is still starting: its Events are not read yet.
pub(crate) const READ_EVENTS_AFTER: Duration = Duration::from_secs(5);
/// Shortest and longest pause between two looks at a Pending pod.
const RECHECK_MIN: Duration = Duration::from_secs(5);
const RECHECK_MAX: Duration = Duration::from_secs(120);

/// `reason` as the `&'static str` of `table`, None when it is not in it.
pub(crate) fn known(reason: &str, table: &[&'static str]) -> Option<&'static str> {
    table.iter().copied().find(|r| *r == reason)
}

/// One Warning Event about the pod, as read from the apiserver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PodEventFact {
    /// Its reason (`FailedMount`, …).
    pub reason: String,
    /// Its message.
    pub message: String,
    /// When it was last seen (series or lastTimestamp or eventTime), when known.
    pub last_seen: Option<Timestamp>,
}

/// The cause a pod's Warning Events give for not starting: the latest of those with a reason in
/// [`STUCK_EVENT_REASONS`], None when there is none.
pub(crate) fn stuck_from_events(events: &[PodEventFact]) -> Option<PodProblem> {
    events
        .iter()
        .filter_map(|e| Some((known(&e.reason, STUCK_EVENT_REASONS)?, e)))
        .max_by_key(|(_, e)| e.last_seen)
        .map(|(reason, e)| PodProblem::Stuck {
            reason,
            message: e.message.clone(),
        })
}

/// Whether the pod's Events are worth reading: it is not running, its status names no problem,
/// and it has been Pending for [`READ_EVENTS_AFTER`] at least.
pub(crate) fn should_read_pod_events(pod: &PodView, now: Timestamp) -> bool {
    !pod.deleting
        && pod.problem.is_none()
        && pod.workload == WorkloadState::NotStarted
        && pending_for(pod, now).is_some_and(|d| d >= READ_EVENTS_AFTER)
}

/// Whether the pod's Events are due for a read at `now`, given when this replica last read them
/// (`last`): worth reading ([`should_read_pod_events`]), and not read within the pause between
/// two looks at the pod as it was at that read ([`pending_recheck`]: read at 5 s, 10 s, 20 s, …,
/// then every 2 min). A read lists the namespace's Events (nothing
/// indexes them by pod), which costs the apiserver as much as the namespace holds: a pod woken
/// again and again by other changes does not have them listed on every reconcile.
pub(crate) fn pod_events_due(pod: &PodView, now: Timestamp, last: Option<Timestamp>) -> bool {
    let rested = |t: Timestamp| {
        let since = Duration::try_from(t.duration_until(now)).unwrap_or(Duration::ZERO);
        since >= pending_recheck(pod, t).unwrap_or(RECHECK_MIN)
    };
    should_read_pod_events(pod, now) && last.is_none_or(rested)
}

/// When to look again at a pod that has not started (its status may not change while it is
/// stuck, e.g. on a missing volume): after as long as it has been Pending, between 5 s and 2 min.
/// None once the workload started.
pub(crate) fn pending_recheck(pod: &PodView, now: Timestamp) -> Option<Duration> {
    if pod.workload != WorkloadState::NotStarted || pod.deleting {
        return None;
    }
    Some(
        pending_for(pod, now)
            .unwrap_or(Duration::ZERO)
            .clamp(RECHECK_MIN, RECHECK_MAX),
    )
}

/// How long the pod has been trying to start (from [`PodView::pending_since`]).
pub(crate) fn pending_for(pod: &PodView, now: Timestamp) -> Option<Duration> {
    Duration::try_from(pod.pending_since?.duration_until(now)).ok()
}

/// The declared paths of the run that have no outcome in its status yet (no entry, or a
/// `Pending` one), in declaration order.
pub(crate) fn undrained_paths(run: &SandboxRun) -> Vec<&str> {
    let recorded = |path: &str| {
        run.status.as_ref().is_some_and(|s| {
            s.read_back
                .iter()
                .any(|e| e.path == path && e.phase != ReadBackPhase::Pending)
        })
    };
    run.spec
        .read_back_paths()
        .iter()
        .map(|p| p.path.as_str())
        .filter(|p| !recorded(p))
        .collect()
}

/// Whether every declared path has a final outcome in the run's status.
pub(crate) fn drain_settled(run: &SandboxRun) -> bool {
    undrained_paths(run).is_empty()
}

/// Most bytes of the workload's termination message kept in `status.workload.message`: the
/// kubelet's own bound on a termination message (4 KiB), kept again here so that a status write
/// never grows with whatever a pod reports.
pub(crate) const MAX_WORKLOAD_MESSAGE_BYTES: usize = 4096;

/// How the workload container of `pod` terminated, None while it has not. Read from its current
/// state, else from its last terminated state (the pod never restarts it: restartPolicy Never).
/// The message is cut to [`MAX_WORKLOAD_MESSAGE_BYTES`] on a character boundary.
pub(crate) fn workload_termination(pod: &Pod) -> Option<WorkloadTermination> {
    let cs = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == WORKLOAD_CONTAINER)?;
    let t = cs
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| cs.last_state.as_ref()?.terminated.as_ref())?;
    fn text(s: &Option<String>) -> Option<&str> {
        s.as_deref().filter(|s| !s.is_empty())
    }
    Some(WorkloadTermination {
        exit_code: t.exit_code,
        signal: t.signal,
        reason: text(&t.reason).map(str::to_string),
        message: text(&t.message).map(|m| crate::text::cut(m, MAX_WORKLOAD_MESSAGE_BYTES)),
        started_at: t.started_at.clone(),
        finished_at: t.finished_at.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::SignedDuration;

    fn at(secs: i64) -> Timestamp {
        let t0: Timestamp = "2026-11-30T12:00:00Z".parse().unwrap();
        t0.checked_add(SignedDuration::from_secs(secs)).unwrap()
    }

    fn event(reason: &str, message: &str, secs: i64) -> PodEventFact {
        PodEventFact {
            reason: reason.into(),
            message: message.into(),
            last_seen: Some(at(secs)),
        }
    }

    #[test]
    fn the_latest_stuck_event_names_the_cause_and_others_are_ignored() {
        assert_eq!(stuck_from_events(&[]), None);
        assert_eq!(
            stuck_from_events(&[event("BackOff", "x", 1), event("Unhealthy", "y", 2)]),
            None
        );
        let got = stuck_from_events(&[
            event("FailedMount", "configmap \"old\" not found", 1),
            event("BackOff", "ignored", 9),
            event(
                "FailedMount",
                "MountVolume.SetUp failed for volume \"mount-0\" : configmap \"cfg\" not found",
                5,
            ),
        ]);
        assert_eq!(
            got,
            Some(PodProblem::Stuck {
                reason: "FailedMount",
                message:
                    "MountVolume.SetUp failed for volume \"mount-0\" : configmap \"cfg\" not found"
                        .into()
            })
        );
    }

    fn pending_pod(since: i64) -> PodView {
        PodView {
            deleting: false,
            holder_running: false,
            workload: WorkloadState::NotStarted,
            started_at: None,
            pending_since: Some(at(since)),
            problem: None,
            host_ip: None,
            gate_waiting: false,
        }
    }

    #[test]
    fn the_view_reads_the_nodes_address_and_whether_the_egress_gate_still_waits() {
        use k8s_openapi::api::core::v1::{
            Container, ContainerState, ContainerStateTerminated, ContainerStatus, PodSpec,
            PodStatus,
        };
        let gate = crate::inpod::gate::GATE_CONTAINER;
        let mut pod = Pod {
            spec: Some(PodSpec {
                init_containers: Some(vec![Container {
                    name: gate.into(),
                    ..Container::default()
                }]),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        // Declared, no status yet: waiting, node unknown.
        let view = PodView::of(&pod);
        assert!(view.gate_waiting);
        assert_eq!(view.host_ip, None);
        pod.status = Some(PodStatus {
            host_ip: Some("10.1.2.3".into()),
            init_container_statuses: Some(vec![ContainerStatus {
                name: gate.into(),
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated::default()),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        });
        let view = PodView::of(&pod);
        assert!(!view.gate_waiting, "the gate ended");
        assert_eq!(view.host_ip, "10.1.2.3".parse().ok());
        // No gate declared: nothing waits.
        assert!(!PodView::of(&Pod::default()).gate_waiting);
    }

    #[test]
    fn a_pending_pod_is_looked_at_again_with_a_growing_bounded_pause() {
        let p = pending_pod(0);
        assert!(!should_read_pod_events(&p, at(1)), "still starting");
        assert!(should_read_pod_events(&p, at(5)));
        assert_eq!(pending_recheck(&p, at(1)), Some(RECHECK_MIN));
        assert_eq!(pending_recheck(&p, at(30)), Some(Duration::from_secs(30)));
        assert_eq!(pending_recheck(&p, at(3600)), Some(RECHECK_MAX));
        // A problem the status already names, a started workload, a pod being deleted: no read.
        let mut named = pending_pod(0);
        named.problem = Some(PodProblem::Unschedulable("0/2 nodes".into()));
        assert!(!should_read_pod_events(&named, at(60)));
        let mut running = pending_pod(0);
        running.workload = WorkloadState::Running;
        assert!(!should_read_pod_events(&running, at(60)));
        assert_eq!(pending_recheck(&running, at(60)), None);
        let mut deleting = pending_pod(0);
        deleting.deleting = true;
        assert!(!should_read_pod_events(&deleting, at(60)));
    }

    #[test]
    fn a_pending_pods_events_are_read_again_only_after_the_pause_between_two_looks() {
        let p = pending_pod(0);
        // Never read: due once it has been Pending for READ_EVENTS_AFTER.
        assert!(pod_events_due(&p, at(5), None));
        // Read at 5 s: the pause is as long as it had been Pending then (5 s at least).
        assert!(!pod_events_due(&p, at(6), Some(at(5))));
        assert!(!pod_events_due(&p, at(9), Some(at(5))));
        assert!(pod_events_due(&p, at(10), Some(at(5))));
        // Read at 30 s: the next read is 30 s later.
        assert!(!pod_events_due(&p, at(59), Some(at(30))));
        assert!(pod_events_due(&p, at(60), Some(at(30))));
        // Read at an hour: every 2 min after that.
        assert!(!pod_events_due(&p, at(3719), Some(at(3600))));
        assert!(pod_events_due(&p, at(3720), Some(at(3600))));
        // Not worth reading is never due.
        let mut started = pending_pod(0);
        started.workload = WorkloadState::Running;
        assert!(!pod_events_due(&started, at(60), None));
    }
}

#[cfg(test)]
mod pod_view_tests {
    use super::*;
    use crate::controller::conditions;
    use crate::controller::events::newly_stuck;
    use crate::controller::run::status::tracked_status;
    use crate::controller::testkit::fixtures::*;
    use k8s_openapi::api::core::v1::{
        ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
        PodStatus,
    };

    #[test]
    fn pod_view_reads_workload_and_holder_separately() {
        let cs = |name: &str, terminated: Option<i32>| ContainerStatus {
            name: name.into(),
            state: Some(match terminated {
                Some(code) => ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: code,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                None => ContainerState {
                    running: Some(ContainerStateRunning::default()),
                    ..Default::default()
                },
            }),
            ..Default::default()
        };
        let pod = Pod {
            status: Some(PodStatus {
                container_statuses: Some(vec![cs("workload", Some(7)), cs("holder", None)]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = PodView::of(&pod);
        assert_eq!(v.workload, WorkloadState::Terminated { exit_code: 7 });
        assert!(v.holder_running);
    }

    #[test]
    fn a_container_the_kubelet_cannot_create_is_a_stuck_pod_and_told_once() {
        let mut pod = pulling_pod("CreateContainerConfigError", "secret \"creds\" not found");
        let v = PodView::of(&pod);
        let problem = PodProblem::Stuck {
            reason: "CreateContainerConfigError",
            message: "container workload: secret \"creds\" not found".into(),
        };
        assert_eq!(v.problem, Some(problem.clone()));
        let r = pending(run_with(&[("/out", false)]));
        let s = tracked_status(&r, "demo-sbr", &v, now());
        let ready = s
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::READY)
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "CreateContainerConfigError")
        );
        assert_eq!(ready.message, problem.message());
        assert_eq!(s.message.as_deref(), Some(problem.message()));
        // Told once: the Event is due before Ready says it, not after.
        let before = r.status.clone().unwrap_or_default();
        assert_eq!(
            newly_stuck(&before, v.problem.as_ref()).as_deref(),
            Some("CreateContainerConfigError: container workload: secret \"creds\" not found")
        );
        assert_eq!(newly_stuck(&s, v.problem.as_ref()), None);
        assert_eq!(newly_stuck(&s, None), None);
        // A different cause is told again.
        let unschedulable = PodProblem::Unschedulable("0/2 nodes are available".into());
        assert_eq!(
            newly_stuck(&s, Some(&unschedulable)).as_deref(),
            Some("Unschedulable: 0/2 nodes are available")
        );
        // An image-pull problem of the same pod is still reported as such (it wins).
        if let Some(st) = pod.status.as_mut() {
            if let Some(cs) = st.container_statuses.as_mut() {
                cs.push(ContainerStatus {
                    name: "extra".into(),
                    state: Some(ContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some("ImagePullBackOff".into()),
                            message: Some("back-off".into()),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
            }
        }
        assert_eq!(
            PodView::of(&pod).problem.map(|p| p.reason()),
            Some(REASON_IMAGE_PULL_FAILED)
        );
    }
}

#[cfg(test)]
mod workload_termination_tests {
    use super::*;
    use crate::controller::testkit::fixtures::*;
    use k8s_openapi::api::core::v1::{ContainerStateRunning, ContainerStateWaiting};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn workload_termination_is_copied_from_the_pod_and_bounded() {
        let w =
            workload_termination(&pod_with_workload(oom_killed("out of memory\n"), None)).unwrap();
        assert_eq!(
            w,
            WorkloadTermination {
                exit_code: 137,
                signal: Some(9),
                reason: Some("OOMKilled".into()),
                message: Some("out of memory\n".into()),
                started_at: Some(Time("2026-11-30T11:59:00Z".parse().unwrap())),
                finished_at: Some(Time(now())),
            }
        );

        // A long message (the log tail, multi-byte characters) is cut on a char boundary.
        let long = "é".repeat(3000); // 6000 bytes
        let w = workload_termination(&pod_with_workload(oom_killed(&long), None)).unwrap();
        let m = w.message.unwrap();
        assert!(m.len() <= MAX_WORKLOAD_MESSAGE_BYTES, "{} bytes", m.len());
        assert!(m.len() > MAX_WORKLOAD_MESSAGE_BYTES - 8, "cut too short");
        assert!(m.ends_with('…') && m.starts_with("éé"));
        // Empty strings are absent, not "".
        let w = workload_termination(&pod_with_workload(oom_killed(""), None)).unwrap();
        assert_eq!(w.message, None);

        // Still running: nothing to record. Waiting after a terminated run: the last state.
        let running = ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        };
        assert_eq!(
            workload_termination(&pod_with_workload(running, None)),
            None
        );
        let waiting = ContainerState {
            waiting: Some(ContainerStateWaiting::default()),
            ..Default::default()
        };
        let w = workload_termination(&pod_with_workload(waiting, Some(oom_killed("x"))));
        assert_eq!(w.map(|w| w.exit_code), Some(137));
        assert_eq!(workload_termination(&Pod::default()), None);
    }
}
