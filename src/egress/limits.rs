//! Connection slots of the egress proxy (docs/operations.md "Egress proxy"): no run, and no
//! unauthenticated source, can take the proxy's connections from the others.
//!
//! - every connection takes a global slot when it is accepted (`max_connections`);
//! - until its request head names a run, it also counts against its source address
//!   (`max_pending_per_source`): unauthenticated heads come before a run is known;
//! - once its token is accepted, it counts against that run instead (`max_per_run`) and against
//!   the run's namespace (`max_per_namespace`): a tenant's runs together cannot fill the proxy
//!   (docs/contract.md "ADR-006 network rules: validated and enforced").
//!
//! The decisions ([`admit_accept`], [`admit_run`]) are pure; [`Slots`] keeps the counts and hands
//! out [`Slot`]s that give their place back when dropped.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus::IntGauge;

/// The bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, all runs together.
    pub max_connections: usize,
    /// Connections of one run open at once (after its token is accepted).
    pub max_per_run: usize,
    /// Connections from one source address whose request head has not named a run yet.
    pub max_pending_per_source: usize,
    /// Connections of all the runs of one namespace open at once (after their tokens are
    /// accepted).
    pub max_per_namespace: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 4096,
            max_per_run: 512,
            max_pending_per_source: 256,
            max_per_namespace: 1024,
        }
    }
}

/// Why a connection is refused a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitRefusal {
    /// The proxy holds `max_connections`.
    Global,
    /// The source has `max_pending_per_source` heads unread.
    Source,
    /// The run holds `max_per_run`.
    Run,
    /// The run's namespace holds `max_per_namespace`.
    Namespace,
}

impl LimitRefusal {
    /// The `reason` label of `sandboxrun_egress_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            LimitRefusal::Global => "global_limit",
            LimitRefusal::Source => "source_limit",
            LimitRefusal::Run => "run_limit",
            LimitRefusal::Namespace => "namespace_limit",
        }
    }
}

/// Whether a new connection gets a slot, given the connections open (`open`) and those of its
/// source still unauthenticated (`pending_from_source`).
pub fn admit_accept(
    limits: &Limits,
    open: usize,
    pending_from_source: usize,
) -> Result<(), LimitRefusal> {
    if open >= limits.max_connections {
        Err(LimitRefusal::Global)
    } else if pending_from_source >= limits.max_pending_per_source {
        Err(LimitRefusal::Source)
    } else {
        Ok(())
    }
}

/// Whether an authenticated connection may count against its run, which holds `run_open`, and
/// its run's namespace, which holds `namespace_open`.
pub fn admit_run(
    limits: &Limits,
    run_open: usize,
    namespace_open: usize,
) -> Result<(), LimitRefusal> {
    if run_open >= limits.max_per_run {
        Err(LimitRefusal::Run)
    } else if namespace_open >= limits.max_per_namespace {
        Err(LimitRefusal::Namespace)
    } else {
        Ok(())
    }
}

#[derive(Default)]
struct Counts {
    open: usize,
    pending: HashMap<IpAddr, usize>,
    runs: HashMap<String, usize>,
    namespaces: HashMap<String, usize>,
}

/// Decrements `map[key]`, dropping the entry at zero (the maps hold only live keys).
fn release<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(key);
        }
    }
}

/// The counts, shared by every connection.
pub struct Slots {
    limits: Limits,
    counts: Mutex<Counts>,
    /// `sandboxrun_egress_connections`.
    gauge: IntGauge,
}

impl Slots {
    /// Slots under `limits`; `gauge` follows the connections open.
    pub fn new(limits: Limits, gauge: IntGauge) -> Arc<Slots> {
        Arc::new(Slots {
            limits,
            counts: Mutex::new(Counts::default()),
            gauge,
        })
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        // A panic while holding the lock cannot leave the counts half-written (each update is
        // one statement), so a poisoned lock is still good.
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a connection just accepted from `source`.
    pub fn accept(self: &Arc<Self>, source: IpAddr) -> Result<Slot, LimitRefusal> {
        let mut c = self.counts();
        let pending = c.pending.get(&source).copied().unwrap_or(0);
        admit_accept(&self.limits, c.open, pending)?;
        c.open += 1;
        *c.pending.entry(source).or_insert(0) += 1;
        self.gauge.set(c.open as i64);
        Ok(Slot {
            slots: Arc::clone(self),
            source,
            bound: None,
        })
    }

    /// Connections open.
    #[cfg(test)]
    pub fn open(&self) -> usize {
        self.counts().open
    }
}

/// One connection's place; given back when dropped.
pub struct Slot {
    slots: Arc<Slots>,
    source: IpAddr,
    /// The run and the namespace it counts against, once authenticated.
    bound: Option<Bound>,
}

/// What an authenticated connection counts against.
struct Bound {
    run: String,
    namespace: String,
}

impl Slot {
    /// Moves the connection from its source's unauthenticated count to its run's and its run's
    /// namespace's.
    pub fn bind(&mut self, run_uid: &str, namespace: &str) -> Result<(), LimitRefusal> {
        if self.bound.is_some() {
            return Ok(());
        }
        let mut c = self.slots.counts();
        let run_open = c.runs.get(run_uid).copied().unwrap_or(0);
        let namespace_open = c.namespaces.get(namespace).copied().unwrap_or(0);
        admit_run(&self.slots.limits, run_open, namespace_open)?;
        *c.runs.entry(run_uid.to_string()).or_insert(0) += 1;
        *c.namespaces.entry(namespace.to_string()).or_insert(0) += 1;
        release(&mut c.pending, &self.source);
        self.bound = Some(Bound {
            run: run_uid.to_string(),
            namespace: namespace.to_string(),
        });
        Ok(())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.slots.counts();
        match &self.bound {
            Some(b) => {
                release(&mut c.runs, &b.run);
                release(&mut c.namespaces, &b.namespace);
            }
            None => release(&mut c.pending, &self.source),
        }
        c.open = c.open.saturating_sub(1);
        self.slots.gauge.set(c.open as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_connections: 4,
        max_per_run: 2,
        max_pending_per_source: 2,
        max_per_namespace: 3,
    };

    fn gauge() -> IntGauge {
        IntGauge::new("g", "g").unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_decisions_refuse_at_each_bound() {
        assert_eq!(admit_accept(&LIMITS, 3, 1), Ok(()));
        assert_eq!(admit_accept(&LIMITS, 4, 0), Err(LimitRefusal::Global));
        assert_eq!(admit_accept(&LIMITS, 0, 2), Err(LimitRefusal::Source));
        assert_eq!(admit_run(&LIMITS, 1, 2), Ok(()));
        assert_eq!(admit_run(&LIMITS, 2, 0), Err(LimitRefusal::Run));
        assert_eq!(admit_run(&LIMITS, 0, 3), Err(LimitRefusal::Namespace));
        assert_eq!(
            admit_run(&LIMITS, 2, 3),
            Err(LimitRefusal::Run),
            "the run's own first"
        );
    }

    #[test]
    fn one_source_cannot_hold_more_than_its_unauthenticated_share() {
        let slots = Slots::new(LIMITS, gauge());
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let _a1 = slots.accept(a).map_err(|e| e.label());
        let a2 = slots.accept(a).map_err(|e| e.label());
        assert!(a2.is_ok());
        assert_eq!(slots.accept(a).err(), Some(LimitRefusal::Source));
        assert!(slots.accept(b).is_ok(), "another source still gets a slot");
        drop(a2);
        assert!(
            slots.accept(a).is_ok(),
            "a closed head gives its place back"
        );
    }

    #[test]
    fn a_run_is_bounded_and_its_slots_come_back() {
        let slots = Slots::new(
            Limits {
                max_connections: 10,
                ..LIMITS
            },
            gauge(),
        );
        let src: IpAddr = [10, 0, 0, 1].into();
        let mut held = Vec::new();
        for _ in 0..2 {
            let Ok(mut s) = slots.accept(src) else {
                panic!("accept")
            };
            assert_eq!(s.bind("run-a", "ns"), Ok(()));
            held.push(s);
        }
        // Authenticated connections no longer count against the source.
        let Ok(mut third) = slots.accept(src) else {
            panic!("accept")
        };
        assert_eq!(third.bind("run-a", "ns"), Err(LimitRefusal::Run));
        assert_eq!(
            third.bind("run-b", "ns"),
            Ok(()),
            "another run has its own share"
        );
        assert_eq!(slots.open(), 3);
        held.clear();
        drop(third);
        assert_eq!(slots.open(), 0);
        let Ok(mut again) = slots.accept(src) else {
            panic!("accept")
        };
        assert_eq!(again.bind("run-a", "ns"), Ok(()));
    }

    #[test]
    fn the_global_bound_holds_across_sources() {
        let slots = Slots::new(
            Limits {
                max_pending_per_source: 100,
                ..LIMITS
            },
            gauge(),
        );
        let held: Vec<Slot> = (1..=4u8)
            .filter_map(|i| slots.accept([10, 0, 0, i].into()).ok())
            .collect();
        assert_eq!(held.len(), 4);
        assert_eq!(
            slots.accept([10, 0, 0, 9].into()).err(),
            Some(LimitRefusal::Global)
        );
    }

    #[test]
    fn one_namespace_cannot_hold_more_than_its_share_and_another_is_served() {
        let slots = Slots::new(
            Limits {
                max_connections: 10,
                max_per_run: 2,
                max_pending_per_source: 10,
                max_per_namespace: 3,
            },
            gauge(),
        );
        let src: IpAddr = [10, 0, 0, 1].into();
        let bound = |run: &str, ns: &str| {
            let Ok(mut s) = slots.accept(src) else {
                panic!("accept")
            };
            s.bind(run, ns).map(|()| s)
        };
        // Two runs of namespace a: 2 + 1, then a's share is full for either run and a third.
        let mut held = vec![
            bound("a1", "a").ok(),
            bound("a1", "a").ok(),
            bound("a2", "a").ok(),
        ];
        assert!(held.iter().all(Option::is_some));
        assert_eq!(bound("a2", "a").err(), Some(LimitRefusal::Namespace));
        assert_eq!(bound("a3", "a").err(), Some(LimitRefusal::Namespace));
        assert!(bound("b1", "b").is_ok(), "namespace b has its own share");
        held.extend([bound("b1", "b").ok()]);
        assert!(held.iter().all(Option::is_some));
        // A closed connection gives its namespace's place back.
        held.remove(0);
        assert!(bound("a3", "a").is_ok());
    }
}
