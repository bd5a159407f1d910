//! The constant-memory archive upload.

use std::sync::Arc;

use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::ObjectStore;

use super::upload_guard::AbortingStore;

/// Smallest multipart part S3 accepts (all but the last part).
pub const MIN_PART_BYTES: u64 = 5 * 1024 * 1024;
/// Most parts of one S3 multipart upload.
pub const MAX_PARTS: u64 = 10_000;
/// Parts uploaded concurrently: each in flight holds one part in memory (object_store's BufWriter
/// default of 8 would be 8 parts).
pub const UPLOAD_CONCURRENCY: usize = 2;

/// Part size of the multipart upload: large enough that the biggest archive a drain bounded at
/// `max_input_bytes` (`crate::drain::DrainOptions::max_input_bytes`) can emit fits in [`MAX_PARTS`] parts, never below [`MIN_PART_BYTES`], rounded up to a MiB.
pub fn part_size(max_input_bytes: u64) -> usize {
    // The re-emitted archive is a subset of the input plus our own headers (never more than the
    // input's own headers for the same members), so the input bound bounds it; keep 5% margin.
    let bound = max_input_bytes.saturating_add(max_input_bytes / 20);
    let per_part = bound.div_ceil(MAX_PARTS).max(MIN_PART_BYTES);
    let mib = 1024 * 1024;
    usize::try_from(per_part.div_ceil(mib) * mib).unwrap_or(usize::MAX)
}

/// A constant-memory writer for an archive: at most `UPLOAD_CONCURRENCY + 1` parts of
/// [`part_size`] in memory. Small archives go up as one PUT on shutdown; larger ones as a multipart
/// upload that `abort()` cleans up on failure, and that aborts itself when the writer is dropped
/// unfinished (a cancelled attempt: see [`super::upload_guard`]).
pub fn archive_writer(
    store: Arc<dyn ObjectStore>,
    key: Path,
    max_input_bytes: u64,
) -> ArchiveWriter {
    let store: Arc<dyn ObjectStore> = Arc::new(AbortingStore::new(store));
    ArchiveWriter {
        inner: BufWriter::with_capacity(store, key, part_size(max_input_bytes))
            .with_max_concurrency(UPLOAD_CONCURRENCY),
        shutdown_started: false,
    }
}

/// The archive upload: object_store's [`BufWriter`], plus the one thing it does not tell its
/// caller: whether shutdown (the final PUT or the multipart completion) has begun. `BufWriter::abort`
/// PANICS once shutdown was called ("Already shut down"), and a drain fails in shutdown exactly
/// when the store is unreachable at the end of the stream — a panic that took the whole operator
/// down. Here `abort` after a started shutdown is a no-op: the upload's future owned the
/// multipart state and dropped it, so there is nothing left this writer could abort.
pub struct ArchiveWriter {
    inner: BufWriter,
    shutdown_started: bool,
}

impl ArchiveWriter {
    /// Aborts the upload, cleaning up uploaded parts; a no-op once shutdown has begun.
    pub async fn abort(&mut self) -> object_store::Result<()> {
        if self.shutdown_started {
            return Ok(());
        }
        self.inner.abort().await
    }
}

impl tokio::io::AsyncWrite for ArchiveWriter {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.shutdown_started = true;
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Compression;
    use crate::drain::DrainOptions;
    use crate::store::store_from_url;

    #[test]
    fn part_size_fits_the_largest_archive_in_ten_thousand_parts() {
        let small = DrainOptions::new(1024, Compression::None);
        assert_eq!(part_size(small.max_input_bytes) as u64, MIN_PART_BYTES);
        let big = DrainOptions::new(16 * crate::units::GIB, Compression::None);
        let part = part_size(big.max_input_bytes) as u64;
        assert!(part * MAX_PARTS >= big.max_input_bytes, "{part}");
        assert!(
            part < 64 * 1024 * 1024,
            "parts stay small enough for constant memory: {part}"
        );
    }

    #[tokio::test]
    async fn aborting_after_a_failed_final_upload_does_not_panic() {
        use tokio::io::AsyncWriteExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("store");
        let url = url::Url::from_directory_path(&root)
            .expect("url")
            .to_string();
        let (store, prefix) = store_from_url(&url, &[]).expect("store");
        // The store becomes unusable (as an unreachable S3 is) before the upload completes.
        std::fs::remove_dir_all(&root).expect("remove root");
        std::fs::write(&root, b"not a directory").expect("block root");
        let opts = DrainOptions::new(1024, Compression::None);
        let mut w = archive_writer(store, prefix.clone().join("a.tar"), opts.max_input_bytes);
        w.write_all(b"some archive bytes").await.expect("buffered");
        assert!(w.shutdown().await.is_err(), "the final PUT must fail");
        // BufWriter::abort panics here ("Already shut down"); ours must not.
        w.abort()
            .await
            .expect("abort after a failed shutdown is a no-op");
    }
}
