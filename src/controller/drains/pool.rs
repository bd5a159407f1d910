//! The pool the teardowns (the drains) run in, off the reconcile workers, and the fair slots
//! both the teardowns and the paths wait in ([`FairSlots`], ordered by [`FairQueue`]).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use kube::runtime::reflector::ObjectRef;
use tokio::sync::{broadcast, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::queue::{FairQueue, Position, Ticket, Waiter};
use crate::api::SandboxRun;
use crate::metrics::DrainQueueMetrics;

/// How many drain ends may wait for the controllers to take them ([`DrainPool::ends`]); a
/// controller that falls further behind misses some, whose runs are looked at again after
/// [`crate::controller::run::plan::IN_FLIGHT_REQUEUE`].
const ENDS_BUFFER: usize = 1024;

/// Teardowns (the drains) run as tasks of their own, at most `max` at once, so a slow or stuck
/// drain never holds a reconcile worker: the reconcile that starts one returns at once, and the
/// run is reconciled again as the drain ends (its next step follows at once, docs/contract.md
/// "A run's next step follows its drain": [`DrainPool::ends`]). A run whose drain is in flight
/// is not started twice: its reconciles wait for the drain to end. The slots are handed out
/// fairly (docs/contract.md "Fair drain slots").
pub(crate) struct DrainPool {
    slots: FairSlots,
    /// The runs whose drain is in flight (by uid), each with the resourceVersion of the run as
    /// the last reconcile that found it draining saw it (None: none did yet).
    in_flight: Arc<Mutex<HashMap<String, Option<String>>>>,
    /// The runs to reconcile again because their drain ended ([`wakes_at_end`]).
    ends: broadcast::Sender<ObjectRef<SandboxRun>>,
    /// The runs whose wait was announced (the `DrainQueued` Event), until their drain ends.
    announced: Arc<Mutex<HashSet<String>>>,
    tasks: TaskTracker,
}

/// A teardown waiting for its slot, as the reconcile of its run sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Queued {
    /// Where it stands.
    pub position: Position,
    /// How long it has waited.
    pub waited: Duration,
    /// Its wait was announced already.
    pub announced: bool,
}

impl DrainPool {
    /// A pool of `max` concurrent drains (at least 1), its queue shown in `metrics`.
    pub(crate) fn new(max: usize, metrics: Option<DrainQueueMetrics>) -> DrainPool {
        DrainPool {
            slots: FairSlots::new(max, 1, metrics),
            in_flight: Arc::new(Mutex::new(HashMap::new())),
            ends: broadcast::channel(ENDS_BUFFER).0,
            announced: Arc::new(Mutex::new(HashSet::new())),
            tasks: TaskTracker::new(),
        }
    }

    /// Whether the run with this uid has a drain in flight.
    #[cfg(test)]
    pub(crate) fn is_in_flight(&self, uid: &str) -> bool {
        lock(&self.in_flight).contains_key(uid)
    }

    /// Whether the run with this uid has a drain in flight; if so, a reconcile found it so on
    /// the run at `seen` (its resourceVersion), and is owed again when the drain ends
    /// ([`wakes_at_end`]). Under the lock the drain's end takes: a drain that ends meanwhile
    /// either sees this reconcile, or frees the run before it is looked at (then the reconcile
    /// goes on: false).
    pub(crate) fn found_draining(&self, uid: &str, seen: Option<&str>) -> bool {
        match lock(&self.in_flight).get_mut(uid) {
            Some(woken_at) => {
                *woken_at = seen.map(str::to_string);
                true
            }
            None => false,
        }
    }

    /// The runs to reconcile again now because their drain ended ([`wakes_at_end`]), from now on.
    pub(crate) fn ends(&self) -> broadcast::Receiver<ObjectRef<SandboxRun>> {
        self.ends.subscribe()
    }

    /// Where the run's teardown stands in the queue (None: it does not wait).
    pub(crate) fn position(&self, uid: &str) -> Option<Position> {
        self.slots.position(uid)
    }

    /// The run's teardown, if it waits for a slot.
    pub(crate) fn queued(&self, uid: &str) -> Option<Queued> {
        let position = self.slots.position(uid)?;
        Some(Queued {
            position,
            waited: position.since.elapsed(),
            announced: lock(&self.announced).contains(uid),
        })
    }

    /// The run's wait was announced: not again until its next teardown.
    pub(crate) fn mark_announced(&self, uid: &str) {
        lock(&self.announced).insert(uid.to_string());
    }

    /// Serves the run's waiting teardown first: its pod began deleting while it waited.
    pub(crate) fn make_urgent(&self, uid: &str) {
        self.slots.make_urgent(uid);
    }

    /// Sets the queue's age gauge to now (the other gauges follow every change).
    pub(crate) fn refresh_metrics(&self) {
        lock(&self.slots.shared).publish();
    }

    /// Marks the run as draining; false when it already was.
    fn claim(&self, uid: &str) -> bool {
        match lock(&self.in_flight).entry(uid.to_string()) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(vacant) => {
                vacant.insert(None);
                true
            }
        }
    }

    #[cfg(test)]
    fn release(&self, uid: &str) {
        lock(&self.in_flight).remove(uid);
    }

    /// Runs the job `make` makes (the teardown of `waiter`'s run, by uid; `run` names it) in
    /// the pool, unless that run has one in flight: the task waits for a slot (or for `cancel`:
    /// then the job is never made), makes the job then, runs it, frees the run for its next
    /// reconcile, and — when a reconcile found it draining on a cache that shows the job's last
    /// write ([`wakes_at_end`]) — tells [`DrainPool::ends`] to reconcile it again now. The job
    /// answers the resourceVersion its run's last status write made (None: none known). What
    /// the job reads of the clock (the drain's deadline) starts when it has its slot. A waiting
    /// task holds only `make` (the job's future, large, is boxed when it starts), so thousands
    /// of queued teardowns cost little memory. The job is given its [`Slot`]: it gives it back
    /// by dropping it, as soon as its drains are done (a teardown's end — its final status, its
    /// Event, its pod's delete — needs no slot: docs/contract.md "Fair drain slots"), and at the
    /// latest when it ends. False when one was in flight.
    pub(crate) fn start<Job>(
        &self,
        waiter: Waiter,
        run: ObjectRef<SandboxRun>,
        cancel: CancellationToken,
        make: impl FnOnce(Slot) -> Job + Send + 'static,
    ) -> bool
    where
        Job: Future<Output = Option<String>> + Send + 'static,
    {
        let uid = waiter.run.clone();
        if !self.claim(&uid) {
            return false;
        }
        let acquire = self.slots.acquire(waiter, cancel);
        let in_flight = Arc::clone(&self.in_flight);
        let announced = Arc::clone(&self.announced);
        let ends = self.ends.clone();
        self.tasks.spawn(async move {
            let slot = acquire.await;
            release(&announced, &uid);
            let made = match slot {
                Some(slot) => Box::pin(make(slot)).await,
                None => None,
            };
            // Freed before it is woken: the reconcile the wake makes goes on.
            let woken_at = lock(&in_flight).remove(&uid).flatten();
            tracing::debug!(run = %uid, woken_at = ?woken_at, made = ?made, "the drain ended");
            if wakes_at_end(woken_at.as_deref(), made.as_deref()) {
                // No controller listening (shutting down): nothing to wake.
                let _ = ends.send(run);
            }
        });
        true
    }

    /// Drains in flight or waiting for a slot.
    pub(crate) fn len(&self) -> usize {
        lock(&self.in_flight).len()
    }

    /// Waits (at most `limit`) for the drain tasks to end: after a cancel they stop promptly.
    pub(crate) async fn wait(&self, limit: Duration) -> bool {
        self.tasks.close();
        tokio::time::timeout(limit, self.tasks.wait()).await.is_ok()
    }
}

fn release(set: &Mutex<HashSet<String>>, uid: &str) {
    lock(set).remove(uid);
}

/// Whether a run whose drain just ended is reconciled again at once (docs/contract.md "A run's
/// next step follows its drain"): when a reconcile found it draining — it only looked again
/// after [`crate::controller::run::plan::IN_FLIGHT_REQUEUE`] — on the run at `woken_at`, the very version the
/// drain's last status write `made`. That reconcile was most often woken by the watch event of
/// that write, which arrived before the drain was freed; replayed, it decides on a cache that
/// shows the drain's end. One woken on an older version is not replayed: the last write's event
/// is still to come, and it reconciles the run (a replay would decide on a run that does not
/// show its drain's end yet, and start the teardown again).
pub(crate) fn wakes_at_end(woken_at: Option<&str>, made: Option<&str>) -> bool {
    matches!((woken_at, made), (Some(seen), Some(made)) if seen == made)
}

/// The state behind a mutex stays consistent between statements: a panic elsewhere does not
/// make it unusable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Slots handed out by a [`FairQueue`]: the waiters' tasks are woken in its order.
pub(crate) struct FairSlots {
    shared: Arc<Mutex<Shared>>,
}

struct Shared {
    queue: FairQueue,
    wakers: HashMap<Ticket, oneshot::Sender<()>>,
    metrics: Option<DrainQueueMetrics>,
    /// The namespaces the waiting gauge has a series for.
    published: BTreeSet<String>,
}

impl Shared {
    /// Grants every slot it can, waking the waiters; a waiter gone meanwhile gives its slot back.
    fn dispatch(&mut self) {
        loop {
            let granted = self.queue.grant();
            if granted.is_empty() {
                break;
            }
            for (ticket, waiter, _) in granted {
                let woken = self
                    .wakers
                    .remove(&ticket)
                    .is_some_and(|waker| waker.send(()).is_ok());
                if !woken {
                    self.queue.release(&waiter.run);
                }
            }
        }
        self.publish();
    }

    /// The queue's gauges, as it is now.
    fn publish(&mut self) {
        let Some(metrics) = &self.metrics else {
            return;
        };
        let waiting = self.queue.waiting_by_namespace();
        for gone in self
            .published
            .iter()
            .filter(|ns| !waiting.contains_key(*ns))
        {
            let _ = metrics.waiting.remove_label_values(&[gone]);
        }
        for (namespace, count) in &waiting {
            metrics
                .waiting
                .with_label_values(&[namespace])
                .set(i64::try_from(*count).unwrap_or(i64::MAX));
        }
        self.published = waiting.into_keys().collect();
        let oldest = self
            .queue
            .oldest_since()
            .map_or(0.0, |since| since.elapsed().as_secs_f64());
        metrics.oldest_age.set(oldest);
    }
}

/// A slot held: given back when dropped.
pub(crate) struct Slot {
    shared: Arc<Mutex<Shared>>,
    run: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut shared = lock(&self.shared);
        shared.queue.release(&self.run);
        shared.dispatch();
    }
}

/// A waiter not yet given its slot. Dropped so (cancelled, or its task or stream dropped), it
/// leaves the queue, or gives back the slot granted meanwhile, so no slot is ever lost.
struct Pending {
    shared: Arc<Mutex<Shared>>,
    ticket: Ticket,
    run: String,
    /// None once the slot is held by a [`Slot`].
    woken: Option<oneshot::Receiver<()>>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(mut woken) = self.woken.take() else {
            return;
        };
        let mut state = lock(&self.shared);
        state.wakers.remove(&self.ticket);
        if !state.queue.cancel(self.ticket) && woken.try_recv().is_ok() {
            state.queue.release(&self.run);
        }
        state.dispatch();
    }
}

impl FairSlots {
    /// `capacity` slots (at least 1), at most `per_run_cap` (at least 1) held by one run.
    pub(crate) fn new(
        capacity: usize,
        per_run_cap: usize,
        metrics: Option<DrainQueueMetrics>,
    ) -> FairSlots {
        FairSlots {
            shared: Arc::new(Mutex::new(Shared {
                queue: FairQueue::new(capacity, per_run_cap),
                wakers: HashMap::new(),
                metrics,
                published: BTreeSet::new(),
            })),
        }
    }

    /// Queues `waiter` now, and waits for its slot (None: `cancel` came first). The wait is
    /// observed in the slot-wait histogram when the slots have metrics.
    pub(crate) fn acquire(
        &self,
        waiter: Waiter,
        cancel: CancellationToken,
    ) -> impl Future<Output = Option<Slot>> + Send + 'static {
        let shared = Arc::clone(&self.shared);
        let run = waiter.run.clone();
        let (waker, woken) = oneshot::channel();
        let came = Instant::now();
        let ticket = {
            let mut state = lock(&shared);
            let ticket = state.queue.enqueue(waiter, came);
            state.wakers.insert(ticket, waker);
            state.dispatch();
            ticket
        };
        let mut pending = Pending {
            shared,
            ticket,
            run,
            woken: Some(woken),
        };
        async move {
            let woken = pending.woken.as_mut()?;
            let granted = tokio::select! {
                biased;
                granted = woken => granted.is_ok(),
                () = cancel.cancelled() => false,
            };
            if !granted {
                return None;
            }
            pending.woken = None;
            let state = lock(&pending.shared);
            if let Some(metrics) = &state.metrics {
                metrics.slot_wait.observe(came.elapsed().as_secs_f64());
            }
            drop(state);
            Some(Slot {
                shared: Arc::clone(&pending.shared),
                run: std::mem::take(&mut pending.run),
            })
        }
    }

    /// Where the first waiter of `run` stands (None: it does not wait).
    pub(crate) fn position(&self, run: &str) -> Option<Position> {
        lock(&self.shared).queue.position(run)
    }

    /// Serves `run`'s waiters first.
    pub(crate) fn make_urgent(&self, run: &str) {
        let mut shared = lock(&self.shared);
        shared.queue.make_urgent(run);
        shared.dispatch();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    fn waiter(namespace: &str, run: &str) -> Waiter {
        Waiter {
            namespace: namespace.into(),
            run: run.into(),
            urgent: false,
        }
    }

    /// The run `name` (in `ns`), as a drain's end wakes it.
    fn named(name: &str) -> ObjectRef<SandboxRun> {
        ObjectRef::new(name).within("ns")
    }

    #[tokio::test]
    async fn a_run_is_drained_once_at_a_time_and_the_pool_waits_for_its_tasks() {
        let pool = DrainPool::new(2, None);
        assert!(pool.claim("uid-a"));
        assert!(
            !pool.claim("uid-a"),
            "a drain in flight is not started twice"
        );
        assert!(pool.claim("uid-b"));
        assert!(pool.is_in_flight("uid-a") && pool.is_in_flight("uid-b"));
        assert_eq!(pool.len(), 2);
        pool.release("uid-a");
        pool.release("uid-b");
        assert!(!pool.is_in_flight("uid-a"));
        assert!(pool.claim("uid-a"), "claimable again once ended");
        pool.release("uid-a");
        // Jobs beyond the pool's size wait for a slot; the pool waits for all of them.
        let done = Arc::new(AtomicUsize::new(0));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        for i in 0..5 {
            let (done, running, most) = (done.clone(), running.clone(), most.clone());
            let cancel = CancellationToken::new();
            assert!(pool.start(
                waiter("ns", &format!("run-{i}")),
                named(&format!("run-{i}")),
                cancel,
                move |slot| async move {
                    let _slot = slot;
                    let now = running.fetch_add(1, SeqCst) + 1;
                    most.fetch_max(now, SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    running.fetch_sub(1, SeqCst);
                    done.fetch_add(1, SeqCst);
                    None
                }
            ));
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
        let pool = DrainPool::new(1, None);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let cancel = CancellationToken::new();
        assert!(pool.start(
            waiter("ns", "uid-a"),
            named("a"),
            cancel.clone(),
            move |slot| async move {
                let _slot = slot;
                let _ = rx.await;
                None
            }
        ));
        assert!(
            !pool.start(
                waiter("ns", "uid-a"),
                named("a"),
                cancel.clone(),
                |_| async { None }
            ),
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

    /// docs/contract.md "Fair drain slots": a job that gave its slot back (its drains done)
    /// lets the next teardown start while it still writes its end; it stays in flight until
    /// it ends.
    #[tokio::test]
    async fn a_slot_given_back_starts_the_next_teardown_while_the_first_still_ends() {
        let pool = DrainPool::new(1, None);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (next_tx, next_rx) = tokio::sync::oneshot::channel::<()>();
        let cancel = CancellationToken::new();
        assert!(pool.start(
            waiter("ns", "uid-a"),
            named("a"),
            cancel.clone(),
            move |slot| async move {
                drop(slot);
                let _ = rx.await;
                None
            }
        ));
        assert!(pool.start(
            waiter("ns", "uid-b"),
            named("b"),
            cancel,
            move |slot| async move {
                let _slot = slot;
                let _ = next_tx.send(());
                None
            }
        ));
        let started = tokio::time::timeout(Duration::from_secs(5), next_rx).await;
        assert!(matches!(started, Ok(Ok(()))), "b waited for a's end");
        assert!(pool.is_in_flight("uid-a"), "a is in flight until it ends");
        let _ = tx.send(());
        assert!(pool.wait(Duration::from_secs(10)).await);
        assert!(!pool.is_in_flight("uid-a"));
    }

    /// docs/contract.md "A run's next step follows its drain", as the pool decides it: only a
    /// reconcile that found the run draining on the very version the drain's last write made is
    /// replayed as the drain ends.
    #[test]
    fn a_drains_end_wakes_its_run_only_when_a_reconcile_found_it_draining_on_its_last_write() {
        assert!(wakes_at_end(Some("8"), Some("8")));
        assert!(
            !wakes_at_end(Some("7"), Some("8")),
            "the last write is still to come"
        );
        assert!(
            !wakes_at_end(None, Some("8")),
            "no reconcile waits: its event comes"
        );
        assert!(
            !wakes_at_end(Some("8"), None),
            "nothing known of the drain's writes"
        );
        assert!(!wakes_at_end(None, None));
    }

    /// A reconcile that finds the run draining is remembered with the version it saw, and the
    /// drain's end wakes the run once it is free; one that comes after is not held back.
    #[tokio::test]
    async fn a_run_found_draining_is_woken_free_as_its_drain_ends() {
        let pool = Arc::new(DrainPool::new(1, None));
        let mut ends = pool.ends();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let cancel = CancellationToken::new();
        assert!(pool.start(
            waiter("ns", "uid-a"),
            named("a"),
            cancel,
            move |slot| async move {
                let _slot = slot;
                let _ = rx.await;
                Some("8".to_string())
            }
        ));
        assert!(pool.found_draining("uid-a", Some("8")));
        assert!(!pool.found_draining("uid-b", Some("8")), "not draining");
        let _ = tx.send(());
        let woken = tokio::time::timeout(Duration::from_secs(5), ends.recv()).await;
        assert!(
            matches!(woken, Ok(Ok(ref run)) if *run == named("a")),
            "{woken:?}"
        );
        assert!(!pool.is_in_flight("uid-a"));
        assert!(
            !pool.found_draining("uid-a", Some("8")),
            "free: the reconcile goes on"
        );
    }

    /// The pool serves its queue in the fair order: with the slot held, a second namespace's
    /// teardown starts before the first namespace's next, and an urgent one before both; the
    /// queue's gauges follow.
    #[tokio::test]
    async fn the_pool_starts_waiting_teardowns_in_the_fair_order() {
        let metrics = crate::metrics::Metrics::new().unwrap();
        let pool = DrainPool::new(1, Some(metrics.drain_queue.clone()));
        let order = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let cancel = CancellationToken::new();
        pool.start(
            waiter("a", "a-0"),
            named("a-0"),
            cancel.clone(),
            move |slot| async move {
                let _slot = slot;
                let _ = rx.await;
                None
            },
        );
        let runs = [("a", "a-1"), ("a", "a-2"), ("b", "b-0"), ("a", "a-evicted")];
        for (namespace, run) in runs {
            let order = Arc::clone(&order);
            let started = run.to_string();
            pool.start(
                waiter(namespace, run),
                named(run),
                cancel.clone(),
                move |slot| async move {
                    let _slot = slot;
                    lock(&order).push(started);
                    None
                },
            );
        }
        pool.make_urgent("a-evicted");
        assert_eq!(pool.position("a-evicted").map(|p| p.place), Some(1));
        assert_eq!(pool.position("b-0").map(|p| p.place), Some(2));
        assert_eq!(
            metrics.drain_queue.waiting.with_label_values(&["a"]).get(),
            3
        );
        let _ = tx.send(());
        assert!(pool.wait(Duration::from_secs(10)).await);
        assert_eq!(*lock(&order), ["a-evicted", "b-0", "a-1", "a-2"]);
        assert_eq!(metrics.drain_queue.slot_wait.get_sample_count(), 5);
        pool.refresh_metrics();
        assert_eq!(metrics.drain_queue.oldest_age.get(), 0.0);
        assert!(!metrics.render().contains("drain_queue_waiting{"));
    }

    /// A waiter dropped or cancelled (its stream dropped by a teardown that failed) never keeps
    /// a slot: the next waiter gets it.
    #[tokio::test]
    async fn a_dropped_or_cancelled_waiter_loses_no_slot() {
        let slots = FairSlots::new(1, 1, None);
        let cancel = CancellationToken::new();
        let held = slots.acquire(waiter("a", "a-0"), cancel.clone()).await;
        assert!(held.is_some());
        let dropped = slots.acquire(waiter("a", "a-1"), cancel.clone());
        let stop = CancellationToken::new();
        let cancelled = slots.acquire(waiter("b", "b-0"), stop.clone());
        stop.cancel();
        assert!(cancelled.await.is_none(), "cancelled before its turn");
        assert!(slots.position("b-0").is_none(), "and out of the queue");
        // Granted while nobody polls it, then dropped: the slot comes back.
        drop(held);
        drop(dropped);
        let last = slots.acquire(waiter("c", "c-0"), cancel.clone());
        let got = tokio::time::timeout(Duration::from_secs(5), last).await;
        assert!(matches!(got, Ok(Some(_))), "the slot was lost");
    }
}
