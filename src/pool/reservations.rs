//! The pool pods this replica is claiming right now (docs/contract.md "A warm pool's launcher is
//! the operator's code; a pool pod serves one run (issue #39)"): runs of one burst reconcile at
//! once, and without a record each would aim at the pod its uid hashes to, so two runs of five
//! shared a pod most of the time (five of five spread only 4 % of the time); the loser's patch
//! failed its precondition and it picked again a reconcile later. A run now reserves the pod it
//! is about to claim, and another run of this replica picks past it. The reservation only
//! spreads the picks: the claim's resourceVersion precondition still decides a race (another
//! replica, a reservation that expired), and a reservation lapses on its own after [`HOLD`], so
//! a reconcile that failed between reserving and claiming never keeps a pod from the pool.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use jiff::{SignedDuration, Timestamp};

/// How long a reservation holds once taken: longer than a claim's patch takes, shorter than a
/// pool pod stays ready unclaimed.
pub const HOLD: SignedDuration = SignedDuration::from_secs(5);

/// The pods (by `<namespace>/<name>`) reserved for a claim, each by one run (its uid), until a
/// time.
#[derive(Default)]
pub struct ClaimReservations {
    held: Mutex<HashMap<String, (String, Timestamp)>>,
}

impl ClaimReservations {
    /// The pods reserved by runs other than `run` at `now`.
    pub fn held_by_others(&self, run: &str, now: Timestamp) -> HashSet<String> {
        let Ok(held) = self.held.lock() else {
            return HashSet::new();
        };
        held.iter()
            .filter(|(_, (by, until))| by != run && *until > now)
            .map(|(pod, _)| pod.clone())
            .collect()
    }

    /// Whether `run` holds a reservation at `now`: this replica picked a pod for it within
    /// [`HOLD`] (a claim in flight, or just made: a successful claim keeps its reservation until
    /// it lapses).
    pub fn holds_any(&self, run: &str, now: Timestamp) -> bool {
        let Ok(held) = self.held.lock() else {
            return false;
        };
        held.values().any(|(by, until)| by == run && *until > now)
    }

    /// Reserves `pod` for `run` from `now` unless another run holds it: whether `run` has it.
    pub fn reserve(&self, pod: &str, run: &str, now: Timestamp) -> bool {
        let Ok(mut held) = self.held.lock() else {
            return true;
        };
        held.retain(|_, (_, until)| *until > now);
        match held.get(pod) {
            Some((by, _)) if by != run => false,
            _ => {
                let until = now.checked_add(HOLD).unwrap_or(now);
                held.insert(pod.to_string(), (run.to_string(), until));
                true
            }
        }
    }

    /// Gives `pod` back (the claim failed): `run`'s reservation only.
    pub fn release(&self, pod: &str, run: &str) {
        if let Ok(mut held) = self.held.lock() {
            if held.get(pod).is_some_and(|(by, _)| by == run) {
                held.remove(pod);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_holds_a_reservation_until_it_lapses_or_is_released_and_never_anothers() {
        let r = ClaimReservations::default();
        assert!(!r.holds_any("run-a", at(0)), "nothing reserved yet");
        assert!(r.reserve("ns/p1", "run-a", at(0)));
        assert!(r.holds_any("run-a", at(1)));
        assert!(!r.holds_any("run-b", at(1)), "run-a's, not run-b's");
        assert!(!r.holds_any("run-a", at(5)), "lapsed after HOLD");
        assert!(r.reserve("ns/p1", "run-a", at(6)));
        r.release("ns/p1", "run-a");
        assert!(!r.holds_any("run-a", at(6)), "given back");
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    #[test]
    fn a_pod_reserved_by_one_run_is_held_from_the_others_until_it_lapses_or_is_released() {
        let r = ClaimReservations::default();
        assert!(r.reserve("ns/p1", "run-a", at(0)));
        assert!(!r.reserve("ns/p1", "run-b", at(1)), "held by run-a");
        assert!(
            r.reserve("ns/p1", "run-a", at(1)),
            "run-a may take it again"
        );
        assert_eq!(
            r.held_by_others("run-b", at(1)),
            HashSet::from(["ns/p1".to_string()])
        );
        assert!(r.held_by_others("run-a", at(1)).is_empty());
        assert!(
            r.held_by_others("run-b", at(7)).is_empty(),
            "lapsed after HOLD"
        );
        assert!(r.reserve("ns/p1", "run-b", at(7)));
        r.release("ns/p1", "run-a");
        assert!(
            !r.reserve("ns/p1", "run-c", at(8)),
            "only its holder releases it"
        );
        r.release("ns/p1", "run-b");
        assert!(r.reserve("ns/p1", "run-c", at(8)));
    }
}
