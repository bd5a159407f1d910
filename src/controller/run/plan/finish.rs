//! After the end: deleting the finished pod, the TTL's expiry, skip-drain, a pod lost before
//! teardown, and deleting the stored files under `retention: Delete` (docs/contract.md "Stored
//! files when a run is deleted").

use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;

use super::super::retention::{self, Ttl};
use super::super::status::pod_lost_status;
use super::model::{Effect, NotPurged, Plan, PurgeTarget, Requeue, LOOK_AGAIN_MARGIN};
use crate::api::{ReadBackPhase, ReadBackStatus, Retention, SandboxRun, FINALIZER};
use crate::controller::events::{self, drain_summary, PlannedEvent};
use crate::controller::pod_view::{drain_settled, undrained_paths, PodView};
use crate::identity::RunId;
use crate::store::tenant_read::RunStore;

pub(super) fn delete_finished_pod(run: &SandboxRun, pod: Option<&PodView>, now: Timestamp) -> Plan {
    let settled = drain_settled(run);
    let deleting = run.metadata.deletion_timestamp.is_some();
    let mut effects = Vec::new();
    // A pod already being deleted is left to its grace period unless its drain is settled.
    if pod.is_some_and(|p| !p.deleting || settled) {
        effects.push(Effect::DeletePod { at_once: settled });
    }
    if deleting && run.finalizers().iter().any(|f| f == FINALIZER) {
        effects.push(Effect::RemoveFinalizer);
    }
    let requeue = match retention::ttl(run, now) {
        // At the exact time the TTL passes (a little after, so the decision sees it passed).
        Ttl::Wait(d) if !deleting => Requeue::After(d + LOOK_AGAIN_MARGIN),
        _ => Requeue::AwaitChange,
    };
    Plan {
        effects,
        ..Plan::wait(requeue)
    }
}

pub(super) fn skip_drain(run: &SandboxRun, pod_exists: bool, retention: Retention) -> Plan {
    let undrained = undrained_paths(run);
    let mut note = if undrained.is_empty() {
        "sandbox.iterion.io/skip-drain=true: finalizer released without draining".to_string()
    } else {
        format!(
            "sandbox.iterion.io/skip-drain=true: finalizer released; NOT drained: {}",
            undrained.join(", ")
        )
    };
    if retention == Retention::Delete {
        note.push_str("; retention: Delete skipped too, stored files are kept");
    }
    let mut effects = Vec::new();
    if pod_exists {
        effects.push(Effect::DeletePod { at_once: true });
    }
    effects.push(Effect::RemoveFinalizer);
    Plan {
        events: vec![PlannedEvent::warning(events::DRAIN_SKIPPED, note, "Delete").about_pod()],
        status: None,
        effects,
        requeue: Requeue::AwaitChange,
    }
}

/// The Event published once a run whose `spec.ttlSecondsAfterFinished` passed is deleted. The
/// delete only sets the deletion timestamp: the finalizer path runs as for any deletion
/// (docs/contract.md).
pub(super) fn expired_event(run: &SandboxRun, retention: Retention) -> PlannedEvent {
    let ttl = run.spec.ttl_seconds_after_finished.unwrap_or_default();
    let declares_paths = run
        .spec
        .read_back
        .as_ref()
        .is_some_and(|r| !r.paths.is_empty());
    let kept = match retention {
        _ if !declares_paths => "it declares no read-back paths",
        Retention::Retain => "its stored files are kept",
        Retention::Delete => "its stored files are deleted (retention: Delete)",
    };
    PlannedEvent::normal(
        events::TTL_EXPIRED,
        format!("finished more than ttlSecondsAfterFinished={ttl}s ago: deleted the run; {kept}"),
        "Expire",
    )
}

/// The pod vanished before teardown: every undrained path is reported lost, unless the store
/// has its committed manifest (`committed`, docs/contract.md §4). A deleted run with retention
/// Retain is released here; with Delete, the next reconcile (woken by this final status) deletes
/// the stored files first ([`Step::ReleaseFinalizer`]).
pub(crate) fn record_pod_lost(
    run: &SandboxRun,
    committed: &[ReadBackStatus],
    default_retention: Retention,
    now: Timestamp,
) -> Plan {
    let status = pod_lost_status(run, committed, now);
    let was_failed = |path: &str| {
        run.status.as_ref().is_some_and(|s| {
            s.read_back
                .iter()
                .any(|e| e.path == path && e.phase == ReadBackPhase::Failed)
        })
    };
    let newly_failed = status
        .read_back
        .iter()
        .any(|e| e.phase == ReadBackPhase::Failed && !was_failed(&e.path));
    // One Event for every path (a series of per-path Events shows only the first).
    let events = if newly_failed {
        drain_summary(&status.read_back)
            .map(|s| s.into_event("PodLost"))
            .into_iter()
            .collect()
    } else {
        Vec::new()
    };
    let mut effects = Vec::new();
    if run.metadata.deletion_timestamp.is_some()
        && retention::retention(run, default_retention) == Retention::Retain
    {
        effects.push(Effect::RemoveFinalizer);
    }
    Plan {
        events,
        status: Some(status),
        effects,
        requeue: Requeue::AwaitChange,
    }
}

/// What a delete of the run's stored files leaves to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Purge {
    /// Nothing (more) to delete, or the retries ran out: release the finalizer.
    Done,
    /// The delete failed; try again after this long (the finalizer stays).
    RetryAfter(Duration),
}

/// What a delete of the run's stored files works on in `store` (the store it uses now), or why
/// nothing is deleted and where, for the Event: a store that cannot be used; a run whose status
/// records an object outside its directory there (its namespace's store changed since its
/// drain: a delete must not guess where its files are, [`retention::stored_elsewhere`]).
pub(crate) fn purge_target(
    run: &SandboxRun,
    store: Result<&RunStore, &NotPurged>,
) -> Result<PurgeTarget, (NotPurged, String)> {
    // Without its identity the run names no directory: nothing is deleted (an empty namespace
    // or uid would name another run's, or another namespace's, files).
    let reference = RunId::of(run)
        .map_err(|missing| (missing.into(), format!("the store of {}", run.name_any())))?;
    let store = store.map_err(|why| {
        let location = format!("the store of {}/{}", reference.namespace, reference.name);
        (why.clone(), location)
    })?;
    let dir = crate::store::run_dir(&store.prefix, &reference);
    // The run directory's URL as its objects' URLs name it (the store URL's prefix once).
    let location = format!("{}/", crate::store::ObjectUrl::of(&store.url, &dir));
    if let Some(object) = retention::stored_elsewhere(run, &store.url, &dir) {
        let store = store.describe();
        return Err((NotPurged::StoredElsewhere { object, store }, location));
    }
    let manifests = run
        .spec
        .read_back_paths()
        .iter()
        .enumerate()
        .map(|(i, p)| crate::store::keys::manifest_key(&store.prefix, &reference, i, &p.path))
        .collect();
    Ok(PurgeTarget {
        store: store.clone(),
        run: reference,
        manifests,
        location,
    })
}

/// What a delete of the run's stored files (everything under `location`) that deleted `result`
/// objects, or failed with `result`'s words, means at `now`: a failure is retried with back-off
/// until the run's drain timeout (`bound_seconds`) has passed since the later of the deletion and
/// the drain's end; then the files are left and the finalizer released (docs/contract.md
/// "Stored files when a run is deleted").
pub(crate) fn purged(
    run: &SandboxRun,
    result: Result<usize, super::model::NotPurged>,
    location: &str,
    bound_seconds: i64,
    now: Timestamp,
) -> (PlannedEvent, Purge) {
    let e = match result {
        Ok(count) => {
            return (
                PlannedEvent::normal(
                    events::ARCHIVES_DELETED,
                    format!("retention: Delete: deleted {count} stored objects (archives and manifests) under {location}"),
                    "Delete",
                ),
                Purge::Done,
            )
        }
        Err(e) => e,
    };
    let bound = Duration::from_secs(u64::try_from(bound_seconds).unwrap_or(0));
    let start = retention::purge_window_start(run, now);
    match retention::purge_retry_after(start, bound, now) {
        Some(pause) => (
            PlannedEvent::warning(
                events::ARCHIVE_DELETE_FAILED,
                format!("retention: Delete: could not delete the stored files under {location}: {e}; retrying in {}s (gives up {bound_seconds}s after deletion; annotate sandbox.iterion.io/skip-drain=true to release the run now)", pause.as_secs().max(1)),
                "Delete",
            ),
            Purge::RetryAfter(pause),
        ),
        None => (
            PlannedEvent::warning(
                events::ARCHIVE_DELETE_ABANDONED,
                format!("retention: Delete: gave up after {bound_seconds}s (the drain timeout): the stored files under {location} were NOT all deleted ({e}); the run is released, delete them by hand"),
                "Delete",
            ),
            Purge::Done,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Phase, Retention};

    use crate::controller::events;
    use crate::controller::testkit::fixtures::*;

    use crate::controller::run::plan::testing::*;

    use std::time::Duration;

    #[test]
    fn the_ttl_event_says_what_becomes_of_the_stored_files_and_never_claims_files_a_run_has_not() {
        let with_paths = run_with(&[("/out", true)]);
        let note = |r: &SandboxRun, retention| expired_event(r, retention).note;
        assert!(note(&with_paths, Retention::Retain).ends_with("its stored files are kept"));
        assert!(note(&with_paths, Retention::Delete)
            .ends_with("its stored files are deleted (retention: Delete)"));
        let no_paths = run_with(&[]);
        for retention in [Retention::Retain, Retention::Delete] {
            let said = note(&no_paths, retention);
            assert!(!said.contains("stored files"), "{retention:?}: {said}");
            assert!(said.ends_with("it declares no read-back paths"), "{said}");
        }
    }

    /// A store that refused the delete.
    fn store_denied() -> super::super::model::NotPurged {
        super::super::model::NotPurged::Store {
            store: "s3://bucket".into(),
            error: "denied".into(),
        }
    }

    #[test]
    fn a_lost_pod_is_told_once_and_a_deleted_run_kept_by_retain_is_released() {
        let r = with_phase(run_with(&[("/out", true)]), Phase::Running);
        let plan = record_pod_lost(&r, &[], Retention::Retain, now());
        assert_eq!(
            line(&plan),
            "[!sandbox_runfiles_drain_failed/PodLost] | Failed | [] | await"
        );
        // Already reported: no second Event.
        let mut told = r.clone();
        told.status = plan.status;
        assert_eq!(
            line(&record_pod_lost(&told, &[], Retention::Retain, now())),
            "[] | Failed | [] | await"
        );
        // Deleted: Retain releases here, Delete leaves it to ReleaseFinalizer (files first).
        let gone = deleting(r);
        assert_eq!(
            line(&record_pod_lost(&gone, &[], Retention::Retain, now())),
            "[!sandbox_runfiles_drain_failed/PodLost] | Failed | [RemoveFinalizer] | await"
        );
        assert_eq!(
            line(&record_pod_lost(&gone, &[], Retention::Delete, now())),
            "[!sandbox_runfiles_drain_failed/PodLost] | Failed | [] | await"
        );
    }

    #[test]
    fn a_failed_delete_of_stored_files_is_retried_until_the_drain_timeout() {
        let r = deleting(with_phase(run_with(&[("/out", false)]), Phase::Succeeded));
        let (event, purge) = purged(&r, Ok(4), "file:///s/ns/demo/u1/", 300, now());
        assert_eq!(
            (event.reason, purge),
            (events::ARCHIVES_DELETED, Purge::Done)
        );
        assert!(
            event.note.contains("deleted 4 stored objects"),
            "{}",
            event.note
        );
        let (event, purge) = purged(&r, Err(store_denied()), "x/", 300, later(10));
        assert_eq!(
            (event.reason, purge),
            (
                events::ARCHIVE_DELETE_FAILED,
                Purge::RetryAfter(Duration::from_secs(5))
            )
        );
        let (event, purge) = purged(&r, Err(store_denied()), "x/", 300, later(300));
        assert_eq!(
            (event.reason, purge),
            (events::ARCHIVE_DELETE_ABANDONED, Purge::Done)
        );
        assert!(event.warning);
    }
}
