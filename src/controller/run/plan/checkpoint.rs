//! Checkpoints of a running sandbox (`spec.checkpoint`, docs/user-guide.md "Checkpoints", issue
//! #40): whether one is due, the paths it drains (every declared path, from the running holder,
//! into the checkpoint's own generation), and the status and Events that record it — or refuse
//! it past the run's limit. The sandbox keeps running either way. Pure.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::model::{Plan, Requeue};
use super::teardown::PathPlan;
use crate::api::{CheckpointStatus, ReadBackStatus, SandboxRun, REFUSED_CHECKPOINTS_KEPT};
use crate::caps::CapSettings;
use crate::controller::events::{self, drain_summary, PlannedEvent};

/// Every declared path, drained from `pod`'s running holder within what its cap leaves: a path's
/// checkpoints together stay within its cap (each gets the cap less the bytes its earlier
/// checkpoints stored; a member past it is dropped and listed, as at a teardown). The teardown's
/// own drain keeps the whole cap.
pub(crate) fn checkpoint_paths(run: &SandboxRun, pod: &Pod, caps: &CapSettings) -> Vec<PathPlan> {
    let used = |path: &str| -> u64 {
        run.status
            .iter()
            .flat_map(|s| s.checkpoints.iter())
            .flat_map(|c| c.read_back.iter())
            .filter(|e| e.path == path)
            .map(|e| e.bytes)
            .sum()
    };
    run.spec
        .read_back_paths()
        .iter()
        .enumerate()
        .map(|(index, declared)| {
            let requested = declared
                .size_limit
                .as_ref()
                .and_then(|q| crate::units::quantity_to_bytes(q).ok());
            let cap_bytes = caps
                .effective(requested)
                .saturating_sub(used(&declared.path));
            PathPlan {
                entry: index,
                index,
                path: declared.path.clone(),
                work: super::teardown::drain_in_slot(pod, (index, &declared.path), cap_bytes, 0),
            }
        })
        .collect()
}

/// The checkpoint `index` answering `token`, its paths' outcomes `read_back`, recorded: one more
/// `status.checkpoints` entry; a Normal `Checkpointed` Event, or the drain's own Warning when a
/// path failed or was capped (a failed checkpoint is never an empty set).
pub(crate) fn checkpoint_recorded(
    run: &SandboxRun,
    token: String,
    index: u32,
    read_back: Vec<ReadBackStatus>,
    now: Timestamp,
) -> Plan {
    let mut events = Vec::new();
    let summary = drain_summary(&read_back);
    let note = format!("checkpoint {index} ({token}) taken; the sandbox keeps running");
    match summary {
        Some(s) if s.warning => events.push(s.into_event("Checkpoint").about_pod()),
        Some(s) => events.push(
            PlannedEvent::normal(
                events::CHECKPOINTED,
                format!("{note}. {}", s.note),
                "Checkpoint",
            )
            .about_pod(),
        ),
        None => {
            events.push(PlannedEvent::normal(events::CHECKPOINTED, note, "Checkpoint").about_pod())
        }
    }
    record(
        run,
        CheckpointStatus {
            index,
            token,
            attempt: Some(crate::identity::current_attempt(run)),
            time: Some(Time(now)),
            message: None,
            read_back,
        },
        events,
    )
}

/// The number of the checkpoint a due token gets, or None when it is refused: the run holds
/// `max` checkpoints with files already (`run --max-checkpoints`; refused entries hold none and
/// do not count). Numbers only grow: a generation's keys (`checkpoint-N/`) are never reused,
/// whatever entries were pruned (docs/contract.md "A run's object stays bounded").
pub(crate) fn checkpoint_number(run: &SandboxRun, max: u32) -> Option<u32> {
    let entries = run
        .status
        .as_ref()
        .map_or(&[][..], |s| s.checkpoints.as_slice());
    let stored = entries.iter().filter(|c| !c.is_refused()).count();
    if stored >= max as usize {
        return None;
    }
    Some(next_number(entries))
}

/// One past the highest number of `entries` (1 when there are none).
fn next_number(entries: &[CheckpointStatus]) -> u32 {
    entries
        .iter()
        .map(|c| c.index)
        .max()
        .unwrap_or(0)
        .saturating_add(1)
}

/// A checkpoint refused: the run has `max` already (`run --max-checkpoints`). Recorded with why,
/// told by a Warning; nothing is drained and the sandbox keeps running. Only the latest
/// [`REFUSED_CHECKPOINTS_KEPT`] refusals stay listed, every one is counted
/// (`status.checkpointsRefused`): a run patched with new tokens for ever keeps a bounded status
/// (docs/contract.md "A run's object stays bounded").
pub(crate) fn checkpoint_refused(
    run: &SandboxRun,
    token: String,
    max: u32,
    now: Timestamp,
) -> Plan {
    let message = format!(
        "checkpoint {token:?} refused: the run has its {max} checkpoints (the operator's --max-checkpoints); nothing was drained"
    );
    let index = next_number(
        run.status
            .as_ref()
            .map_or(&[][..], |s| s.checkpoints.as_slice()),
    );
    let events = vec![PlannedEvent::warning(
        events::CHECKPOINT_REFUSED,
        message.clone(),
        "Checkpoint",
    )];
    let mut plan = record(
        run,
        CheckpointStatus {
            index,
            token,
            attempt: Some(crate::identity::current_attempt(run)),
            time: Some(Time(now)),
            message: Some(message),
            read_back: Vec::new(),
        },
        events,
    );
    if let Some(status) = plan.status.as_mut() {
        status.checkpoints_refused =
            Some(status.checkpoints_refused.unwrap_or(0).saturating_add(1));
        prune_refused(&mut status.checkpoints);
    }
    plan
}

/// Drops the oldest refused entries past [`REFUSED_CHECKPOINTS_KEPT`]; entries with files stay.
fn prune_refused(entries: &mut Vec<CheckpointStatus>) {
    let refused = entries.iter().filter(|c| c.is_refused()).count();
    let mut drop = refused.saturating_sub(REFUSED_CHECKPOINTS_KEPT);
    entries.retain(|c| {
        if drop > 0 && c.is_refused() {
            drop -= 1;
            return false;
        }
        true
    });
}

fn record(run: &SandboxRun, entry: CheckpointStatus, events: Vec<PlannedEvent>) -> Plan {
    let mut status = run.status.clone().unwrap_or_default();
    status.checkpoints.push(entry);
    Plan {
        events,
        status: Some(status),
        effects: Vec::new(),
        requeue: Requeue::AwaitChange,
    }
}

#[cfg(test)]
mod tests {
    use super::super::teardown::PathWork;
    use super::*;
    use crate::api::ReadBackPhase;
    use crate::controller::testkit::fixtures::{run_with, with_slots};

    fn at(i: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + i).unwrap()
    }

    /// docs/contract.md "A read-back slot is made once": a checkpoint reads a path only where
    /// the pod serves its slot.
    #[test]
    fn a_checkpoint_never_reads_a_path_where_the_pods_mounts_are_not_its_slot() {
        let r = run_with(&[("/out", false), ("/logs", false)]);
        let caps = CapSettings::default();
        let mut pod = with_slots(Pod::default(), &r);
        let mut workload = pod.spec.as_mut().unwrap().containers.iter_mut();
        let workload = workload
            .find(|c| c.name == crate::pod::WORKLOAD_CONTAINER)
            .unwrap();
        let mounts = workload.volume_mounts.as_mut().unwrap();
        mounts.retain(|m| m.name != "readback-1");
        let paths = checkpoint_paths(&r, &pod, &caps);
        assert!(matches!(
            &paths[0].work,
            PathWork::Drain { holder_path, .. } if holder_path == "/sandboxrun-readback/out"
        ));
        let PathWork::Record(failed) = &paths[1].work else {
            panic!("read a path its pod does not serve: {paths:?}");
        };
        assert_eq!(failed.phase, ReadBackPhase::Failed);
        assert_eq!((paths[1].entry, failed.path.as_str()), (1, "/logs"));
    }

    #[test]
    fn a_paths_checkpoints_share_its_cap() {
        let mut r = run_with(&[("/out", false)]);
        if let Some(rb) = r.spec.read_back.as_mut() {
            rb.paths[0].size_limit = Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                "1000".into(),
            ));
        }
        let pod = with_slots(Pod::default(), &r);
        let caps = CapSettings::default();
        let cap = |r: &SandboxRun| match &checkpoint_paths(r, &pod, &caps)[0].work {
            PathWork::Drain { cap_bytes, .. } => *cap_bytes,
            PathWork::Record(_) => panic!("drained"),
        };
        assert_eq!(cap(&r), 1000);
        let stored = |bytes| CheckpointStatus {
            read_back: vec![ReadBackStatus {
                path: "/out".into(),
                phase: ReadBackPhase::Drained,
                bytes,
                ..Default::default()
            }],
            ..Default::default()
        };
        r.status.get_or_insert_with(Default::default).checkpoints = vec![stored(300), stored(500)];
        assert_eq!(cap(&r), 200, "what the earlier checkpoints left");
        r.status
            .get_or_insert_with(Default::default)
            .checkpoints
            .push(stored(400));
        assert_eq!(
            cap(&r),
            0,
            "never below zero: every member is dropped and listed"
        );
    }

    #[test]
    fn a_new_token_is_due_once_and_a_failed_checkpoint_is_a_warning_never_an_empty_set() {
        let mut r = run_with(&[("/out", false)]);
        assert_eq!(r.checkpoint_due(), None, "no token, no checkpoint");
        r.spec.checkpoint = Some("c1".into());
        assert_eq!(r.checkpoint_due().as_deref(), Some("c1"));
        let failed = ReadBackStatus {
            path: "/out".into(),
            phase: ReadBackPhase::Failed,
            message: Some("exec refused".into()),
            ..Default::default()
        };
        let plan = checkpoint_recorded(&r, "c1".into(), 1, vec![failed], at(0));
        assert!(plan
            .events
            .iter()
            .any(|e| e.warning && e.reason == events::DRAIN_FAILED));
        assert!(plan.effects.is_empty(), "the sandbox keeps running");
        r.status = plan.status;
        assert_eq!(r.checkpoint_due(), None, "answered");
        let entry = &r.status.as_ref().unwrap().checkpoints[0];
        assert_eq!(
            (entry.index, entry.read_back[0].phase),
            (1, ReadBackPhase::Failed)
        );
        r.spec.checkpoint = Some("c2".into());
        assert_eq!(r.checkpoint_due().as_deref(), Some("c2"));
        let refused = checkpoint_refused(&r, "c2".into(), 1, at(1));
        assert!(refused
            .events
            .iter()
            .any(|e| e.warning && e.reason == events::CHECKPOINT_REFUSED));
        r.status = refused.status;
        assert_eq!(r.checkpoint_due(), None, "a refusal answers the token too");
    }

    #[test]
    fn a_run_patched_with_two_hundred_checkpoint_tokens_keeps_a_bounded_status() {
        let max = 16;
        let mut r = run_with(&[("/out", false)]);
        for i in 0..200u32 {
            let token = format!("t{i}");
            r.spec.checkpoint = Some(token.clone());
            assert_eq!(r.checkpoint_due().as_deref(), Some(token.as_str()));
            let plan = match checkpoint_number(&r, max) {
                Some(n) => {
                    let stored = ReadBackStatus {
                        path: "/out".into(),
                        phase: ReadBackPhase::Drained,
                        ..Default::default()
                    };
                    checkpoint_recorded(&r, token, n, vec![stored], at(i.into()))
                }
                None => checkpoint_refused(&r, token, max, at(i.into())),
            };
            r.status = plan.status;
            assert_eq!(r.checkpoint_due(), None, "every token is answered");
        }
        let status = r.status.as_ref().unwrap();
        let stored: Vec<u32> = status
            .checkpoints
            .iter()
            .filter(|c| !c.is_refused())
            .map(|c| c.index)
            .collect();
        assert_eq!(stored, (1..=max).collect::<Vec<_>>());
        assert!(
            status.checkpoints.len() <= max as usize + REFUSED_CHECKPOINTS_KEPT,
            "{} entries",
            status.checkpoints.len()
        );
        assert_eq!(status.checkpoints_refused, Some(200 - max));
        assert_eq!(
            status.checkpoints.last().map(|c| c.token.as_str()),
            Some("t199"),
            "the latest refusal is kept"
        );
        let numbers: Vec<u32> = status.checkpoints.iter().map(|c| c.index).collect();
        assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");
        // The operator's limit raised: the next checkpoint gets a number never used before.
        assert_eq!(checkpoint_number(&r, max + 1), Some(201));
    }
}
