//! The pool the teardowns (the drains) run in, off the reconcile workers.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Teardowns (the drains) run as tasks of their own, at most `max` at once, so a slow or stuck
/// drain never holds a reconcile worker: the reconcile that starts one returns at once, and the
/// run is reconciled again when the drain's status writes (or the requeue below) wake it. A run
/// whose drain is in flight is not started twice: its reconciles wait for the drain to end.
pub(crate) struct DrainPool {
    permits: Arc<Semaphore>,
    in_flight: Arc<Mutex<HashSet<String>>>,
    tasks: TaskTracker,
}

impl DrainPool {
    /// A pool of `max` concurrent drains (at least 1).
    pub(crate) fn new(max: usize) -> DrainPool {
        DrainPool {
            permits: Arc::new(Semaphore::new(max.max(1))),
            in_flight: Arc::new(Mutex::new(HashSet::new())),
            tasks: TaskTracker::new(),
        }
    }

    /// Whether the run with this uid has a drain in flight.
    pub(crate) fn is_in_flight(&self, uid: &str) -> bool {
        self.in_flight
            .lock()
            .map(|set| set.contains(uid))
            .unwrap_or(false)
    }

    /// Marks the run as draining; false when it already was.
    fn claim(&self, uid: &str) -> bool {
        self.in_flight
            .lock()
            .map(|mut set| set.insert(uid.to_string()))
            .unwrap_or(false)
    }

    #[cfg(test)]
    fn release(&self, uid: &str) {
        release(&self.in_flight, uid);
    }

    /// Runs the job `make` makes (the teardown of the run with this uid) in the pool, unless that
    /// run has one in flight: the task waits for a slot (or for `cancel`: then the job is never
    /// made), makes the job then, runs it, and frees the run for its next reconcile. What the job
    /// reads of the clock (the drain's deadline) starts when it has its slot. A waiting task
    /// holds only `make` (the job's future, large, is boxed when it starts), so thousands of
    /// queued teardowns cost little memory. False when one was in flight.
    pub(crate) fn start<Job>(
        &self,
        uid: String,
        cancel: CancellationToken,
        make: impl FnOnce() -> Job + Send + 'static,
    ) -> bool
    where
        Job: Future<Output = ()> + Send + 'static,
    {
        if !self.claim(&uid) {
            return false;
        }
        let permits = Arc::clone(&self.permits);
        let in_flight = Arc::clone(&self.in_flight);
        self.tasks.spawn(async move {
            let permit = tokio::select! {
                permit = permits.acquire_owned() => permit.ok(),
                () = cancel.cancelled() => None,
            };
            if let Some(_permit) = permit {
                Box::pin(make()).await;
            }
            release(&in_flight, &uid);
        });
        true
    }

    /// Drains in flight or waiting for a slot.
    pub(crate) fn len(&self) -> usize {
        self.in_flight.lock().map(|set| set.len()).unwrap_or(0)
    }

    /// Waits (at most `limit`) for the drain tasks to end: after a cancel they stop promptly.
    pub(crate) async fn wait(&self, limit: Duration) -> bool {
        self.tasks.close();
        tokio::time::timeout(limit, self.tasks.wait()).await.is_ok()
    }
}

fn release(in_flight: &Mutex<HashSet<String>>, uid: &str) {
    if let Ok(mut set) = in_flight.lock() {
        set.remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_run_is_drained_once_at_a_time_and_the_pool_waits_for_its_tasks() {
        let pool = DrainPool::new(2);
        assert!(pool.claim("uid-a"));
        assert!(
            !pool.claim("uid-a"),
            "a drain in flight is not started twice"
        );
        assert!(pool.claim("uid-b"));
        assert!(pool.is_in_flight("uid-a") && pool.is_in_flight("uid-b"));
        assert_eq!(pool.len(), 2);
        pool.release("uid-a");
        assert!(!pool.is_in_flight("uid-a"));
        assert!(pool.claim("uid-a"), "claimable again once ended");
        // Tasks beyond the pool's size wait for a permit; the pool waits for all of them.
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let done = Arc::new(AtomicUsize::new(0));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        for _ in 0..5 {
            let permits = Arc::clone(&pool.permits);
            let (done, running, most) = (done.clone(), running.clone(), most.clone());
            pool.tasks.spawn(async move {
                let _permit = permits.acquire_owned().await;
                let now = running.fetch_add(1, SeqCst) + 1;
                most.fetch_max(now, SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                running.fetch_sub(1, SeqCst);
                done.fetch_add(1, SeqCst);
            });
        }
        assert!(pool.wait(Duration::from_secs(10)).await);
        assert_eq!(done.load(SeqCst), 5);
        assert_eq!(
            most.load(SeqCst),
            2,
            "never more than the pool's size at once"
        );
    }

    #[tokio::test]
    async fn a_started_job_runs_once_per_run_and_frees_the_run_when_it_ends() {
        let pool = DrainPool::new(1);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let cancel = CancellationToken::new();
        assert!(
            pool.start("uid-a".into(), cancel.clone(), move || async move {
                let _ = rx.await;
            })
        );
        assert!(
            !pool.start("uid-a".into(), cancel.clone(), || async {}),
            "a teardown in flight is not started twice"
        );
        assert!(pool.is_in_flight("uid-a"));
        let _ = tx.send(());
        assert!(pool.wait(Duration::from_secs(10)).await);
        assert!(
            !pool.is_in_flight("uid-a"),
            "the run is free once its job ended"
        );
    }
}
