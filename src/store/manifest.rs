//! The manifest: the commit point of one drained path and the record of what it holds — every
//! member, every dropped or rejected entry with its reason (docs/contract.md §4). The record types
//! live here, with the store that writes and reads them, not in the drain that fills them.

use std::sync::Arc;

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::keys::{run_prefix, ObjectKeys, MANIFEST_SUFFIX};
use super::manifest_read;
use crate::api::{Compression, ReadBackPhase};
use crate::identity::RunId;
use crate::tar::sanitize::{MemberKind, Reason};

/// Version of the manifest layout; bumped on any incompatible change.
pub const MANIFEST_SCHEMA_VERSION: u32 = 1;

/// What the drain caller knows about the path being drained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestContext {
    /// The run.
    pub run: RunId,
    /// The declared container path.
    pub declared_path: String,
    /// Its position in `spec.readBack.paths`.
    pub index: usize,
    /// Drain attempt number (1-based).
    pub attempt: u32,
}

/// How the drain stored a path: the archive's compression and the cap it metered against
/// (`crate::drain::DrainOptions::stored` from the drain's options).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stored {
    /// Compression of the archive.
    pub compression: Compression,
    /// The cap the drain metered against.
    pub cap_bytes: u64,
}

/// Totals of a drained path.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    /// Members stored.
    pub members: u64,
    /// Content bytes stored.
    pub bytes: u64,
    /// Files dropped by the cap.
    pub dropped_members: u64,
    /// Their content bytes.
    pub dropped_bytes: u64,
    /// Entries rejected by the sanitizer.
    pub rejected_members: u64,
    /// Bytes read from the pod.
    pub input_bytes: u64,
    /// Bytes of the stored archive.
    pub archive_bytes: u64,
    /// Stored files whose content changed while the packer read them ([`Manifest::changed`]),
    /// listed or not.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub changed_members: u64,
}

/// The commit point of one drained path: present means the archive is complete
/// (docs/contract.md §3). Lists every member and every dropped or rejected entry with its reason, so a reader
/// can tell a failed drain from an empty one (ADR-143 §4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// [`MANIFEST_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The run.
    pub run: RunId,
    /// The declared container path.
    pub declared_path: String,
    /// Its position in `spec.readBack.paths`.
    pub index: usize,
    /// Key of the archive this manifest commits.
    pub archive_key: String,
    /// Compression of the archive.
    pub compression: Compression,
    /// The cap the drain metered against.
    pub cap_bytes: u64,
    /// Drain attempt that committed.
    pub attempt: u32,
    /// When the committing attempt started (RFC 3339).
    pub started_at: String,
    /// When it finished (RFC 3339).
    pub finished_at: String,
    /// Drained, Empty or Capped.
    pub phase: ReadBackPhase,
    /// Totals.
    pub totals: Totals,
    /// Stored members, in archive order (read within the metadata allowance:
    /// [`super::manifest_read`]).
    #[serde(deserialize_with = "super::manifest_read::within_metadata")]
    pub members: Vec<MemberRecord>,
    /// Files dropped by the cap: by the drain's meter, or by the packer in the pod (`inPod`, only
    /// a placeholder crossed the wire), or because the stream reached the input bound.
    #[serde(deserialize_with = "super::manifest_read::within_listed")]
    pub dropped: Vec<DroppedRecord>,
    /// Entries rejected by the sanitizer, with reasons.
    #[serde(deserialize_with = "super::manifest_read::within_listed")]
    pub rejected: Vec<RejectedRecord>,
    /// Set (to the bound, in bytes) when the drain stopped reading the stream at its input bound:
    /// the members listed are the ones read before that point, the rest was never seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at_input_bound: Option<u64>,
    /// What the packer in the pod reported on stderr: files it could not read, special files it
    /// skipped, files that changed size while read. Never silent (docs/contract.md §3: an unreadable
    /// file is recorded as such, never silently skipped).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "super::manifest_read::within_notes"
    )]
    pub pod_notes: Vec<String>,
    /// Stored files that changed while the packer read them (docs/contract.md, "A changed file is
    /// never stored as a clean one"): their member is zero-padded (`shrunk`, `read_error`) or cut
    /// at the stat size (`grew`), and its sha256 covers that. The first ones the packer listed;
    /// `totals.changedMembers` counts them all.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "super::manifest_read::within_notes"
    )]
    pub changed: Vec<ChangedRecord>,
    /// The run's attempt whose files these are (`spec.retryPolicy`; docs/user-guide.md
    /// "Retries"): absent for the first attempt, so manifests written before retries read as it.
    #[serde(default = "first_attempt", skip_serializing_if = "is_first_attempt")]
    pub run_attempt: u32,
    /// The checkpoint whose files these are (`spec.checkpoint`; docs/user-guide.md
    /// "Checkpoints"), absent for a teardown's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<u32>,
    /// How the packer's stream crossed the exec wire for the committing attempt (docs/contract.md
    /// "The stream on the wire"): what the operator read, not the packer's word. Absent from
    /// manifests written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wire: Option<WireRecord>,
}

/// How one attempt's stream crossed the exec wire, as the operator read it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireRecord {
    /// `tar`, `zstd` or `adaptive` (a string: a later encoding still reads).
    pub encoding: String,
    /// Bytes that crossed the wire (compare `totals.inputBytes`, the tar they carried).
    pub bytes: u64,
    /// Adaptive wire: blocks sent as is (they would not shrink).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stored_blocks: u64,
    /// Adaptive wire: blocks sent zstd-compressed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub compressed_blocks: u64,
}

fn first_attempt() -> u32 {
    1
}

fn is_first_attempt(attempt: &u32) -> bool {
    *attempt <= 1
}

impl Manifest {
    /// The manifest of a successful drain.
    pub fn new(
        ctx: &ManifestContext,
        keys: &ObjectKeys,
        stored: Stored,
        outcome: &DrainOutcome,
        started: jiff::Timestamp,
        finished: jiff::Timestamp,
    ) -> Self {
        Self::from_outcome(ctx, keys, stored, outcome.clone(), started, finished)
    }

    /// [`Manifest::new`], taking the outcome's records instead of copying them (a drain's records
    /// may be tens of MiB: docs/contract.md, "Unbounded size").
    pub(crate) fn from_outcome(
        ctx: &ManifestContext,
        keys: &ObjectKeys,
        stored: Stored,
        outcome: DrainOutcome,
        started: jiff::Timestamp,
        finished: jiff::Timestamp,
    ) -> Self {
        Manifest {
            schema_version: MANIFEST_SCHEMA_VERSION,
            run: ctx.run.clone(),
            declared_path: ctx.declared_path.clone(),
            index: ctx.index,
            archive_key: keys.archive.to_string(),
            compression: stored.compression,
            cap_bytes: stored.cap_bytes,
            attempt: ctx.attempt,
            started_at: started.to_string(),
            finished_at: finished.to_string(),
            phase: outcome.phase(),
            totals: Totals {
                members: outcome.members.len() as u64,
                bytes: outcome.bytes,
                // Listed or not (docs/contract.md: past a bound, records are only counted).
                dropped_members: outcome.dropped_count(),
                // Saturating: a dropped size may be the pod's (forged) word.
                dropped_bytes: outcome.dropped_bytes(),
                rejected_members: outcome.rejected_count(),
                input_bytes: outcome.input_bytes,
                archive_bytes: outcome.archive_bytes,
                // The packer's notes say it, not the stream (`crate::drain::pod_notes`).
                changed_members: 0,
            },
            members: outcome.members,
            dropped: outcome.dropped,
            rejected: outcome.rejected,
            stopped_at_input_bound: outcome.stopped_at_input_bound,
            pod_notes: Vec::new(),
            changed: Vec::new(),
            run_attempt: 1,
            checkpoint: None,
            wire: None,
        }
    }

    /// The drain outcome this manifest records.
    pub fn outcome(&self) -> DrainOutcome {
        DrainOutcome {
            members: self.members.clone(),
            dropped: self.dropped.clone(),
            rejected: self.rejected.clone(),
            bytes: self.totals.bytes,
            input_bytes: self.totals.input_bytes,
            archive_bytes: self.totals.archive_bytes,
            stopped_at_input_bound: self.stopped_at_input_bound,
            unlisted_dropped: self
                .totals
                .dropped_members
                .saturating_sub(self.dropped.len() as u64),
            unlisted_dropped_bytes: self.totals.dropped_bytes.saturating_sub(
                self.dropped
                    .iter()
                    .fold(0u64, |sum, d| sum.saturating_add(d.size)),
            ),
            unlisted_rejected: self
                .totals
                .rejected_members
                .saturating_sub(self.rejected.len() as u64),
            in_band_notes: None,
        }
    }

    /// A SHA-256 of what [`Manifest::same_content`] compares, streamed (nothing the size of the
    /// records is allocated): what a drain remembers of the manifest it last tried to write,
    /// instead of a second copy of its records (docs/contract.md "Drain memory").
    pub(crate) fn content_digest(&self) -> [u8; 32] {
        struct Hashing(sha2::Sha256);
        impl std::io::Write for Hashing {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                sha2::Digest::update(&mut self.0, buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut out = Hashing(<sha2::Sha256 as sha2::Digest>::new());
        let content = (
            &self.archive_key,
            self.compression,
            &self.members,
            &self.dropped,
            &self.rejected,
            self.stopped_at_input_bound,
        );
        // Writing into a hasher cannot fail, and these types always serialize.
        let _ = serde_json::to_writer(&mut out, &content);
        sha2::Digest::finalize(out.0).into()
    }

    /// Whether two manifests describe the same stored content (timestamps and attempt aside).
    pub(crate) fn same_content(&self, other: &Manifest) -> bool {
        self.archive_key == other.archive_key
            && self.compression == other.compression
            && self.members == other.members
            && self.dropped == other.dropped
            && self.rejected == other.rejected
            && self.stopped_at_input_bound == other.stopped_at_input_bound
            && self.changed == other.changed
    }

    /// The changed member at `path`, if the manifest lists it.
    pub fn changed_member(&self, path: &str) -> Option<&ChangedRecord> {
        self.changed.iter().find(|c| c.path == path)
    }
}

/// Result of a create-only manifest write.
#[derive(Debug, PartialEq, Eq)]
pub enum ManifestWrite {
    /// This call committed the path.
    Created,
    /// A manifest was already there (an earlier attempt committed); here it is.
    AlreadyCommitted(Box<Manifest>),
}

/// The manifest's JSON, allocated once at its exact size: a manifest may list tens of MiB of
/// records (docs/contract.md, "Unbounded size"), and a buffer grown by doubling would hold up to
/// three times that at once.
fn manifest_json(manifest: &Manifest) -> serde_json::Result<Vec<u8>> {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer_pretty(&mut count, manifest)?;
    let mut json = Vec::with_capacity(count.0);
    serde_json::to_writer_pretty(&mut json, manifest)?;
    Ok(json)
}

/// Writes a manifest create-only: the first complete attempt commits, later ones read it back.
pub async fn write_manifest(
    store: &Arc<dyn ObjectStore>,
    key: &Path,
    manifest: &Manifest,
) -> Result<ManifestWrite, StoreError> {
    let json = manifest_json(manifest).map_err(|source| StoreError::ManifestJson {
        key: key.to_string(),
        source,
    })?;
    let opts = PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    match store.put_opts(key, PutPayload::from(json), opts).await {
        Ok(_) => Ok(ManifestWrite::Created),
        Err(
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. },
        ) => {
            tracing::info!(manifest = %key, "manifest already committed by an earlier attempt");
            Ok(ManifestWrite::AlreadyCommitted(Box::new(
                read_manifest(store, key).await?,
            )))
        }
        Err(source) => Err(StoreError::Object {
            op: "writing manifest",
            key: key.to_string(),
            source,
        }),
    }
}

/// The largest manifest the operator reads (docs/contract.md "Drain memory": a drain writes at
/// most ~2 × A + 16 MiB of manifest, A ≤ [`crate::caps::MAX_METADATA_ALLOWANCE`]). A tenant holds
/// its own store's credentials and can PUT anything at a manifest key: 1.2 GiB of zeros there
/// was read whole before each drain attempt (peak RSS 1,239 MiB, issue #38). Larger objects are
/// refused by their size before a byte is read, and the read stops at the bound whatever size
/// the store announced.
pub const MAX_MANIFEST_BYTES: u64 = 2 * crate::caps::MAX_METADATA_ALLOWANCE + 16 * 1024 * 1024;

/// Reads a manifest, at most [`MAX_MANIFEST_BYTES`] of it.
pub async fn read_manifest(
    store: &Arc<dyn ObjectStore>,
    key: &Path,
) -> Result<Manifest, StoreError> {
    read_manifest_within(store, key, MAX_MANIFEST_BYTES).await
}

/// Reads a manifest, at most `max` bytes of it.
async fn read_manifest_within(
    store: &Arc<dyn ObjectStore>,
    key: &Path,
    max: u64,
) -> Result<Manifest, StoreError> {
    let object_error = |source| match source {
        object_store::Error::NotFound { .. } => StoreError::NotFound {
            key: key.to_string(),
        },
        source => StoreError::Object {
            op: "reading manifest",
            key: key.to_string(),
            source,
        },
    };
    let too_large = |size: u64| StoreError::ManifestTooLarge {
        key: key.to_string(),
        size,
        max,
    };
    let got = store.get(key).await.map_err(object_error)?;
    if got.meta.size > max {
        return Err(too_large(got.meta.size));
    }
    // Parsed as it streams in, never held whole, within the bounds of `super::manifest_read`.
    let stream = got
        .into_stream()
        .map(|chunk| chunk.map_err(std::io::Error::other));
    let reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(stream));
    let parsed = tokio::task::spawn_blocking(move || {
        serde_json::from_reader::<_, Manifest>(super::manifest_read::Bounded::new(reader, max))
    })
    .await
    .map_err(|e| StoreError::ManifestRead {
        key: key.to_string(),
        why: e.to_string(),
    })?;
    parsed.map_err(|source| manifest_error(key, max, source))
}

/// The store error of a manifest read that failed in the parser: a bound it crossed, the
/// store's own error mid-stream, or JSON that is no manifest.
fn manifest_error(key: &Path, max: u64, source: serde_json::Error) -> StoreError {
    use super::manifest_read::ReadBound;
    if source.is_io() {
        let io = std::io::Error::from(source);
        let kind = io.kind();
        return match io.into_inner().map(|inner| inner.downcast::<ReadBound>()) {
            Some(Ok(bound)) => match *bound {
                ReadBound::TooLarge(max) => StoreError::ManifestTooLarge {
                    key: key.to_string(),
                    size: max.saturating_add(1),
                    max,
                },
                ReadBound::LongString => StoreError::ManifestRead {
                    key: key.to_string(),
                    why: bound.to_string(),
                },
            },
            Some(Err(inner)) => match inner.downcast::<object_store::Error>() {
                Ok(e) => StoreError::Object {
                    op: "reading manifest",
                    key: key.to_string(),
                    source: *e,
                },
                Err(other) => StoreError::ManifestRead {
                    key: key.to_string(),
                    why: format!("{kind}: {other}"),
                },
            },
            None => StoreError::ManifestRead {
                key: key.to_string(),
                why: format!("{kind} (of at most {max} bytes)"),
            },
        };
    }
    StoreError::ManifestJson {
        key: key.to_string(),
        source,
    }
}

/// Reads a manifest if there is one.
pub async fn try_read_manifest(
    store: &Arc<dyn ObjectStore>,
    key: &Path,
) -> Result<Option<Manifest>, StoreError> {
    match read_manifest(store, key).await {
        Ok(m) => Ok(Some(m)),
        Err(StoreError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Every manifest stored for a run name (all uids, all paths), sorted by key: what `files ls`
/// shows and `files get` picks from.
pub async fn list_manifests(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    namespace: &str,
    name: &str,
) -> Result<Vec<(Path, Manifest)>, StoreError> {
    let dir = run_prefix(prefix, namespace, name);
    let mut keys: Vec<Path> = super::keys::list_keys(store, &dir)
        .await?
        .into_iter()
        .filter(|p| p.filename().is_some_and(|f| f.ends_with(MANIFEST_SUFFIX)))
        .collect();
    keys.sort();
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let manifest = read_manifest(store, &key).await?;
        out.push((key, manifest));
    }
    Ok(out)
}

/// [`DroppedRecord::reason`] of a file that would cross the cap (dropped by this meter, or by the
/// packer in the pod: then [`DroppedRecord::in_pod`] is set).
pub(crate) const DROPPED_OVER_CAP: &str = "over_cap";
/// [`DroppedRecord::reason`] of a file that fit the cap but whose content would have taken the
/// stream past the drain's input bound: the drain stopped reading before it.
pub(crate) const DROPPED_INPUT_BOUND: &str = "input_bound";
/// [`DroppedRecord::reason`] of a member whose name, link target and header would take the path's
/// stored metadata past its allowance (`crate::caps::metadata_allowance`).
pub(crate) const DROPPED_METADATA: &str = "over_metadata_allowance";

/// One stored member, as listed in the manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberRecord {
    /// Normalized relative path (directories without trailing `/`).
    pub path: String,
    /// file | dir | symlink.
    pub kind: MemberKind,
    /// Content bytes (0 for directories and symlinks).
    pub size: u64,
    /// Hex SHA-256 of the content (files only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Permission bits as stored (setuid/setgid/sticky are stripped).
    pub mode: u32,
    /// Symlink target (symlinks only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
    /// A later member of the archive has the same path: it is stored (and metered) but replaced
    /// on extraction — the last one wins, as with `tar -x` (docs/contract.md §3).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub superseded: bool,
}

/// A stored file whose content changed while the packer read it: its member is not the file's
/// content at any one moment (docs/contract.md, "A changed file is never stored as a clean one").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangedRecord {
    /// Normalized relative path of the stored member.
    pub path: String,
    /// `shrunk` (zero-padded after `readSize`), `grew` (cut at `statSize`) or `read_error`
    /// (zero-padded after `readSize`).
    pub reason: String,
    /// Its size when the packer listed it: the member's size.
    pub stat_size: u64,
    /// Content bytes the packer actually read into the member.
    pub read_size: u64,
}

/// A file dropped because it would cross the cap (or the input bound).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DroppedRecord {
    /// Normalized relative path.
    pub path: String,
    /// Its content bytes (for a member dropped in the pod: as the packer declared it).
    pub size: u64,
    /// [`DROPPED_OVER_CAP`] or [`DROPPED_INPUT_BOUND`].
    pub reason: String,
    /// Dropped by the packer in the pod (`pack --budget`): only a placeholder crossed the wire,
    /// and `size` is the pod's word, unverified.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_pod: bool,
}

/// An entry the sanitizer refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RejectedRecord {
    /// The raw path, rendered lossily (it may be the very thing that was unsafe).
    pub path: String,
    /// The tar type flag, as a character.
    pub entry_type: String,
    /// Announced content bytes.
    pub size: u64,
    /// Why.
    pub reason: Reason,
}

/// What a successful drain stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainOutcome {
    /// Stored members, in stream order.
    pub members: Vec<MemberRecord>,
    /// Files dropped by the cap.
    pub dropped: Vec<DroppedRecord>,
    /// Entries rejected by the sanitizer.
    pub rejected: Vec<RejectedRecord>,
    /// Content bytes stored (what the cap meters).
    pub bytes: u64,
    /// Bytes read from the stream.
    pub input_bytes: u64,
    /// Bytes of the stored archive (after compression).
    pub archive_bytes: u64,
    /// Set (to the bound, in bytes) when the drain stopped reading at its input bound: the members
    /// listed are the ones read before that point; whatever followed was never seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at_input_bound: Option<u64>,
    /// Dropped files counted but not listed in `dropped` (`crate::drain::archive::MAX_LISTED_RECORD_BYTES`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unlisted_dropped: u64,
    /// Their content bytes (saturating: a size may be the pod's word).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unlisted_dropped_bytes: u64,
    /// Rejected entries counted but not listed in `rejected`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unlisted_rejected: u64,
    /// The packer's notes, read from its archive's marker entry (`crate::tar::notes`); None from
    /// a packer that predates them (its stderr is all there is). Not a record of its own: the
    /// manifest keeps what is decided from it.
    #[serde(skip)]
    pub in_band_notes: Option<crate::tar::notes::InBandNotes>,
}

// What each record costs while a manifest is read (docs/contract.md "Drain memory"): the drain's
// own charges, so every manifest it writes reads back.
impl manifest_read::Costed for MemberRecord {
    /// The drain's metadata charge ([`crate::caps::metadata_cost`]), and a hash longer than a SHA-256.
    fn cost(&self) -> u64 {
        let sha = self.sha256.as_ref().map_or(0, |s| s.len() as u64);
        crate::caps::metadata_cost(&self.path, self.link_target.as_deref())
            .saturating_add(sha.saturating_sub(manifest_read::SHA256_HEX))
    }
}

impl manifest_read::Costed for DroppedRecord {
    fn cost(&self) -> u64 {
        manifest_read::record_cost(&self.path, &self.reason, 32)
    }
}

impl manifest_read::Costed for RejectedRecord {
    fn cost(&self) -> u64 {
        manifest_read::record_cost(&self.path, &self.entry_type, 8)
    }
}

impl manifest_read::Costed for ChangedRecord {
    fn cost(&self) -> u64 {
        manifest_read::record_cost(&self.path, &self.reason, 32)
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl DrainOutcome {
    /// The path's phase: Capped when anything was dropped or the input bound cut the stream,
    /// Empty when the stream held nothing at all, Drained otherwise (rejected entries are listed,
    /// and counted in the status).
    pub fn phase(&self) -> ReadBackPhase {
        if self.dropped_count() > 0 || self.stopped_at_input_bound.is_some() {
            ReadBackPhase::Capped
        } else if self.members.is_empty() && self.rejected_count() == 0 {
            ReadBackPhase::Empty
        } else {
            ReadBackPhase::Drained
        }
    }

    /// Files dropped, listed or not.
    pub(crate) fn dropped_count(&self) -> u64 {
        (self.dropped.len() as u64).saturating_add(self.unlisted_dropped)
    }

    /// Content bytes of the files dropped, listed or not (saturating).
    pub(crate) fn dropped_bytes(&self) -> u64 {
        self.dropped
            .iter()
            .fold(self.unlisted_dropped_bytes, |sum, d| {
                sum.saturating_add(d.size)
            })
    }

    /// Entries rejected, listed or not.
    pub(crate) fn rejected_count(&self) -> u64 {
        (self.rejected.len() as u64).saturating_add(self.unlisted_rejected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{object_keys, store_from_url};

    fn run() -> RunId {
        RunId {
            namespace: "ns".into(),
            name: "job".into(),
            uid: "1234-abcd".into(),
        }
    }

    fn manifest(attempt: u32) -> Manifest {
        let keys = object_keys(&Path::default(), &run(), 0, "/out", Compression::None);
        let ctx = ManifestContext {
            run: run(),
            declared_path: "/out".into(),
            index: 0,
            attempt,
        };
        let outcome = DrainOutcome {
            bytes: 3,
            ..DrainOutcome::default()
        };
        let t = jiff::Timestamp::UNIX_EPOCH;
        Manifest::new(
            &ctx,
            &keys,
            Stored {
                compression: Compression::None,
                cap_bytes: 10,
            },
            &outcome,
            t,
            t,
        )
    }

    #[tokio::test]
    async fn the_wire_is_recorded_in_the_manifest_and_an_older_manifest_without_it_reads() {
        let (store, _) = store_from_url("memory://", &[]).expect("memory store");
        let key = Path::from("ns/job/uid/00-out.manifest.json");
        let mut written = manifest(1);
        written.wire = Some(WireRecord {
            encoding: "adaptive".into(),
            bytes: 1000,
            stored_blocks: 3,
            compressed_blocks: 0,
        });
        let json = serde_json::to_value(&written).expect("json");
        assert_eq!(
            json["wire"],
            serde_json::json!({"encoding": "adaptive", "bytes": 1000, "storedBlocks": 3})
        );
        write_manifest(&store, &key, &written).await.expect("write");
        assert_eq!(read_manifest(&store, &key).await.expect("read"), written);
        // The wire is how the bytes travelled, not what was stored.
        assert!(written.same_content(&manifest(1)));

        let mut older = json;
        older.as_object_mut().expect("an object").remove("wire");
        let older: Manifest = serde_json::from_value(older).expect("reads");
        assert_eq!(older.wire, None);
    }

    #[tokio::test]
    async fn manifest_is_create_only_and_a_second_write_reads_the_first_back() {
        let (store, _) = store_from_url("memory://", &[]).expect("memory store");
        let key = Path::from("ns/job/uid/00-out.manifest.json");
        let first = manifest(1);
        assert_eq!(
            write_manifest(&store, &key, &first).await.expect("write"),
            ManifestWrite::Created
        );
        let second = write_manifest(&store, &key, &manifest(2))
            .await
            .expect("write");
        assert_eq!(
            second,
            ManifestWrite::AlreadyCommitted(Box::new(first.clone()))
        );
        assert_eq!(read_manifest(&store, &key).await.expect("read").attempt, 1);
        assert!(
            first.started_at.ends_with('Z'),
            "RFC 3339: {}",
            first.started_at
        );
    }

    /// Issue #38: a tenant's 1.2 GiB object at its run's manifest key was read whole before each
    /// drain attempt. An object larger than any manifest is refused by its size, unread, and
    /// named; the bound is what a drain can write at most.
    #[tokio::test]
    async fn an_object_at_a_manifest_key_larger_than_any_manifest_is_refused_unread() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let key = Path::from("ns/job/uid/00-out.manifest.json");
        let json = serde_json::to_vec(&manifest(1)).expect("json");
        store
            .put(&key, PutPayload::from(json.clone()))
            .await
            .expect("put");
        let max = json.len() as u64;
        assert!(read_manifest_within(&store, &key, max).await.is_ok());
        let refused = read_manifest_within(&store, &key, max - 1).await;
        match refused {
            Err(ref e @ StoreError::ManifestTooLarge { size, .. }) => {
                assert_eq!(size, max);
                assert!(e.is_permanent());
                assert!(e.to_string().contains("00-out.manifest.json"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        let largest_written = 2 * crate::caps::MAX_METADATA_ALLOWANCE + 16 * 1024 * 1024;
        assert_eq!(MAX_MANIFEST_BYTES, largest_written);
    }

    #[tokio::test]
    async fn list_manifests_returns_every_committed_path_of_a_run_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = url::Url::from_directory_path(dir.path())
            .expect("url")
            .to_string();
        let (store, prefix) = store_from_url(&url, &[]).expect("file store");
        let keys0 = object_keys(&prefix, &run(), 0, "/a", Compression::None);
        let keys1 = object_keys(&prefix, &run(), 1, "/b", Compression::Gzip);
        write_manifest(&store, &keys1.manifest, &manifest(1))
            .await
            .expect("write");
        write_manifest(&store, &keys0.manifest, &manifest(1))
            .await
            .expect("write");
        store
            .put(&keys0.archive, PutPayload::from_static(b"tar"))
            .await
            .expect("put");
        let other = RunId {
            name: "other".into(),
            ..run()
        };
        let keys_other = object_keys(&prefix, &other, 0, "/a", Compression::None);
        write_manifest(&store, &keys_other.manifest, &manifest(1))
            .await
            .expect("write");
        let listed = list_manifests(&store, &prefix, "ns", "job")
            .await
            .expect("list");
        let listed: Vec<_> = listed.into_iter().map(|(k, _)| k).collect();
        assert_eq!(listed, vec![keys0.manifest, keys1.manifest]);
        let missing = read_manifest(&store, &Path::from("nope.manifest.json")).await;
        assert!(
            matches!(missing, Err(StoreError::NotFound { .. })),
            "{missing:?}"
        );
    }
}
