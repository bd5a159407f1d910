//! The warm claim's plans (`run --warm-pools`, docs/user-guide.md "Sandboxes for agents: warm
//! pools"; what the claim reads and how it chooses is `super::super::warm`'s): the claim is
//! carried out by act as effects with typed answers — claim the pod ([`Effect::ClaimPoolPod`]),
//! hand its launcher the start ([`Effect::HandPoolStart`]), delete a pod whose launcher did not
//! take it ([`Effect::DeletePoolPod`]), count a miss on the pool ([`Effect::CountPoolMiss`]) —
//! and what follows each answer is planned here, pure, with the reconcile's one `now`. An attempt
//! that restores its paths is handed its start by the restore stage once the restore answered
//! ([`super::restore`]), never by the claim.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub(crate) use super::model::{
    Claim, Cold, Delivery, Miss, MissCount, NotDelivered, PoolStart, CLAIM_REQUEUE, MISS_TRIES,
};
use super::model::{Effect, Plan, Requeue};
use crate::api::{SandboxRun, SandboxRunStatus, WarmStart};

/// The claim of a pool pod for the run: before it, `before` (the restricted run's template
/// record and policies, `super::super::warm`), then the pod made the run's by the merge `patch`
/// (guarded by the pod's resourceVersion).
pub(crate) fn take(
    claim: Claim,
    patch: serde_json::Value,
    (status, before): (Option<SandboxRunStatus>, Vec<Effect>),
) -> Plan {
    let mut effects = before;
    effects.push(Effect::ClaimPoolPod {
        claim: Box::new(claim),
        patch: Box::new(patch),
    });
    Plan {
        status,
        effects,
        ..Plan::wait(Requeue::After(CLAIM_REQUEUE))
    }
}

/// A claim made in an earlier reconcile and not recorded yet, finished: its start handed on
/// again (to a launcher still waiting only), or — an attempt that restores first — recorded.
pub(crate) fn resume(run: &SandboxRun, claim: Claim, now: Timestamp) -> Plan {
    started(
        run,
        claim,
        true,
        Vec::new(),
        (Requeue::After(CLAIM_REQUEUE), now),
    )
}

/// The run starts cold, for `why`: the start and the miss are counted, then its status says
/// why (and a later reconcile creates its pod).
pub(crate) fn cold(pool: &str, why: &Cold) -> Plan {
    Plan {
        effects: counting(pool, why),
        ..Plan::wait(Requeue::After(CLAIM_REQUEUE))
    }
}

/// After the pod was claimed: its launcher is handed the run's start, or — an attempt that
/// restores its paths first — the pod is recorded the run's without it.
pub(crate) fn after_claim(
    run: &SandboxRun,
    claim: &Claim,
    rest: Vec<Effect>,
    (requeue, now): (Requeue, Timestamp),
) -> Plan {
    started(run, claim.clone(), false, rest, (requeue, now))
}

/// The claimed pod's start (`resumed`: the claim was made in an earlier reconcile): handed to
/// its launcher, or recorded at once when the restore stage hands it later.
fn started(
    run: &SandboxRun,
    claim: Claim,
    resumed: bool,
    rest: Vec<Effect>,
    (requeue, now): (Requeue, Timestamp),
) -> Plan {
    if !claim.hand_over {
        return recorded(run, &claim, rest, (requeue, now));
    }
    let mut effects = vec![Effect::HandPoolStart(Box::new(Delivery { claim, resumed }))];
    effects.extend(rest);
    Plan {
        effects,
        ..Plan::wait(requeue)
    }
}

/// After the launcher was handed the start (`result`): the run records the pod and its start.
/// A fresh claim whose launcher did not take it deletes the pod and starts cold; a resumed one
/// keeps its pod (the workload ran and ended, or the pod is going: its tracking says what
/// became of it).
pub(crate) fn after_delivery(
    run: &SandboxRun,
    (delivery, result): (&Delivery, &Result<(), NotDelivered>),
    rest: Vec<Effect>,
    (requeue, now): (Requeue, Timestamp),
) -> Plan {
    let claim = &delivery.claim;
    if let (Err(why), false) = (result, delivery.resumed) {
        let mut effects = vec![Effect::DeletePoolPod(claim.pod.clone())];
        effects.extend(counting(&claim.pool, &Cold::NotStarted(why.clone())));
        effects.extend(rest);
        return Plan {
            effects,
            ..Plan::wait(requeue)
        };
    }
    recorded(run, claim, rest, (requeue, now))
}

/// The run records the claimed pod (`status.warmStart.pod`, from then on the run's pod for its
/// attempt) and its start, and the warm start is counted.
fn recorded(
    run: &SandboxRun,
    claim: &Claim,
    rest: Vec<Effect>,
    (requeue, now): (Requeue, Timestamp),
) -> Plan {
    let mut status = run.status.clone().unwrap_or_default();
    status.warm_start = Some(WarmStart {
        pool: claim.pool.clone(),
        pod: Some(claim.pod.clone()),
        cold_reason: None,
        attempt: Some(crate::identity::current_attempt(run)),
    });
    // Its deadline counts from its own start, not the pool pod's (a retried attempt's, as a
    // cold one's, from the first start).
    status.start_time.get_or_insert(Time(now));
    let mut effects = vec![Effect::CountPoolStart(PoolStart::Warm)];
    effects.extend(rest);
    Plan {
        status: Some(status),
        effects,
        ..Plan::wait(requeue)
    }
}

/// After a miss was counted (or not): a pool that changed under the count is counted again, on
/// a fresh read, up to [`MISS_TRIES`] times; then the run's status says why it starts cold. The
/// count is best effort: the run starts cold all the same.
pub(crate) fn after_count(
    run: &SandboxRun,
    (miss, counted): (&Miss, MissCount),
    rest: Vec<Effect>,
    requeue: Requeue,
) -> Plan {
    if counted == MissCount::Changed && miss.tries < MISS_TRIES {
        let mut effects = vec![Effect::CountPoolMiss(Box::new(Miss {
            tries: miss.tries + 1,
            ..miss.clone()
        }))];
        effects.extend(rest);
        return Plan {
            effects,
            ..Plan::wait(requeue)
        };
    }
    let mut status = run.status.clone().unwrap_or_default();
    status.warm_start = Some(WarmStart {
        pool: miss.pool.clone(),
        pod: None,
        cold_reason: Some(miss.why.clone()),
        attempt: Some(crate::identity::current_attempt(run)),
    });
    Plan {
        status: Some(status),
        effects: rest,
        ..Plan::wait(requeue)
    }
}

/// The cold start counted: in the metric, then on the pool.
fn counting(pool: &str, why: &Cold) -> Vec<Effect> {
    vec![
        Effect::CountPoolStart(PoolStart::Cold),
        Effect::CountPoolMiss(Box::new(Miss {
            pool: pool.to_string(),
            why: why.to_string(),
            tries: 1,
        })),
    ]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::api::Phase;
    use crate::controller::run::plan::testing::*;
    use crate::controller::run::plan::{after, AfterInputs, Answer};
    use crate::controller::testkit::fixtures::*;
    use crate::inpod::launch::StartMessage;

    fn claim(hand_over: bool) -> Claim {
        Claim {
            pool: "agents".into(),
            pod: "agents-h-x1".into(),
            message: StartMessage {
                run: "u1".into(),
                argv: vec!["sh".into(), "-c".into(), "true".into()],
                env: vec![("TOKEN".into(), "s3cr3t".into())],
                refuse: None,
            },
            hand_over,
        }
    }

    fn delivery(resumed: bool) -> Delivery {
        Delivery {
            claim: claim(true),
            resumed,
        }
    }

    fn miss(tries: u8) -> Miss {
        Miss {
            pool: "agents".into(),
            why: Cold::NoReadyPod.to_string(),
            tries,
        }
    }

    fn inputs(run: &SandboxRun) -> AfterInputs<'_> {
        AfterInputs {
            run,
            pod_name: "demo-sbr",
            settle: Duration::from_secs(2),
            drain_timeout_seconds: 300,
            now: now(),
        }
    }

    fn soon() -> Requeue {
        Requeue::After(CLAIM_REQUEUE)
    }

    fn answered(run: &SandboxRun, answer: Answer) -> Plan {
        after(&answer, Vec::new(), soon(), &inputs(run))
    }

    fn warm_start(plan: &Plan) -> WarmStart {
        let status = plan.status.as_ref().expect("a status");
        status.warm_start.clone().expect("a warmStart")
    }

    fn handed(resumed: bool, result: Result<(), NotDelivered>) -> Answer {
        Answer::PoolStartHanded {
            delivery: Box::new(delivery(resumed)),
            result,
        }
    }

    #[test]
    fn a_claim_records_the_template_and_applies_the_runs_policies_before_the_patch() {
        let run = run_with(&[("/out", false)]);
        let policy = Effect::Publish(crate::controller::events::PlannedEvent::normal(
            "EgressPolicyApplied",
            "applied",
            "Egress",
        ));
        let patch = serde_json::json!({"metadata": {"resourceVersion": "5"}});
        let plan = take(
            claim(true),
            patch.clone(),
            (run.status.clone(), vec![policy.clone()]),
        );
        assert_eq!(plan.status, run.status);
        assert_eq!(
            plan.effects,
            vec![
                policy,
                Effect::ClaimPoolPod {
                    claim: Box::new(claim(true)),
                    patch: Box::new(patch)
                }
            ]
        );
        assert_eq!(plan.requeue, soon());
    }

    #[test]
    fn a_cold_start_counts_the_start_and_the_miss_before_the_status_says_why() {
        let plan = cold("agents", &Cold::NoReadyPod);
        assert_eq!(plan.status, None, "the miss is counted first");
        assert_eq!(
            plan.effects,
            vec![
                Effect::CountPoolStart(PoolStart::Cold),
                Effect::CountPoolMiss(Box::new(miss(1)))
            ]
        );
        let run = run_with(&[("/out", false)]);
        let counted = answered(
            &run,
            Answer::MissCounted {
                miss: Box::new(miss(1)),
                counted: MissCount::Counted,
            },
        );
        let recorded = warm_start(&counted);
        assert_eq!(recorded.pool, "agents");
        assert_eq!(recorded.pod, None);
        assert_eq!(
            recorded.cold_reason.as_deref(),
            Some("the pool had no ready pod")
        );
        assert_eq!(recorded.attempt, Some(1));
        assert!(counted.effects.is_empty(), "{counted:?}");
        assert_eq!(counted.requeue, soon());
    }

    #[test]
    fn a_miss_on_a_pool_that_keeps_changing_is_counted_three_times_then_the_cold_start_is_recorded()
    {
        let run = run_with(&[("/out", false)]);
        let changed = |tries| Answer::MissCounted {
            miss: Box::new(miss(tries)),
            counted: MissCount::Changed,
        };
        for tries in 1..MISS_TRIES {
            let plan = answered(&run, changed(tries));
            assert_eq!(plan.status, None);
            assert_eq!(
                plan.effects,
                vec![Effect::CountPoolMiss(Box::new(miss(tries + 1)))]
            );
        }
        let given_up = answered(&run, changed(MISS_TRIES));
        assert!(given_up.effects.is_empty(), "{given_up:?}");
        assert!(warm_start(&given_up).cold_reason.is_some());
        // A count that failed is not tried again: the run starts cold all the same.
        let failed = answered(
            &run,
            Answer::MissCounted {
                miss: Box::new(miss(1)),
                counted: MissCount::Failed,
            },
        );
        assert_eq!(failed, given_up);
    }

    #[test]
    fn a_claimed_pod_is_handed_the_runs_start_and_a_resumed_claim_only_to_a_waiting_launcher() {
        let run = run_with(&[("/out", false)]);
        let plan = answered(&run, Answer::PoolPodClaimed(Box::new(claim(true))));
        assert_eq!(
            plan.effects,
            vec![Effect::HandPoolStart(Box::new(delivery(false)))]
        );
        assert_eq!(plan.status, None, "recorded once the launcher took it");
        let resumed = resume(&run, claim(true), now());
        assert_eq!(
            resumed.effects,
            vec![Effect::HandPoolStart(Box::new(delivery(true)))]
        );
        assert_eq!(resumed.requeue, soon());
    }

    /// Issue #54: an attempt that restores its paths takes the pod without its start: the pod is
    /// recorded the run's at once, and the restore stage hands the start once the restore
    /// answered (`plan::restore`); nothing is attached to.
    #[test]
    fn a_restoring_attempts_claim_records_the_pod_and_hands_no_start() {
        let run = run_with(&[("/out", false)]);
        for plan in [
            answered(&run, Answer::PoolPodClaimed(Box::new(claim(false)))),
            resume(&run, claim(false), now()),
        ] {
            assert_eq!(plan.effects, vec![Effect::CountPoolStart(PoolStart::Warm)]);
            let recorded = warm_start(&plan);
            assert_eq!(recorded.pod.as_deref(), Some("agents-h-x1"));
            assert_eq!(recorded.cold_reason, None);
        }
    }

    #[test]
    fn a_pod_another_run_took_first_is_left_and_the_run_picks_again_soon() {
        let run = run_with(&[("/out", false)]);
        let plan = answered(&run, Answer::PoolPodTaken);
        assert_eq!(line(&plan), "[] | - | [] | 100ms");
    }

    #[test]
    fn a_delivered_start_records_the_pod_and_the_start_from_the_reconciles_now() {
        let run = with_phase(run_with(&[("/out", false)]), Phase::Pending);
        let plan = answered(&run, handed(false, Ok(())));
        let recorded = warm_start(&plan);
        assert_eq!(recorded.pod.as_deref(), Some("agents-h-x1"));
        assert_eq!(recorded.cold_reason, None);
        assert_eq!(recorded.attempt, Some(1));
        let status = plan.status.as_ref().unwrap();
        assert_eq!(status.start_time.as_ref().map(|t| t.0), Some(now()));
        assert_eq!(status.phase, Some(Phase::Pending), "the rest is kept");
        assert_eq!(plan.effects, vec![Effect::CountPoolStart(PoolStart::Warm)]);
        // A retried attempt's deadline counts from the first start.
        let mut retried = run.clone();
        retried.status.as_mut().unwrap().start_time = Some(Time(later(-60)));
        let plan = answered(&retried, handed(false, Ok(())));
        let start = plan.status.unwrap().start_time.map(|t| t.0);
        assert_eq!(start, Some(later(-60)));
    }

    #[test]
    fn a_fresh_claim_the_launcher_refused_deletes_the_pod_then_starts_cold_saying_why() {
        let run = run_with(&[("/out", false)]);
        let refused = || Err(NotDelivered("attach to the parked workload: gone".into()));
        let plan = answered(&run, handed(false, refused()));
        let why =
            "the pool pod's launcher did not start the run: attach to the parked workload: gone";
        assert_eq!(plan.status, None, "the miss is counted first");
        assert_eq!(
            plan.effects,
            vec![
                Effect::DeletePoolPod("agents-h-x1".into()),
                Effect::CountPoolStart(PoolStart::Cold),
                Effect::CountPoolMiss(Box::new(Miss {
                    why: why.into(),
                    ..miss(1)
                }))
            ]
        );
        // A resumed claim keeps its pod whatever the launcher says: its tracking tells.
        let kept = answered(&run, handed(true, refused()));
        assert_eq!(warm_start(&kept).pod.as_deref(), Some("agents-h-x1"));
        assert!(!kept
            .effects
            .iter()
            .any(|e| matches!(e, Effect::DeletePoolPod(_))));
    }

    /// The effects left when an answer came are kept after its follow-up's own.
    #[test]
    fn a_claims_follow_ups_keep_the_effects_left_after_their_own() {
        let run = run_with(&[("/out", false)]);
        let rest = vec![Effect::ForgetCreateAttempts];
        let plan = after(&handed(false, Ok(())), rest.clone(), soon(), &inputs(&run));
        assert_eq!(
            plan.effects,
            vec![Effect::CountPoolStart(PoolStart::Warm), rest[0].clone()]
        );
        let plan = after(&Answer::PoolPodTaken, rest.clone(), soon(), &inputs(&run));
        assert_eq!(plan.effects, rest);
    }
}
