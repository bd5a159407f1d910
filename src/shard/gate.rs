//! The shards this replica owns, as the controller asks them (docs/contract.md "Shards"): a
//! reconcile or a teardown of a run enters its shard's gate and holds a [`ShardGuard`] while it
//! works; a shard being released admits no one new, cancels its teardowns still waiting for a
//! drain slot, and is idle once every guard is dropped: only then does the owner loop clear the
//! Lease's holder, so a run is never worked on by two replicas at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// One owned shard.
#[derive(Debug)]
struct Owned {
    /// Being released: admits no one new.
    releasing: bool,
    /// Guards alive (reconciles and teardowns in flight or queued).
    guards: usize,
    /// Cancelled on release: the shard's teardowns still waiting for a slot are never started.
    cancel: CancellationToken,
}

/// The shards this replica owns, and the work in flight in each.
#[derive(Debug)]
pub(crate) struct ShardGate {
    shards: u32,
    owned: Mutex<BTreeMap<u32, Owned>>,
    /// Bumped whenever a shard is acquired: the controller reconciles every run again then.
    acquired: watch::Sender<u64>,
    /// The shards owned and not being released: what the watches select.
    serving: watch::Sender<BTreeSet<u32>>,
    /// Set to the number of shards owned whenever it changes (`sandboxrun_shards_owned`).
    owned_gauge: Option<prometheus::IntGauge>,
}

/// A reconcile or a teardown at work on a run of `shard`; dropping it lets a release go on.
#[derive(Debug)]
pub(crate) struct ShardGuard {
    gate: Arc<ShardGate>,
    shard: u32,
    /// The shard's cancellation (a child of the controller's).
    pub cancel: CancellationToken,
}

impl ShardGate {
    /// A gate over `shards` shards (at least 1), owning none, counted by no gauge.
    #[cfg(test)]
    pub(crate) fn new(shards: u32) -> Arc<ShardGate> {
        Self::with_gauge(shards, None)
    }

    /// A gate like [`ShardGate::new`] that keeps `gauge` at the number of shards it owns.
    pub(crate) fn counted(shards: u32, gauge: prometheus::IntGauge) -> Arc<ShardGate> {
        gauge.set(0);
        Self::with_gauge(shards, Some(gauge))
    }

    fn with_gauge(shards: u32, owned_gauge: Option<prometheus::IntGauge>) -> Arc<ShardGate> {
        Arc::new(ShardGate {
            shards: shards.max(1),
            owned: Mutex::new(BTreeMap::new()),
            acquired: watch::channel(0).0,
            serving: watch::channel(BTreeSet::new()).0,
            owned_gauge,
        })
    }

    /// Brings the gauge to `owned`'s size.
    fn count(&self, owned: &BTreeMap<u32, Owned>) {
        if let Some(gauge) = &self.owned_gauge {
            gauge.set(i64::try_from(owned.len()).unwrap_or(i64::MAX));
        }
    }

    /// The number of shards.
    pub(crate) fn shards(&self) -> u32 {
        self.shards
    }

    /// The shard of `run` ([`super::shard_of_run`]); None without a uid.
    pub(crate) fn shard_of(&self, run: &crate::api::SandboxRun) -> Option<u32> {
        self.shard_of_meta(&run.metadata)
    }

    /// [`Self::shard_of`] from a run's metadata alone (all the labeller's watch holds).
    pub(crate) fn shard_of_meta(&self, meta: &kube::api::ObjectMeta) -> Option<u32> {
        let uid = meta.uid.as_deref()?;
        let empty = std::collections::BTreeMap::new();
        let labels = meta.labels.as_ref().unwrap_or(&empty);
        Some(super::shard_of_run(labels, uid, self.shards))
    }

    /// A guard on `shard` when this replica owns it and is not releasing it.
    pub(crate) fn enter(self: &Arc<Self>, shard: u32) -> Option<ShardGuard> {
        let mut owned = self.owned.lock().ok()?;
        let entry = owned.get_mut(&shard).filter(|o| !o.releasing)?;
        entry.guards += 1;
        Some(ShardGuard {
            gate: Arc::clone(self),
            shard,
            cancel: entry.cancel.clone(),
        })
    }

    /// Another guard on `shard` even while it is being released, for work started by a
    /// reconcile that holds one (its teardown): the release then waits for that work too.
    pub(crate) fn join(self: &Arc<Self>, shard: u32) -> Option<ShardGuard> {
        let mut owned = self.owned.lock().ok()?;
        let entry = owned.get_mut(&shard)?;
        entry.guards += 1;
        Some(ShardGuard {
            gate: Arc::clone(self),
            shard,
            cancel: entry.cancel.clone(),
        })
    }

    /// Records `shard` as owned (its Lease was just acquired); `parent` is the controller's
    /// cancellation, which cancels every shard's too.
    pub(crate) fn own(&self, shard: u32, parent: &CancellationToken) {
        if let Ok(mut owned) = self.owned.lock() {
            owned.insert(
                shard,
                Owned {
                    releasing: false,
                    guards: 0,
                    cancel: parent.child_token(),
                },
            );
            self.count(&owned);
        }
        self.serving.send_modify(|set| {
            set.insert(shard);
        });
        self.acquired.send_modify(|n| *n += 1);
    }

    /// Starts releasing `shard`: no new reconcile or teardown enters, the queued teardowns are
    /// cancelled; [`ShardGate::is_idle`] tells when the Lease may be released.
    pub(crate) fn start_release(&self, shard: u32) {
        if let Ok(mut owned) = self.owned.lock() {
            if let Some(o) = owned.get_mut(&shard) {
                o.releasing = true;
                o.cancel.cancel();
            }
        }
        self.serving.send_if_modified(|set| set.remove(&shard));
    }

    /// Whether `shard` is being released and nothing works in it any more.
    pub(crate) fn is_idle(&self, shard: u32) -> bool {
        self.owned
            .lock()
            .map(|owned| {
                owned
                    .get(&shard)
                    .is_some_and(|o| o.releasing && o.guards == 0)
            })
            .unwrap_or(false)
    }

    /// Forgets `shard` (its Lease's holder was cleared, or the Lease was lost).
    pub(crate) fn forget(&self, shard: u32) {
        if let Ok(mut owned) = self.owned.lock() {
            owned.remove(&shard);
            self.count(&owned);
        }
        self.serving.send_if_modified(|set| set.remove(&shard));
    }

    /// The shards owned (releasing ones included) and whether each is being released.
    pub(crate) fn owned(&self) -> BTreeMap<u32, bool> {
        self.owned
            .lock()
            .map(|owned| owned.iter().map(|(k, o)| (*k, o.releasing)).collect())
            .unwrap_or_default()
    }

    /// The shards owned and not being released, as they change.
    pub(crate) fn serving(&self) -> watch::Receiver<BTreeSet<u32>> {
        self.serving.subscribe()
    }

    /// Changes whenever a shard is acquired.
    pub(crate) fn acquisitions(&self) -> watch::Receiver<u64> {
        self.acquired.subscribe()
    }

    fn leave(&self, shard: u32) {
        if let Ok(mut owned) = self.owned.lock() {
            if let Some(o) = owned.get_mut(&shard) {
                o.guards = o.guards.saturating_sub(1);
            }
        }
    }
}

impl Drop for ShardGuard {
    fn drop(&mut self) {
        self.gate.leave(self.shard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_waits_for_every_guard_and_admits_no_one_new() {
        let gate = ShardGate::new(4);
        let parent = CancellationToken::new();
        assert!(gate.enter(1).is_none(), "not owned");
        let acquisitions = gate.acquisitions();
        gate.own(1, &parent);
        assert!(acquisitions.has_changed().unwrap());
        let reconcile = gate.enter(1).expect("owned");
        let teardown = gate.join(1).expect("owned");
        gate.start_release(1);
        assert!(
            teardown.cancel.is_cancelled(),
            "queued teardowns are cancelled"
        );
        assert!(!parent.is_cancelled());
        assert!(gate.enter(1).is_none(), "releasing: no one new");
        assert!(gate.serving().borrow().is_empty(), "no longer watched");
        assert!(!gate.is_idle(1));
        drop(reconcile);
        assert!(!gate.is_idle(1), "the teardown it started still runs");
        drop(teardown);
        assert!(gate.is_idle(1));
        gate.forget(1);
        assert!(gate.owned().is_empty());
        assert!(!gate.is_idle(1));
    }

    #[test]
    fn the_shards_owned_gauge_follows_the_leases_held_releases_included() {
        let metrics = crate::metrics::Metrics::new().unwrap();
        metrics.shards_owned.set(99);
        let gate = ShardGate::counted(8, metrics.shards_owned.clone());
        assert_eq!(metrics.shards_owned.get(), 0, "a fresh replica owns none");
        let parent = CancellationToken::new();
        gate.own(2, &parent);
        gate.own(5, &parent);
        gate.own(5, &parent);
        assert_eq!(metrics.shards_owned.get(), 2);
        gate.start_release(2);
        assert_eq!(
            metrics.shards_owned.get(),
            2,
            "a shard being handed back still has its Lease held"
        );
        gate.forget(2);
        assert_eq!(metrics.shards_owned.get(), 1);
        gate.forget(7);
        assert_eq!(
            metrics.shards_owned.get(),
            1,
            "never owned: nothing changes"
        );
        assert!(metrics.render().contains("sandboxrun_shards_owned 1"));
    }

    #[test]
    fn the_controllers_cancellation_reaches_every_shard() {
        let gate = ShardGate::new(4);
        let parent = CancellationToken::new();
        gate.own(0, &parent);
        gate.own(3, &parent);
        let guard = gate.enter(3).unwrap();
        parent.cancel();
        assert!(guard.cancel.is_cancelled());
        assert_eq!(gate.owned(), BTreeMap::from([(0, false), (3, false)]));
        assert_eq!(*gate.serving().borrow(), BTreeSet::from([0, 3]));
    }
}
