//! The byte adapters of the drain pipeline (src/drain/archive.rs): the metered reader that bounds
//! what the parser may read (the input bound, the header window, the extension bodies), the
//! hashing reader, and the counting, compressing writer of the re-emitted archive.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use async_compression::tokio::write::{GzipEncoder, ZstdEncoder};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::options::MAX_EXTENSION_BODY_BYTES;
use crate::api::Compression;

pub(super) const TRIPPED_NONE: u8 = 0;
pub(super) const TRIPPED_INPUT: u8 = 1;
pub(super) const TRIPPED_HEADER: u8 = 2;
pub(super) const TRIPPED_EXTENSION: u8 = 3;
/// [`MeterState::watch_at`] when no header is watched.
pub(super) const NOT_WATCHING: u64 = u64::MAX;

/// What the metered reader saw, shared with the drain (the parser owns the reader).
#[derive(Debug)]
pub(super) struct MeterState {
    pub(super) total: AtomicU64,
    pub(super) window: AtomicU64,
    pub(super) window_limit: AtomicU64,
    pub(super) eof: AtomicBool,
    pub(super) read_failed: AtomicBool,
    pub(super) tripped: AtomicU8,
    /// Stream offset of the next header the parser reads, while the drain is between members.
    pub(super) watch_at: AtomicU64,
    /// Type flag and announced size of the extension header that tripped [`TRIPPED_EXTENSION`].
    pub(super) extension_type: AtomicU8,
    pub(super) extension_size: AtomicU64,
}

impl Default for MeterState {
    fn default() -> Self {
        MeterState {
            total: AtomicU64::new(0),
            window: AtomicU64::new(0),
            window_limit: AtomicU64::new(u64::MAX),
            eof: AtomicBool::new(false),
            read_failed: AtomicBool::new(false),
            tripped: AtomicU8::new(TRIPPED_NONE),
            watch_at: AtomicU64::new(NOT_WATCHING),
            extension_type: AtomicU8::new(0),
            extension_size: AtomicU64::new(0),
        }
    }
}

impl MeterState {
    /// From now on, at most `limit` bytes may be read (the parser is between members), and the
    /// headers from stream offset `next_header_at` on are watched for extension records.
    pub(super) fn open_window(&self, limit: u64, next_header_at: u64) {
        self.window.store(0, Ordering::Relaxed);
        self.window_limit.store(limit, Ordering::Relaxed);
        self.watch_at.store(next_header_at, Ordering::Relaxed);
    }

    /// Member content is being read: only the total bound applies.
    pub(super) fn close_window(&self) {
        self.window_limit.store(u64::MAX, Ordering::Relaxed);
        self.watch_at.store(NOT_WATCHING, Ordering::Relaxed);
    }
}

/// The stream as the parser sees it: counts bytes, notices EOF and transport errors, and enforces
/// the input and header bounds — and, between members, looks at each header block as it passes:
/// a PAX or GNU long-name/link header announcing a body over [`MAX_EXTENSION_BODY_BYTES`] fails
/// the read that delivers it, so the parser never reads (or allocates for) that body.
pub(super) struct MeteredReader<R> {
    pub(super) inner: R,
    pub(super) state: Arc<MeterState>,
    pub(super) max_input: u64,
    pub(super) watch: Option<HeaderWatch>,
}

/// The header block being collected between members.
pub(super) struct HeaderWatch {
    /// The offset the drain asked to watch from (a new one restarts the watch).
    pub(super) origin: u64,
    /// Offset of the block being collected.
    pub(super) at: u64,
    pub(super) block: [u8; 512],
    pub(super) filled: usize,
}

/// What a header block says, as far as the watch cares.
pub(super) enum Block {
    /// An extension header (`x`, `L`, `K`) with the size of its body.
    Extension(u8, u64),
    /// Anything else: a member, the end marker, or something the parser will judge.
    Other,
}

pub(super) fn classify(block: &[u8; 512]) -> Block {
    let type_byte = block[156];
    if !matches!(type_byte, b'x' | b'L' | b'K') {
        return Block::Other;
    }
    match tokio_tar::Header::from_byte_slice(block).raw_entry_size() {
        Ok(size) => Block::Extension(type_byte, size),
        Err(_) => Block::Other,
    }
}

impl<R> MeteredReader<R> {
    /// Feeds `data`, read at stream offset `offset`, to the header watch. Returns the extension
    /// header that must be refused, if one passed.
    pub(super) fn watch_headers(&mut self, offset: u64, data: &[u8]) -> Option<(u8, u64)> {
        let want = self.state.watch_at.load(Ordering::Relaxed);
        if want == NOT_WATCHING {
            self.watch = None;
            return None;
        }
        if self.watch.as_ref().is_none_or(|w| w.origin != want) {
            self.watch = Some(HeaderWatch {
                origin: want,
                at: want,
                block: [0u8; 512],
                filled: 0,
            });
        }
        let end = offset.saturating_add(data.len() as u64);
        loop {
            let w = self.watch.as_mut()?;
            let need = w.at.saturating_add(w.filled as u64);
            if need >= end {
                return None;
            }
            if need < offset {
                // The block began before this read: a position the drain mis-predicted. Stop
                // watching; the window still bounds what the parser reads.
                self.watch = None;
                return None;
            }
            let start = usize::try_from(need - offset).unwrap_or(usize::MAX);
            let n = (512 - w.filled).min(data.len().saturating_sub(start));
            w.block[w.filled..w.filled + n].copy_from_slice(&data[start..start + n]);
            w.filled += n;
            if w.filled < 512 {
                return None;
            }
            match classify(&w.block) {
                Block::Extension(ty, size) if size > MAX_EXTENSION_BODY_BYTES => {
                    return Some((ty, size));
                }
                Block::Extension(_, size) => {
                    // The body follows, then the next header.
                    w.at =
                        w.at.saturating_add(512)
                            .saturating_add(size.div_ceil(512).saturating_mul(512));
                    w.filled = 0;
                }
                Block::Other => {
                    self.watch = None;
                    return None;
                }
            }
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for MeteredReader<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.state.tripped.load(Ordering::Relaxed) != TRIPPED_NONE {
            return Poll::Ready(Err(io::Error::other("drain input bound exceeded")));
        }
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        if let Err(e) = ready!(Pin::new(&mut self.inner).poll_read(cx, buf)) {
            self.state.read_failed.store(true, Ordering::Relaxed);
            return Poll::Ready(Err(e));
        }
        let n = (buf.filled().len() - before) as u64;
        let state = &self.state;
        if n == 0 {
            state.eof.store(true, Ordering::Relaxed);
            return Poll::Ready(Ok(()));
        }
        let total = state.total.fetch_add(n, Ordering::Relaxed) + n;
        if total > self.max_input {
            state.tripped.store(TRIPPED_INPUT, Ordering::Relaxed);
            return Poll::Ready(Err(io::Error::other("drain input bound exceeded")));
        }
        let this = &mut *self;
        if let Some((ty, size)) = this.watch_headers(total - n, &buf.filled()[before..]) {
            let state = &this.state;
            state.extension_type.store(ty, Ordering::Relaxed);
            state.extension_size.store(size, Ordering::Relaxed);
            state.tripped.store(TRIPPED_EXTENSION, Ordering::Relaxed);
            return Poll::Ready(Err(io::Error::other(
                "extension record over the drain's bound",
            )));
        }
        let state = &self.state;
        let window = state.window.fetch_add(n, Ordering::Relaxed) + n;
        if window > state.window_limit.load(Ordering::Relaxed) {
            state.tripped.store(TRIPPED_HEADER, Ordering::Relaxed);
            return Poll::Ready(Err(io::Error::other("drain header bound exceeded")));
        }
        Poll::Ready(Ok(()))
    }
}

/// Reads exactly `size` bytes of a member, hashing them; a member cut short is an error (never a
/// padded or shorter member in the stored archive).
pub(super) struct HashingReader<R> {
    pub(super) inner: R,
    pub(super) remaining: u64,
    pub(super) read: u64,
    pub(super) hasher: Sha256,
    pub(super) short: bool,
    pub(super) failed: bool,
}

impl<R> HashingReader<R> {
    pub(super) fn new(inner: R, size: u64) -> Self {
        HashingReader {
            inner,
            remaining: size,
            read: 0,
            hasher: Sha256::new(),
            short: false,
            failed: false,
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for HashingReader<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.remaining == 0 || buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        // The entry itself never yields more than its size: no limit needed here.
        let before = buf.filled().len();
        if let Err(e) = ready!(Pin::new(&mut self.inner).poll_read(cx, buf)) {
            self.failed = true;
            return Poll::Ready(Err(e));
        }
        let n = buf.filled().len() - before;
        if n == 0 {
            self.short = true;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "member cut short",
            )));
        }
        let this = &mut *self;
        this.hasher.update(&buf.filled()[before..]);
        this.remaining = this.remaining.saturating_sub(n as u64);
        this.read += n as u64;
        Poll::Ready(Ok(()))
    }
}

/// Counts the bytes of the stored archive.
pub(super) struct CountingWriter<W> {
    pub(super) inner: W,
    pub(super) count: Arc<AtomicU64>,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for CountingWriter<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut self.inner).poll_write(cx, buf))?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The chosen compression in front of the output.
pub(super) enum Encoder<W: AsyncWrite> {
    Plain(W),
    Gzip(GzipEncoder<W>),
    Zstd(ZstdEncoder<W>),
}

impl<W: AsyncWrite + Unpin> Encoder<W> {
    pub(super) fn new(inner: W, compression: Compression) -> Self {
        match compression {
            Compression::None => Encoder::Plain(inner),
            Compression::Gzip => Encoder::Gzip(GzipEncoder::new(inner)),
            Compression::Zstd => Encoder::Zstd(ZstdEncoder::new(inner)),
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Encoder<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Encoder::Plain(w) => Pin::new(w).poll_write(cx, buf),
            Encoder::Gzip(w) => Pin::new(w).poll_write(cx, buf),
            Encoder::Zstd(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Encoder::Plain(w) => Pin::new(w).poll_flush(cx),
            Encoder::Gzip(w) => Pin::new(w).poll_flush(cx),
            Encoder::Zstd(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Encoder::Plain(w) => Pin::new(w).poll_shutdown(cx),
            Encoder::Gzip(w) => Pin::new(w).poll_shutdown(cx),
            Encoder::Zstd(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}
