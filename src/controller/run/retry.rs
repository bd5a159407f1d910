//! Retries (docs/user-guide.md "Retries", issue #41): what an ended attempt means under the run's
//! `spec.retryPolicy` — retry it (counted against the limit or not, after a backoff), fail the
//! run now, or end it as a run without a policy ends. Pure: the attempts so far come from the
//! status, the end of this one from the teardown's trigger and the pod.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::decide::Trigger;
use crate::api::{AttemptStatus, ExitCodeOperator, RetryAction, RetryPolicy, RetryRule};

/// The pod condition a disruption sets (eviction, preemption, a node drain, a delete by someone
/// else), as Kubernetes names it.
pub(crate) const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// Uncounted attempts (disruptions, `Ignore` rules) a run may have at most: a workload that gets
/// its pod disrupted over and over cannot keep a run alive for ever.
pub(crate) const MAX_UNCOUNTED_ATTEMPTS: usize = 10;
/// Attempts ended by `spec.suspend` or a Kueue preemption (never counted against the retry
/// limit) a run may have at most: each stores a full copy of the run's files and an entry in
/// `status.attempts`, so an author toggling `spec.suspend` for ever cannot grow the run without
/// bound; past it the run fails, its last attempt drained (docs/contract.md "A run's object
/// stays bounded").
pub(crate) const MAX_HELD_ATTEMPTS: usize = 32;
/// `status.attempts[].reason` of an attempt `spec.suspend` ended.
pub(crate) const ATTEMPT_SUSPENDED: &str = "Suspended";
/// `status.attempts[].reason` of an attempt a Kueue preemption ended.
pub(crate) const ATTEMPT_PREEMPTED: &str = "Preempted";
/// Backoff defaults: the first wait, its factor and its cap.
const DEFAULT_BASE: u32 = 10;
const DEFAULT_FACTOR: u32 = 2;
const DEFAULT_CAP: u32 = 300;

/// How an attempt ended, as far as its retry is concerned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AttemptEnd {
    /// The workload's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The pod was deleted or evicted by someone else (not the run's own stop or deletion).
    pub disrupted: bool,
    /// The types of the pod's conditions that were True.
    pub pod_conditions: Vec<String>,
    /// `spec.suspend` stopped it (docs/user-guide.md "Suspend"): never counted, the next attempt
    /// waits until the run is resumed.
    pub suspended: bool,
    /// Kueue evicted it (docs/user-guide.md "Queueing with Kueue"): never counted, the next
    /// attempt waits until Kueue admits the run again.
    pub preempted: bool,
}

impl AttemptEnd {
    /// The end a teardown with `trigger` on `pod` is, when it may be retried: a workload that
    /// exited, or a pod deleted or evicted by someone else. None for what ends a run whatever its
    /// policy: `spec.stop`, the deadline, the run's deletion, a workload that never started.
    pub(crate) fn of(trigger: &Trigger, pod: Option<&Pod>) -> Option<AttemptEnd> {
        let (exit_code, disrupted) = match trigger {
            Trigger::WorkloadFinished { exit_code } => (Some(*exit_code), false),
            Trigger::PodDeleting => (None, true),
            Trigger::Suspend => {
                return Some(AttemptEnd {
                    suspended: true,
                    ..AttemptEnd::default()
                })
            }
            Trigger::Preempted { .. } => {
                return Some(AttemptEnd {
                    preempted: true,
                    ..AttemptEnd::default()
                })
            }
            _ => return None,
        };
        let pod_conditions = pod
            .and_then(|p| p.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .map(|cs| {
                cs.iter()
                    .filter(|c| c.status == "True")
                    .map(|c| c.type_.clone())
                    .collect()
            })
            .unwrap_or_default();
        Some(AttemptEnd {
            exit_code,
            disrupted,
            pod_conditions,
            suspended: false,
            preempted: false,
        })
    }

    fn disruption(&self) -> bool {
        self.disrupted || self.pod_conditions.iter().any(|c| c == DISRUPTION_TARGET)
    }

    /// Whether it was held (suspended or evicted by Kueue): never counted, and the next
    /// attempt's deadline starts again.
    pub(crate) fn held(&self) -> bool {
        self.suspended || self.preempted
    }

    pub(crate) fn words(&self) -> String {
        if self.suspended {
            return "spec.suspend was set".to_string();
        }
        if self.preempted {
            return "Kueue evicted it".to_string();
        }
        match self.exit_code {
            Some(code) => format!("the workload exited with code {code}"),
            None => "the pod was deleted or evicted".to_string(),
        }
    }
}

/// What the policy makes of an ended attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Not for the policy (none, a success, an end no policy retries): the run ends as without
    /// one.
    Final,
    /// Another attempt, after `after`.
    Retry {
        /// Whether this attempt counts against the limit.
        counted: bool,
        /// The backoff.
        after: Duration,
        /// Why, in words.
        why: String,
    },
    /// The policy ends the run here (a `FailRun` rule, the limit reached).
    Fail {
        /// Why the policy ends it, in words; how the attempt ended is not in them (the run's
        /// final message already says it: [`AttemptEnd::words`] completes it when it does not).
        why: String,
    },
}

/// The verdict on an attempt `spec.suspend` or a Kueue preemption ended (None: another end):
/// the next attempt when the run wants it again, never counted — unless the run has had
/// [`MAX_HELD_ATTEMPTS`] such attempts already: then it fails (docs/contract.md "A run's object
/// stays bounded").
fn held_verdict(end: &AttemptEnd, attempts: &[AttemptStatus]) -> Option<Verdict> {
    if !end.held() {
        return None;
    }
    let held_before = attempts
        .iter()
        .filter(|a| {
            !a.counted && [ATTEMPT_SUSPENDED, ATTEMPT_PREEMPTED].contains(&a.reason.as_str())
        })
        .count();
    if held_before >= MAX_HELD_ATTEMPTS {
        return Some(Verdict::Fail {
            why: format!(
                "{}; {MAX_HELD_ATTEMPTS} attempts ended by spec.suspend or a Kueue preemption are the most a run may have",
                end.words()
            ),
        });
    }
    let why = if end.suspended {
        "spec.suspend was set; the next attempt starts when it is cleared"
    } else {
        "Kueue evicted it; the next attempt starts when Kueue admits the run again"
    };
    Some(Verdict::Retry {
        counted: false,
        after: Duration::ZERO,
        why: why.to_string(),
    })
}

/// What `policy` makes of the attempt that ended as `end`, after `attempts` ended before it.
pub(crate) fn judge(
    policy: Option<&RetryPolicy>,
    end: &AttemptEnd,
    attempts: &[AttemptStatus],
) -> Verdict {
    if let Some(verdict) = held_verdict(end, attempts) {
        return verdict;
    }
    let Some(policy) = policy else {
        return Verdict::Final;
    };
    if end.exit_code == Some(0) {
        return Verdict::Final;
    }
    let (action, rule) = match policy.rules.iter().position(|r| matches(r, end)) {
        Some(i) => (policy.rules[i].action, format!("rule {}", i + 1)),
        None if end.disruption() => (RetryAction::Ignore, "a disruption".to_string()),
        None => (RetryAction::Retry, "no rule matched".to_string()),
    };
    let what = end.words();
    let counted = match action {
        RetryAction::FailRun => {
            return Verdict::Fail {
                why: format!("{rule} of spec.retryPolicy fails the run"),
            }
        }
        RetryAction::Retry => true,
        RetryAction::Ignore => false,
    };
    let counted_before = attempts.iter().filter(|a| a.counted).count();
    let uncounted_before = attempts.len() - counted_before;
    if counted && counted_before >= policy.limit as usize {
        return Verdict::Fail {
            why: format!(
                "the retry limit of {} is reached ({} attempt(s) counted)",
                policy.limit,
                counted_before + 1
            ),
        };
    }
    if !counted && uncounted_before >= MAX_UNCOUNTED_ATTEMPTS {
        return Verdict::Fail {
            why: format!("{MAX_UNCOUNTED_ATTEMPTS} uncounted attempts are the most a run may have"),
        };
    }
    let after = backoff(policy, attempts.len());
    let how = if counted {
        format!(
            "retried ({rule}; {} of {} retries)",
            counted_before + 1,
            policy.limit
        )
    } else {
        format!("retried without counting ({rule})")
    };
    Verdict::Retry {
        counted,
        after,
        why: format!("{what}; {how}"),
    }
}

/// Whether `rule` matches `end`: its exit codes (when it names some) and its pod conditions
/// (when it names some) both match; a rule naming neither matches nothing.
fn matches(rule: &RetryRule, end: &AttemptEnd) -> bool {
    if rule.on_exit_codes.is_none() && rule.on_pod_conditions.is_empty() {
        return false;
    }
    let codes = rule.on_exit_codes.as_ref().is_none_or(|c| {
        end.exit_code.is_some_and(|code| match c.operator {
            ExitCodeOperator::In => c.values.contains(&code),
            ExitCodeOperator::NotIn => !c.values.contains(&code),
        })
    });
    let conditions = rule.on_pod_conditions.is_empty()
        || rule.on_pod_conditions.iter().any(|want| {
            end.pod_conditions.contains(&want.type_)
                || (want.type_ == DISRUPTION_TARGET && end.disrupted)
        });
    codes && conditions
}

/// The wait before the next attempt, after `ended` attempts: `base × factor^(ended − 1)`, at most
/// the cap.
pub(crate) fn backoff(policy: &RetryPolicy, ended: usize) -> Duration {
    let b = policy.backoff.as_ref();
    let base = b.and_then(|b| b.base_seconds).unwrap_or(DEFAULT_BASE);
    let factor = b.and_then(|b| b.factor).unwrap_or(DEFAULT_FACTOR).max(1);
    let cap = b.and_then(|b| b.cap_seconds).unwrap_or(DEFAULT_CAP);
    let power = u32::try_from(ended.saturating_sub(1)).unwrap_or(u32::MAX);
    let secs = u64::from(factor)
        .checked_pow(power)
        .and_then(|f| f.checked_mul(u64::from(base)))
        .unwrap_or(u64::MAX)
        .min(u64::from(cap));
    Duration::from_secs(secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ExitCodeRule, PodConditionRule, RetryBackoff};

    fn policy(limit: u32, rules: Vec<RetryRule>) -> RetryPolicy {
        RetryPolicy {
            limit,
            backoff: Some(RetryBackoff {
                base_seconds: Some(1),
                factor: Some(2),
                cap_seconds: Some(5),
            }),
            rules,
        }
    }

    fn exit(code: i32) -> AttemptEnd {
        AttemptEnd {
            exit_code: Some(code),
            ..AttemptEnd::default()
        }
    }

    fn ended(counted: &[bool]) -> Vec<AttemptStatus> {
        counted
            .iter()
            .enumerate()
            .map(|(i, c)| AttemptStatus {
                index: i as u32 + 1,
                counted: *c,
                ..AttemptStatus::default()
            })
            .collect()
    }

    fn on_codes(action: RetryAction, operator: ExitCodeOperator, values: &[i32]) -> RetryRule {
        RetryRule {
            action,
            on_exit_codes: Some(ExitCodeRule {
                operator,
                values: values.to_vec(),
            }),
            on_pod_conditions: Vec::new(),
        }
    }

    #[test]
    fn without_a_policy_or_on_success_the_run_ends_as_before() {
        assert_eq!(judge(None, &exit(3), &[]), Verdict::Final);
        assert_eq!(
            judge(Some(&policy(3, vec![])), &exit(0), &[]),
            Verdict::Final
        );
    }

    #[test]
    fn a_failed_attempt_is_retried_until_the_limit_then_the_run_fails() {
        let p = policy(2, vec![]);
        for before in [vec![], vec![true]] {
            let v = judge(Some(&p), &exit(3), &ended(&before));
            assert!(
                matches!(v, Verdict::Retry { counted: true, .. }),
                "{before:?}: {v:?}"
            );
        }
        let v = judge(Some(&p), &exit(3), &ended(&[true, true]));
        assert!(
            matches!(&v, Verdict::Fail { why } if why.contains("limit of 2")),
            "{v:?}"
        );
    }

    #[test]
    fn exit_code_rules_fail_now_retry_or_do_not_count_first_match_wins() {
        let p = policy(
            1,
            vec![
                on_codes(RetryAction::FailRun, ExitCodeOperator::In, &[42]),
                on_codes(RetryAction::Ignore, ExitCodeOperator::In, &[75]),
                on_codes(RetryAction::Retry, ExitCodeOperator::NotIn, &[42, 75]),
            ],
        );
        assert!(matches!(
            judge(Some(&p), &exit(42), &[]),
            Verdict::Fail { why } if why.contains("rule 1")
        ));
        assert!(matches!(
            judge(Some(&p), &exit(75), &ended(&[true])),
            Verdict::Retry { counted: false, .. }
        ));
        assert!(matches!(
            judge(Some(&p), &exit(1), &[]),
            Verdict::Retry { counted: true, .. }
        ));
        // The limit (1) is reached by one counted attempt; an uncounted one does not use it.
        assert!(matches!(
            judge(Some(&p), &exit(1), &ended(&[false, true])),
            Verdict::Fail { .. }
        ));
    }

    #[test]
    fn a_disruption_is_retried_without_counting_unless_a_rule_says_otherwise() {
        let evicted = AttemptEnd {
            exit_code: None,
            disrupted: true,
            pod_conditions: vec![DISRUPTION_TARGET.into()],
            suspended: false,
            preempted: false,
        };
        let p = policy(0, vec![]);
        assert!(matches!(
            judge(Some(&p), &evicted, &[]),
            Verdict::Retry { counted: false, .. }
        ));
        let strict = policy(
            0,
            vec![RetryRule {
                action: RetryAction::FailRun,
                on_exit_codes: None,
                on_pod_conditions: vec![PodConditionRule {
                    type_: DISRUPTION_TARGET.into(),
                }],
            }],
        );
        assert!(matches!(
            judge(Some(&strict), &evicted, &[]),
            Verdict::Fail { .. }
        ));
        // Bounded: a pod disrupted over and over does not keep the run alive for ever.
        let many = ended(&[false; MAX_UNCOUNTED_ATTEMPTS]);
        assert!(matches!(
            judge(Some(&p), &evicted, &many),
            Verdict::Fail { .. }
        ));
    }

    #[test]
    fn an_attempt_kueue_evicted_never_counts_and_needs_no_policy() {
        let preempted = AttemptEnd::of(
            &Trigger::Preempted {
                message: "Preempted to accommodate a workload".into(),
            },
            None,
        )
        .unwrap();
        assert!(preempted.held());
        for policy in [None, Some(policy(0, vec![]))] {
            assert!(matches!(
                judge(policy.as_ref(), &preempted, &ended(&[true; 20])),
                Verdict::Retry {
                    counted: false,
                    after: Duration::ZERO,
                    ..
                }
            ));
        }
    }

    #[test]
    fn a_suspended_attempt_never_counts_and_needs_no_policy() {
        let suspended = AttemptEnd {
            suspended: true,
            ..AttemptEnd::default()
        };
        for policy in [None, Some(policy(0, vec![]))] {
            assert!(matches!(
                judge(policy.as_ref(), &suspended, &ended(&[false; 20])),
                Verdict::Retry { counted: false, after, .. } if after.is_zero()
            ));
        }
    }

    #[test]
    fn a_run_suspended_or_preempted_over_and_over_fails_once_its_held_attempts_are_spent() {
        let held = |n: usize, reason: &str| -> Vec<AttemptStatus> {
            (0..n)
                .map(|i| AttemptStatus {
                    index: i as u32 + 1,
                    reason: reason.into(),
                    ..AttemptStatus::default()
                })
                .collect()
        };
        let suspended = AttemptEnd {
            suspended: true,
            ..AttemptEnd::default()
        };
        let preempted = AttemptEnd {
            preempted: true,
            ..AttemptEnd::default()
        };
        for end in [&suspended, &preempted] {
            for policy in [None, Some(policy(3, vec![]))] {
                let policy = policy.as_ref();
                let below = held(MAX_HELD_ATTEMPTS - 1, ATTEMPT_SUSPENDED);
                assert!(matches!(
                    judge(policy, end, &below),
                    Verdict::Retry { counted: false, .. }
                ));
                let mut spent = held(MAX_HELD_ATTEMPTS / 2, ATTEMPT_SUSPENDED);
                spent.extend(held(MAX_HELD_ATTEMPTS / 2, ATTEMPT_PREEMPTED));
                let Verdict::Fail { why } = judge(policy, end, &spent) else {
                    panic!("{MAX_HELD_ATTEMPTS} held attempts: the run fails");
                };
                assert!(why.contains("spec.suspend or a Kueue preemption"), "{why}");
            }
        }
    }

    #[test]
    fn the_backoff_doubles_from_its_base_up_to_its_cap() {
        let p = policy(5, vec![]);
        let waits: Vec<u64> = (1..=5).map(|n| backoff(&p, n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 5, 5]);
        let defaults = RetryPolicy {
            limit: 1,
            ..RetryPolicy::default()
        };
        assert_eq!(backoff(&defaults, 1), Duration::from_secs(10));
        assert_eq!(backoff(&defaults, 60), Duration::from_secs(300));
    }
}
