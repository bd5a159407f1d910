//! When the apiserver refuses a run's pod (a ResourceQuota that requires limits, Pod Security
//! admission, a policy webhook, missing RBAC), the refusal is told in words `kubectl describe sbr`
//! shows (docs/contract.md "No run is silent"; docs/user-guide.md "Troubleshooting"):
//! Ready=False with reason [`REASON_POD_CREATE_FAILED`] and the apiserver's words, a Warning
//! Event with the same reason, and the creation retried with an exponential back-off
//! ([`retry_delay`]: 10 s doubling to 5 min) whose clock is Ready's `lastTransitionTime`, so it
//! survives an operator restart. Pure decisions: the controller only reads and writes. (A pod
//! that exists but cannot start is read in [`super::observe`].)

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use super::status::{ensure_pending_entries, set_pending};
use crate::api::{SandboxRun, SandboxRunStatus};
use crate::controller::conditions::{self, remove_condition, REASON_POD_CREATE_FAILED};

/// First pause after the apiserver refused the pod.
pub(crate) const FIRST_RETRY: Duration = Duration::from_secs(10);
/// Longest pause between two attempts to create a refused pod.
pub(crate) const MAX_RETRY: Duration = Duration::from_secs(300);

/// Whether an apiserver error status answering a pod creation is a refusal the user must see
/// (admission, quota, Pod Security, RBAC, a webhook that denied or could not be called). `409`
/// (the pod exists) and `429` (throttled) are not: the first is fine, the second is retried
/// quietly like a lost connection.
pub(crate) fn is_refusal(code: u16) -> bool {
    (400..600).contains(&code) && code != 409 && code != 429
}

/// When the apiserver first refused this generation's pod: Ready's `lastTransitionTime` while
/// Ready is False with reason [`REASON_POD_CREATE_FAILED`] for the run's current generation.
pub(crate) fn refused_since(run: &SandboxRun) -> Option<Timestamp> {
    refused_since_in(run.status.as_ref()?, run.metadata.generation)
}

/// [`refused_since`] of a status about to be written for `generation`.
pub(crate) fn refused_since_in(
    status: &SandboxRunStatus,
    generation: Option<i64>,
) -> Option<Timestamp> {
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::READY)?;
    (ready.status == "False"
        && ready.reason == REASON_POD_CREATE_FAILED
        && ready.observed_generation == generation)
        .then_some(ready.last_transition_time.0)
}

/// The pause after an attempt made at `attempt` when the refusals began at `since`: as long as
/// they have lasted, at least [`FIRST_RETRY`], at most [`MAX_RETRY`]. Attempts therefore come at
/// 0, 10, 20, 40, 80, 160, 320 s, then every 5 min: a doubling that needs no counter, only the
/// condition's clock.
pub(crate) fn retry_delay(since: Timestamp, attempt: Timestamp) -> Duration {
    let lasted = Duration::try_from(since.duration_until(attempt)).unwrap_or(Duration::ZERO);
    lasted.clamp(FIRST_RETRY, MAX_RETRY)
}

/// How long to wait before creating the run's pod again, None to create it now.
///
/// `last_attempt` is when this operator process last tried (unknown after a restart: then it
/// tries at once, and the next pause is already as long as the refusals have lasted). A spec
/// change starts over at once: the refused pod was built from the old spec.
pub(crate) fn create_retry_wait(
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
pub(crate) fn refused_status(run: &SandboxRun, message: &str, now: Timestamp) -> SandboxRunStatus {
    let mut status = run.status.clone().unwrap_or_default();
    if refused_since(run).is_none() {
        remove_condition(&mut status.conditions, conditions::READY);
    }
    let message = format!("the apiserver refused the pod: {message}");
    set_pending(run, &mut status, REASON_POD_CREATE_FAILED, &message, now);
    ensure_pending_entries(run, &mut status);
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Phase;
    use crate::controller::conditions::set_condition;

    fn at(secs: i64) -> Timestamp {
        let t0: Timestamp = "2026-11-30T12:00:00Z".parse().unwrap();
        t0.checked_add(SignedDuration::from_secs(secs)).unwrap()
    }

    fn run(generation: i64) -> SandboxRun {
        crate::testkit::sandbox_run("demo")
            .generation(generation)
            .build()
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
            conditions::READY,
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
            .find(|c| c.type_ == conditions::READY)
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", REASON_POD_CREATE_FAILED)
        );
        assert!(ready.message.contains("must specify limits.cpu"));
        assert_eq!(ready.observed_generation, Some(4));
        assert_eq!(s.message.as_deref(), Some(ready.message.as_str()));
    }
}
