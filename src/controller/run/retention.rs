//! What happens to a run once it is over, decided purely (no client, no clock: `now` is an
//! argument): when `spec.ttlSecondsAfterFinished` deletes it, whether deleting it deletes its
//! stored files (`spec.readBack.retention`), and how long a failing delete of those files is
//! retried before the finalizer is released anyway (docs/contract.md "Stored files when a run is
//! deleted": bounded like the drain, by the run's drain timeout).

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use crate::api::{Retention, SandboxRun};
use crate::controller::conditions;

/// Shortest pause between two attempts at deleting stored files.
pub(crate) const PURGE_RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest pause between two attempts at deleting stored files.
pub(crate) const PURGE_RETRY_MAX: Duration = Duration::from_secs(60);

/// When the run finished: it has condition Complete or Failed True (its drain settled; the
/// contract's Job semantics), at `status.completionTime`, else at that condition's transition.
pub(crate) fn finished_at(run: &SandboxRun) -> Option<Timestamp> {
    let status = run.status.as_ref()?;
    let ended = status.conditions.iter().find(|c| {
        (c.type_ == conditions::COMPLETE || c.type_ == conditions::FAILED) && c.status == "True"
    })?;
    Some(
        status
            .completion_time
            .as_ref()
            .map(|t| t.0)
            .unwrap_or(ended.last_transition_time.0),
    )
}

/// What `spec.ttlSecondsAfterFinished` asks of a run now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ttl {
    /// No TTL, or the run has not finished: nothing to do.
    Keep,
    /// Finished; delete it this much later (requeue then, no polling).
    Wait(Duration),
    /// Finished at least TTL ago: delete it now.
    Expired,
}

/// The TTL decision for `run` at `now`.
pub(crate) fn ttl(run: &SandboxRun, now: Timestamp) -> Ttl {
    let Some(secs) = run.spec.ttl_seconds_after_finished else {
        return Ttl::Keep;
    };
    let Some(finished) = finished_at(run) else {
        return Ttl::Keep;
    };
    // A negative TTL cannot pass admission; read as 0 if one is stored anyway. A TTL so large
    // the sum overflows never expires.
    let Ok(due) = finished.checked_add(SignedDuration::from_secs(secs.max(0))) else {
        return Ttl::Keep;
    };
    if now >= due {
        Ttl::Expired
    } else {
        Duration::try_from(now.duration_until(due))
            .map(Ttl::Wait)
            .unwrap_or(Ttl::Expired)
    }
}

/// The retention that applies to the run: its `spec.readBack.retention`, else the operator's.
pub(crate) fn retention(run: &SandboxRun, operator_default: Retention) -> Retention {
    run.spec
        .read_back
        .as_ref()
        .and_then(|r| r.retention)
        .unwrap_or(operator_default)
}

/// When retries of the delete of stored files may start counting: the later of the deletion
/// request and the drain's end (the Drained condition's last transition), so a long drain does
/// not eat the delete's time.
pub(crate) fn purge_window_start(run: &SandboxRun, now: Timestamp) -> Timestamp {
    let deleted = run.metadata.deletion_timestamp.as_ref().map(|t| t.0);
    let drained = run.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == conditions::DRAINED && c.status != "Unknown")
            .map(|c| c.last_transition_time.0)
    });
    match (deleted, drained) {
        (Some(a), Some(b)) => a.max(b),
        (a, b) => a.or(b).unwrap_or(now),
    }
}

/// After a failed delete of stored files: how long to wait before the next attempt, or None
/// when `bound` (the run's drain timeout) has passed since `start` and the finalizer must be
/// released with the files left in place. The pause grows with the time already spent (half of
/// it, between [`PURGE_RETRY_MIN`] and [`PURGE_RETRY_MAX`]), and never reaches past the bound by
/// more than [`PURGE_RETRY_MIN`], so the last attempt falls at the bound.
pub(crate) fn purge_retry_after(
    start: Timestamp,
    bound: Duration,
    now: Timestamp,
) -> Option<Duration> {
    let spent = Duration::try_from(start.duration_until(now)).unwrap_or(Duration::ZERO);
    let left = bound.checked_sub(spent).filter(|d| !d.is_zero())?;
    let pause = (spent / 2).clamp(PURGE_RETRY_MIN, PURGE_RETRY_MAX);
    Some(pause.min(left.max(PURGE_RETRY_MIN)))
}

/// The first object the run's status records outside its run directory `dir` of the store at
/// `store_url` (the store the run uses now): its files are in another store (its namespace's
/// store ConfigMap changed since its drain), which a delete must not guess at (docs/contract.md
/// "A store per namespace"). None: every recorded object is there (or none is recorded).
pub(crate) fn stored_elsewhere(
    run: &SandboxRun,
    store_url: &str,
    dir: &object_store::path::Path,
) -> Option<String> {
    let base = crate::store::ObjectUrl::of(store_url, dir);
    run.status
        .as_ref()?
        .read_back
        .iter()
        .flat_map(|p| [p.object.as_deref(), p.manifest.as_deref()])
        .flatten()
        .find(|object| !base.holds(object))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ReadBack, SandboxRunSpec, SandboxRunStatus};
    use crate::controller::conditions::set_condition;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn finished(type_: &str, when: i64, ttl: Option<i64>) -> SandboxRun {
        let mut status = SandboxRunStatus {
            completion_time: Some(Time(at(when))),
            ..Default::default()
        };
        set_condition(
            &mut status.conditions,
            type_,
            true,
            "Test",
            "test",
            Some(1),
            at(when),
        );
        crate::testkit::sandbox_run("r")
            .edit(|spec| spec.ttl_seconds_after_finished = ttl)
            .status(status)
            .build()
    }

    #[test]
    fn a_finished_run_waits_exactly_until_finished_at_plus_ttl_then_expires() {
        for type_ in [conditions::COMPLETE, conditions::FAILED] {
            let run = finished(type_, 0, Some(30));
            assert_eq!(ttl(&run, at(0)), Ttl::Wait(Duration::from_secs(30)));
            assert_eq!(ttl(&run, at(29)), Ttl::Wait(Duration::from_secs(1)));
            assert_eq!(ttl(&run, at(30)), Ttl::Expired);
            assert_eq!(ttl(&run, at(3000)), Ttl::Expired);
        }
        // TTL 0: deleted as soon as it finished.
        assert_eq!(
            ttl(&finished(conditions::COMPLETE, 0, Some(0)), at(0)),
            Ttl::Expired
        );
    }

    #[test]
    fn no_ttl_or_no_end_keeps_the_run() {
        assert_eq!(
            ttl(&finished(conditions::COMPLETE, 0, None), at(1_000_000)),
            Ttl::Keep
        );
        // A final phase alone is not the end: Complete/Failed must be True (drain settled).
        for type_ in [conditions::DRAINED, conditions::READY] {
            assert_eq!(ttl(&finished(type_, 0, Some(1)), at(100)), Ttl::Keep);
        }
        let mut run = finished(conditions::COMPLETE, 0, Some(1));
        if let Some(s) = run.status.as_mut() {
            s.conditions[0].status = "False".into();
        }
        assert_eq!(ttl(&run, at(100)), Ttl::Keep);
        run.status = None;
        assert_eq!(ttl(&run, at(100)), Ttl::Keep);
    }

    #[test]
    fn finished_at_falls_back_to_the_condition_and_huge_ttls_never_overflow() {
        let mut run = finished(conditions::FAILED, 5, Some(10));
        if let Some(s) = run.status.as_mut() {
            s.completion_time = None;
        }
        assert_eq!(finished_at(&run), Some(at(5)));
        assert_eq!(ttl(&run, at(14)), Ttl::Wait(Duration::from_secs(1)));
        run.spec.ttl_seconds_after_finished = Some(i64::MAX);
        assert_eq!(ttl(&run, at(14)), Ttl::Keep);
    }

    #[test]
    fn the_run_s_retention_wins_over_the_operator_default() {
        let mut run = SandboxRun::new("r", SandboxRunSpec::default());
        assert_eq!(retention(&run, Retention::Retain), Retention::Retain);
        assert_eq!(retention(&run, Retention::Delete), Retention::Delete);
        run.spec.read_back = Some(ReadBack {
            retention: Some(Retention::Retain),
            ..Default::default()
        });
        assert_eq!(retention(&run, Retention::Delete), Retention::Retain);
        run.spec.read_back = Some(ReadBack {
            retention: Some(Retention::Delete),
            ..Default::default()
        });
        assert_eq!(retention(&run, Retention::Retain), Retention::Delete);
        run.spec.read_back = Some(ReadBack::default());
        assert_eq!(retention(&run, Retention::Delete), Retention::Delete);
    }

    #[test]
    fn retries_back_off_and_stop_at_the_bound() {
        let bound = Duration::from_secs(300);
        let start = at(0);
        assert_eq!(
            purge_retry_after(start, bound, at(0)),
            Some(PURGE_RETRY_MIN)
        );
        assert_eq!(
            purge_retry_after(start, bound, at(10)),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            purge_retry_after(start, bound, at(200)),
            Some(PURGE_RETRY_MAX)
        );
        // Never past the bound by more than the minimum pause.
        assert_eq!(
            purge_retry_after(start, bound, at(290)),
            Some(Duration::from_secs(10))
        );
        assert_eq!(purge_retry_after(start, bound, at(300)), None);
        assert_eq!(purge_retry_after(start, bound, at(10_000)), None);
        // A clock behind the start counts as no time spent.
        assert_eq!(
            purge_retry_after(start, bound, at(-5)),
            Some(PURGE_RETRY_MIN)
        );
    }

    #[test]
    fn the_window_starts_at_the_later_of_deletion_and_the_drain_s_end() {
        let mut run = finished(conditions::COMPLETE, 0, None);
        assert_eq!(purge_window_start(&run, at(50)), at(50));
        if let Some(s) = run.status.as_mut() {
            set_condition(
                &mut s.conditions,
                conditions::DRAINED,
                true,
                "Drained",
                "",
                Some(1),
                at(20),
            );
        }
        assert_eq!(purge_window_start(&run, at(50)), at(20));
        run.metadata.deletion_timestamp = Some(Time(at(10)));
        assert_eq!(purge_window_start(&run, at(50)), at(20));
        run.metadata.deletion_timestamp = Some(Time(at(40)));
        assert_eq!(purge_window_start(&run, at(50)), at(40));
    }

    #[test]
    fn a_delete_is_refused_when_the_run_stored_its_files_in_another_store() {
        use crate::api::{ReadBackStatus, SandboxRunStatus};
        let dir = object_store::path::Path::from("runs/team/r/u-1");
        let mut run = SandboxRun::new("r", SandboxRunSpec::default());
        assert_eq!(stored_elsewhere(&run, "s3://tenant-a/runs", &dir), None);
        run.status = Some(SandboxRunStatus {
            read_back: vec![ReadBackStatus {
                path: "/out".into(),
                object: Some("s3://tenant-a/runs/team/r/u-1/00-out.tar".into()),
                manifest: Some("s3://tenant-a/runs/team/r/u-1/00-out.tar.manifest.json".into()),
                ..Default::default()
            }],
            ..Default::default()
        });
        assert_eq!(stored_elsewhere(&run, "s3://tenant-a/runs", &dir), None);
        assert_eq!(
            stored_elsewhere(&run, "s3://tenant-b/runs", &dir).as_deref(),
            Some("s3://tenant-a/runs/team/r/u-1/00-out.tar")
        );
        // A sibling run directory is not this run's.
        let other = object_store::path::Path::from("runs/team/r/u-10");
        assert!(stored_elsewhere(&run, "s3://tenant-a/runs", &other).is_some());
    }
}
