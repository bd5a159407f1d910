//! The fair share of the shards (pure, docs/contract.md "Shards"): given the live replicas and
//! who holds each shard now, which shards this replica takes and which it gives back.
//!
//! Every live replica's quota is ⌊N/R⌋ or ⌈N/R⌉; the ⌈⌉ quotas go to the replicas that hold the
//! most now (ties: the smaller identity), so a replica joining or leaving moves only the shards
//! it must. A replica over its quota gives back its highest shards; a replica under its quota
//! takes free shards (no holder, or an expired Lease), the lowest first from a start of its own,
//! so replicas taking at once seldom race for the same Lease (a race is settled by the Lease's
//! resourceVersion: one write wins, the other replica decides again on its next round).

use std::collections::{BTreeMap, BTreeSet};

/// What one replica sees of the shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct View<'a> {
    /// The number of shards.
    pub shards: u32,
    /// The identities of the live replicas (this one included).
    pub live: &'a BTreeSet<String>,
    /// Each shard's holder, for the shards whose Lease is held and not expired.
    pub holders: &'a BTreeMap<u32, String>,
}

/// What this replica should do with its Leases this round.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Decision {
    /// Free shards to take.
    pub acquire: Vec<u32>,
    /// Held shards to give back (after their work in flight ends).
    pub release: Vec<u32>,
}

/// Each live replica's quota: ⌊N/R⌋, and ⌈N/R⌉ for the N mod R replicas that hold the most
/// (ties: the smaller identity).
pub(crate) fn quotas(view: &View<'_>) -> BTreeMap<String, u32> {
    let replicas = u32::try_from(view.live.len()).unwrap_or(u32::MAX);
    if replicas == 0 {
        return BTreeMap::new();
    }
    let base = view.shards / replicas;
    let extra = view.shards % replicas;
    let mut ranked: Vec<(&String, u32)> =
        view.live.iter().map(|id| (id, held_by(view, id))).collect();
    ranked.sort_by(|(a, held_a), (b, held_b)| held_b.cmp(held_a).then_with(|| a.cmp(b)));
    ranked
        .into_iter()
        .enumerate()
        .map(|(rank, (id, _))| {
            let more = u32::try_from(rank).unwrap_or(u32::MAX) < extra;
            (id.clone(), base + u32::from(more))
        })
        .collect()
}

fn held_by(view: &View<'_>, id: &str) -> u32 {
    let held = view.holders.values().filter(|h| h.as_str() == id).count();
    u32::try_from(held).unwrap_or(u32::MAX)
}

/// What `me` should acquire and release (nothing when `me` is not among the live replicas: it
/// first has to be seen alive).
pub(crate) fn decide(view: &View<'_>, me: &str) -> Decision {
    let Some(&quota) = quotas(view).get(me) else {
        return Decision::default();
    };
    let mine: Vec<u32> = view
        .holders
        .iter()
        .filter(|(_, holder)| holder.as_str() == me)
        .map(|(&shard, _)| shard)
        .collect();
    let held = u32::try_from(mine.len()).unwrap_or(u32::MAX);
    if held > quota {
        let surplus = usize::try_from(held - quota).unwrap_or(usize::MAX);
        let release = mine.iter().rev().take(surplus).rev().copied().collect();
        return Decision {
            acquire: Vec::new(),
            release,
        };
    }
    let wanted = usize::try_from(quota - held).unwrap_or(usize::MAX);
    let start = start_of(me, view.shards);
    let acquire = (0..view.shards)
        .map(|i| (start + i) % view.shards.max(1))
        .filter(|shard| !view.holders.contains_key(shard))
        .take(wanted)
        .collect();
    Decision {
        acquire,
        release: Vec::new(),
    }
}

/// Where `me` starts looking for free shards: its identity's shard, so that replicas taking at
/// once start apart.
fn start_of(me: &str, shards: u32) -> u32 {
    super::shard_of(me, shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The replicas decide one after the other, each seeing the others' writes, until nobody
    /// moves (the Lease loop's rounds, minus the waiting); returns the holders and the number of
    /// shards that changed hands (a release then an acquire is one move).
    fn settle(shards: u32, live: &BTreeSet<String>, holders: &mut BTreeMap<u32, String>) -> usize {
        let mut moves = 0;
        for _round in 0..100 {
            let mut changed = false;
            for me in live {
                let d = decide(
                    &View {
                        shards,
                        live,
                        holders,
                    },
                    me,
                );
                for k in &d.release {
                    assert_eq!(holders.remove(k).as_deref(), Some(me.as_str()));
                    moves += 1;
                    changed = true;
                }
                for k in &d.acquire {
                    assert!(
                        holders.insert(*k, me.clone()).is_none(),
                        "shard {k} taken while held"
                    );
                    changed = true;
                }
            }
            if !changed {
                return moves;
            }
        }
        panic!("no fixed point: {holders:?}");
    }

    fn ids(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn counts(holders: &BTreeMap<u32, String>) -> BTreeMap<String, u32> {
        let mut counts = BTreeMap::new();
        for h in holders.values() {
            *counts.entry(h.clone()).or_default() += 1;
        }
        counts
    }

    fn assert_balanced(shards: u32, live: &BTreeSet<String>, holders: &BTreeMap<u32, String>) {
        assert_eq!(
            holders.len() as u32,
            shards,
            "every shard held: {holders:?}"
        );
        let counts = counts(holders);
        let r = live.len() as u32;
        for id in live {
            let c = counts.get(id).copied().unwrap_or(0);
            assert!(
                c == shards / r || c == shards.div_ceil(r),
                "{id} holds {c} of {shards} among {r}: {counts:?}"
            );
        }
        assert!(holders.values().all(|h| live.contains(h)));
    }

    #[test]
    fn one_replica_takes_every_shard_and_three_share_them_within_one() {
        let mut holders = BTreeMap::new();
        let one = ids(&["a"]);
        settle(32, &one, &mut holders);
        assert_balanced(32, &one, &holders);
        let three = ids(&["a", "b", "c"]);
        let moves = settle(32, &three, &mut holders);
        assert_balanced(32, &three, &holders);
        assert_eq!(moves, 21, "a holds 11, the others' 21 moved once each");
    }

    #[test]
    fn a_join_moves_the_fewest_shards_and_a_leave_only_the_leavers() {
        for (shards, before, after) in [(32u32, 3usize, 4usize), (32, 4, 5), (7, 2, 3), (64, 5, 6)]
        {
            let names: Vec<String> = (0..after).map(|i| format!("replica-{i}")).collect();
            let old: BTreeSet<String> = names[..before].iter().cloned().collect();
            let new: BTreeSet<String> = names.iter().cloned().collect();
            let mut holders = BTreeMap::new();
            settle(shards, &old, &mut holders);
            let moves = settle(shards, &new, &mut holders);
            assert_balanced(shards, &new, &holders);
            let joiner = names.last().unwrap();
            assert_eq!(
                moves as u32,
                counts(&holders)[joiner],
                "{shards}/{before}→{after}: only what the joiner ends with moved"
            );
            assert_eq!(
                moves as u32,
                shards / after as u32,
                "the joiner gets the floor"
            );
            // The joiner leaves: its shards are free (its Leases expired or released) and only
            // those move.
            let before_leave = holders.clone();
            holders.retain(|_, h| h != joiner);
            let freed = (shards as usize) - holders.len();
            settle(shards, &old, &mut holders);
            assert_balanced(shards, &old, &holders);
            let moved = holders
                .iter()
                .filter(|(k, h)| before_leave.get(k) != Some(h))
                .count();
            assert_eq!(moved, freed, "the survivors kept their own shards");
        }
    }

    #[test]
    fn a_held_shard_is_never_taken_and_an_unseen_replica_does_nothing() {
        let live = ids(&["a", "b"]);
        // c is not live (its heartbeat expired) but its shard Leases have not: they stay its.
        let mut holders: BTreeMap<u32, String> = (0..8).map(|k| (k, "c".to_string())).collect();
        let d = decide(
            &View {
                shards: 8,
                live: &live,
                holders: &holders,
            },
            "a",
        );
        assert!(d.acquire.is_empty() && d.release.is_empty(), "{d:?}");
        holders.retain(|k, _| *k < 4);
        let d = decide(
            &View {
                shards: 8,
                live: &live,
                holders: &holders,
            },
            "a",
        );
        assert!(d.acquire.iter().all(|k| *k >= 4), "{d:?}");
        assert_eq!(
            decide(
                &View {
                    shards: 8,
                    live: &live,
                    holders: &holders
                },
                "z"
            ),
            Decision::default(),
            "a replica not seen alive yet waits"
        );
    }

    #[test]
    fn decisions_are_deterministic_and_quotas_sum_to_the_shards() {
        let live = ids(&["a", "b", "c"]);
        let holders: BTreeMap<u32, String> = (0..32)
            .map(|k| (k, if k % 2 == 0 { "a" } else { "b" }.to_string()))
            .collect();
        let view = View {
            shards: 32,
            live: &live,
            holders: &holders,
        };
        assert_eq!(quotas(&view).values().sum::<u32>(), 32);
        assert_eq!(quotas(&view)["c"], 10, "the holder of none gets the floor");
        assert_eq!(decide(&view, "a"), decide(&view, "a"));
        assert_eq!(decide(&view, "a").release.len(), 5);
        assert_eq!(
            decide(&view, "c").acquire,
            Vec::<u32>::new(),
            "nothing free yet"
        );
    }
}
