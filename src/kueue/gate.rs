//! What a run's Kueue Workload means for the run, in Kueue's own words (docs/user-guide.md
//! "Queueing with Kueue"): which queue decides for it ([`queueing`]), whether its pod counts as
//! ready ([`pods_ready`]), and for each place a run can be in, the Workload's answer — an ended
//! run's Workload finished ([`finished`]), a running one preempted or told its pod is ready
//! ([`running`]), a suspended one deactivated and requeued ([`suspended`]), a resumed one
//! activated ([`resumed`]), and one that would get its pod held with Kueue's reason and words,
//! admitted, or never started again ([`before_pod`]). Pure: the answers name Workload edits
//! ([`WorkloadEdit`]), never the controller's steps or plans; the controller's run room
//! (`controller/run/kueue_gate.rs`) maps them onto its steps, plans and conditions.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use crate::api::SandboxRun;
use crate::kueue::QueueState;

/// An edit of the run's Workload an answer carries.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum WorkloadEdit {
    /// Create the Workload (it is absent).
    Create(Value),
    /// Merge-patch the Workload itself (its `spec.active`).
    Patch(Value),
    /// Merge-patch the Workload's status (its admission cleared: requeued).
    PatchStatus(Value),
}

/// Which Kueue queue decides for a run (docs/contract.md "Quota cannot be edited away").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Queueing<'a> {
    /// Not in Kueue: nothing recorded, no label.
    Not,
    /// In this LocalQueue: the one recorded (the label agrees), or the label's before the run
    /// was queued.
    In(&'a str),
    /// Queued once (recorded in `status.queue`), and the live label now says otherwise: the run
    /// is held, never started, until the label is put back; its Workload still decides
    /// everything else.
    Disagrees {
        /// The queue recorded.
        recorded: &'a str,
        /// The live label.
        label: Option<&'a str>,
    },
}

/// Which queue decides for `run`: what the operator recorded when it made the run's Workload,
/// never the live label alone (a tenant can edit labels).
pub(crate) fn queueing(run: &SandboxRun) -> Queueing<'_> {
    let label = crate::kueue::queue_of(run);
    let recorded = run.status.as_ref().and_then(|s| s.queue.as_deref());
    match (recorded, label) {
        (None, None) => Queueing::Not,
        (None, Some(label)) => Queueing::In(label),
        (Some(recorded), Some(label)) if recorded == label => Queueing::In(label),
        (Some(recorded), label) => Queueing::Disagrees { recorded, label },
    }
}

/// The `Queued` reason of a run whose queue label was edited after it was queued.
pub(crate) const QUEUE_LABEL_CHANGED: &str = "QueueLabelChanged";

/// In words: the label says `label`, the run was queued in `recorded`.
pub(crate) fn label_changed(recorded: &str, label: Option<&str>) -> String {
    let queued = format!("the run was queued in LocalQueue {recorded:?}");
    let now = label.map_or_else(|| "removed".to_string(), |l| format!("changed to {l:?}"));
    format!(
        "{queued} and its label {} was {now}; no pod is started until the label is put back (docs/contract.md \"Quota cannot be edited away\")",
        crate::kueue::QUEUE_LABEL
    )
}

/// Whether the run's pod counts as ready for Kueue's `waitForPodsReady` (as its Pod
/// integration counts a pod: Ready=True, or done): its `Ready` condition is True, or its
/// workload container has ended (the run is draining or ending; Finished follows).
pub(crate) fn pods_ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let ended = status
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.name == crate::names::WORKLOAD_CONTAINER
                    && c.state.as_ref().is_some_and(|s| s.terminated.is_some())
            })
        });
    ready || ended
}

/// Whether the Workload read is the run's own and not finished: the only one the run edits.
pub(crate) fn owned(state: &QueueState) -> bool {
    !matches!(
        state,
        QueueState::Foreign | QueueState::Finished | QueueState::Absent
    )
}

/// An ended run: the status patch that marks its Workload Finished (Failed unless `succeeded`,
/// with the run's `words`), so Kueue releases its quota; None when there is none to finish (none
/// read, not the run's, finished already).
pub(crate) fn finished(
    state: &QueueState,
    workload: Option<&Value>,
    succeeded: bool,
    words: &str,
    now: Timestamp,
) -> Option<Value> {
    match (state, workload) {
        (QueueState::Finished | QueueState::Absent | QueueState::Foreign, _) | (_, None) => None,
        (_, Some(w)) => Some(crate::kueue::finished_patch(w, succeeded, words, now)),
    }
}

/// What the Workload makes of a run whose pod runs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Running {
    /// Kueue evicted it (a preemption, or `waitForPodsReady`'s timeout): tear it down, with
    /// Kueue's words.
    Preempted(String),
    /// Admitted: this status patch says whether its pod is ready (docs/contract.md "A queued
    /// run's Workload says when its pod is ready"), then go on.
    PodsReady(Value),
    /// Go on; nothing to write.
    Go,
}

/// What the Workload makes of a run whose pod runs (tracked or checkpointed): `pod_ready` as
/// [`pods_ready`] says.
pub(crate) fn running(
    state: &QueueState,
    workload: Option<&Value>,
    pod_ready: bool,
    now: Timestamp,
) -> Running {
    match state {
        QueueState::Evicted { message, .. } => Running::Preempted(message.clone()),
        QueueState::Admitted { .. } => {
            match workload.and_then(|w| crate::kueue::pods_ready_patch(w, pod_ready, now)) {
                Some(patch) => Running::PodsReady(patch),
                None => Running::Go,
            }
        }
        _ => Running::Go,
    }
}

/// A suspended run without its pod (docs/contract.md "A suspended queued run frees its quota"):
/// its Workload is deactivated (`spec.active: false`, as Kueue's integrations do for a job its
/// owner suspends), and once Kueue evicted it for that, its admission is cleared — its quota
/// freed — as after a preemption.
pub(crate) fn suspended(
    state: &QueueState,
    workload: Option<&Value>,
    now: Timestamp,
) -> Vec<WorkloadEdit> {
    let Some(w) = workload else {
        return Vec::new();
    };
    let mut edits = Vec::new();
    if !owned(state) {
        return edits;
    }
    if crate::kueue::is_active(w) {
        edits.push(WorkloadEdit::Patch(crate::kueue::active_patch(false)));
    }
    if let QueueState::Evicted { admitted: true, .. } = state {
        edits.push(WorkloadEdit::PatchStatus(crate::kueue::requeue_patch(
            w, now,
        )));
    }
    edits
}

/// A run that would get its pod whose Workload is inactive (it was suspended): activated again,
/// so Kueue queues it (it is held until Kueue admits it).
pub(crate) fn resumed(state: &QueueState, workload: Option<&Value>) -> Option<WorkloadEdit> {
    let w = workload?;
    (owned(state) && !crate::kueue::is_active(w))
        .then(|| WorkloadEdit::Patch(crate::kueue::active_patch(true)))
}

/// What the Workload makes of a run that would get its pod now.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum BeforePod<'a> {
    /// Admitted to this ClusterQueue: the pod may be created.
    Admitted {
        /// The ClusterQueue that admitted it.
        cluster_queue: &'a str,
    },
    /// Held without a pod, with Kueue's reason and words (or the operator's when the Workload
    /// is absent or not the run's), and these edits of the Workload carried out with the hold.
    Held {
        /// The reason (`Queued=True`).
        reason: &'a str,
        /// The words.
        message: &'a str,
        /// The Workload's creation, or its admission cleared after an eviction.
        edits: Vec<WorkloadEdit>,
    },
    /// Its Workload finished: the run ended, and never gets a pod again.
    Finished,
}

/// What the Workload (`state`, as read: `workload`) makes of a run that would get its pod now;
/// `to_create` is the Workload to create when it is absent.
pub(crate) fn before_pod<'a>(
    state: &'a QueueState,
    workload: Option<&Value>,
    to_create: Option<Value>,
    now: Timestamp,
) -> BeforePod<'a> {
    match state {
        QueueState::Admitted { cluster_queue } => BeforePod::Admitted { cluster_queue },
        QueueState::Absent => BeforePod::Held {
            reason: "Created",
            message: "its Workload was created; waiting for Kueue",
            edits: to_create.map(WorkloadEdit::Create).into_iter().collect(),
        },
        QueueState::Foreign => BeforePod::Held {
            reason: "WorkloadNameTaken",
            message: "a Workload with this run's Workload name exists and is not this run's; delete it or rename the run",
            edits: Vec::new(),
        },
        QueueState::Pending { reason, message } => BeforePod::Held {
            reason,
            message,
            edits: Vec::new(),
        },
        QueueState::Evicted {
            reason,
            message,
            admitted,
        } => {
            let requeue = workload
                .filter(|_| *admitted)
                .map(|w| WorkloadEdit::PatchStatus(crate::kueue::requeue_patch(w, now)));
            BeforePod::Held {
                reason,
                message,
                edits: requeue.into_iter().collect(),
            }
        }
        QueueState::Finished => BeforePod::Finished,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> Timestamp {
        Timestamp::from_second(1_700_000_000).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_pod_counts_as_ready_when_it_is_ready_or_its_workload_ended() {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateTerminated, ContainerStatus, PodCondition, PodStatus,
        };
        let with = |ready: &str, terminated: bool| k8s_openapi::api::core::v1::Pod {
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    ..Default::default()
                }]),
                container_statuses: Some(vec![ContainerStatus {
                    name: crate::names::WORKLOAD_CONTAINER.into(),
                    state: Some(ContainerState {
                        terminated: terminated.then(ContainerStateTerminated::default),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(pods_ready(&with("True", false)));
        assert!(!pods_ready(&with("False", false)));
        assert!(pods_ready(&with("False", true)), "done counts as ready");
        assert!(
            !pods_ready(&k8s_openapi::api::core::v1::Pod::default()),
            "no status yet"
        );
    }

    /// Which queue decides is what the operator recorded when it made the Workload; the live
    /// label only before that (docs/contract.md "Quota cannot be edited away").
    #[test]
    fn the_queue_that_decides_is_the_recorded_one_never_the_live_label_alone() {
        let with = |recorded: Option<&str>, label: Option<&str>| {
            let run = crate::testkit::sandbox_run("demo")
                .namespace("ns")
                .uid("u1");
            let mut run = match label {
                Some(queue) => run.label(crate::kueue::QUEUE_LABEL, queue),
                None => run,
            }
            .build();
            run.status.get_or_insert_with(Default::default).queue = recorded.map(str::to_string);
            run
        };
        let not = with(None, None);
        assert_eq!(queueing(&not), Queueing::Not);
        let labelled_only = with(None, Some("lq"));
        assert_eq!(queueing(&labelled_only), Queueing::In("lq"));
        let agreeing = with(Some("lq"), Some("lq"));
        assert_eq!(queueing(&agreeing), Queueing::In("lq"));
        let moved = with(Some("lq"), Some("free"));
        assert_eq!(
            queueing(&moved),
            Queueing::Disagrees {
                recorded: "lq",
                label: Some("free")
            }
        );
        let removed = with(Some("lq"), None);
        assert_eq!(
            queueing(&removed),
            Queueing::Disagrees {
                recorded: "lq",
                label: None
            }
        );
    }

    fn evicted(admitted: bool) -> QueueState {
        QueueState::Evicted {
            reason: "Preempted".into(),
            message: "preempted by a higher priority workload".into(),
            admitted,
        }
    }

    /// A run that would get its pod: admitted, or held with Kueue's words and only the
    /// Workload edits its state asks for — made when absent, its admission cleared after an
    /// eviction that had admitted it, nothing when not the run's; a finished one never again.
    #[test]
    fn before_its_pod_a_run_is_admitted_held_in_kueues_words_or_never_started_again() {
        let w = json!({"metadata": {"name": "w"}, "spec": {"active": true}});
        let to_create = || Some(json!({"metadata": {"name": "new"}}));
        let admitted = QueueState::Admitted {
            cluster_queue: "cq".into(),
        };
        assert_eq!(
            before_pod(&admitted, Some(&w), to_create(), now()),
            BeforePod::Admitted {
                cluster_queue: "cq"
            }
        );
        let BeforePod::Held { reason, edits, .. } =
            before_pod(&QueueState::Absent, None, to_create(), now())
        else {
            panic!("held");
        };
        assert_eq!(reason, "Created");
        assert!(
            matches!(edits.as_slice(), [WorkloadEdit::Create(made)] if made["metadata"]["name"] == "new")
        );
        let BeforePod::Held { reason, edits, .. } =
            before_pod(&QueueState::Foreign, Some(&w), to_create(), now())
        else {
            panic!("held");
        };
        assert_eq!((reason, edits.len()), ("WorkloadNameTaken", 0));
        let pending = QueueState::Pending {
            reason: "Pending".into(),
            message: "insufficient unused quota".into(),
        };
        assert_eq!(
            before_pod(&pending, Some(&w), to_create(), now()),
            BeforePod::Held {
                reason: "Pending",
                message: "insufficient unused quota",
                edits: Vec::new()
            }
        );
        let evicted_admitted = evicted(true);
        let BeforePod::Held { reason, edits, .. } =
            before_pod(&evicted_admitted, Some(&w), to_create(), now())
        else {
            panic!("held");
        };
        assert_eq!(reason, "Preempted");
        assert!(matches!(edits.as_slice(), [WorkloadEdit::PatchStatus(_)]));
        let evicted_not = evicted(false);
        let BeforePod::Held { edits, .. } = before_pod(&evicted_not, Some(&w), to_create(), now())
        else {
            panic!("held");
        };
        assert!(edits.is_empty());
        assert_eq!(
            before_pod(&QueueState::Finished, Some(&w), to_create(), now()),
            BeforePod::Finished
        );
    }

    /// A running run: an eviction is a preemption with Kueue's words; an admitted one's
    /// Workload is told its pod is ready once, and nothing is written about one not the run's.
    #[test]
    fn a_running_run_is_preempted_on_eviction_and_its_pods_readiness_said_when_admitted() {
        let w = json!({"metadata": {"name": "w"}, "status": {}});
        assert_eq!(
            running(&evicted(true), Some(&w), true, now()),
            Running::Preempted("preempted by a higher priority workload".into())
        );
        let admitted = QueueState::Admitted {
            cluster_queue: "cq".into(),
        };
        assert!(matches!(
            running(&admitted, Some(&w), true, now()),
            Running::PodsReady(_)
        ));
        assert_eq!(running(&admitted, None, true, now()), Running::Go);
        assert_eq!(
            running(&QueueState::Foreign, Some(&w), true, now()),
            Running::Go
        );
        assert_eq!(
            finished(&QueueState::Foreign, Some(&w), true, "done", now()),
            None
        );
        assert!(finished(&admitted, Some(&w), false, "failed", now()).is_some());
    }
}
