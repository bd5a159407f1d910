//! What a pool does next, decided from what it observes (pure; the controller acts on it).
//!
//! A pool keeps `replicas` unclaimed pods of its template's current hash. A claimed pod is the
//! run's: the pool never touches it and replaces it by making a new one. An unclaimed pod of an
//! older template hash is replaced (template changed → rollout); unclaimed pods beyond `replicas`
//! are deleted, the ones not yet ready first. Only a pod the pool sealed is the pool's
//! ([`super::seal`]): a look-alike carrying its labels is never counted, claimed or deleted; an
//! unsealed pod the pool controls past the grace (its creator stopped before sealing it) is
//! deleted.

use std::collections::HashSet;

/// What a pod carrying a pool's label is to that pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    /// The pool made it: it carries the pool's seal.
    Sealed,
    /// Unsealed, controlled by the pool and older than [`super::seal::SEAL_GRACE`]: made by the
    /// pool and left unsealed by a creator that stopped (or a look-alike naming the pool as its
    /// controller): never served, deleted.
    Orphan,
    /// Anyone's pod with the pool's labels: never counted, claimed or touched.
    Foreign,
}

/// One pod the pool owns (or owned, when a run has claimed it), as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolPod {
    pub name: String,
    /// The template hash the pod was built from (its label).
    pub template_hash: String,
    /// Whether a run has claimed it (it then belongs to the run).
    pub claimed: bool,
    /// Whether it is ready to be claimed: workload parked in the launcher, holder running.
    pub ready: bool,
    /// Whether its deletion has already been asked for.
    pub deleting: bool,
    /// Whether it carries the pool's seal ([`super::seal::Made::Sealed`]): only then is it the
    /// pool's.
    pub sealed: bool,
    /// Whether it is an unsealed pod the pool controls past the grace
    /// ([`super::seal::Made::Orphan`]): deleted.
    pub orphan: bool,
}

/// The pool's next actions and the counts its status reports.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolPlan {
    /// How many new pods to create from the current template.
    pub create: usize,
    /// The unclaimed pods to delete (outdated, then surplus), by name.
    pub delete: Vec<String>,
    /// What the look observed, before its deletes and creations ([`Rollout`]).
    pub rollout: Rollout,
}

/// The pool's unclaimed pods as a look observed them (sealed, not being deleted), in the
/// Deployment's words: the counts of its status (docs/contract.md "Warm pools"). Observed, not
/// planned: the outdated and surplus pods this look deletes are counted until their deletion is
/// seen, the pods it creates from the next look on, so `updated == ready == replicas ==
/// spec.replicas` holds only once the rollout is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rollout {
    /// Every version's (`status.replicas`, the scale subresource's).
    pub replicas: usize,
    /// The current version's (`status.updatedReplicas`).
    pub updated: usize,
    /// The current version's ready to be claimed (`status.readyReplicas`).
    pub ready: usize,
}

impl Rollout {
    /// The current version's not ready yet (`status.pendingReplicas`).
    pub fn pending(&self) -> usize {
        self.updated - self.ready
    }
}

/// Plans the pool from its desired replica count, its template's current hash and its pods.
pub fn plan(replicas: usize, current_hash: &str, pods: &[PoolPod]) -> PoolPlan {
    let live: Vec<&PoolPod> = pods
        .iter()
        .filter(|p| p.sealed && !p.claimed && !p.deleting)
        .collect();
    let (current, outdated): (Vec<&PoolPod>, Vec<&PoolPod>) = live
        .into_iter()
        .partition(|p| p.template_hash == current_hash);
    let orphans = pods.iter().filter(|p| p.orphan && !p.sealed && !p.deleting);
    let mut delete: Vec<String> = outdated
        .iter()
        .copied()
        .chain(orphans)
        .map(|p| p.name.clone())
        .collect();
    // Surplus: keep the ready ones; drop the not-ready ones first, then by name for stability.
    let mut keep = current.clone();
    keep.sort_by(|a, b| b.ready.cmp(&a.ready).then_with(|| a.name.cmp(&b.name)));
    let surplus = keep.split_off(keep.len().min(replicas));
    delete.extend(surplus.iter().map(|p| p.name.clone()));
    PoolPlan {
        create: replicas.saturating_sub(keep.len()),
        delete,
        rollout: Rollout {
            replicas: current.len() + outdated.len(),
            updated: current.len(),
            ready: current.iter().filter(|p| p.ready).count(),
        },
    }
}

/// The pod a claim by the run `key` (its uid) should take: a ready, unclaimed, sealed pod of the
/// current hash, not `reserved` by another run's claim in flight
/// ([`super::reservations::ClaimReservations`]): from the one `key` hashes to among them by name,
/// the first one in name order (wrapping) that nobody reserved, so runs claiming at once spread
/// over the pool instead of all aiming at one pod (the claim's precondition still decides a
/// collision, and the loser picks again). Every ready pod reserved: the one `key` hashes to (the
/// precondition decides).
pub fn pick_for_claim<'a>(
    current_hash: &str,
    pods: &'a [PoolPod],
    key: &str,
    reserved: &HashSet<String>,
) -> Option<&'a PoolPod> {
    let mut ready: Vec<&PoolPod> = pods
        .iter()
        .filter(|p| p.sealed && p.ready && !p.claimed && !p.deleting)
        .filter(|p| p.template_hash == current_hash)
        .collect();
    ready.sort_by(|a, b| a.name.cmp(&b.name));
    let spread = u32::from_str_radix(&crate::names::short_hash(key), 16).unwrap_or(0);
    let at = usize::try_from(spread).unwrap_or(0) % ready.len().max(1);
    (0..ready.len())
        .map(|i| ready[(at + i) % ready.len()])
        .find(|p| !reserved.contains(&p.name))
        .or_else(|| ready.get(at).copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, hash: &str, claimed: bool, ready: bool) -> PoolPod {
        PoolPod {
            name: name.into(),
            template_hash: hash.into(),
            claimed,
            ready,
            deleting: false,
            sealed: true,
            orphan: false,
        }
    }

    #[test]
    fn an_empty_pool_creates_its_replicas() {
        let p = plan(3, "h1", &[]);
        assert_eq!((p.create, p.delete.len()), (3, 0));
        assert_eq!(p.rollout, Rollout::default());
    }

    #[test]
    fn a_claimed_pod_is_replaced_and_never_deleted() {
        let pods = [pod("a", "h1", true, true), pod("b", "h1", false, true)];
        let p = plan(2, "h1", &pods);
        assert_eq!(p.create, 1);
        assert!(p.delete.is_empty());
        assert_eq!(p.rollout.ready, 1);
    }

    #[test]
    fn a_template_change_replaces_unclaimed_pods_and_leaves_claimed_ones() {
        let pods = [
            pod("a", "old", true, true),
            pod("b", "old", false, true),
            pod("c", "old", false, false),
        ];
        let p = plan(2, "new", &pods);
        assert_eq!(p.delete, vec!["b".to_string(), "c".to_string()]);
        assert_eq!(p.create, 2);
    }

    /// Issue #54 item 4: on the old code the status counted only the current version's pods, so
    /// `updatedReplicas` could not be told from `replicas` and a rollout never showed.
    #[test]
    fn a_rollout_counts_the_outdated_pods_until_their_deletion_is_seen_then_the_new_ones() {
        let old = [
            pod("a", "old", false, true),
            pod("b", "old", false, true),
            pod("x", "old", true, true),
        ];
        let seen = |replicas, updated, ready| Rollout {
            replicas,
            updated,
            ready,
        };
        // The look that sees the new version: two outdated unclaimed pods, none updated.
        let p = plan(2, "new", &old);
        assert_eq!((p.rollout, p.create), (seen(2, 0, 0), 2));
        // The next: the outdated ones are being deleted, the new ones pending.
        let mut next: Vec<PoolPod> = old
            .iter()
            .cloned()
            .map(|mut p| {
                p.deleting = !p.claimed;
                p
            })
            .collect();
        next.extend([
            pod("n1", "new", false, false),
            pod("n2", "new", false, false),
        ]);
        let p = plan(2, "new", &next);
        assert_eq!(
            (p.rollout, p.rollout.pending(), p.create),
            (seen(2, 2, 0), 2, 0)
        );
        // Then ready: done, updated == ready == replicas == spec.replicas.
        next.retain(|p| !p.deleting);
        next.iter_mut().for_each(|p| p.ready = true);
        assert_eq!(plan(2, "new", &next).rollout, seen(2, 2, 2));
    }

    #[test]
    fn scaling_down_deletes_pending_pods_before_ready_ones() {
        let pods = [
            pod("a", "h", false, true),
            pod("b", "h", false, false),
            pod("c", "h", false, true),
        ];
        let p = plan(2, "h", &pods);
        assert_eq!(p.delete, vec!["b".to_string()]);
        assert_eq!(p.create, 0);
        // Observed: the surplus pod is counted until its deletion is seen.
        let seen = Rollout {
            replicas: 3,
            updated: 3,
            ready: 2,
        };
        assert_eq!((p.rollout, p.rollout.pending()), (seen, 1));
    }

    #[test]
    fn a_pod_being_deleted_is_not_counted_so_it_is_replaced() {
        let mut gone = pod("a", "h", false, true);
        gone.deleting = true;
        let p = plan(1, "h", &[gone]);
        assert_eq!(p.create, 1);
        assert!(p.delete.is_empty());
    }

    #[test]
    fn a_claim_takes_only_a_ready_unclaimed_current_pod() {
        let pods = [
            pod("a", "h", true, true),
            pod("b", "old", false, true),
            pod("c", "h", false, false),
            pod("e", "h", false, true),
            pod("d", "h", false, true),
        ];
        // Only d and e qualify, whatever the run.
        for key in ["run-a", "run-b", "run-c"] {
            let picked = pick_for_claim("h", &pods, key, &HashSet::new()).map(|p| p.name.as_str());
            assert!(matches!(picked, Some("d" | "e")), "{key}: {picked:?}");
        }
        assert_eq!(
            pick_for_claim("h", &pods[..3], "run-a", &HashSet::new()),
            None
        );
        // Runs claiming at once spread over the ready pods.
        let many: Vec<PoolPod> = (0..8)
            .map(|i| pod(&format!("p{i}"), "h", false, true))
            .collect();
        let picked: std::collections::BTreeSet<&str> = (0..32)
            .filter_map(|i| pick_for_claim("h", &many, &format!("uid-{i}"), &HashSet::new()))
            .map(|p| p.name.as_str())
            .collect();
        assert!(picked.len() >= 4, "{picked:?}");
    }

    #[test]
    fn a_look_alike_with_the_pools_labels_is_never_counted_claimed_or_deleted() {
        let mut look_alike = pod("fake", "h", false, true);
        look_alike.sealed = false;
        let p = plan(1, "h", std::slice::from_ref(&look_alike));
        assert_eq!((p.create, p.rollout), (1, Rollout::default()));
        assert!(p.delete.is_empty(), "not the pool's to delete");
        assert_eq!(
            pick_for_claim("h", &[look_alike.clone()], "run-a", &HashSet::new()),
            None
        );
        // Beside a sealed pod, the claim still never lands on the look-alike.
        let pods = [look_alike.clone(), pod("real", "h", false, true)];
        for i in 0..16 {
            let picked = pick_for_claim("h", &pods, &format!("uid-{i}"), &HashSet::new());
            assert_eq!(picked.map(|p| p.name.as_str()), Some("real"));
        }
        // An unsealed pod the pool controls, past the grace: deleted, never served.
        let mut orphan = look_alike;
        orphan.orphan = true;
        let p = plan(1, "h", &[orphan]);
        assert_eq!((p.create, p.delete.clone()), (1, vec!["fake".to_string()]));
    }

    #[test]
    fn runs_claiming_at_once_each_pick_a_pod_no_other_run_reserved() {
        let pods: Vec<PoolPod> = (0..5)
            .map(|i| pod(&format!("p{i}"), "h", false, true))
            .collect();
        for burst in 0..50 {
            let mut reserved = HashSet::new();
            for run in 0..5 {
                let key = format!("uid-{burst}-{run}");
                let picked = pick_for_claim("h", &pods, &key, &reserved).map(|p| p.name.clone());
                let picked = picked.expect("a ready pod is left");
                assert!(
                    reserved.insert(picked),
                    "burst {burst}: a reserved pod was picked again"
                );
            }
        }
        let all: HashSet<String> = pods.iter().map(|p| p.name.clone()).collect();
        let fallback = pick_for_claim("h", &pods, "late", &all).map(|p| p.name.as_str());
        assert!(fallback.is_some(), "all reserved: the precondition decides");
    }
}
