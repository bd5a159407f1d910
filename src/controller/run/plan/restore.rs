//! Pause, resume and fork (docs/contract.md "Pause, resume and fork"): when an attempt's pod is
//! built parked in the launcher so that its read-back paths can be restored before the workload
//! starts ([`restore_source`], [`parked_if_due`]), when the restore and the start are due
//! ([`restore_step`]), and what their answers bring ([`restored`], [`delivered`]). Pure.
//!
//! A restore that fails is a Warning Event (`RestoreFailed`) and the `WorkspaceRestored=False`
//! condition, and the launcher is handed a refusal instead of the start: the workload never runs,
//! the attempt fails (exit 127) and its retry policy decides what follows. An attempt whose
//! restore failed is never a later restore's source (its paths hold no workload's files).

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use super::fork::{Bound, NotBound, Source};
use super::model::{Effect, Plan, Requeue};
use crate::api::{RestoreOutcome, RestoreStatus, SandboxRun, WorkspaceRestore};
use crate::controller::conditions::set_condition;
use crate::controller::events::{self, PlannedEvent};

/// The condition that says whether the current attempt's paths were restored.
pub(crate) const WORKSPACE_RESTORED: &str = "WorkspaceRestored";
/// Its reason once they were.
pub(crate) const REASON_RESTORED: &str = "Restored";

/// How soon a run whose start could not be handed over is looked at again.
const DELIVER_AGAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Where the run's current attempt's read-back paths are restored from: with
/// `spec.workspace.restore: Latest` its own newest ended attempt whose workload ran (not one whose
/// own restore failed); else, for a fork not yet past its source, that source
/// ([`super::fork::fork_source`]). None: the paths start empty.
pub(crate) fn restore_source(run: &SandboxRun) -> Option<Source> {
    own_source(run)
        .map(Source::Own)
        .or_else(|| super::fork::fork_source(run).map(Source::Fork))
}

/// The run's own attempt its current one restores from (`restore: Latest`).
fn own_source(run: &SandboxRun) -> Option<u32> {
    let asks = run
        .spec
        .workspace
        .as_ref()
        .is_some_and(|w| w.restore == WorkspaceRestore::Latest);
    let status = run.status.as_ref()?;
    let current = crate::identity::current_attempt(run);
    let failed = |attempt: u32| {
        status
            .restores
            .iter()
            .any(|r| r.attempt == attempt && r.outcome == RestoreOutcome::Failed)
    };
    status
        .attempts
        .iter()
        .rev()
        .map(|a| a.index)
        .filter(|&index| index < current)
        .find(|&index| !failed(index))
        .filter(|_| asks)
}

/// `pod` parked in the launcher when its attempt restores its paths ([`restore_source`]): its
/// holder's read-back mounts writable, as every parked pod's (`crate::pool::park`). A fork's
/// parked pod names the source run it was created for (its rights verified then, at the pod's
/// creation): see [`restore_step`].
pub(crate) fn parked_if_due(run: &SandboxRun, pod: Pod, settings: &crate::pod::PodSettings) -> Pod {
    let Some(source) = restore_source(run) else {
        return pod;
    };
    let Some(mut parked) = crate::pool::park::park_in_launcher(pod.clone(), settings) else {
        return pod;
    };
    if let Source::Fork(fork) = source {
        parked
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(FORK_FROM_ANNOTATION.to_string(), fork.run);
    }
    parked
}

/// The annotation of a fork's parked pod that names the source run it was created for.
pub(crate) const FORK_FROM_ANNOTATION: &str = "sandbox.iterion.io/fork-from";

/// What the current attempt's restore needs next.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum RestoreStep {
    /// Restore the paths from these files.
    Restore(Source),
    /// Hand the launcher the start (or the refusal) this record says.
    Deliver(Box<RestoreStatus>),
}

/// What the run's parked `pod` needs now: nothing unless its attempt restores, its workload
/// container (the launcher) runs, and the restore or the start is not recorded yet.
pub(crate) fn restore_step(run: &SandboxRun, pod: &Pod) -> Option<RestoreStep> {
    let from = restore_source(run)?;
    if !parked_and_running(pod) {
        return None;
    }
    let attempt = crate::identity::current_attempt(run);
    let record = run
        .status
        .as_ref()
        .and_then(|s| s.restores.iter().find(|r| r.attempt == attempt));
    match record {
        None => {
            Some(not_the_pods_source(&from, pod, attempt).unwrap_or(RestoreStep::Restore(from)))
        }
        Some(r) if !r.delivered => Some(RestoreStep::Deliver(Box::new(r.clone()))),
        Some(_) => None,
    }
}

/// A fork not bound yet whose `spec.workspace.from` no longer names the run its pod was created
/// for (the spec changed after the rights were verified at the pod's creation, the webhook
/// bypassed): its restore is refused, the other run never read.
fn not_the_pods_source(from: &Source, pod: &Pod, attempt: u32) -> Option<RestoreStep> {
    let Source::Fork(fork) = from else {
        return None;
    };
    let annotations = pod.metadata.annotations.as_ref();
    let created_for = annotations.and_then(|a| a.get(FORK_FROM_ANNOTATION));
    if fork.uid.is_some() || created_for == Some(&fork.run) {
        return None;
    }
    let message = format!(
        "spec.workspace.from names run {} but the pod was created for {}: a fork's source is \
         fixed at creation",
        fork.run,
        created_for.map_or("no source", String::as_str)
    );
    Some(RestoreStep::Deliver(Box::new(RestoreStatus {
        attempt,
        from_run: Some(fork.run.clone()),
        outcome: RestoreOutcome::Failed,
        message: Some(message),
        ..RestoreStatus::default()
    })))
}

/// Whether `pod`'s workload is the launcher and runs, and its holder (which the restore execs
/// into) runs too.
fn parked_and_running(pod: &Pod) -> bool {
    let parked = crate::pool::park::is_parked(pod);
    let running = |name: &str| {
        let status = pod.status.as_ref();
        let all = status
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter();
        let init = status.and_then(|s| s.init_container_statuses.as_ref());
        all.chain(init)
            .flatten()
            .any(|c| c.name == name && c.state.as_ref().is_some_and(|s| s.running.is_some()))
    };
    parked && running(crate::pod::WORKLOAD_CONTAINER) && running(crate::pod::HOLDER_CONTAINER)
}

/// Whether `live` (the run read now) records a restore of the attempt `cached` (the
/// reconcile's copy) is at, when `cached` records none: `cached` is older than a write of it.
/// A run re-created under the name (another uid) is not this one.
pub(crate) fn restore_recorded(live: &SandboxRun, cached: &SandboxRun) -> bool {
    let attempt = crate::identity::current_attempt(cached);
    let records = |r: &SandboxRun| {
        r.status
            .as_ref()
            .is_some_and(|s| s.restores.iter().any(|x| x.attempt == attempt))
    };
    live.metadata.uid == cached.metadata.uid && records(live) && !records(cached)
}

/// The plan of a step.
pub(crate) fn plan_of(step: RestoreStep) -> Plan {
    let effect = match step {
        RestoreStep::Restore(from) => Effect::RestoreWorkspace(Box::new(from)),
        RestoreStep::Deliver(record) => Effect::DeliverStart(record),
    };
    Plan {
        effects: vec![effect],
        ..Plan::wait(Requeue::AwaitChange)
    }
}

/// Why a restore failed, in words for the status.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct NotRestored(pub String);

impl From<NotBound> for NotRestored {
    fn from(e: NotBound) -> NotRestored {
        NotRestored(e.to_string())
    }
}

/// Why the launcher was not handed its start or refusal.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct NotHanded(pub String);

/// What the restore from attempt `from` carried (files, bytes), or why it failed.
pub(crate) type RestoreResult = Result<(u64, u64), NotRestored>;

/// After the restore of the current attempt's paths from the files `from` was bound to: the
/// launcher is handed the start, or — it failed — a refusal.
pub(crate) fn restored(run: &SandboxRun, from: &Bound, result: &RestoreResult) -> Plan {
    let attempt = crate::identity::current_attempt(run);
    let source = RestoreStatus {
        attempt,
        from_attempt: from.attempt,
        from_run: from.run.clone(),
        from_uid: from.uid.clone(),
        from_checkpoint: from.checkpoint,
        ..RestoreStatus::default()
    };
    let record = match result {
        Ok((files, bytes)) => RestoreStatus {
            outcome: RestoreOutcome::Restored,
            files: *files,
            bytes: *bytes,
            ..source
        },
        Err(why) => RestoreStatus {
            outcome: RestoreOutcome::Failed,
            message: Some(why.to_string()),
            ..source
        },
    };
    plan_of(RestoreStep::Deliver(Box::new(record)))
}

/// After the launcher was handed `record`'s start or refusal (`handed`), or not (why): the record
/// written with its Event and condition; not handed, written undelivered and tried again.
pub(crate) fn delivered(
    run: &SandboxRun,
    record: &RestoreStatus,
    handed: &Result<(), NotHanded>,
    now: Timestamp,
) -> Plan {
    let mut status = run.status.clone().unwrap_or_default();
    let mut record = record.clone();
    record.delivered = handed.is_ok();
    status.restores.retain(|r| r.attempt != record.attempt);
    status.restores.push(record.clone());
    let generation = run.metadata.generation;
    let (event, ok, reason, message) = match (&record.outcome, &record.message) {
        (RestoreOutcome::Restored, _) => {
            let note = format!(
                "attempt {}: {} file(s), {} byte(s) restored from {}; the workload starts",
                record.attempt,
                record.files,
                record.bytes,
                whose(&record)
            );
            let event = PlannedEvent::normal(events::WORKSPACE_RESTORED, note.clone(), "Restore");
            (event, true, REASON_RESTORED, note)
        }
        (RestoreOutcome::Failed, why) => {
            let note = format!(
                "attempt {}: restoring {} failed, so the workload is not started: {}",
                record.attempt,
                whose(&record),
                why.as_deref().unwrap_or("")
            );
            let event = PlannedEvent::warning(events::RESTORE_FAILED, note.clone(), "Restore");
            (event, false, events::RESTORE_FAILED, note)
        }
    };
    let conditions = &mut status.conditions;
    set_condition(
        conditions,
        WORKSPACE_RESTORED,
        ok,
        reason,
        message,
        generation,
        now,
    );
    let requeue = match handed {
        Ok(()) => Requeue::AwaitChange,
        Err(_) => Requeue::After(DELIVER_AGAIN),
    };
    Plan {
        events: handed.is_ok().then_some(event).into_iter().collect(),
        status: Some(status),
        effects: Vec::new(),
        requeue,
    }
}

/// The files a record restored from, in words: `attempt 2's files`, `run a's attempt 2's files`
/// (a fork), `run a's files` (a fork whose source could not be read).
fn whose(record: &RestoreStatus) -> String {
    match (&record.from_run, record.from_attempt) {
        (None, attempt) => format!("attempt {attempt}'s files"),
        (Some(run), 0) => format!("run {run}'s files"),
        (Some(run), attempt) => format!("run {run}'s attempt {attempt}'s files"),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        Container, ContainerState, ContainerStateRunning, ContainerStatus, PodSpec, PodStatus,
    };

    use super::*;
    use crate::api::{AttemptStatus, SandboxRunStatus, Workspace};

    fn run(restore: WorkspaceRestore, attempts: u32) -> SandboxRun {
        crate::testkit::sandbox_run("job")
            .namespace("ns")
            .uid("u1")
            .edit(|spec| {
                spec.command = Some(vec!["sh".into()]);
                spec.workspace = Some(Workspace {
                    restore,
                    ..Workspace::default()
                });
            })
            .status(SandboxRunStatus {
                attempts: (1..=attempts)
                    .map(|index| AttemptStatus {
                        index,
                        ..AttemptStatus::default()
                    })
                    .collect(),
                attempt: Some(attempts + 1),
                ..SandboxRunStatus::default()
            })
            .build()
    }

    fn parked_pod(running: bool) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: crate::pod::WORKLOAD_CONTAINER.into(),
                    command: Some(vec![crate::pool::park::launcher_path(), "launch".into()]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                container_statuses: Some(
                    [crate::pod::WORKLOAD_CONTAINER, crate::pod::HOLDER_CONTAINER]
                        .map(|name| ContainerStatus {
                            name: name.into(),
                            state: Some(ContainerState {
                                running: running.then(ContainerStateRunning::default),
                                ..ContainerState::default()
                            }),
                            ..ContainerStatus::default()
                        })
                        .to_vec(),
                ),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn a_resumed_attempt_restores_from_the_newest_attempt_whose_workload_ran() {
        assert_eq!(restore_source(&run(WorkspaceRestore::Latest, 0)), None);
        assert_eq!(restore_source(&run(WorkspaceRestore::Never, 2)), None);
        assert_eq!(
            restore_source(&run(WorkspaceRestore::Latest, 2)),
            Some(Source::Own(2))
        );
        // Attempt 2's own restore failed: its paths never held a workload's files.
        let mut r = run(WorkspaceRestore::Latest, 2);
        let failed = RestoreStatus {
            attempt: 2,
            from_attempt: 1,
            outcome: RestoreOutcome::Failed,
            ..RestoreStatus::default()
        };
        r.status.as_mut().unwrap().restores.push(failed);
        assert_eq!(restore_source(&r), Some(Source::Own(1)));
    }

    #[test]
    fn a_run_without_restore_gets_its_pod_unparked() {
        let settings = crate::pod::PodSettings::default();
        let pod = parked_pod(false);
        let mut plain = pod.clone();
        plain.spec.as_mut().unwrap().containers[0].command = Some(vec!["sh".into()]);
        let kept = parked_if_due(&run(WorkspaceRestore::Never, 1), plain.clone(), &settings);
        assert_eq!(kept, plain);
        let parked = parked_if_due(&run(WorkspaceRestore::Latest, 1), plain, &settings);
        let command = parked.spec.unwrap().containers[0].command.clone().unwrap();
        assert_eq!(command[0], crate::pool::park::launcher_path());
    }

    #[test]
    fn a_parked_restore_pods_holder_may_write_its_read_back_paths_and_no_other_holder_may() {
        use crate::api::{ReadBack, ReadBackPath};
        let settings = crate::pod::PodSettings::default();
        let with_paths = |restore| {
            let mut r = run(restore, 1);
            r.spec.image = Some("busybox@sha256:abc".into());
            r.spec.user = Some("1000:3000".into());
            r.spec.read_back = Some(ReadBack {
                paths: vec![ReadBackPath {
                    path: "/work/out".into(),
                    ..ReadBackPath::default()
                }],
                ..ReadBack::default()
            });
            r
        };
        let readback_mounts = |pod: &Pod| {
            let spec = pod.spec.as_ref().unwrap();
            let mut holder = spec.containers.iter();
            let holder = holder.find(|c| c.name == crate::pod::HOLDER_CONTAINER);
            let mounts = holder.unwrap().volume_mounts.clone().unwrap_or_default();
            let readback = mounts.into_iter();
            let readback =
                readback.filter(|m| m.name.starts_with(crate::pod::READBACK_VOLUME_PREFIX));
            readback.map(|m| m.read_only).collect::<Vec<_>>()
        };
        for (restore, read_only) in [
            (WorkspaceRestore::Latest, None),
            (WorkspaceRestore::Never, Some(true)),
        ] {
            let r = with_paths(restore);
            let pod = parked_if_due(&r, crate::pod::build_pod(&r, &settings).unwrap(), &settings);
            // restore-unpack writes through the holder's mount: read-only, it fails at once.
            assert_eq!(readback_mounts(&pod), vec![read_only], "{restore:?}");
        }
    }

    #[test]
    fn the_restore_comes_once_the_launcher_runs_and_the_start_after_it() {
        let r = run(WorkspaceRestore::Latest, 1);
        assert_eq!(restore_step(&r, &parked_pod(false)), None);
        assert_eq!(
            restore_step(&r, &parked_pod(true)),
            Some(RestoreStep::Restore(Source::Own(1)))
        );
        let plan = restored(&r, &Bound::own(1), &Ok((3, 30)));
        let Effect::DeliverStart(record) = &plan.effects[0] else {
            panic!("{plan:?}")
        };
        assert_eq!(
            (record.outcome, record.files, record.delivered),
            (RestoreOutcome::Restored, 3, false)
        );
        let now = Timestamp::now();
        let written = delivered(&r, record, &Ok(()), now);
        let status = written.status.unwrap();
        assert!(status.restores[0].delivered);
        assert_eq!(written.events[0].reason, events::WORKSPACE_RESTORED);
        let mut done = r.clone();
        done.status = Some(status);
        assert_eq!(
            restore_step(&done, &parked_pod(true)),
            None,
            "delivered once"
        );
    }

    /// docs/contract.md "Pause, resume and fork": the webhook bypassed, `workspace.from` changed
    /// after the fork's pod was created (its rights verified for the first source) is refused,
    /// never read.
    #[test]
    fn a_forks_source_changed_after_its_pod_was_created_is_refused_never_read() {
        let mut r = run(WorkspaceRestore::Never, 0);
        r.status = None;
        r.spec.workspace = Some(Workspace {
            from: Some(crate::api::WorkspaceFrom {
                run: "a".into(),
                attempt: None,
                checkpoint: None,
            }),
            ..Workspace::default()
        });
        let settings = crate::pod::PodSettings::default();
        let built = parked_if_due(&r, parked_pod(true), &settings);
        let mut pod = parked_pod(true);
        pod.metadata.annotations = built.metadata.annotations.clone();
        assert!(matches!(
            restore_step(&r, &pod),
            Some(RestoreStep::Restore(Source::Fork(_)))
        ));
        r.spec
            .workspace
            .as_mut()
            .unwrap()
            .from
            .as_mut()
            .unwrap()
            .run = "c".into();
        let Some(RestoreStep::Deliver(record)) = restore_step(&r, &pod) else {
            panic!("refused")
        };
        assert_eq!(
            (record.outcome, record.from_run.as_deref()),
            (RestoreOutcome::Failed, Some("c"))
        );
        assert!(record.message.unwrap().contains("fixed at creation"));
    }

    #[test]
    fn a_failed_restore_hands_a_refusal_with_a_warning_and_a_false_condition() {
        let r = run(WorkspaceRestore::Latest, 1);
        let plan = restored(&r, &Bound::own(1), &Err(NotRestored("sha mismatch".into())));
        let Effect::DeliverStart(record) = &plan.effects[0] else {
            panic!("{plan:?}")
        };
        assert_eq!(record.outcome, RestoreOutcome::Failed);
        let written = delivered(&r, record, &Ok(()), Timestamp::now());
        assert!(written.events[0].warning);
        assert_eq!(written.events[0].reason, events::RESTORE_FAILED);
        let status = written.status.unwrap();
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == WORKSPACE_RESTORED)
            .unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", events::RESTORE_FAILED)
        );
        // Not handed over: recorded undelivered, handed again later (never restored twice).
        let again = delivered(
            &r,
            record,
            &Err(NotHanded("attach".into())),
            Timestamp::now(),
        );
        let mut later = r.clone();
        later.status = again.status;
        assert!(matches!(
            restore_step(&later, &parked_pod(true)),
            Some(RestoreStep::Deliver(_))
        ));
    }

    #[test]
    fn a_restore_recorded_in_the_live_run_and_not_in_the_reconciles_copy_is_recorded() {
        let mut cached = run(WorkspaceRestore::Latest, 1);
        cached.metadata.uid = Some("u1".into());
        let mut live = cached.clone();
        live.status.get_or_insert_with(Default::default).restores = vec![RestoreStatus {
            attempt: 2,
            from_attempt: 1,
            ..RestoreStatus::default()
        }];
        assert!(restore_recorded(&live, &cached));
        assert!(
            !restore_recorded(&cached, &cached),
            "nothing recorded anywhere"
        );
        assert!(!restore_recorded(&live, &live), "the copy is not behind");
        let mut other = live.clone();
        other.metadata.uid = Some("u2".into());
        assert!(
            !restore_recorded(&other, &cached),
            "a re-created run is not this one"
        );
        let mut earlier = live.clone();
        earlier.status.as_mut().unwrap().restores[0].attempt = 1;
        assert!(
            !restore_recorded(&earlier, &cached),
            "another attempt's record"
        );
    }
}
