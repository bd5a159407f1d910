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
//!   the owned set changes; [`label`]: the shard label written on runs that have none yet.

pub(crate) mod assign;
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

/// The shard of a run: its [`SHARD_LABEL`] when it has one below `shards` (written once, it
/// stays the run's shard even if `--shards` grows later), else [`shard_of`] its uid.
pub fn shard_of_run(
    labels: &std::collections::BTreeMap<String, String>,
    uid: &str,
    shards: u32,
) -> u32 {
    labels
        .get(SHARD_LABEL)
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|k| *k < shards.max(1))
        .unwrap_or_else(|| shard_of(uid, shards))
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

    #[test]
    fn lease_names_round_trip() {
        assert_eq!(shard_lease_name("op", 7), "op-shard-7");
        assert_eq!(shard_of_lease_name("op", "op-shard-7"), Some(7));
        assert_eq!(shard_of_lease_name("op", "op-replica-x"), None);
        assert_eq!(shard_of_lease_name("op", "other-shard-7"), None);
        assert_eq!(replica_lease_name("op", "pod-1"), "op-replica-pod-1");
    }
}
