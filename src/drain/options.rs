//! What a drain is told (its bounds: [`DrainOptions`]) and how it fails ([`DrainError`], with the
//! [`Progress`] made before it).

use std::io;

use crate::api::Compression;
use crate::caps as cap;
use crate::store::{self, StoreError};
use crate::tar::sanitize::Limits;

/// Default bound on the bytes the parser may read between two members (headers, PAX records, GNU
/// long names, sparse maps, padding). The parser buffers extension records whole; each is also
/// bounded on its own by [`MAX_EXTENSION_BODY_BYTES`], checked before its body is read.
pub(crate) const DEFAULT_MAX_HEADER_BYTES: u64 = 1024 * 1024;
/// Largest body of a PAX extended header (`x`) or a GNU long name or link (`L`, `K`), the records
/// the parser holds in memory: a header announcing more is refused as malformed before a byte of
/// its body is read (a path is at most 4 KiB, so no honest packer comes near it).
pub(crate) const MAX_EXTENSION_BODY_BYTES: u64 = 64 * 1024;
/// Bytes of dropped and rejected records a drain lists (each counts its path plus
/// [`RECORD_OVERHEAD_BYTES`]); past it, further ones are counted in the totals but not listed
/// ([`DrainOutcome::unlisted_dropped`], [`DrainOutcome::unlisted_rejected`]), so the records the
/// operator holds stay bounded whatever the pod wrote (docs/contract.md, "Unbounded size").
pub(crate) const MAX_LISTED_RECORD_BYTES: u64 = 8 * 1024 * 1024;
/// What one listed record costs against [`MAX_LISTED_RECORD_BYTES`] besides its path.
pub(crate) const RECORD_OVERHEAD_BYTES: u64 = 64;
/// Longest raw path kept in a rejected record (a rejected path is not bounded by the sanitizer's
/// path rules: it may be the very thing that broke them); longer ones are cut and say so.
pub(crate) const MAX_REJECTED_PATH_BYTES: usize = 1024;
/// Input allowed on top of 4 × the cap by [`DrainOptions::new`].
pub(crate) const INPUT_HEADROOM_BYTES: u64 = 256 * 1024 * 1024;

/// How one path is drained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainOptions {
    /// Cap of the stored member content (ADR-143 "Unbounded size").
    pub cap_bytes: u64,
    /// Allowance of the stored members' metadata: names, link targets, headers
    /// ([`cap::metadata_cost`]); [`cap::metadata_allowance`] of the cap by default.
    pub metadata_allowance: u64,
    /// Compression of the stored archive.
    pub compression: Compression,
    /// Sanitizer limits (entries, path and component lengths).
    pub limits: Limits,
    /// Most bytes read from the stream (the endless-stream guard; the caller's timeout bounds the
    /// time). Reaching it while members are being read ends the drain `Capped` with the members
    /// read so far; reaching it after the end-of-archive marker fails the drain. With an older
    /// packer, dropped members still flow through the stream, so this sits well above the cap.
    pub max_input_bytes: u64,
    /// See [`DEFAULT_MAX_HEADER_BYTES`].
    pub max_header_bytes: u64,
    /// See [`MAX_LISTED_RECORD_BYTES`].
    pub max_listed_record_bytes: u64,
}

impl DrainOptions {
    /// Defaults for a path with this cap: input bounded at 4 × cap + [`INPUT_HEADROOM_BYTES`].
    pub fn new(cap_bytes: u64, compression: Compression) -> Self {
        DrainOptions {
            cap_bytes,
            metadata_allowance: cap::metadata_allowance(cap_bytes),
            compression,
            limits: Limits::default(),
            max_input_bytes: cap_bytes
                .saturating_mul(4)
                .saturating_add(INPUT_HEADROOM_BYTES),
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_listed_record_bytes: MAX_LISTED_RECORD_BYTES,
        }
    }

    /// What the manifest records of these options: the compression and the cap.
    pub fn stored(&self) -> store::Stored {
        store::Stored {
            compression: self.compression,
            cap_bytes: self.cap_bytes,
        }
    }
}

/// How far a drain got before it failed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Bytes read from the stream.
    pub input_bytes: u64,
    /// Entries parsed.
    pub entries: u64,
    /// Members re-emitted.
    pub members: u64,
    /// Content bytes re-emitted.
    pub bytes: u64,
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "after {} input bytes, {} entries parsed, {} members ({} content bytes) re-emitted",
            self.input_bytes, self.entries, self.members, self.bytes
        )
    }
}

/// A failed drain: what failed, and how far it got.
#[derive(Debug, thiserror::Error)]
#[error("drain failed: {kind} ({progress})")]
pub struct DrainError {
    /// What failed.
    pub kind: DrainErrorKind,
    /// How far it got.
    pub progress: Progress,
}

impl DrainError {
    /// A short stable label for metrics and Event reasons.
    pub(crate) fn metric_label(&self) -> &'static str {
        self.kind.metric_label()
    }
}

/// What failed in a drain.
#[derive(Debug, thiserror::Error)]
pub enum DrainErrorKind {
    /// The stream ended mid-archive (no end-of-archive marker, or a member cut short).
    #[error("the tar stream is truncated: {0}")]
    Truncated(String),
    /// The stream is not a valid tar archive.
    #[error("the tar stream is malformed: {0}")]
    Malformed(String),
    /// Non-zero bytes follow the end-of-archive marker.
    #[error("non-zero bytes follow the end-of-archive marker")]
    TrailingGarbage,
    /// The stream is longer than the input bound.
    #[error("the stream exceeds {limit} input bytes (the drain's bound on an endless stream)")]
    InputLimit {
        /// The bound.
        limit: u64,
    },
    /// Too many header bytes between two members (huge PAX records or long names).
    #[error("more than {limit} header bytes between two members")]
    HeaderLimit {
        /// The bound.
        limit: u64,
    },
    /// A PAX extended header or GNU long name/link announces a body over
    /// [`MAX_EXTENSION_BODY_BYTES`]: refused before its body is read.
    #[error("the tar stream is malformed: {what} announces a {size}-byte body, over the {limit}-byte bound on extension records (refused before reading it)")]
    ExtensionTooLarge {
        /// Which extension (`PAX header`, `GNU long name`, `GNU long link`).
        what: &'static str,
        /// The size it announced.
        size: u64,
        /// The bound.
        limit: u64,
    },
    /// Too many entries.
    #[error("more than {limit} entries")]
    TooManyEntries {
        /// The bound.
        limit: u64,
    },
    /// Reading the stream failed (the exec transport).
    #[error("reading the stream failed: {0}")]
    Read(io::Error),
    /// Writing the re-emitted archive failed.
    #[error("writing the archive failed: {0}")]
    Write(io::Error),
    /// The object store refused the archive or the manifest.
    #[error("object store: {0}")]
    Store(#[from] StoreError),
    /// A manifest for this path was committed concurrently and lists different content.
    #[error("manifest {key} was committed concurrently with different content; the archive may not match it")]
    ManifestConflict {
        /// The manifest key.
        key: String,
    },
}

impl DrainErrorKind {
    /// A short stable label for metrics and Event reasons.
    pub(crate) fn metric_label(&self) -> &'static str {
        match self {
            DrainErrorKind::Truncated(_) => "truncated",
            DrainErrorKind::Malformed(_) => "malformed",
            DrainErrorKind::TrailingGarbage => "trailing_garbage",
            DrainErrorKind::InputLimit { .. } => "input_limit",
            DrainErrorKind::HeaderLimit { .. } => "header_limit",
            DrainErrorKind::ExtensionTooLarge { .. } => "malformed",
            DrainErrorKind::TooManyEntries { .. } => "too_many_entries",
            DrainErrorKind::Read(_) => "read",
            DrainErrorKind::Write(_) => "write",
            DrainErrorKind::Store(_) => "store",
            DrainErrorKind::ManifestConflict { .. } => "manifest_conflict",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bounds a manifest is read within (`crate::store::manifest_read`) are what a drain
    /// lists at most: if these ever diverge, the operator would refuse its own manifests.
    #[test]
    fn the_manifest_bounds_are_the_drains() {
        use crate::store::manifest_read::{LISTED_RECORD_BYTES, RECORD_OVERHEAD};
        assert_eq!(LISTED_RECORD_BYTES, MAX_LISTED_RECORD_BYTES);
        assert_eq!(RECORD_OVERHEAD, RECORD_OVERHEAD_BYTES);
        // A rejected path is cut at 1 KiB, and an extension body (a link target, a note) at
        // 64 KiB: every string a manifest holds fits the string bound, escaped.
        const {
            use crate::store::manifest_read::MAX_JSON_STRING_BYTES;
            assert!(MAX_REJECTED_PATH_BYTES as u64 * 6 <= MAX_JSON_STRING_BYTES);
            assert!(MAX_EXTENSION_BODY_BYTES * 6 <= MAX_JSON_STRING_BYTES);
        }
    }
}
