//! The end of one attempt of a run with `spec.retryPolicy` (docs/user-guide.md "Retries", issue
//! #41): what the policy makes of it ([`super::super::retry`]), and, when another attempt
//! follows, the status that records this one in `status.attempts` — its exit code, why, and its
//! own read-back drains — and waits out the backoff, the Events, and the effects (the pod marked
//! drained and deleted). Pure.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::super::retry::{self, AttemptEnd, Verdict};
use super::super::status::ensure_pending_entries;
use super::model::{Effect, Plan, Requeue};
use super::teardown::teardown_end;
use crate::api::{AttemptStatus, Phase, Retention, SandboxRun, SandboxRunStatus};
use crate::controller::conditions::{self, remove_condition, set_condition};
use crate::controller::events::{self, drain_summary, PlannedEvent};

/// The end of a teardown whose drains are done: another attempt when the run's retry policy says
/// so ([`attempt_ended`]), else the run's end ([`teardown_end`]), with the policy's words when it
/// is what ended the run. `end`: how the attempt ended, when it may be retried
/// ([`AttemptEnd::of`]); a run being deleted is never retried.
pub(crate) fn attempt_end(
    run: &SandboxRun,
    status: SandboxRunStatus,
    (holder_running, pod_exists): (bool, bool),
    default_retention: Retention,
    end: Option<&AttemptEnd>,
    now: Timestamp,
) -> Plan {
    let verdict = match end {
        Some(end) if run.metadata.deletion_timestamp.is_none() => {
            retry::judge(run.spec.retry_policy.as_ref(), end, &status.attempts)
        }
        _ => Verdict::Final,
    };
    match verdict {
        Verdict::Retry {
            counted,
            after,
            why,
        } => attempt_ended(
            run,
            status,
            (holder_running, pod_exists),
            (counted, after, why),
            end,
            now,
        ),
        Verdict::Fail { why } => {
            let mut plan = teardown_end(
                run,
                status,
                holder_running,
                pod_exists,
                default_retention,
                now,
            );
            // The run's message already says how the attempt ended (`workload exited with code
            // N`): the policy's words complete it, never repeat it.
            if let Some(s) = plan.status.as_mut() {
                s.message = Some(match (s.message.take(), end) {
                    (Some(m), _) => format!("{m}; {why}"),
                    (None, Some(end)) => format!("{}; {why}", end.words()),
                    (None, None) => why,
                });
            }
            plan
        }
        Verdict::Final => teardown_end(
            run,
            status,
            holder_running,
            pod_exists,
            default_retention,
            now,
        ),
    }
}

/// The record of the attempt that ended (`status.attempts[]`), its drains taken from `status`.
fn ended_attempt(
    run: &SandboxRun,
    status: &mut SandboxRunStatus,
    counted: bool,
    why: String,
    end: Option<&AttemptEnd>,
    now: Timestamp,
) -> AttemptStatus {
    AttemptStatus {
        index: crate::identity::current_attempt(run),
        pod_name: crate::identity::current_pod_name(run),
        exit_code: end.and_then(|e| e.exit_code),
        reason: match end {
            Some(e) if e.suspended => retry::ATTEMPT_SUSPENDED,
            Some(e) if e.preempted => retry::ATTEMPT_PREEMPTED,
            Some(e) if e.exit_code.is_none() => "Disrupted",
            _ => "WorkloadFailed",
        }
        .to_string(),
        message: Some(why),
        counted,
        start_time: status.workload.as_ref().and_then(|w| w.started_at.clone()),
        end_time: Some(Time(now)),
        read_back: std::mem::take(&mut status.read_back),
    }
}

/// A suspended run without a pod (`spec.suspend`): Pending, Ready=False `Suspended`, told once.
pub(crate) fn suspended(run: &SandboxRun, now: Timestamp) -> Plan {
    let already = run.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == conditions::READY && c.reason == conditions::REASON_SUSPENDED)
    });
    if already {
        return Plan::wait(Requeue::AwaitChange);
    }
    let mut status = run.status.clone().unwrap_or_default();
    let generation = run.metadata.generation;
    let message = "suspended (spec.suspend): no pod until it is cleared".to_string();
    status.phase = Some(Phase::Pending);
    status.observed_generation = generation;
    status.message = Some(message.clone());
    set_condition(
        &mut status.conditions,
        conditions::READY,
        false,
        conditions::REASON_SUSPENDED,
        message.clone(),
        generation,
        now,
    );
    ensure_pending_entries(run, &mut status);
    Plan {
        events: vec![PlannedEvent::normal(events::SUSPENDED, message, "Suspend")],
        status: Some(status),
        effects: Vec::new(),
        requeue: Requeue::AwaitChange,
    }
}

/// This attempt recorded, the next one waiting out `after`: the run is Pending again with no pod,
/// its read-back entries Pending for the next attempt, Ready=False `Retrying`.
fn attempt_ended(
    run: &SandboxRun,
    mut status: SandboxRunStatus,
    (holder_running, pod_exists): (bool, bool),
    (counted, after, why): (bool, Duration, String),
    end: Option<&AttemptEnd>,
    now: Timestamp,
) -> Plan {
    let index = crate::identity::current_attempt(run);
    let generation = run.metadata.generation;
    // This attempt's drain is told as any teardown's is (a failed path is this attempt's
    // `sandbox_runfiles_drain_failed`, never hidden by a later attempt's success).
    let mut events = Vec::new();
    if let Some(summary) = drain_summary(&status.read_back) {
        if summary.warning {
            events.push(summary.into_event("Drain").about_pod());
        }
    }
    let next_at = now
        .checked_add(jiff::SignedDuration::try_from(after).unwrap_or_default())
        .unwrap_or(now);
    let message = if end.is_some_and(AttemptEnd::held) {
        format!("attempt {index} ended: {why}")
    } else {
        format!(
            "attempt {index} ended: {why}; attempt {} starts at {next_at}",
            index + 1
        )
    };
    let record = ended_attempt(run, &mut status, counted, why, end, now);
    status.attempts.push(record);
    status.phase = Some(Phase::Pending);
    status.pod_name = None;
    status.exit_code = None;
    status.workload = None;
    status.observed_generation = generation;
    status.next_attempt_time = Some(Time(next_at));
    status.attempt = Some(index + 1);
    if end.is_some_and(AttemptEnd::held) {
        // The deadline starts again when the run resumes, as a Job's does (docs/user-guide.md
        // "Suspend"); a retried attempt keeps counting from the first start.
        status.start_time = None;
        status.next_attempt_time = None;
    }
    status.message = Some(message.clone());
    for gone in [conditions::WORKLOAD_FINISHED, conditions::DRAINED] {
        remove_condition(&mut status.conditions, gone);
    }
    set_condition(
        &mut status.conditions,
        conditions::READY,
        false,
        conditions::REASON_RETRYING,
        message.clone(),
        generation,
        now,
    );
    ensure_pending_entries(run, &mut status);
    events.push(PlannedEvent::warning(events::ATTEMPT_FAILED, message, "Retry").about_pod());
    let mut effects = Vec::new();
    if holder_running {
        effects.push(Effect::MarkDrained);
    }
    if pod_exists {
        effects.push(Effect::DeletePod { at_once: true });
    }
    Plan {
        events,
        status: Some(status),
        effects,
        requeue: Requeue::After(after),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        ExitCodeOperator, ExitCodeRule, ReadBackPhase, RetryAction, RetryPolicy, RetryRule,
    };
    use crate::controller::run::decide::Trigger;
    use crate::controller::run::status::draining_status;
    use crate::controller::testkit::fixtures::{cond_of, drain_all, now, pair, run_with};

    fn failing_on(code: i32, limit: u32) -> SandboxRun {
        let mut r = run_with(&[("/out", true)]);
        r.spec.retry_policy = Some(RetryPolicy {
            limit,
            backoff: None,
            rules: vec![RetryRule {
                action: RetryAction::FailRun,
                on_exit_codes: Some(ExitCodeRule {
                    operator: ExitCodeOperator::In,
                    values: vec![code],
                }),
                on_pod_conditions: Vec::new(),
            }],
        });
        r
    }

    fn final_message(r: &SandboxRun, exit_code: i32) -> String {
        let trigger = Trigger::WorkloadFinished { exit_code };
        let status = drain_all(
            draining_status(r, &trigger, None, now()),
            ReadBackPhase::Drained,
        );
        let end = AttemptEnd {
            exit_code: Some(exit_code),
            ..AttemptEnd::default()
        };
        let plan = attempt_end(
            r,
            status,
            (false, false),
            Retention::Retain,
            Some(&end),
            now(),
        );
        let Some(status) = plan.status else {
            panic!("no status: {:?}", plan.events)
        };
        assert_eq!(status.phase, Some(Phase::Failed), "{status:?}");
        status.message.unwrap_or_default()
    }

    #[test]
    fn a_run_the_retry_policy_fails_names_its_exit_code_once_and_the_rule_that_failed_it() {
        let message = final_message(&failing_on(42, 3), 42);
        assert_eq!(message.matches("code 42").count(), 1, "{message}");
        assert!(
            message.contains("rule 1 of spec.retryPolicy fails the run"),
            "{message}"
        );
        // The limit reached: the same, with the limit's words.
        let message = final_message(&failing_on(42, 0), 7);
        assert_eq!(message.matches("code 7").count(), 1, "{message}");
        assert!(
            message.contains("the retry limit of 0 is reached"),
            "{message}"
        );
    }

    /// A run whose policy retries any failure (counted), `limit` times, after `base` seconds.
    fn retrying(limit: u32, base: u32) -> SandboxRun {
        let mut r = run_with(&[("/out", true)]);
        r.spec.retry_policy = Some(RetryPolicy {
            limit,
            backoff: Some(crate::api::RetryBackoff {
                base_seconds: Some(base),
                factor: Some(1),
                cap_seconds: None,
            }),
            rules: Vec::new(),
        });
        r
    }

    fn ended(r: &SandboxRun, end: &AttemptEnd, pod: (bool, bool)) -> Plan {
        let trigger = Trigger::WorkloadFinished {
            exit_code: end.exit_code.unwrap_or(0),
        };
        let status = drain_all(
            draining_status(r, &trigger, None, now()),
            ReadBackPhase::Drained,
        );
        attempt_end(r, status, pod, Retention::Retain, Some(end), now())
    }

    fn exited(code: i32) -> AttemptEnd {
        AttemptEnd {
            exit_code: Some(code),
            ..AttemptEnd::default()
        }
    }

    #[test]
    fn a_retried_attempt_is_recorded_and_the_next_waits_out_its_backoff_with_no_pod() {
        let r = retrying(2, 7);
        let plan = ended(&r, &exited(3), (true, true));
        let status = plan.status.expect("status");
        assert_eq!(status.phase, Some(Phase::Pending));
        assert_eq!(status.attempt, Some(2), "the next attempt is counted up");
        let record = status.attempts.last().expect("the ended attempt recorded");
        assert_eq!(
            (
                record.index,
                record.exit_code,
                record.reason.as_str(),
                record.counted
            ),
            (1, Some(3), "WorkloadFailed", true)
        );
        assert!(
            !record.read_back.is_empty(),
            "the attempt keeps its own drains"
        );
        assert_eq!(
            status.next_attempt_time.as_ref().map(|t| t.0),
            Some(now() + jiff::SignedDuration::from_secs(7))
        );
        assert_eq!(plan.requeue, Requeue::After(Duration::from_secs(7)));
        assert_eq!(
            plan.effects,
            vec![Effect::MarkDrained, Effect::DeletePod { at_once: true }]
        );
        assert!(plan
            .events
            .iter()
            .any(|e| e.warning && e.reason == events::ATTEMPT_FAILED && e.about_pod));
        assert_eq!(
            cond_of(&status, conditions::READY),
            pair("False", conditions::REASON_RETRYING)
        );
        assert_eq!(cond_of(&status, conditions::WORKLOAD_FINISHED), None);
        assert!(status.workload.is_none() && status.pod_name.is_none());
    }

    #[test]
    fn a_retry_marks_and_deletes_only_the_pod_that_is_still_there() {
        let r = retrying(2, 1);
        assert_eq!(
            ended(&r, &exited(1), (false, true)).effects,
            vec![Effect::DeletePod { at_once: true }]
        );
        assert!(ended(&r, &exited(1), (false, false)).effects.is_empty());
    }

    #[test]
    fn a_suspended_attempt_is_never_counted_and_its_deadline_starts_again() {
        let mut r = retrying(0, 5);
        r.status.get_or_insert_with(Default::default).start_time = Some(Time(now()));
        let end = AttemptEnd {
            suspended: true,
            ..AttemptEnd::default()
        };
        let plan = ended(&r, &end, (true, true));
        let status = plan.status.expect("status");
        let record = status.attempts.last().expect("recorded");
        assert_eq!(
            (record.reason.as_str(), record.counted),
            ("Suspended", false)
        );
        assert_eq!(
            status.start_time, None,
            "the deadline starts again on resume"
        );
        assert_eq!(
            status.next_attempt_time, None,
            "no backoff: it waits for the resume"
        );
        let message = status.message.unwrap_or_default();
        assert!(!message.contains("starts at"), "{message}");
    }

    #[test]
    fn a_run_being_deleted_is_never_retried() {
        let mut r = retrying(5, 1);
        r.metadata.deletion_timestamp = Some(Time(now()));
        let plan = ended(&r, &exited(1), (false, false));
        let status = plan.status.expect("status");
        assert!(status.attempts.is_empty(), "{:?}", status.attempts);
        assert_ne!(status.phase, Some(Phase::Pending));
    }

    #[test]
    fn a_suspended_run_is_told_once() {
        let r = run_with(&[("/out", true)]);
        let first = suspended(&r, now());
        let status = first.status.clone().expect("status");
        assert_eq!(status.phase, Some(Phase::Pending));
        assert_eq!(
            cond_of(&status, conditions::READY),
            pair("False", conditions::REASON_SUSPENDED)
        );
        assert_eq!(first.events.len(), 1);
        let mut told = r.clone();
        told.status = Some(status);
        let again = suspended(&told, now());
        assert!(again.status.is_none() && again.events.is_empty());
        assert_eq!(again.requeue, Requeue::AwaitChange);
    }
}
