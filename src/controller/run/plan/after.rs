//! The follow-up of an effect whose outcome is the world's answer ([`Answer`]): act stops at
//! such an effect and [`after`] plans what comes next, with the reconcile's one `now`.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use super::claim::{self, Claim, Delivery, Miss, MissCount, NotDelivered};
use super::create::{pod_created, pod_refused};
use super::finish::{purge_target, purged, Purge};
use super::model::{Effect, NotPurged, Plan, Requeue};
use crate::api::SandboxRun;
use crate::store::tenant_read::RunStore;

/// What the world answered an effect whose follow-up is planned by [`after`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Answer {
    /// The pod was created (as the apiserver returned it).
    PodCreated(Box<Pod>),
    /// A pod with its name already exists (409).
    PodExists,
    /// The apiserver refused the pod (quota, Pod Security, a webhook, RBAC: see
    /// [`refusals::is_refusal`]).
    PodRefused {
        /// The HTTP status.
        code: u16,
        /// The apiserver's words.
        message: String,
    },
    /// The store the run uses now, for the delete of its stored files (`retention: Delete`), or
    /// why it cannot be used ([`NotPurged::StoreUnusable`]).
    PurgeStore(Result<Box<RunStore>, NotPurged>),
    /// The current attempt's paths were restored from the files `from` was bound to (files,
    /// bytes), or not (why).
    Restored {
        /// Whose files: the run, its uid as read, the attempt.
        from: super::fork::Bound,
        /// What, or why not.
        result: super::restore::RestoreResult,
    },
    /// The live run already records this attempt's restore: the reconcile saw a copy older than
    /// this operator's own write of it (the watch cache lags), and nothing is restored again.
    RestoreAlreadyRecorded,
    /// The launcher was handed `record`'s start or refusal, or not (why).
    StartDelivered {
        /// The restore's record.
        record: Box<crate::api::RestoreStatus>,
        /// Handed, or why not.
        result: Result<(), super::restore::NotHanded>,
    },
    /// The pool pod was made the run's (the warm claim, [`super::claim`]).
    PoolPodClaimed(Box<Claim>),
    /// Another run took the pool pod first (409): the run picks again.
    PoolPodTaken,
    /// The claimed pool pod's launcher was handed the run's start, or not (why).
    PoolStartHanded {
        /// The start.
        delivery: Box<Delivery>,
        /// Taken, or why not.
        result: Result<(), NotDelivered>,
    },
    /// A miss was counted on the pool, or not.
    MissCounted {
        /// The miss.
        miss: Box<Miss>,
        /// What came of it.
        counted: MissCount,
    },
    /// The run's stored files under `location` were deleted (how many objects) or not (why).
    FilesPurged {
        /// The count, or why not.
        result: Result<usize, NotPurged>,
        /// Where (for the Event).
        location: String,
    },
}

impl Answer {
    /// The pod the follow-up's Events name as `related`: the one just created.
    pub(crate) fn created_pod(&self) -> Option<&Pod> {
        match self {
            Answer::PodCreated(pod) => Some(pod),
            _ => None,
        }
    }
}

/// What the follow-up of an [`Answer`] is planned from, besides the answer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AfterInputs<'a> {
    /// The run.
    pub run: &'a SandboxRun,
    /// The name of its pod.
    pub pod_name: &'a str,
    /// How long a passing state may last unreported ([`SETTLE`] by default).
    pub settle: Duration,
    /// The run's drain timeout: the bound of a failing delete of its stored files.
    pub drain_timeout_seconds: i64,
    /// The reconcile's `now`.
    pub now: Timestamp,
}

/// The plan that follows `answer`: `rest` are the effects of the plan that were left when the
/// answer came, `requeue` its requeue. A delete of the stored files that must be retried drops
/// `rest` (the finalizer stays) and looks again after the back-off.
pub(crate) fn after(
    answer: &Answer,
    rest: Vec<Effect>,
    requeue: Requeue,
    inputs: &AfterInputs<'_>,
) -> Plan {
    let (run, now) = (inputs.run, inputs.now);
    let mut plan = match answer {
        Answer::PodCreated(_) => pod_created(run, inputs.pod_name, true, inputs.settle, now),
        Answer::PodExists => pod_created(run, inputs.pod_name, false, inputs.settle, now),
        Answer::PodRefused { message, .. } => pod_refused(run, message, now),
        Answer::PurgeStore(store) => {
            return match purge_target(run, store.as_deref()) {
                Ok(target) => {
                    let mut effects = vec![Effect::DeleteStoredFiles(Box::new(target))];
                    effects.extend(rest);
                    Plan {
                        effects,
                        ..Plan::wait(requeue)
                    }
                }
                Err((result, location)) => {
                    after_purge(Err(result), &location, rest, requeue, inputs)
                }
            };
        }
        Answer::FilesPurged { result, location } => {
            return after_purge(result.clone(), location, rest, requeue, inputs)
        }
        Answer::Restored { from, result } => super::restore::restored(run, from, result),
        Answer::RestoreAlreadyRecorded => Plan::wait(Requeue::AwaitChange),
        Answer::StartDelivered { record, result } => {
            super::restore::delivered(run, record, result, now)
        }
        Answer::PoolPodClaimed(claim) => {
            return claim::after_claim(run, claim, rest, (requeue, now))
        }
        Answer::PoolPodTaken => {
            return Plan {
                effects: rest,
                ..Plan::wait(requeue)
            }
        }
        Answer::PoolStartHanded { delivery, result } => {
            return claim::after_delivery(run, (delivery, result), rest, (requeue, now))
        }
        Answer::MissCounted { miss, counted } => {
            return claim::after_count(run, (miss, *counted), rest, requeue)
        }
    };
    plan.effects.extend(rest);
    plan
}

/// The plan after a delete of the run's stored files under `location` ended with `result`: its
/// Event, then `rest` — or, for a delete that must be retried, only the Event and the back-off.
fn after_purge(
    result: Result<usize, NotPurged>,
    location: &str,
    rest: Vec<Effect>,
    requeue: Requeue,
    inputs: &AfterInputs<'_>,
) -> Plan {
    let bound = inputs.drain_timeout_seconds;
    match purged(inputs.run, result, location, bound, inputs.now) {
        (event, Purge::Done) => Plan {
            events: vec![event],
            status: None,
            effects: rest,
            requeue,
        },
        (event, Purge::RetryAfter(pause)) => Plan {
            events: vec![event],
            ..Plan::wait(Requeue::After(pause))
        },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::api::{Phase, ReadBackStatus};
    use crate::controller::run::plan::testing::*;
    use crate::controller::testkit::fixtures::*;

    fn store(url: &str) -> RunStore {
        RunStore {
            store: Arc::new(object_store::memory::InMemory::new()),
            prefix: object_store::path::Path::from("runs"),
            url: url.to_string(),
            tenant: None,
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

    fn answered(run: &SandboxRun, answer: Answer) -> String {
        let rest = vec![Effect::RemoveFinalizer];
        line(&after(&answer, rest, Requeue::AwaitChange, &inputs(run)))
    }

    /// A run whose status records its archive under `url`'s run directory.
    fn stored_in(url: &str) -> SandboxRun {
        let mut r = deleting(with_phase(run_with(&[("/out", false)]), Phase::Succeeded));
        if let Some(status) = r.status.as_mut() {
            status.read_back = vec![ReadBackStatus {
                path: "/out".into(),
                object: Some(format!("{url}/runs/ns/demo/u1/00-out.tar")),
                ..Default::default()
            }];
        }
        r
    }

    #[test]
    fn the_store_a_run_uses_is_deleted_under_its_own_directory_its_manifests_first() {
        let r = stored_in("s3://a");
        let plan = after(
            &Answer::PurgeStore(Ok(Box::new(store("s3://a")))),
            vec![Effect::RemoveFinalizer],
            Requeue::AwaitChange,
            &inputs(&r),
        );
        let Some(Effect::DeleteStoredFiles(target)) = plan.effects.first() else {
            panic!("{plan:?}");
        };
        assert_eq!(target.location, "s3://a/runs/ns/demo/u1/");
        assert_eq!(
            target.manifests,
            vec![crate::store::keys::manifest_key(
                &target.store.prefix,
                &target.run,
                0,
                "/out"
            )]
        );
        assert_eq!(
            line(&plan),
            "[] | - | [DeleteStoredFiles(s3://a/runs/ns/demo/u1/) RemoveFinalizer] | await"
        );
    }

    #[test]
    fn the_purge_names_the_run_directory_as_its_objects_urls_do_under_a_store_urls_prefix() {
        // The store at `s3://a/runs` keys its objects under `runs/`: the run's objects are
        // `s3://a/runs/ns/demo/u1/…`, and so is the directory the Event names (never
        // `s3://a/runs/runs/…`).
        let r = stored_in("s3://a");
        let plan = after(
            &Answer::PurgeStore(Ok(Box::new(store("s3://a/runs")))),
            vec![Effect::RemoveFinalizer],
            Requeue::AwaitChange,
            &inputs(&r),
        );
        let Some(Effect::DeleteStoredFiles(target)) = plan.effects.first() else {
            panic!("{plan:?}");
        };
        assert_eq!(target.location, "s3://a/runs/ns/demo/u1/");
    }

    #[test]
    fn a_run_without_its_namespace_or_uid_has_nothing_deleted_anywhere() {
        // An empty namespace or uid would name another directory than the run's own
        // (docs/contract.md "A write always names its object"): the delete is refused, retried.
        // Its status records no object yet (a drain that stored nothing): nothing else stops it.
        for field in ["namespace", "name", "uid"] {
            let mut r = deleting(with_phase(run_with(&[("/out", false)]), Phase::Succeeded));
            match field {
                "namespace" => r.metadata.namespace = None,
                "name" => r.metadata.name = Some(String::new()),
                _ => r.metadata.uid = None,
            }
            let plan = answered(&r, Answer::PurgeStore(Ok(Box::new(store("s3://a")))));
            assert_eq!(
                plan, "[!ArchiveDeleteFailed/Delete] | - | [] | 1s",
                "{field}"
            );
        }
    }

    #[test]
    fn nothing_is_deleted_in_a_store_the_run_did_not_store_its_files_in_nor_in_one_that_cannot_be_used(
    ) {
        let r = stored_in("s3://a");
        // Its namespace's store changed since its drain: the delete is refused, retried.
        let elsewhere = answered(&r, Answer::PurgeStore(Ok(Box::new(store("s3://b")))));
        assert_eq!(elsewhere, "[!ArchiveDeleteFailed/Delete] | - | [] | 1s");
        let unusable = answered(
            &r,
            Answer::PurgeStore(Err(NotPurged::StoreUnusable("no Secret".into()))),
        );
        assert_eq!(unusable, elsewhere);
        // Past the drain timeout: given up, the rest (the release) carried out.
        let mut inputs = inputs(&r);
        inputs.now = later(300);
        let plan = after(
            &Answer::PurgeStore(Ok(Box::new(store("s3://b")))),
            vec![Effect::RemoveFinalizer],
            Requeue::AwaitChange,
            &inputs,
        );
        assert!(
            plan.events[0]
                .note
                .contains("s3://a/runs/ns/demo/u1/00-out.tar"),
            "{plan:?}"
        );
        assert_eq!(plan.effects, vec![Effect::RemoveFinalizer]);
    }
}
