//! Sharding (issue #28, docs/contract.md "Shards"): the runs map to a fixed number of shards by a
//! stable hash of their uid, each shard is owned by one replica through its own
//! `coordination.k8s.io` Lease, and a replica reconciles and drains only the runs of the shards
//! it owns.
//!
//! - this file: the shard of a run ([`shard_of`], the same on every replica and every version)
//!   and the names and labels of the Leases;
//! - [`assign`]: the fair share (pure): which shards a replica takes and which it gives back;
//! - [`sightings`]: when a Lease counts as expired, from this replica's own clock (pure);
//! - [`gate`]: the shards this replica owns, as the controller asks them (may this run be
//!   reconciled now?), and the reconciles and teardowns in flight per shard, which a release
//!   waits for;
//! - [`lease`]: the Lease reads and writes (the only I/O), guarded by resourceVersion;
//! - [`owner`]: the loop that ties them: observe the Leases, decide, write;
//! - [`watches`]: the label-selected watches of the owned shards' runs and pods, restarted when
//!   the owned set changes; [`label`]: the shard label written on runs that have none yet;
//! - [`drain_claim`]: one teardown of a run at a time across replicas, whatever its label says.

pub(crate) mod assign;
pub(crate) mod drain_claim;
pub(crate) mod gate;
pub(crate) mod label;
pub(crate) mod lease;
pub(crate) mod owner;
pub(crate) mod sightings;
pub(crate) mod watches;

/// The label on the shard Leases and the replicas' heartbeat Leases, valued with the operator's
/// `--lease-name` (the group: replicas of one operator share it).
pub const LEASE_GROUP_LABEL: &str = "sandbox.iterion.io/shard-group";

/// The label telling a shard Lease (`shard`) from a replica's heartbeat Lease (`replica`).
pub const LEASE_KIND_LABEL: &str = "sandbox.iterion.io/lease-kind";

/// The label on the runs (written once by the owner of their shard, [`label`]) and on the pods
/// this operator creates: the shard of the run (never changes: it is a function of the run's
/// uid). The sharded watches select on it.
pub const SHARD_LABEL: &str = "sandbox.iterion.io/shard";

/// The default number of shards (`run --shards`).
pub const DEFAULT_SHARDS: u32 = 32;

/// The shard of the run with this uid among `shards` (at least 1): FNV-1a (64 bits) of the uid,
/// modulo `shards`. A fixed hash, not std's `DefaultHasher`, so every replica and every
/// version of the operator computes the same shard (docs/contract.md "Shards").
pub fn shard_of(uid: &str, shards: u32) -> u32 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = uid
        .bytes()
        .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
    let shards = u64::from(shards.max(1));
    // The remainder is below `shards`, a u32.
    u32::try_from(hash % shards).unwrap_or(0)
}

/// The shard of a run: its [`SHARD_LABEL`] when it is canonical ([`canonical_label`]: written
/// once, it stays the run's shard even if `--shards` grows later), else [`shard_of`] its uid.
pub fn shard_of_run(
    labels: &std::collections::BTreeMap<String, String>,
    uid: &str,
    shards: u32,
) -> u32 {
    labels
        .get(SHARD_LABEL)
        .and_then(|v| canonical_label(v, shards))
        .unwrap_or_else(|| shard_of(uid, shards))
}

/// The shard a label value names when it is canonical: the decimal of a shard below `shards`,
/// as the operator writes it (`11`, never `011`, `+11` or ` 11`). The watches select on the
/// label as text and a tenant may write its runs' labels (issue #38): a run relabelled `011`
/// was watched by no replica — past its deadline, its deletion held by the finalizer. A value
/// that is not canonical is the uid's shard's, and the labeller writes that back.
pub fn canonical_label(value: &str, shards: u32) -> Option<u32> {
    value
        .parse::<u32>()
        .ok()
        .filter(|k| *k < shards.max(1) && k.to_string() == value)
}

/// The label selector of the runs whose shard label is missing or not canonical: every value
/// but the canonical ones (`notin` also selects the runs without the label).
pub fn uncanonical_selector(shards: u32) -> String {
    let all: Vec<String> = (0..shards.max(1)).map(|k| k.to_string()).collect();
    format!("{SHARD_LABEL} notin ({})", all.join(","))
}

/// Why an admission refuses what a request does to a run's [`SHARD_LABEL`] (docs/contract.md
/// "Shards"; issue #38), None when it may: the operator owns the label. `old`: the stored run's
/// value (None on CREATE, or when it had none); `new`: the request's; `shards`: the operator's
/// `--shards` when it is sharded. A CREATE may only name a canonical value; an UPDATE may keep
/// the value, or set the uid's own shard where the value was missing or not canonical (what the
/// labeller writes; without a shard count, any canonical value where there was none). Moving a
/// run to another shard (another replica's, mid-drain) or removing the label is refused.
pub fn label_change_refusal(
    old: Option<&str>,
    new: Option<&str>,
    uid: Option<&str>,
    shards: Option<u32>,
    create: bool,
) -> Option<String> {
    let canonical = |v: &str| match shards {
        Some(n) => canonical_label(v, n).is_some(),
        None => canonical_label(v, u32::MAX).is_some(),
    };
    let refusal = match (old, new) {
        (_, None) if create => return None,
        (Some(o), Some(n)) if o == n => return None,
        (_, Some(n)) if create => (!canonical(n)).then(|| format!("{n:?} is not a shard")),
        (Some(o), None) => Some(format!("it removes the label ({o:?})")),
        (old, Some(n)) => {
            let repairable = old.is_none_or(|o| !canonical(o));
            let own = match (shards, uid) {
                (Some(count), Some(uid)) => n == shard_of(uid, count).to_string(),
                _ => canonical(n),
            };
            (!(repairable && own)).then(|| format!("it moves the run to shard {n:?}"))
        }
        (None, None) => None,
    };
    refusal.map(|why| {
        format!("{SHARD_LABEL} is written by the operator only (its replicas watch the runs of their shards by it): {why}")
    })
}

/// The name of shard `k`'s Lease: `<group>-shard-<k>`.
pub fn shard_lease_name(group: &str, shard: u32) -> String {
    format!("{group}-shard-{shard}")
}

/// The shard a Lease named by [`shard_lease_name`] stands for.
pub fn shard_of_lease_name(group: &str, name: &str) -> Option<u32> {
    name.strip_prefix(group)?
        .strip_prefix("-shard-")?
        .parse()
        .ok()
}

/// The name of a replica's heartbeat Lease: `<group>-replica-<identity>`.
pub fn replica_lease_name(group: &str, identity: &str) -> String {
    format!("{group}-replica-{identity}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shard_of_a_uid_is_fixed_across_versions_and_spread() {
        // Pinned values: a change of hash would move every run to another replica mid-flight.
        assert_eq!(shard_of("", 32), (0xcbf2_9ce4_8422_2325u64 % 32) as u32);
        assert_eq!(
            shard_of("a", u32::MAX),
            (0xaf63_dc4c_8601_ec8cu64 % u64::from(u32::MAX)) as u32
        );
        assert_eq!(shard_of("anything", 1), 0);
        assert_eq!(shard_of("anything", 0), 0, "0 shards is read as 1");
        let mut counts = [0u32; 32];
        for i in 0..3200 {
            counts[shard_of(&format!("0b7c6a2e-{i:04}-4f6e-9d1a-5d2c3b4a5e6f"), 32) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (50..=150).contains(&c)),
            "uids spread over the shards: {counts:?}"
        );
    }

    #[test]
    fn a_runs_label_is_its_shard_once_written() {
        let uid = "0b7c6a2e-0001-4f6e-9d1a-5d2c3b4a5e6f";
        let none = std::collections::BTreeMap::new();
        assert_eq!(shard_of_run(&none, uid, 32), shard_of(uid, 32));
        let label =
            |v: &str| std::collections::BTreeMap::from([(SHARD_LABEL.to_string(), v.to_string())]);
        assert_eq!(
            shard_of_run(&label("5"), uid, 32),
            5,
            "the label, whatever the hash"
        );
        assert_eq!(
            shard_of_run(&label("5"), uid, 64),
            5,
            "kept when --shards grows"
        );
        assert_eq!(
            shard_of_run(&label("40"), uid, 32),
            shard_of(uid, 32),
            "out of range: the hash"
        );
        assert_eq!(shard_of_run(&label("x"), uid, 32), shard_of(uid, 32));
    }

    /// Issue #38: relabelled `011`, a run was watched by no replica (the watches match the text
    /// `11`) while `parse` read it as shard 11. Only the decimal the operator writes is a shard;
    /// anything else is the uid's shard, and the labeller's selector finds it to write it back.
    #[test]
    fn only_the_canonical_decimal_is_a_shard_and_the_rest_is_selected_for_repair() {
        let uid = "0b7c6a2e-0001-4f6e-9d1a-5d2c3b4a5e6f";
        let label =
            |v: &str| std::collections::BTreeMap::from([(SHARD_LABEL.to_string(), v.to_string())]);
        for bad in ["011", "+11", " 11", "11 ", "1_1", "32", ""] {
            assert_eq!(canonical_label(bad, 32), None, "{bad:?}");
            assert_eq!(
                shard_of_run(&label(bad), uid, 32),
                shard_of(uid, 32),
                "{bad:?}"
            );
        }
        assert_eq!(canonical_label("11", 32), Some(11));
        assert_eq!(canonical_label("0", 32), Some(0));
        let selector = uncanonical_selector(4);
        assert_eq!(selector, "sandbox.iterion.io/shard notin (0,1,2,3)");
    }

    /// Issue #38: relabelled to another replica's shard mid-drain, a run was drained by two
    /// replicas; relabelled `011`, by none. The webhook lets only the operator's own value in.
    #[test]
    fn only_the_operators_own_value_of_the_shard_label_is_admitted() {
        let uid = "0b7c6a2e-0001-4f6e-9d1a-5d2c3b4a5e6f";
        let own = shard_of(uid, 32).to_string();
        let other = ((shard_of(uid, 32) + 1) % 32).to_string();
        let judge = |old: Option<&str>, new: Option<&str>, create: bool| {
            label_change_refusal(old, new, Some(uid), Some(32), create)
        };
        // Kept, or written by the labeller (missing or not canonical before).
        assert_eq!(judge(Some(&own), Some(&own), false), None);
        assert_eq!(judge(None, Some(&own), false), None);
        assert_eq!(judge(Some("011"), Some(&own), false), None);
        assert_eq!(judge(None, None, false), None);
        // Moved, made uncanonical or removed by anyone.
        assert!(judge(Some(&own), Some(&other), false).is_some());
        assert!(judge(None, Some(&other), false).is_some());
        assert!(judge(Some(&own), Some(&format!("0{own}")), false).is_some());
        assert!(judge(Some(&own), None, false).is_some());
        // A new run: no label, or a canonical one (the labeller keeps what is written).
        assert_eq!(judge(None, None, true), None);
        assert_eq!(judge(None, Some("3"), true), None);
        assert!(judge(None, Some("03"), true).is_some());
        assert!(judge(None, Some("40"), true).is_some());
        // An unsharded webhook (no count) admits any canonical value where there was none.
        assert_eq!(
            label_change_refusal(None, Some("7"), Some(uid), None, false),
            None
        );
        assert!(label_change_refusal(Some("7"), Some("8"), Some(uid), None, false).is_some());
    }

    #[test]
    fn lease_names_round_trip() {
        assert_eq!(shard_lease_name("op", 7), "op-shard-7");
        assert_eq!(shard_of_lease_name("op", "op-shard-7"), Some(7));
        assert_eq!(shard_of_lease_name("op", "op-replica-x"), None);
        assert_eq!(shard_of_lease_name("op", "other-shard-7"), None);
        assert_eq!(replica_lease_name("op", "pod-1"), "op-replica-pod-1");
    }
}
