//! The streaming drain pipeline: parse the holder's UNTRUSTED tar stream, sanitize every entry,
//! meter files against the cap, and re-emit the accepted members as a fresh archive (optionally
//! compressed) while hashing their content — in constant memory: content is streamed member by
//! member through fixed buffers, never held whole.
//!
//! The parser is `astral-tokio-tar` (lib `tokio_tar`), the fork fixed for CVE-2025-62518: a PAX
//! `size` record overrides the ustar size, so a member's content cannot be re-read as smuggled
//! headers. The re-emitted archive is written by us, with sizes we counted, so whatever a reader
//! makes of the input, the stored archive has one unambiguous reading.
//!
//! A drain that fails is an error with what was read before it, never an empty or silently
//! truncated set (ADR-143 §4): a truncated stream, garbage, trailing junk, a stream that goes on
//! past its end-of-archive marker up to the input bound, and an entry flood are all errors.
//!
//! The input bound (4 × cap + 256 MiB, [`DrainOptions::new`]) is the guard against an endless or
//! hostile stream, not a failure of what was already read: when the members of the stream would
//! take it past the bound, the drain stops reading right there — before a member whose content
//! would cross it, so no member is ever stored cut short — lists that member as dropped, and ends
//! `Capped` with every member read so far ([`DrainOutcome::stopped_at_input_bound`]). What came
//! after that point was never seen.
//!
//! Members the packer dropped in the pod (`pack --budget`) arrive as zero-length placeholders with
//! a `SANDBOXRUN.dropped` PAX record; they are validated ([`crate::tar::sanitize::dropped_in_pod`]) and listed
//! as dropped like the members this meter drops (docs/contract.md, "Unbounded size").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use object_store::ObjectStore;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::store::manifest::DrainOutcome;
use crate::store::{self, Manifest, ManifestContext, ObjectKeys, StoreError};

#[cfg(test)]
pub(crate) use super::options::MAX_EXTENSION_BODY_BYTES;
pub use super::options::{DrainError, DrainErrorKind, DrainOptions, Progress};
use super::pipeline::Pipeline;
use super::stream_io::*;

/// Drains one tar stream into `output`: see the module doc. On success the output has been shut
/// down (the compressor finished; for an object-store writer, the upload completed). On error the
/// output is left as is: the caller aborts it (see [`drain_into_store`]).
pub async fn drain_stream<R, W>(
    input: R,
    output: W,
    opts: &DrainOptions,
) -> Result<DrainOutcome, DrainError>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    let state = Arc::new(MeterState::default());
    let reader = MeteredReader {
        inner: input,
        state: Arc::clone(&state),
        max_input: opts.max_input_bytes,
        watch: None,
    };
    let archive_bytes = Arc::new(AtomicU64::new(0));
    let counted = CountingWriter {
        inner: output,
        count: Arc::clone(&archive_bytes),
    };
    let mut pipeline = Pipeline::new(opts, state, Encoder::new(counted, opts.compression));
    let mut archive = tokio_tar::ArchiveBuilder::new(reader)
        .set_ignore_zeros(false)
        .build();
    pipeline.entries(&mut archive).await?;
    if pipeline.outcome.stopped_at_input_bound.is_none() {
        pipeline.trailer(&mut archive).await?;
    }
    let progress = pipeline.progress();
    let write_failed = move |e| DrainError {
        kind: DrainErrorKind::Write(e),
        progress,
    };
    let mut encoder = pipeline.builder.into_inner().await.map_err(write_failed)?;
    encoder.shutdown().await.map_err(write_failed)?;
    pipeline.outcome.input_bytes = pipeline.state.total.load(Ordering::Relaxed);
    pipeline.outcome.archive_bytes = archive_bytes.load(Ordering::Relaxed);
    tracing::debug!(
        members = pipeline.outcome.members.len(),
        dropped = pipeline.outcome.dropped_count(),
        rejected = pipeline.outcome.rejected_count(),
        bytes = pipeline.outcome.bytes,
        input_bytes = pipeline.outcome.input_bytes,
        stopped_at_input_bound = ?pipeline.outcome.stopped_at_input_bound,
        "drained tar stream"
    );
    Ok(pipeline.outcome)
}

/// Drains `input` into `keys.archive` with a constant-memory multipart upload, then commits it by
/// writing the manifest create-only (ADR-143 §3, DESIGN "Object layout").
///
/// - a manifest already at `keys.manifest` means an earlier attempt committed: it is returned as
///   is, without draining again (the archive it describes must not be overwritten);
/// - any failure aborts the multipart upload, so no orphaned parts stay behind;
/// - a manifest committed concurrently (create-only refused) is accepted only when it lists the
///   same content; otherwise the drain fails with [`DrainErrorKind::ManifestConflict`].
pub async fn drain_into_store<R>(
    input: R,
    store: &Arc<dyn ObjectStore>,
    keys: &ObjectKeys,
    opts: &DrainOptions,
    manifest_ctx: ManifestContext,
) -> Result<(DrainOutcome, Manifest), DrainError>
where
    R: AsyncRead + Unpin + Send,
{
    let store_err = |e: StoreError| DrainError {
        kind: DrainErrorKind::Store(e),
        progress: Progress::default(),
    };
    if let Some(existing) = store::try_read_manifest(store, &keys.manifest)
        .await
        .map_err(store_err)?
    {
        tracing::info!(manifest = %keys.manifest, "read-back path already committed; not draining again");
        return Ok((existing.outcome(), existing));
    }
    let started = jiff::Timestamp::now();
    let mut writer = store::archive_writer(
        Arc::clone(store),
        keys.archive.clone(),
        opts.max_input_bytes,
    );
    let outcome = match drain_stream(input, &mut writer, opts).await {
        Ok(outcome) => outcome,
        Err(err) => {
            if let Err(abort) = writer.abort().await {
                tracing::warn!(archive = %keys.archive, error = %abort, "aborting the multipart upload failed");
            }
            return Err(err);
        }
    };
    let progress = Progress {
        input_bytes: outcome.input_bytes,
        entries: (outcome.members.len() as u64)
            .saturating_add(outcome.dropped_count())
            .saturating_add(outcome.rejected_count()),
        members: outcome.members.len() as u64,
        bytes: outcome.bytes,
    };
    let manifest = Manifest::from_outcome(
        &manifest_ctx,
        keys,
        opts.stored(),
        outcome,
        started,
        jiff::Timestamp::now(),
    );
    match store::write_manifest(store, &keys.manifest, &manifest).await {
        Ok(store::ManifestWrite::Created) => Ok((manifest.outcome(), manifest)),
        Ok(store::ManifestWrite::AlreadyCommitted(existing)) => {
            if existing.same_content(&manifest) {
                Ok((existing.outcome(), *existing))
            } else {
                Err(DrainError {
                    kind: DrainErrorKind::ManifestConflict {
                        key: keys.manifest.to_string(),
                    },
                    progress,
                })
            }
        }
        Err(e) => Err(DrainError {
            kind: DrainErrorKind::Store(e),
            progress,
        }),
    }
}
