//! The operator's bounds on a run: the read-back caps (the operator-wide [`CapSettings`] that
//! admission, the pod builder and the drain share, and the pure meters of one path), and the
//! image pull timeout's default.
//!
//! # The cap meter
//!
//! The cap meter of one declared read-back path (ADR-143 "What is not promised: Unbounded size").
//! Pure: it only counts.
//!
//! What it counts: member CONTENT bytes (a file's size), so the cap means what a user expects
//! ("512Mi of files"). What the store holds besides content — names, link targets, headers — is
//! metered by [`MetadataMeter`] against a separate per-path allowance ([`metadata_allowance`]),
//! so a flood of long names cannot store (or make the operator hold) more than that
//! (docs/contract.md, "Unbounded size").
//!
//! How it decides: from the header size, before any content is read. A member that would cross the
//! cap is dropped whole and recorded; later members that still fit are kept. The contract is "a
//! dropped member and the rest of the run", never a truncated archive and never a truncated member.
//!
//! The same rule runs twice: in the pod, `pack --budget` meters with this very type and writes
//! a member it drops as a zero-length placeholder (so its content never crosses the wire), and on
//! the operator side the drain meters everything it receives again (the packer runs in a pod the
//! workload shares, so it is not trusted to meter) and records the placeholders as dropped with
//! [`CapMeter::record_drop`] (see docs/contract.md, "Unbounded size").
//!
//! Retries: ADR-143 says the meter "meters what the host holds — every attempt of a retried drain
//! counted together, since tar never deletes". Here every attempt of a path's drain writes the SAME
//! object key (`store::object_keys`), and a failed attempt aborts its multipart upload, so what the
//! store holds for the path after any attempt is that attempt's archive alone. A retry therefore
//! starts from [`CapMeter::fresh`] (same cap, zero used): counting earlier attempts again would drop
//! members the store does not hold twice. Should the key layout ever become per-attempt, this
//! reasoning breaks and the meter must be carried across attempts instead.

use serde::{Deserialize, Serialize};

use crate::units::GIB;

/// Default of `run --image-pull-timeout`: how long a retryable image-pull error may last before
/// the run is failed (see `controller::run::decide::DecideSettings`).
pub(crate) const DEFAULT_IMAGE_PULL_TIMEOUT: std::time::Duration =
    std::time::Duration::from_secs(5 * 60);

/// The read-back cap bounds (ADR-143 "Unbounded size"): a path's `sizeLimit`, else `default_bytes`,
/// never above `max_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapSettings {
    /// Cap of a path that declares no `sizeLimit`.
    pub default_bytes: u64,
    /// Highest cap any path may get, whatever it declares.
    pub max_bytes: u64,
}

impl Default for CapSettings {
    fn default() -> Self {
        CapSettings {
            default_bytes: GIB,
            max_bytes: 16 * GIB,
        }
    }
}

impl CapSettings {
    /// The effective cap of a path that asked for `requested` bytes (None: no sizeLimit).
    pub(crate) fn effective(&self, requested: Option<u64>) -> u64 {
        requested.unwrap_or(self.default_bytes).min(self.max_bytes)
    }
}

/// Verdict on one member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Fits: store it (the meter has counted it).
    Keep,
    /// Would cross the cap: drop it whole (the meter has recorded it).
    Drop,
}

/// Counts the content bytes kept against a cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CapMeter {
    cap_bytes: u64,
    kept_bytes: u64,
    dropped_members: u64,
    dropped_bytes: u64,
}

impl CapMeter {
    /// A meter with nothing counted yet.
    pub fn new(cap_bytes: u64) -> Self {
        CapMeter {
            cap_bytes,
            kept_bytes: 0,
            dropped_members: 0,
            dropped_bytes: 0,
        }
    }

    #[cfg(test)]
    /// A meter for the next attempt of the same path: same cap, nothing counted (see module doc).
    pub fn fresh(&self) -> Self {
        CapMeter::new(self.cap_bytes)
    }

    /// Decides on a member of `size` content bytes and counts it.
    pub(crate) fn admit(&mut self, size: u64) -> Admit {
        match self.kept_bytes.checked_add(size) {
            Some(total) if total <= self.cap_bytes => {
                self.kept_bytes = total;
                Admit::Keep
            }
            _ => {
                self.dropped_members += 1;
                self.dropped_bytes = self.dropped_bytes.saturating_add(size);
                Admit::Drop
            }
        }
    }

    /// Whether a member of `size` content bytes would be kept, without counting it.
    pub(crate) fn fits(&self, size: u64) -> bool {
        self.kept_bytes
            .checked_add(size)
            .is_some_and(|total| total <= self.cap_bytes)
    }

    /// Counts a member dropped for a reason the meter did not decide (dropped in the pod by the
    /// packer, or cut by the drain's input bound): it is never kept, whatever its size.
    pub(crate) fn record_drop(&mut self, size: u64) {
        self.dropped_members += 1;
        self.dropped_bytes = self.dropped_bytes.saturating_add(size);
    }

    #[cfg(test)]
    /// The cap.
    pub(crate) fn cap_bytes(&self) -> u64 {
        self.cap_bytes
    }

    #[cfg(test)]
    /// Content bytes kept so far.
    pub(crate) fn kept_bytes(&self) -> u64 {
        self.kept_bytes
    }

    #[cfg(test)]
    /// Bytes still available under the cap.
    pub(crate) fn remaining_bytes(&self) -> u64 {
        self.cap_bytes - self.kept_bytes
    }

    #[cfg(test)]
    /// Members dropped so far.
    pub fn dropped_members(&self) -> u64 {
        self.dropped_members
    }

    #[cfg(test)]
    /// Content bytes of the members dropped so far.
    pub(crate) fn dropped_bytes(&self) -> u64 {
        self.dropped_bytes
    }
}

/// Metadata bytes a stored member costs against its path's metadata allowance, on top of its
/// content: one tar header block, plus its path and link target (which the re-emitted archive
/// carries in a PAX record when they do not fit the header, and the manifest lists once more).
pub(crate) const METADATA_BYTES_PER_MEMBER: u64 = 512;
/// Smallest metadata allowance of a path, whatever its cap.
pub(crate) const MIN_METADATA_ALLOWANCE: u64 = 1024 * 1024;
/// Largest metadata allowance of a path, whatever its cap: it bounds the member records the
/// operator holds for one drain (and the manifest it writes) — docs/contract.md, "Unbounded size".
pub(crate) const MAX_METADATA_ALLOWANCE: u64 = 32 * 1024 * 1024;

/// The metadata allowance of a path with this content cap: the cap itself, at least
/// [`MIN_METADATA_ALLOWANCE`] and at most [`MAX_METADATA_ALLOWANCE`].
pub(crate) fn metadata_allowance(cap_bytes: u64) -> u64 {
    cap_bytes.clamp(MIN_METADATA_ALLOWANCE, MAX_METADATA_ALLOWANCE)
}

/// What one stored member costs against the metadata allowance (see
/// [`METADATA_BYTES_PER_MEMBER`]).
pub(crate) fn metadata_cost(path: &str, link_target: Option<&str>) -> u64 {
    METADATA_BYTES_PER_MEMBER
        .saturating_add(path.len() as u64)
        .saturating_add(link_target.map_or(0, str::len) as u64)
}

/// Meters what a path's stored members cost beside their content — names, link targets, headers
/// (docs/contract.md, "Unbounded size"): a member whose metadata would take the total past the
/// allowance is dropped whole, like a member over the content cap, and a later one that fits is
/// still kept. Pure: it only counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MetadataMeter {
    allowance: u64,
    used: u64,
}

impl MetadataMeter {
    /// A meter with nothing counted yet.
    pub fn new(allowance: u64) -> Self {
        MetadataMeter { allowance, used: 0 }
    }

    /// Whether a member costing `cost` fits, without counting it.
    pub(crate) fn fits(&self, cost: u64) -> bool {
        self.used
            .checked_add(cost)
            .is_some_and(|total| total <= self.allowance)
    }

    /// Decides on a member costing `cost` and counts it when it is kept.
    pub(crate) fn admit(&mut self, cost: u64) -> Admit {
        if self.fits(cost) {
            self.used += cost;
            Admit::Keep
        } else {
            Admit::Drop
        }
    }

    #[cfg(test)]
    /// Metadata bytes counted so far.
    pub fn used(&self) -> u64 {
        self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_under_the_cap_are_kept() {
        let mut m = CapMeter::new(10);
        assert_eq!(m.admit(4), Admit::Keep);
        assert_eq!(m.admit(6), Admit::Keep);
        assert_eq!(m.kept_bytes(), 10);
        assert_eq!(m.remaining_bytes(), 0);
    }

    #[test]
    fn member_over_cap_is_dropped_and_the_rest_is_kept() {
        let mut m = CapMeter::new(10);
        assert_eq!(m.admit(6), Admit::Keep);
        assert_eq!(m.admit(5), Admit::Drop, "6 + 5 crosses 10");
        assert_eq!(m.admit(4), Admit::Keep, "a later member that fits is kept");
        assert_eq!(m.admit(1), Admit::Drop);
        assert_eq!(m.admit(0), Admit::Keep, "empty files always fit");
        assert_eq!(m.kept_bytes(), 10);
        assert_eq!(m.dropped_members(), 2);
        assert_eq!(m.dropped_bytes(), 6);
    }

    #[test]
    fn a_member_larger_than_the_whole_cap_is_dropped_without_overflow() {
        let mut m = CapMeter::new(u64::MAX - 1);
        assert_eq!(m.admit(u64::MAX - 1), Admit::Keep);
        assert_eq!(m.admit(u64::MAX), Admit::Drop);
        assert_eq!(m.dropped_bytes(), u64::MAX);
    }

    #[test]
    fn fits_peeks_without_counting_and_record_drop_never_keeps() {
        let mut m = CapMeter::new(10);
        assert!(m.fits(10));
        assert!(!m.fits(11));
        assert_eq!(m.kept_bytes(), 0, "fits counts nothing");
        m.record_drop(3);
        m.record_drop(u64::MAX);
        assert_eq!(m.kept_bytes(), 0);
        assert_eq!(m.dropped_members(), 2);
        assert_eq!(m.dropped_bytes(), u64::MAX, "saturates");
        assert_eq!(m.admit(10), Admit::Keep, "a recorded drop uses no budget");
    }

    #[test]
    fn a_retry_starts_from_a_fresh_meter_with_the_same_cap() {
        let mut first = CapMeter::new(10);
        assert_eq!(first.admit(8), Admit::Keep);
        let mut retry = first.fresh();
        assert_eq!(retry.cap_bytes(), 10);
        assert_eq!(
            retry.admit(8),
            Admit::Keep,
            "the retry overwrites the same key"
        );
    }

    #[test]
    fn the_metadata_allowance_follows_the_cap_within_its_bounds() {
        assert_eq!(metadata_allowance(10), MIN_METADATA_ALLOWANCE);
        assert_eq!(metadata_allowance(1 << 20), 1 << 20);
        assert_eq!(metadata_allowance(8 << 20), 8 << 20);
        assert_eq!(metadata_allowance(u64::MAX), MAX_METADATA_ALLOWANCE);
        assert_eq!(metadata_cost("a/b", None), 512 + 3);
        assert_eq!(metadata_cost("l", Some("../x")), 512 + 1 + 4);
    }

    #[test]
    fn fifty_thousand_long_names_cannot_outgrow_a_one_mib_allowance() {
        // Item 5 of issue 10: 50,000 empty files with 4 KiB names under `sizeLimit: 1Mi`.
        let mut m = MetadataMeter::new(metadata_allowance(1 << 20));
        let name = "n".repeat(4096);
        let kept = (0..50_000)
            .filter(|_| m.admit(metadata_cost(&name, None)) == Admit::Keep)
            .count();
        assert_eq!(kept, (1 << 20) / (512 + 4096));
        assert!(m.used() <= 1 << 20);
        // A later, smaller member still fits in what is left.
        assert_eq!(m.admit(metadata_cost("s", None)), Admit::Keep);
        assert!(!m.fits(u64::MAX), "no overflow");
    }
}
