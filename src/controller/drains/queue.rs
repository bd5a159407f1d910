//! Who gets the next drain slot (docs/contract.md "Fair drain slots"). Pure: no clock, no I/O.
//!
//! Waiters are keyed by namespace and run. A free slot goes, in this order, to
//! 1. the *urgent* waiters (its pod is being deleted or evicted: its emptyDirs vanish when the
//!    grace period ends), the namespaces in turn among them too (issue #38 item 1: a namespace
//!    that deletes 20 of its runs at once cannot keep another's one urgent teardown behind
//!    them all), then
//! 2. the other waiters, the namespaces in turn (round robin, each namespace's waiters oldest
//!    first), so one namespace with 1,000 finishing runs cannot keep another's one run waiting
//!    behind them all,
//!
//! and never to a waiter whose run already holds `per_run_cap` slots (a run declaring 16 slow
//! paths cannot hold every path slot). The same queue orders the teardowns (one slot per run)
//! and the paths (`--max-path-drains-per-run` slots per run).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

/// One waiter's place in the queue (or its slot, once granted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Ticket(u64);

/// Who waits: the namespace the slots are shared across, and the run the per-run cap counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Waiter {
    /// The run's namespace.
    pub namespace: String,
    /// The run (its uid).
    pub run: String,
    /// Its pod is being deleted or evicted: served before every other waiter.
    pub urgent: bool,
}

impl Waiter {
    /// The run `id` waiting (`urgent`: its pod is being deleted or evicted).
    pub(crate) fn of(id: &crate::identity::RunId, urgent: bool) -> Waiter {
        Waiter {
            namespace: id.namespace.clone(),
            run: id.uid.clone(),
            urgent,
        }
    }
}

#[derive(Clone, Debug)]
struct Waiting {
    waiter: Waiter,
    since: Instant,
}

/// Where a waiter stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Position {
    /// Its place in the order of service if no other waiter arrives: 1 is next.
    pub place: usize,
    /// Every waiter.
    pub waiting: usize,
    /// When it came.
    pub since: Instant,
    /// It is served first.
    pub urgent: bool,
}

/// The fair queue of a pool of slots.
#[derive(Debug)]
pub(crate) struct FairQueue {
    capacity: usize,
    per_run_cap: usize,
    held: usize,
    /// Slots held by each run, and its namespace.
    held_by_run: HashMap<String, (String, usize)>,
    next: u64,
    /// When (in grants) each namespace with waiters or slots was last served.
    last_served: HashMap<String, u64>,
    grants: u64,
    waiting: BTreeMap<Ticket, Waiting>,
    /// Each namespace's waiters, oldest first.
    by_namespace: HashMap<String, VecDeque<Ticket>>,
}

impl FairQueue {
    /// A queue of `capacity` slots (at least 1), at most `per_run_cap` (at least 1) held by one run.
    pub(crate) fn new(capacity: usize, per_run_cap: usize) -> FairQueue {
        FairQueue {
            capacity: capacity.max(1),
            per_run_cap: per_run_cap.max(1),
            held: 0,
            held_by_run: HashMap::new(),
            next: 0,
            last_served: HashMap::new(),
            grants: 0,
            waiting: BTreeMap::new(),
            by_namespace: HashMap::new(),
        }
    }

    /// Queues `waiter`, come at `now`. Call [`FairQueue::grant`] next.
    pub(crate) fn enqueue(&mut self, waiter: Waiter, now: Instant) -> Ticket {
        let ticket = Ticket(self.next);
        self.next += 1;
        self.by_namespace
            .entry(waiter.namespace.clone())
            .or_default()
            .push_back(ticket);
        self.waiting.insert(ticket, Waiting { waiter, since: now });
        ticket
    }

    /// The waiters given a slot now, each with when it came, in the order served.
    pub(crate) fn grant(&mut self) -> Vec<(Ticket, Waiter, Instant)> {
        let mut granted = Vec::new();
        while self.held < self.capacity {
            let Some(ticket) = self.next_urgent().or_else(|| self.next_in_turn()) else {
                break;
            };
            let Some(waiting) = self.remove(ticket) else {
                break;
            };
            self.held += 1;
            self.grants += 1;
            let namespace = waiting.waiter.namespace.clone();
            self.last_served.insert(namespace.clone(), self.grants);
            self.held_by_run
                .entry(waiting.waiter.run.clone())
                .or_insert((namespace, 0))
                .1 += 1;
            granted.push((ticket, waiting.waiter, waiting.since));
        }
        granted
    }

    /// A slot held by `run` is free again. Call [`FairQueue::grant`] next.
    pub(crate) fn release(&mut self, run: &str) {
        let Some((namespace, count)) = self.held_by_run.get_mut(run) else {
            return;
        };
        *count -= 1;
        self.held = self.held.saturating_sub(1);
        if *count > 0 {
            return;
        }
        let namespace = namespace.clone();
        self.held_by_run.remove(run);
        self.forget_if_idle(&namespace);
    }

    /// A waiter that stopped waiting (its task was cancelled): true when it was still waiting.
    pub(crate) fn cancel(&mut self, ticket: Ticket) -> bool {
        self.remove(ticket).is_some()
    }

    /// Marks every waiter of `run` urgent (its pod began deleting while it waited).
    pub(crate) fn make_urgent(&mut self, run: &str) {
        for waiting in self.waiting.values_mut() {
            if waiting.waiter.run == run {
                waiting.waiter.urgent = true;
            }
        }
    }

    /// Waiters, by namespace.
    pub(crate) fn waiting_by_namespace(&self) -> BTreeMap<String, usize> {
        self.by_namespace
            .iter()
            .map(|(namespace, queue)| (namespace.clone(), queue.len()))
            .collect()
    }

    /// When the oldest waiter came.
    pub(crate) fn oldest_since(&self) -> Option<Instant> {
        self.waiting.values().map(|w| w.since).min()
    }

    /// Slots held.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// Where the first waiter of `run` stands (None: it does not wait). Counts, within its class
    /// (urgent or not; every urgent waiter is ahead of the others), the round robin's turns
    /// before it, each namespace giving at most as many as the run's own namespace has before it
    /// (the per-run cap aside).
    pub(crate) fn position(&self, run: &str) -> Option<Position> {
        let (ticket, waiting) = self.waiting.iter().find(|(_, w)| w.waiter.run == run)?;
        let urgent = waiting.waiter.urgent;
        let ahead = self.ahead_in_class(&waiting.waiter.namespace, *ticket, urgent)?;
        let urgent_before = if urgent {
            0
        } else {
            self.waiting.values().filter(|w| w.waiter.urgent).count()
        };
        Some(Position {
            place: urgent_before + ahead + 1,
            waiting: self.waiting.len(),
            since: waiting.since,
            urgent,
        })
    }

    /// The waiters of `ticket`'s class (`urgent` or not) served before it, `namespace` being its.
    fn ahead_in_class(&self, namespace: &String, ticket: Ticket, urgent: bool) -> Option<usize> {
        let own = self.by_namespace.get(namespace)?;
        let of_class = |t: &&Ticket| {
            self.waiting
                .get(t)
                .is_some_and(|w| w.waiter.urgent == urgent)
        };
        let rank = own
            .iter()
            .filter(of_class)
            .take_while(|t| **t != ticket)
            .count();
        let turn = self.turn(urgent);
        let own_turn = turn.iter().position(|ns| *ns == namespace).unwrap_or(0);
        let mut ahead = rank;
        for (index, other) in turn.iter().enumerate() {
            if *other == namespace {
                continue;
            }
            let theirs = self
                .by_namespace
                .get(*other)
                .map_or(0, |q| q.iter().filter(of_class).count());
            // A namespace before ours in the turn is served once more than ours before it.
            let turns = if index < own_turn { rank + 1 } else { rank };
            ahead += theirs.min(turns);
        }
        Some(ahead)
    }

    fn below_cap(&self, run: &str) -> bool {
        self.held_by_run.get(run).map_or(0, |(_, count)| *count) < self.per_run_cap
    }

    /// The namespaces with waiters of a class (`urgent` or not), the next to be served first:
    /// the least recently served (never served first; ties: the oldest waiter of the class
    /// first). One record of service for both classes: a namespace served urgently has had its
    /// turn.
    fn turn(&self, urgent: bool) -> Vec<&String> {
        let mut turn: Vec<(u64, Ticket, &String)> = self
            .by_namespace
            .iter()
            .filter_map(|(namespace, queue)| {
                let first = *queue.iter().find(|t| {
                    self.waiting
                        .get(t)
                        .is_some_and(|w| w.waiter.urgent == urgent)
                })?;
                let served = self.last_served.get(namespace).copied().unwrap_or(0);
                Some((served, first, namespace))
            })
            .collect();
        turn.sort();
        turn.into_iter()
            .map(|(_, _, namespace)| namespace)
            .collect()
    }

    /// Forgets when `namespace` was last served once it neither waits nor holds a slot.
    fn forget_if_idle(&mut self, namespace: &str) {
        let holds = self.held_by_run.values().any(|(ns, _)| ns == namespace);
        if !holds && !self.by_namespace.contains_key(namespace) {
            self.last_served.remove(namespace);
        }
    }

    /// The oldest urgent waiter below the cap of the first namespace in the urgent turn that
    /// has one.
    fn next_urgent(&self) -> Option<Ticket> {
        self.next_of_class(true)
    }

    /// The oldest waiter below the cap of the first namespace in turn that has one.
    fn next_in_turn(&self) -> Option<Ticket> {
        self.next_of_class(false)
    }

    /// The oldest waiter of a class (`urgent` or not) below the cap, of the first namespace in
    /// that class's turn that has one.
    fn next_of_class(&self, urgent: bool) -> Option<Ticket> {
        self.turn(urgent).into_iter().find_map(|namespace| {
            self.by_namespace.get(namespace)?.iter().copied().find(|t| {
                self.waiting
                    .get(t)
                    .is_some_and(|w| w.waiter.urgent == urgent && self.below_cap(&w.waiter.run))
            })
        })
    }

    fn remove(&mut self, ticket: Ticket) -> Option<Waiting> {
        let waiting = self.waiting.remove(&ticket)?;
        let namespace = &waiting.waiter.namespace;
        if let Some(queue) = self.by_namespace.get_mut(namespace) {
            queue.retain(|t| *t != ticket);
            if queue.is_empty() {
                let namespace = namespace.clone();
                self.by_namespace.remove(&namespace);
                self.forget_if_idle(&namespace);
            }
        }
        Some(waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(namespace: &str, run: &str) -> Waiter {
        Waiter {
            namespace: namespace.into(),
            run: run.into(),
            urgent: false,
        }
    }

    fn runs(granted: &[(Ticket, Waiter, Instant)]) -> Vec<String> {
        granted.iter().map(|(_, w, _)| w.run.clone()).collect()
    }

    #[test]
    fn one_namespace_with_a_thousand_waiters_does_not_starve_another_with_one() {
        let now = Instant::now();
        let mut queue = FairQueue::new(4, 1);
        for i in 0..1_000 {
            queue.enqueue(waiter("busy", &format!("busy-{i}")), now);
        }
        assert_eq!(
            runs(&queue.grant()),
            ["busy-0", "busy-1", "busy-2", "busy-3"]
        );
        queue.enqueue(waiter("quiet", "quiet-0"), now);
        assert_eq!(queue.position("quiet-0").map(|p| p.place), Some(1));
        queue.release("busy-0");
        assert_eq!(
            runs(&queue.grant()),
            ["quiet-0"],
            "the other namespace's teardown is served next, not after the 996 before it"
        );
        queue.release("busy-1");
        assert_eq!(runs(&queue.grant()), ["busy-4"]);
        assert_eq!(queue.waiting_by_namespace().get("busy"), Some(&995));
        assert_eq!(queue.waiting_by_namespace().get("quiet"), None);
    }

    #[test]
    fn namespaces_take_turns() {
        let now = Instant::now();
        let mut queue = FairQueue::new(6, 1);
        for i in 0..3 {
            queue.enqueue(waiter("a", &format!("a-{i}")), now);
        }
        for i in 0..3 {
            queue.enqueue(waiter("b", &format!("b-{i}")), now);
        }
        queue.enqueue(waiter("c", "c-0"), now);
        assert_eq!(queue.position("b-1").map(|p| p.place), Some(5));
        assert_eq!(queue.position("a-2").map(|p| p.place), Some(6));
        assert_eq!(
            runs(&queue.grant()),
            ["a-0", "b-0", "c-0", "a-1", "b-1", "a-2"]
        );
    }

    #[test]
    fn an_evicted_runs_teardown_jumps_the_queue() {
        let now = Instant::now();
        let mut queue = FairQueue::new(2, 1);
        for i in 0..10 {
            queue.enqueue(waiter("a", &format!("a-{i}")), now);
        }
        assert_eq!(runs(&queue.grant()), ["a-0", "a-1"]);
        queue.enqueue(waiter("b", "b-0"), now);
        let evicted = Waiter {
            urgent: true,
            ..waiter("a", "a-evicted")
        };
        queue.enqueue(evicted, now);
        assert_eq!(queue.position("a-evicted").map(|p| p.place), Some(1));
        queue.release("a-0");
        assert_eq!(runs(&queue.grant()), ["a-evicted"]);
        // One queued before its pod began deleting is promoted.
        queue.make_urgent("a-9");
        queue.release("a-1");
        assert_eq!(runs(&queue.grant()), ["a-9"]);
        queue.release("a-evicted");
        assert_eq!(runs(&queue.grant()), ["b-0"], "then the namespaces in turn");
    }

    #[test]
    fn urgent_teardowns_take_turns_across_namespaces() {
        let now = Instant::now();
        let urgent = |namespace: &str, run: &str| Waiter {
            urgent: true,
            ..waiter(namespace, run)
        };
        let mut queue = FairQueue::new(1, 1);
        // A deletes 20 of its runs with foreground cascade before B's one pod is deleted.
        for i in 0..20 {
            queue.enqueue(urgent("a", &format!("a-{i}")), now);
        }
        queue.enqueue(urgent("b", "b-0"), now);
        queue.enqueue(waiter("c", "c-0"), now);
        assert_eq!(queue.position("b-0").map(|p| p.place), Some(2));
        assert_eq!(queue.position("a-1").map(|p| p.place), Some(3));
        assert_eq!(queue.position("c-0").map(|p| p.place), Some(22));
        let mut served = Vec::new();
        for _ in 0..3 {
            let granted = runs(&queue.grant());
            served.extend(granted.iter().cloned());
            for run in granted {
                queue.release(&run);
            }
        }
        assert_eq!(
            served,
            ["a-0", "b-0", "a-1"],
            "B's urgent teardown is served within the first two slots, not after A's 20"
        );
    }

    #[test]
    fn the_per_run_cap_holds_and_frees_slots_for_other_runs() {
        let now = Instant::now();
        let mut queue = FairQueue::new(8, 4);
        for _ in 0..16 {
            queue.enqueue(waiter("a", "wide"), now);
        }
        let granted = queue.grant();
        assert_eq!(granted.len(), 4, "one run holds at most 4 slots");
        assert_eq!(queue.held(), 4);
        queue.enqueue(waiter("a", "narrow"), now);
        assert_eq!(runs(&queue.grant()), ["narrow"]);
        queue.release("wide");
        assert_eq!(
            runs(&queue.grant()),
            ["wide"],
            "back to the cap, not beyond"
        );
        assert!(queue.grant().is_empty());
        // Urgent waiters are capped too.
        queue.make_urgent("wide");
        assert!(queue.grant().is_empty());
    }

    #[test]
    fn a_cancelled_waiter_leaves_the_queue_and_a_release_of_nothing_is_ignored() {
        let now = Instant::now();
        let mut queue = FairQueue::new(1, 1);
        let first = queue.enqueue(waiter("a", "a-0"), now);
        let second = queue.enqueue(waiter("b", "b-0"), now);
        assert_eq!(runs(&queue.grant()), ["a-0"]);
        assert!(!queue.cancel(first), "a granted ticket does not wait");
        assert!(queue.cancel(second));
        assert_eq!(queue.oldest_since(), None);
        queue.release("nobody");
        assert_eq!(queue.held(), 1);
        queue.release("a-0");
        assert_eq!(queue.held(), 0);
        assert!(queue.waiting_by_namespace().is_empty());
    }
}
