//! One drain in progress (the streaming pipeline of [`super::archive::drain_stream`]): the
//! parser's entries, each sanitized, metered against the path's cap and metadata allowance, and
//! the accepted members re-emitted into the stored archive while their content is hashed; what
//! was dropped or rejected listed, bounded.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::StreamExt;
use sha2::Digest;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use crate::caps::{self as cap, Admit, CapMeter, MetadataMeter};
use crate::store::manifest::{
    DrainOutcome, DroppedRecord, MemberRecord, RejectedRecord, DROPPED_INPUT_BOUND,
    DROPPED_METADATA, DROPPED_OVER_CAP,
};
use crate::tar::entry::RawEntry;
use crate::tar::notes::InBandNotes;
use crate::tar::sanitize::{self, Decision, EntryKind, MemberKind, Reason, Sanitizer};
use crate::tar::ustar;

use super::options::*;
use super::stream_io::*;
use super::tar_headers::*;

/// One drain in progress: parser, sanitizer, meters and re-emitter.
pub(super) struct Pipeline<'o, W: AsyncWrite + Unpin + Send> {
    opts: &'o DrainOptions,
    pub(super) state: Arc<MeterState>,
    pub(super) builder: tokio_tar::Builder<Encoder<CountingWriter<W>>>,
    sanitizer: Sanitizer,
    meter: CapMeter,
    metadata: MetadataMeter,
    /// Bytes of dropped and rejected records listed so far ([`MAX_LISTED_RECORD_BYTES`]).
    listed_bytes: u64,
    /// Where each stored path is in `outcome.members` (the latest one).
    stored: PathIndex,
    pub(super) outcome: DrainOutcome,
}

/// Stored paths → their latest position in the member list, without a second copy of the paths
/// (they are what the metadata allowance bounds): keyed by a randomly seeded hash, each position
/// checked against the member's path.
#[derive(Default)]
struct PathIndex {
    hasher: std::collections::hash_map::RandomState,
    positions: std::collections::HashMap<u64, Vec<usize>>,
}

impl PathIndex {
    fn key(&self, path: &str) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(path)
    }

    /// The latest position of `path` in `members`.
    fn get(&self, path: &str, members: &[MemberRecord]) -> Option<usize> {
        self.positions
            .get(&self.key(path))?
            .iter()
            .copied()
            .find(|&i| members.get(i).is_some_and(|m| m.path == path))
    }

    /// Records `path` at `position`, replacing its earlier position.
    fn insert(&mut self, path: &str, position: usize) {
        let key = self.key(path);
        let slot = self.positions.entry(key).or_default();
        // Positions of other paths with the same hash stay; an earlier one of this path is the
        // one `get` would find first only if it were kept, so keep the newest in front.
        slot.insert(0, position);
    }
}

impl<'o, W: AsyncWrite + Unpin + Send> Pipeline<'o, W> {
    /// A drain under `opts` reading through `state`'s meter and writing into `output`.
    pub(super) fn new(
        opts: &'o DrainOptions,
        state: Arc<MeterState>,
        output: Encoder<CountingWriter<W>>,
    ) -> Self {
        Pipeline {
            opts,
            state,
            builder: tokio_tar::Builder::new_non_terminated(output),
            sanitizer: Sanitizer::new(opts.limits),
            meter: CapMeter::new(opts.cap_bytes),
            metadata: MetadataMeter::new(opts.metadata_allowance),
            listed_bytes: 0,
            stored: PathIndex::default(),
            outcome: DrainOutcome::default(),
        }
    }
}

impl<W: AsyncWrite + Unpin + Send> Pipeline<'_, W> {
    pub(super) fn progress(&self) -> Progress {
        Progress {
            input_bytes: self.state.total.load(Ordering::Relaxed),
            entries: self.sanitizer.entries_seen(),
            members: self.outcome.members.len() as u64,
            bytes: self.outcome.bytes,
        }
    }

    fn fail(&self, kind: DrainErrorKind) -> DrainError {
        DrainError {
            kind,
            progress: self.progress(),
        }
    }

    /// Turns an I/O error seen while reading the stream into what actually went wrong.
    fn read_failure(&self, err: io::Error) -> DrainError {
        let kind = match self.state.tripped.load(Ordering::Relaxed) {
            TRIPPED_INPUT => DrainErrorKind::InputLimit {
                limit: self.opts.max_input_bytes,
            },
            TRIPPED_HEADER => DrainErrorKind::HeaderLimit {
                limit: self.opts.max_header_bytes,
            },
            TRIPPED_EXTENSION => DrainErrorKind::ExtensionTooLarge {
                what: extension_name(self.state.extension_type.load(Ordering::Relaxed)),
                size: self.state.extension_size.load(Ordering::Relaxed),
                limit: MAX_EXTENSION_BODY_BYTES,
            },
            _ if self.state.read_failed.load(Ordering::Relaxed) => DrainErrorKind::Read(err),
            _ if self.state.eof.load(Ordering::Relaxed) => {
                DrainErrorKind::Truncated(err.to_string())
            }
            _ => DrainErrorKind::Malformed(err.to_string()),
        };
        self.fail(kind)
    }

    pub(super) async fn entries<R: AsyncRead + Unpin + Send>(
        &mut self,
        archive: &mut tokio_tar::Archive<MeteredReader<R>>,
    ) -> Result<(), DrainError> {
        let mut entries = archive.entries().map_err(|e| self.read_failure(e))?;
        // Where the parser reads the next header: after the previous entry's content (what the
        // parser really skips, see `parser_skip`) and its padding.
        let mut next_header_at = 0u64;
        loop {
            let skip = next_header_at.saturating_sub(self.state.total.load(Ordering::Relaxed));
            self.state.open_window(
                self.opts
                    .max_header_bytes
                    .saturating_add(skip)
                    .saturating_add(512),
                next_header_at,
            );
            let next = entries.next().await;
            self.state.close_window();
            let mut entry = match next {
                None => break,
                Some(Ok(entry)) => entry,
                // The bound was reached between two members: every member so far is whole.
                Some(Err(_)) if self.state.tripped.load(Ordering::Relaxed) == TRIPPED_INPUT => {
                    self.stop_at_input_bound();
                    return Ok(());
                }
                Some(Err(e)) => return Err(self.read_failure(e)),
            };
            let next = self.entry(&mut entry).await?;
            next_header_at = parser_next_header(&mut entry).await;
            if next == Next::Stop {
                self.stop_at_input_bound();
                return Ok(());
            }
            // Skipping what the entry announced would take the stream past the bound: stop now
            // rather than read it for nothing.
            let skip = next_header_at.saturating_sub(self.state.total.load(Ordering::Relaxed));
            if self.would_cross_input_bound(skip) {
                self.stop_at_input_bound();
                return Ok(());
            }
        }
        if self.state.eof.load(Ordering::Relaxed) {
            return Err(self.fail(DrainErrorKind::Truncated(
                "the stream ended without an end-of-archive marker".into(),
            )));
        }
        Ok(())
    }

    /// Whether reading `bytes` more would take the stream past the input bound.
    fn would_cross_input_bound(&self, bytes: u64) -> bool {
        self.state
            .total
            .load(Ordering::Relaxed)
            .saturating_add(bytes)
            > self.opts.max_input_bytes
    }

    fn stop_at_input_bound(&mut self) {
        tracing::info!(
            limit = self.opts.max_input_bytes,
            input_bytes = self.state.total.load(Ordering::Relaxed),
            members = self.outcome.members.len(),
            "the stream reached the drain's input bound; keeping the members read so far"
        );
        self.outcome.stopped_at_input_bound = Some(self.opts.max_input_bytes);
    }

    /// Records a stored member; the member stored earlier at the same path, if any, is
    /// superseded by it.
    fn keep(&mut self, record: MemberRecord, earlier: Option<usize>) {
        if let Some(i) = earlier {
            tracing::debug!(path = %record.path, "a later member replaces an earlier one (last wins)");
            self.outcome.members[i].superseded = true;
        }
        self.stored.insert(&record.path, self.outcome.members.len());
        self.outcome.members.push(record);
    }

    /// A member the sanitizer accepted is not stored after all: a symlink is forgotten, so what
    /// the sanitizer remembers stays within the stored members, which the metadata allowance
    /// bounds (docs/contract.md "Drain memory").
    fn not_stored(&mut self, kind: MemberKind, path: &str) {
        if kind == MemberKind::Symlink {
            self.sanitizer.forget_symlink(path);
        }
    }

    /// Lists a dropped file, or only counts it once the listed records reach their bound
    /// ([`DrainOptions::max_listed_record_bytes`]).
    fn push_dropped(&mut self, record: DroppedRecord) {
        let cost = RECORD_OVERHEAD_BYTES.saturating_add(record.path.len() as u64);
        if self.listed_bytes.saturating_add(cost) <= self.opts.max_listed_record_bytes {
            self.listed_bytes += cost;
            self.outcome.dropped.push(record);
        } else {
            self.outcome.unlisted_dropped += 1;
            self.outcome.unlisted_dropped_bytes = self
                .outcome
                .unlisted_dropped_bytes
                .saturating_add(record.size);
        }
    }

    /// Lists a rejected entry, or only counts it once the listed records reach their bound.
    fn push_rejected(&mut self, record: RejectedRecord) {
        let cost = RECORD_OVERHEAD_BYTES.saturating_add(record.path.len() as u64);
        if self.listed_bytes.saturating_add(cost) <= self.opts.max_listed_record_bytes {
            self.listed_bytes += cost;
            self.outcome.rejected.push(record);
        } else {
            self.outcome.unlisted_rejected += 1;
        }
    }

    /// Handles one entry: go on with the next one, or stop the drain here (the entry's content
    /// would cross the input bound).
    async fn entry<R: AsyncRead + Unpin + Send>(
        &mut self,
        entry: &mut tokio_tar::Entry<tokio_tar::Archive<R>>,
    ) -> Result<Next, DrainError> {
        let header = entry.header();
        let mode = header.mode().unwrap_or(0o644) & 0o777;
        let mtime = header.mtime().unwrap_or(0);
        let malformed = |e: io::Error| self.fail(DrainErrorKind::Malformed(e.to_string()));
        let mut raw = RawEntry::read(entry).map_err(malformed)?;
        if raw.kind == EntryKind::File && has_gnu_sparse_records(entry).await {
            raw.kind = EntryKind::Sparse;
        }
        let drop_record = match raw.kind {
            EntryKind::File | EntryKind::Directory | EntryKind::Symlink => {
                pax_value(entry, ustar::DROPPED_KEY).await
            }
            _ => None,
        };
        let accepted = match raw.judge(&mut self.sanitizer) {
            Decision::Ignore => {
                // The root entry: the packer's in-band notes ride on it (crate::tar::notes).
                if raw.kind == EntryKind::Directory {
                    self.take_notes(entry).await;
                }
                return Ok(Next::Continue);
            }
            Decision::Reject(reason) if reason.is_fatal() => {
                return Err(self.fail(DrainErrorKind::TooManyEntries {
                    limit: self.opts.limits.max_entries,
                }));
            }
            Decision::Reject(reason) => {
                self.push_rejected(rejected_record(&raw, reason));
                return Ok(Next::Continue);
            }
            Decision::Accept(accepted) => accepted,
        };
        if let Some(value) = drop_record {
            self.dropped_in_pod(&raw, accepted, &value);
            return Ok(Next::Continue);
        }
        let metadata_cost = cap::metadata_cost(&accepted.path, accepted.link_target.as_deref());
        let record = MemberRecord {
            path: accepted.path,
            kind: accepted.kind,
            size: 0,
            sha256: None,
            mode: if accepted.kind == MemberKind::Symlink {
                0o777
            } else {
                mode
            },
            link_target: accepted.link_target,
            superseded: false,
        };
        // A path stored earlier: the last one wins (the earlier is marked superseded once this
        // one is stored), unless one of them is a directory and the other is not — replacing a
        // directory that may hold members, or a member by a directory, has no safe reading.
        let earlier = self.stored.get(&record.path, &self.outcome.members);
        if let Some(i) = earlier {
            let kind = self.outcome.members[i].kind;
            if kind != record.kind && (kind == MemberKind::Dir || record.kind == MemberKind::Dir) {
                self.push_rejected(rejected_record(&raw, Reason::DuplicatePath));
                self.not_stored(record.kind, &record.path);
                return Ok(Next::Continue);
            }
        }
        let stored = Stored {
            record,
            earlier,
            mtime,
            metadata_cost,
        };
        match stored.record.kind {
            MemberKind::File => self.file(entry, stored, raw.size).await,
            MemberKind::Dir | MemberKind::Symlink => self.dir_or_link(stored).await,
        }
    }

    /// An entry the packer dropped in the pod (a placeholder with its PAX drop record): listed
    /// as dropped with the size it declares, or rejected when the record does not add up.
    fn dropped_in_pod(&mut self, raw: &RawEntry, accepted: sanitize::Accepted, value: &[u8]) {
        self.not_stored(accepted.kind, &accepted.path);
        match sanitize::dropped_in_pod(accepted.kind, raw.size, value) {
            Ok(declared) => {
                self.meter.record_drop(declared);
                self.push_dropped(DroppedRecord {
                    path: accepted.path,
                    size: declared,
                    reason: DROPPED_OVER_CAP.into(),
                    in_pod: true,
                });
            }
            Err(reason) => self.push_rejected(rejected_record(raw, reason)),
        }
    }

    /// A regular file: stopped before at the input bound, dropped over the cap or the metadata
    /// allowance, else its content streamed into the archive and hashed.
    async fn file<R: AsyncRead + Unpin + Send>(
        &mut self,
        entry: &mut tokio_tar::Entry<tokio_tar::Archive<R>>,
        stored: Stored,
        size: u64,
    ) -> Result<Next, DrainError> {
        if let Some(next) = self.file_not_stored(&stored, size) {
            return Ok(next);
        }
        let Stored {
            mut record,
            earlier,
            mtime,
            metadata_cost,
        } = stored;
        self.metadata.admit(metadata_cost);
        let header = self
            .header(tokio_tar::EntryType::Regular, &record, size, mtime)
            .await?;
        let mut source = HashingReader::new(&mut *entry, size);
        if let Err(e) = self.builder.append(&header, &mut source).await {
            return Err(self.append_failure(e, &source, &record.path, size));
        }
        record.size = size;
        record.sha256 = Some(hex::encode(source.hasher.finalize()));
        self.outcome.bytes += size;
        self.keep(record, earlier);
        Ok(Next::Continue)
    }

    /// Whether a file of `size` bytes is left out (listed as dropped), and what the drain does
    /// then; None when it is to be stored.
    fn file_not_stored(&mut self, stored: &Stored, size: u64) -> Option<Next> {
        let (next, reason) = if self.would_cross_input_bound(size) {
            // Its content cannot be read whole within the bound: stop before it, so the
            // stored archive never holds a member cut short.
            let reason = if self.meter.fits(size) {
                self.meter.record_drop(size);
                DROPPED_INPUT_BOUND
            } else {
                self.meter.admit(size);
                DROPPED_OVER_CAP
            };
            (Next::Stop, reason)
        } else if self.meter.fits(size) && !self.metadata.fits(stored.metadata_cost) {
            // Its content fits the cap, but its name would take the stored metadata past
            // the path's allowance (docs/contract.md, "Unbounded size").
            self.meter.record_drop(size);
            (Next::Continue, DROPPED_METADATA)
        } else if self.meter.admit(size) == Admit::Drop {
            (Next::Continue, DROPPED_OVER_CAP)
        } else {
            return None;
        };
        self.push_dropped(DroppedRecord {
            path: stored.record.path.clone(),
            size,
            reason: reason.into(),
            in_pod: false,
        });
        Some(next)
    }

    /// Whose failure a file's append is: the input's (cut short, or a read that failed) or the
    /// archive writer's.
    fn append_failure<E>(
        &self,
        e: io::Error,
        source: &HashingReader<E>,
        path: &str,
        size: u64,
    ) -> DrainError {
        let state = &self.state;
        let input_side = state.tripped.load(Ordering::Relaxed) != TRIPPED_NONE
            || state.read_failed.load(Ordering::Relaxed);
        let cut_short = source.short || state.eof.load(Ordering::Relaxed);
        if !input_side && cut_short {
            self.fail(DrainErrorKind::Truncated(format!(
                "member {path:?} ended after {} of {size} bytes",
                source.read
            )))
        } else if input_side || source.failed {
            self.read_failure(e)
        } else {
            self.fail(DrainErrorKind::Write(e))
        }
    }

    /// A directory or a symlink: stored (no content) unless it would take the stored metadata
    /// past the path's allowance.
    async fn dir_or_link(&mut self, stored: Stored) -> Result<Next, DrainError> {
        let Stored {
            record,
            earlier,
            mtime,
            metadata_cost,
        } = stored;
        if self.metadata.admit(metadata_cost) == Admit::Drop {
            self.not_stored(record.kind, &record.path);
            self.push_dropped(DroppedRecord {
                path: record.path,
                size: 0,
                reason: DROPPED_METADATA.into(),
                in_pod: false,
            });
            return Ok(Next::Continue);
        }
        let ty = if record.kind == MemberKind::Dir {
            tokio_tar::EntryType::Directory
        } else {
            tokio_tar::EntryType::Symlink
        };
        let header = self.header(ty, &record, 0, mtime).await?;
        self.builder
            .append(&header, tokio::io::empty())
            .await
            .map_err(|e| self.fail(DrainErrorKind::Write(e)))?;
        self.keep(record, earlier);
        // A directory or link has no content; whatever a hostile header claims, the
        // parser skips.
        Ok(Next::Continue)
    }

    /// Keeps the packer's notes if the root entry carries them: never stored, only recorded
    /// ([`DrainOutcome::in_band_notes`]; docs/contract.md, "The packer's notes travel in-band").
    /// Reads nothing from the stream: a directory's PAX records are already held.
    async fn take_notes<R: AsyncRead + Unpin>(&mut self, entry: &mut tokio_tar::Entry<R>) {
        let Ok(Some(records)) = entry.pax_extensions().await else {
            return;
        };
        let pairs = records.flatten().map(|r| (r.key_bytes(), r.value_bytes()));
        if let Some(notes) = InBandNotes::decode(pairs) {
            match &mut self.outcome.in_band_notes {
                Some(earlier) => earlier.absorb(notes),
                None => self.outcome.in_band_notes = Some(notes),
            }
        }
    }

    /// Builds the ustar header of a re-emitted member, writing a PAX `x` header first when its
    /// path, link target or size does not fit ustar.
    async fn header(
        &mut self,
        ty: tokio_tar::EntryType,
        record: &MemberRecord,
        size: u64,
        mtime: u64,
    ) -> Result<tokio_tar::Header, DrainError> {
        let mut header = tokio_tar::Header::new_ustar();
        header.set_entry_type(ty);
        header.set_mode(record.mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(mtime);
        header.set_size(size);
        let mut path = record.path.clone().into_bytes();
        if ty == tokio_tar::EntryType::Directory {
            path.push(b'/');
        }
        let link = record.link_target.as_deref().map(str::as_bytes);
        let pax = ustar::fill(header.as_mut_bytes(), &path, link, size);
        if !pax.is_empty() {
            let x = ustar::pax_header(pax.len() as u64);
            self.builder
                .append(tokio_tar::Header::from_byte_slice(&x), pax.as_slice())
                .await
                .map_err(|e| self.fail(DrainErrorKind::Write(e)))?;
        }
        header.set_cksum();
        Ok(header)
    }

    /// After the end-of-archive marker: the rest of the stream must be zero padding.
    pub(super) async fn trailer<R: AsyncRead + Unpin + Send>(
        &mut self,
        archive: &mut tokio_tar::Archive<MeteredReader<R>>,
    ) -> Result<(), DrainError> {
        let mut buf = [0u8; 8192];
        loop {
            let n = archive
                .read(&mut buf)
                .await
                .map_err(|e| self.read_failure(e))?;
            if n == 0 {
                return Ok(());
            }
            if buf[..n].iter().any(|b| *b != 0) {
                return Err(self.fail(DrainErrorKind::TrailingGarbage));
            }
        }
    }
}

/// A member the sanitizer accepted, on its way into the archive.
struct Stored {
    record: MemberRecord,
    /// The stored member of the same path it supersedes, if any.
    earlier: Option<usize>,
    mtime: u64,
    /// What its name and link target take of the path's metadata allowance.
    metadata_cost: u64,
}

/// The record of a rejected entry, its path bounded.
pub(super) fn rejected_record(raw: &RawEntry, reason: Reason) -> RejectedRecord {
    let path = &raw.path;
    tracing::debug!(path = %String::from_utf8_lossy(path), %reason, "rejected tar entry");
    RejectedRecord {
        path: bounded_lossy(path, MAX_REJECTED_PATH_BYTES),
        entry_type: char::from(raw.type_byte).escape_default().to_string(),
        size: raw.size,
        reason,
    }
}

/// What the drain does after an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// Go on with the next entry.
    Continue,
    /// Stop reading: the input bound would be crossed (see the module doc).
    Stop,
}
