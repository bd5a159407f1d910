//! Why a run's pod cannot be created or cannot start, in words `kubectl describe sbr` shows
//! (docs/contract.md "No run is silent"; docs/user-guide.md "Troubleshooting").
//!
//! Two kinds of trouble, both pure decisions here (the controller only reads and writes):
//!
//! - **The apiserver refuses the pod** (a ResourceQuota that requires limits, Pod Security
//!   admission, a policy webhook, missing RBAC): Ready=False with reason
//!   [`REASON_POD_CREATE_FAILED`] and the apiserver's words, a Warning Event with the same reason,
//!   and the creation retried with an exponential back-off ([`retry_delay`]: 10 s doubling to
//!   5 min) whose clock is Ready's `lastTransitionTime`, so it survives an operator restart.
//! - **The pod exists but is stuck** (CreateContainerConfigError, FailedMount of a missing
//!   ConfigMap/Secret/PVC, ImagePullBackOff, Unschedulable): Ready=False with the cause as reason
//!   and the words of whoever reported it, and one Warning Event [`REASON_POD_STUCK`] per distinct
//!   cause. Volume trouble is only ever an Event on the pod (the kubelet reports `FailedMount`
//!   nowhere else), so a pod that stays Pending has its Warning Events read, bounded
//!   ([`POD_EVENTS_LIMIT`]), every [`pending_recheck`].

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use crate::api::{Phase, SandboxRun, SandboxRunStatus};
use crate::reconcile::{condition, remove_condition, set_condition, PodProblem, PodView};

/// Event reason and Ready=False reason: the apiserver refused to create the run's pod.
pub const REASON_POD_CREATE_FAILED: &str = "PodCreateFailed";
/// Event reason: the run's pod exists and cannot start; the note names the cause (Ready's reason).
pub const REASON_POD_STUCK: &str = "PodStuck";

/// First pause after the apiserver refused the pod.
pub const FIRST_RETRY: Duration = Duration::from_secs(10);
/// Longest pause between two attempts to create a refused pod.
pub const MAX_RETRY: Duration = Duration::from_secs(300);

/// Whether an apiserver error status answering a pod creation is a refusal the user must see
/// (admission, quota, Pod Security, RBAC, a webhook that denied or could not be called). `409`
/// (the pod exists) and `429` (throttled) are not: the first is fine, the second is retried
/// quietly like a lost connection.
pub fn is_refusal(code: u16) -> bool {
    (400..600).contains(&code) && code != 409 && code != 429
}

/// When the apiserver first refused this generation's pod: Ready's `lastTransitionTime` while
/// Ready is False with reason [`REASON_POD_CREATE_FAILED`] for the run's current generation.
pub fn refused_since(run: &SandboxRun) -> Option<Timestamp> {
    refused_since_in(run.status.as_ref()?, run.metadata.generation)
}

/// [`refused_since`] of a status about to be written for `generation`.
pub fn refused_since_in(status: &SandboxRunStatus, generation: Option<i64>) -> Option<Timestamp> {
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::READY)?;
    (ready.status == "False"
        && ready.reason == REASON_POD_CREATE_FAILED
        && ready.observed_generation == generation)
        .then_some(ready.last_transition_time.0)
}

/// The pause after an attempt made at `attempt` when the refusals began at `since`: as long as
/// they have lasted, at least [`FIRST_RETRY`], at most [`MAX_RETRY`]. Attempts therefore come at
/// 0, 10, 20, 40, 80, 160, 320 s, then every 5 min: a doubling that needs no counter, only the
/// condition's clock.
pub fn retry_delay(since: Timestamp, attempt: Timestamp) -> Duration {
    let lasted = Duration::try_from(since.duration_until(attempt)).unwrap_or(Duration::ZERO);
    lasted.clamp(FIRST_RETRY, MAX_RETRY)
}

/// How long to wait before creating the run's pod again, None to create it now.
///
/// `last_attempt` is when this operator process last tried (unknown after a restart: then it
/// tries at once, and the next pause is already as long as the refusals have lasted). A spec
/// change starts over at once: the refused pod was built from the old spec.
pub fn create_retry_wait(
    run: &SandboxRun,
    last_attempt: Option<Timestamp>,
    now: Timestamp,
) -> Option<Duration> {
    let since = refused_since(run)?;
    let last = last_attempt?;
    let delay = SignedDuration::try_from(retry_delay(since, last)).ok()?;
    let due = last.checked_add(delay).ok()?;
    (now < due)
        .then(|| Duration::try_from(now.duration_until(due)).ok())
        .flatten()
}

/// The status after the apiserver refused the pod with `message`: phase Pending, the message,
/// Ready=False [`REASON_POD_CREATE_FAILED`]. Ready's `lastTransitionTime` is the back-off's clock:
/// it is kept across refusals of the same generation and starts at `now` otherwise (Ready was
/// absent, said something else, or described an older spec).
pub fn refused_status(run: &SandboxRun, message: &str, now: Timestamp) -> SandboxRunStatus {
    let mut status = run.status.clone().unwrap_or_default();
    let generation = run.metadata.generation;
    if refused_since(run).is_none() {
        remove_condition(&mut status.conditions, condition::READY);
    }
    let message = format!("the apiserver refused the pod: {message}");
    status.observed_generation = generation;
    status.phase = Some(Phase::Pending);
    status.message = Some(message.clone());
    set_condition(
        &mut status.conditions,
        condition::READY,
        false,
        REASON_POD_CREATE_FAILED,
        message,
        generation,
        now,
    );
    crate::reconcile::ensure_pending_entries(run, &mut status);
    status
}

/// Container waiting reasons that mean a container cannot be created or started (image pulls
/// are [`PodProblem::ImagePull`]). `CreateContainerConfigError`: a referenced ConfigMap/Secret
/// key is missing; `CreateContainerError`, `RunContainerError`: the runtime refused it.
pub const STUCK_CONTAINER_REASONS: &[&str] = &[
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// Warning Event reasons on a Pending pod that mean it cannot start: `FailedMount` (a missing
/// ConfigMap, Secret or PVC; the kubelet reports it only as an Event), `FailedAttachVolume`,
/// `FailedCreatePodSandBox` (network or runtime set-up).
pub const STUCK_EVENT_REASONS: &[&str] = &[
    "FailedMount",
    "FailedAttachVolume",
    "FailedCreatePodSandBox",
];

/// At most this many of a pod's Warning Events are read per look.
pub const POD_EVENTS_LIMIT: u32 = 50;
/// A pod Pending for less than this is still starting: its Events are not read yet.
pub const READ_EVENTS_AFTER: Duration = Duration::from_secs(5);
/// Shortest and longest pause between two looks at a Pending pod.
const RECHECK_MIN: Duration = Duration::from_secs(5);
const RECHECK_MAX: Duration = Duration::from_secs(120);

/// `reason` as the `&'static str` of `table`, None when it is not in it.
pub fn known(reason: &str, table: &[&'static str]) -> Option<&'static str> {
    table.iter().copied().find(|r| *r == reason)
}

/// One Warning Event about the pod, as read from the apiserver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodEventFact {
    /// Its reason (`FailedMount`, …).
    pub reason: String,
    /// Its message.
    pub message: String,
    /// When it was last seen (series or lastTimestamp or eventTime), when known.
    pub last_seen: Option<Timestamp>,
}

/// The cause a pod's Warning Events give for not starting: the latest of those with a reason in
/// [`STUCK_EVENT_REASONS`], None when there is none.
pub fn stuck_from_events(events: &[PodEventFact]) -> Option<PodProblem> {
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
pub fn should_read_pod_events(pod: &PodView, now: Timestamp) -> bool {
    !pod.deleting
        && pod.problem.is_none()
        && pod.workload == crate::reconcile::WorkloadState::NotStarted
        && pending_for(pod, now).is_some_and(|d| d >= READ_EVENTS_AFTER)
}

/// When to look again at a pod that has not started (its status may not change while it is
/// stuck, e.g. on a missing volume): after as long as it has been Pending, between 5 s and 2 min.
/// None once the workload started.
pub fn pending_recheck(pod: &PodView, now: Timestamp) -> Option<Duration> {
    if pod.workload != crate::reconcile::WorkloadState::NotStarted || pod.deleting {
        return None;
    }
    Some(
        pending_for(pod, now)
            .unwrap_or(Duration::ZERO)
            .clamp(RECHECK_MIN, RECHECK_MAX),
    )
}

fn pending_for(pod: &PodView, now: Timestamp) -> Option<Duration> {
    Duration::try_from(pod.pending_since?.duration_until(now)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SandboxRunSpec;
    use crate::reconcile::WorkloadState;

    fn at(secs: i64) -> Timestamp {
        let t0: Timestamp = "2026-11-30T12:00:00Z".parse().unwrap();
        t0.checked_add(SignedDuration::from_secs(secs)).unwrap()
    }

    fn run(generation: i64) -> SandboxRun {
        let mut r = SandboxRun::new("demo", SandboxRunSpec::default());
        r.metadata.generation = Some(generation);
        r
    }

    #[test]
    fn refusals_are_apiserver_answers_other_than_exists_and_throttled() {
        for code in [400, 403, 404, 422, 500, 503] {
            assert!(is_refusal(code), "{code}");
        }
        for code in [200, 201, 409, 429] {
            assert!(!is_refusal(code), "{code}");
        }
    }

    /// The back-off doubles from 10 s to 5 min, from nothing but the condition's clock.
    #[test]
    fn retries_double_from_ten_seconds_to_five_minutes() {
        let mut r = run(1);
        let mut t = 0;
        let mut schedule = vec![t];
        r.status = Some(refused_status(&r, "quota", at(t)));
        assert_eq!(refused_since(&r), Some(at(0)));
        for _ in 0..9 {
            let wait = create_retry_wait(&r, Some(at(t)), at(t)).expect("a pause after a refusal");
            t += wait.as_secs() as i64;
            schedule.push(t);
            // Refused again: the clock is kept.
            r.status = Some(refused_status(&r, "quota", at(t)));
            assert_eq!(refused_since(&r), Some(at(0)));
        }
        assert_eq!(schedule, [0, 10, 20, 40, 80, 160, 320, 620, 920, 1220]);
        // Woken early (our own status write, a label edit): wait for the rest of the pause.
        assert_eq!(
            create_retry_wait(&r, Some(at(1220)), at(1221)),
            Some(Duration::from_secs(299))
        );
        assert_eq!(create_retry_wait(&r, Some(at(1220)), at(1520)), None);
    }

    #[test]
    fn a_restart_tries_at_once_then_keeps_the_long_pause() {
        let mut r = run(1);
        r.status = Some(refused_status(&r, "quota", at(0)));
        // The restarted operator does not know its last attempt: it tries at once ...
        assert_eq!(create_retry_wait(&r, None, at(3600)), None);
        r.status = Some(refused_status(&r, "quota", at(3600)));
        // ... and the refusals have lasted an hour: the next pause is the longest, not 10 s.
        assert_eq!(
            create_retry_wait(&r, Some(at(3600)), at(3600)),
            Some(MAX_RETRY)
        );
    }

    #[test]
    fn a_spec_change_or_another_ready_reason_starts_over() {
        let mut r = run(1);
        r.status = Some(refused_status(&r, "quota", at(0)));
        r.status = Some(refused_status(&r, "quota", at(600)));
        assert_eq!(refused_since(&r), Some(at(0)));
        // The user changed the spec: try now, and the new spec's refusals have their own clock.
        r.metadata.generation = Some(2);
        assert_eq!(create_retry_wait(&r, Some(at(600)), at(601)), None);
        r.status = Some(refused_status(&r, "still quota", at(601)));
        assert_eq!(refused_since(&r), Some(at(601)));
        assert_eq!(
            create_retry_wait(&r, Some(at(601)), at(601)),
            Some(FIRST_RETRY)
        );
        // Ready said something else before (InvalidSpec): the first refusal starts the clock.
        let mut r = run(1);
        let mut s = SandboxRunStatus::default();
        set_condition(
            &mut s.conditions,
            condition::READY,
            false,
            "InvalidSpec",
            "bad",
            Some(1),
            at(0),
        );
        r.status = Some(s);
        assert_eq!(create_retry_wait(&r, Some(at(0)), at(1)), None);
        r.status = Some(refused_status(&r, "quota", at(900)));
        assert_eq!(refused_since(&r), Some(at(900)));
    }

    #[test]
    fn the_refused_status_says_why_in_ready_and_message() {
        let r = run(4);
        let s = refused_status(
            &r,
            "pods \"demo-sbr\" is forbidden: failed quota: q: must specify limits.cpu for: holder",
            at(0),
        );
        assert_eq!(s.phase, Some(Phase::Pending));
        let ready = s
            .conditions
            .iter()
            .find(|c| c.type_ == condition::READY)
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", REASON_POD_CREATE_FAILED)
        );
        assert!(ready.message.contains("must specify limits.cpu"));
        assert_eq!(ready.observed_generation, Some(4));
        assert_eq!(s.message.as_deref(), Some(ready.message.as_str()));
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
        }
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
}
