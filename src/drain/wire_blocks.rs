//! The adaptive wire (`pack --wire adaptive`, docs/contract.md "The stream on the wire"): the
//! packer's tar cut into blocks of at most [`BLOCK_BYTES`], each sent zstd-compressed when that
//! makes it smaller and stored (as is) when it does not, so incompressible bytes (random data,
//! media, archives) cost neither side a compressor or a decoder.
//!
//! The format, after the 8-byte [`MAGIC`] (a NUL then letters: no tar begins so, since a tar's
//! first header names a member):
//!
//! ```text
//! stored: 0x00, len: u32 LE (1..=BLOCK_BYTES), len bytes of the tar
//! zstd:   0x01, len: u32 LE (1..=MAX_COMPRESSED), decoded: u32 LE (1..=BLOCK_BYTES), len bytes
//! end:    0x02, and nothing after it
//! ```
//!
//! The stream is the pod's, so the reader ([`BlockReader`]) trusts none of it: a length over its
//! bound, an unknown kind, a block that decodes to another size than it says or that would decode
//! past [`BLOCK_BYTES`] (a decompression bomb), bytes after the end frame, are `InvalidData`; a
//! stream that stops before its end frame is `UnexpectedEof` (cut, as a cut tar). Its memory is
//! fixed: one compressed block and one decoded block, whatever the headers say.
//!
//! The writer ([`BlockWriter`]) tries zstd's fastest level on a block and stores it when it does
//! not save at least 1/32 of it; after a block that would not shrink it stores the next 1, 2, 4, 8
//! blocks without trying (backing off), and tries every block again once one shrinks.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// The first bytes of an adaptive stream.
pub(crate) const MAGIC: [u8; 8] = *b"\0SRWIRE1";
/// Largest block, before compression (the writer's block size, and the reader's bound).
pub(crate) const BLOCK_BYTES: usize = 512 * 1024;
/// Largest compressed block the reader accepts: the writer only sends a compressed block smaller
/// than the block itself.
pub(crate) const MAX_COMPRESSED: usize = BLOCK_BYTES;
/// Most blocks stored without trying after a block that would not shrink.
const MAX_BACKOFF_BLOCKS: u32 = 8;

const KIND_STORED: u8 = 0x00;
const KIND_ZSTD: u8 = 0x01;
const KIND_END: u8 = 0x02;

/// Blocks that crossed the wire, by how: what the manifest records (`wire.storedBlocks`,
/// `wire.compressedBlocks`). Shared between the reader and the drain.
#[derive(Clone, Debug, Default)]
pub(crate) struct BlockCounts(Arc<[AtomicU64; 2]>);

impl BlockCounts {
    /// Blocks sent as is.
    pub(crate) fn stored(&self) -> u64 {
        self.0[0].load(Ordering::Relaxed)
    }

    /// Blocks sent zstd-compressed.
    pub(crate) fn compressed(&self) -> u64 {
        self.0[1].load(Ordering::Relaxed)
    }

    fn count(&self, compressed: bool) {
        self.0[usize::from(compressed)].fetch_add(1, Ordering::Relaxed);
    }
}

/// What is wrong with an adaptive stream (carried inside the reader's `io::Error`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameError {
    /// A frame kind the format does not have.
    #[error("unknown frame kind {0:#04x}")]
    UnknownKind(u8),
    /// A length of zero or over its bound.
    #[error("a {what} of {len} bytes (the bound is 1..={bound})")]
    Length {
        /// Which length.
        what: &'static str,
        /// What the header said.
        len: u32,
        /// The bound.
        bound: usize,
    },
    /// A compressed block the decoder refused, or that would decode past its stated size.
    #[error("a zstd block does not decode within its stated {decoded} bytes: {source}")]
    Corrupt {
        /// The stated size.
        decoded: usize,
        /// The decoder's words.
        #[source]
        source: io::Error,
    },
    /// A compressed block that decoded to fewer bytes than stated.
    #[error("a zstd block decoded to {got} bytes, not its stated {decoded}")]
    Short {
        /// The stated size.
        decoded: usize,
        /// What it decoded to.
        got: usize,
    },
    /// Bytes after the end frame.
    #[error("bytes after the end frame")]
    AfterEnd,
    /// The stream stopped before its end frame.
    #[error("the stream ended before its end frame")]
    Cut,
}

impl FrameError {
    fn into_io(self) -> io::Error {
        let kind = match self {
            FrameError::Cut => io::ErrorKind::UnexpectedEof,
            _ => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, AdaptiveStream(self))
    }
}

/// The reader's error as the drain words it ("the packer's adaptive stream is corrupt: …").
#[derive(Debug, thiserror::Error)]
#[error("the packer's adaptive stream is corrupt: {0}")]
pub(crate) struct AdaptiveStream(#[source] FrameError);

/// Where the reader is in the stream.
enum State {
    /// Reading a frame header (`head_len` bytes of `head` so far).
    Header,
    /// Passing `left` bytes of a stored block through.
    Stored { left: usize },
    /// Reading a compressed block of `len` bytes that decodes to `decoded`.
    Compressed { len: usize, decoded: usize },
    /// Handing out `out[pos..len]`.
    Decoded { pos: usize, len: usize },
    /// After the end frame: only the end of the stream may follow.
    End,
    /// Done.
    Done,
}

/// Decodes an adaptive stream (after its [`MAGIC`]) into the tar it carries.
pub(crate) struct BlockReader<R> {
    inner: R,
    state: State,
    head: [u8; 9],
    head_len: usize,
    payload: Vec<u8>,
    payload_len: usize,
    out: Vec<u8>,
    decoder: Option<zstd::bulk::Decompressor<'static>>,
    counts: BlockCounts,
}

impl<R: AsyncRead + Unpin> BlockReader<R> {
    /// A reader of `inner`, whose magic number was read already; it counts blocks into `counts`.
    pub(crate) fn new(inner: R, counts: BlockCounts) -> Self {
        BlockReader {
            inner,
            state: State::Header,
            head: [0; 9],
            head_len: 0,
            payload: Vec::new(),
            payload_len: 0,
            out: Vec::new(),
            decoder: None,
            counts,
        }
    }

    /// Reads into `into` once; `Ok(0)` is the end of the inner stream.
    fn poll_fill(inner: &mut R, cx: &mut Context<'_>, into: &mut [u8]) -> Poll<io::Result<usize>> {
        let mut buf = ReadBuf::new(into);
        ready!(Pin::new(inner).poll_read(cx, &mut buf))?;
        Poll::Ready(Ok(buf.filled().len()))
    }

    /// Reads the current frame header; returns the next state once it is whole.
    fn poll_header(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<State>> {
        loop {
            let need = match self.head_len {
                0 => 1,
                _ => header_len(self.head[0])?,
            };
            if self.head_len == need {
                let state = parse_header(&self.head[..need])?;
                self.head_len = 0;
                return Poll::Ready(Ok(state));
            }
            let n = ready!(Self::poll_fill(
                &mut self.inner,
                cx,
                &mut self.head[self.head_len..need]
            ))?;
            if n == 0 {
                return Poll::Ready(Err(FrameError::Cut.into_io()));
            }
            self.head_len += n;
        }
    }

    /// Reads a compressed block whole, then decodes it into `out` (never past `decoded` bytes).
    fn poll_compressed(
        &mut self,
        cx: &mut Context<'_>,
        len: usize,
        decoded: usize,
    ) -> Poll<io::Result<State>> {
        if self.payload.len() < len {
            self.payload.resize(len, 0);
        }
        while self.payload_len < len {
            let n = ready!(Self::poll_fill(
                &mut self.inner,
                cx,
                &mut self.payload[self.payload_len..len]
            ))?;
            if n == 0 {
                return Poll::Ready(Err(FrameError::Cut.into_io()));
            }
            self.payload_len += n;
        }
        self.payload_len = 0;
        if self.out.len() < decoded {
            self.out.resize(decoded, 0);
        }
        let decoder = match self.decoder.as_mut() {
            Some(decoder) => decoder,
            None => self.decoder.insert(zstd::bulk::Decompressor::new()?),
        };
        let got = decoder
            .decompress_to_buffer(&self.payload[..len], &mut self.out[..decoded])
            .map_err(|source| FrameError::Corrupt { decoded, source }.into_io())?;
        if got != decoded {
            return Poll::Ready(Err(FrameError::Short { decoded, got }.into_io()));
        }
        self.counts.count(true);
        Poll::Ready(Ok(State::Decoded {
            pos: 0,
            len: decoded,
        }))
    }

    /// After the end frame: the stream must end too.
    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<State>> {
        let mut probe = [0u8; 1];
        match ready!(Self::poll_fill(&mut self.inner, cx, &mut probe))? {
            0 => Poll::Ready(Ok(State::Done)),
            _ => Poll::Ready(Err(FrameError::AfterEnd.into_io())),
        }
    }
}

/// The length of a frame header that starts with `kind`.
fn header_len(kind: u8) -> io::Result<usize> {
    match kind {
        KIND_STORED => Ok(5),
        KIND_ZSTD => Ok(9),
        KIND_END => Ok(1),
        other => Err(FrameError::UnknownKind(other).into_io()),
    }
}

/// The state a whole frame header leads to; its lengths are checked against their bounds.
fn parse_header(head: &[u8]) -> io::Result<State> {
    let word = |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    let bounded = |what, at, bound| {
        let len = word(at);
        match usize::try_from(len) {
            Ok(n) if (1..=bound).contains(&n) => Ok(n),
            _ => Err(FrameError::Length { what, len, bound }.into_io()),
        }
    };
    match head[0] {
        KIND_STORED => Ok(State::Stored {
            left: bounded("stored block", 1, BLOCK_BYTES)?,
        }),
        KIND_ZSTD => Ok(State::Compressed {
            len: bounded("compressed block", 1, MAX_COMPRESSED)?,
            decoded: bounded("decoded block", 5, BLOCK_BYTES)?,
        }),
        _ => Ok(State::End),
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for BlockReader<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            let next = match this.state {
                State::Header => ready!(this.poll_header(cx))?,
                State::Stored { left } => {
                    // Straight from the wire into the caller's buffer: no copy of ours.
                    let want = left.min(buf.remaining());
                    let n = ready!(Self::poll_fill(
                        &mut this.inner,
                        cx,
                        &mut buf.initialize_unfilled_to(want)[..want]
                    ))?;
                    if n == 0 {
                        return Poll::Ready(Err(FrameError::Cut.into_io()));
                    }
                    buf.advance(n);
                    if n == left {
                        this.counts.count(false);
                        this.state = State::Header;
                    } else {
                        this.state = State::Stored { left: left - n };
                    }
                    return Poll::Ready(Ok(()));
                }
                State::Compressed { len, decoded } => {
                    ready!(this.poll_compressed(cx, len, decoded))?
                }
                State::Decoded { pos, len } => {
                    let n = (len - pos).min(buf.remaining());
                    buf.put_slice(&this.out[pos..pos + n]);
                    this.state = if pos + n == len {
                        State::Header
                    } else {
                        State::Decoded { pos: pos + n, len }
                    };
                    return Poll::Ready(Ok(()));
                }
                State::End => ready!(this.poll_end(cx))?,
                State::Done => return Poll::Ready(Ok(())),
            };
            this.state = next;
        }
    }
}

/// Writes the adaptive stream of what is written to it into `out`; [`BlockWriter::finish`] ends
/// it (an unfinished stream reads as cut).
pub(crate) struct BlockWriter<W: io::Write> {
    out: W,
    block: Vec<u8>,
    packed: Vec<u8>,
    compressor: zstd::bulk::Compressor<'static>,
    /// Blocks still to store without trying.
    skip: u32,
    /// How many to skip after the next block that will not shrink.
    backoff: u32,
}

impl<W: io::Write> BlockWriter<W> {
    /// A writer into `out` that compresses at zstd `level`, its magic number written.
    pub(crate) fn new(mut out: W, level: i32) -> io::Result<Self> {
        out.write_all(&MAGIC)?;
        Ok(BlockWriter {
            out,
            block: Vec::with_capacity(BLOCK_BYTES),
            packed: vec![0; BLOCK_BYTES],
            compressor: zstd::bulk::Compressor::new(level)?,
            skip: 0,
            backoff: 1,
        })
    }

    /// Sends the block held so far, compressed or stored.
    fn send_block(&mut self) -> io::Result<()> {
        if self.block.is_empty() {
            return Ok(());
        }
        let raw = self.block.len();
        let tried = self.skip == 0;
        let packed = if !tried {
            self.skip -= 1;
            None
        } else {
            // Only worth it when it saves 1/32: a longer result does not fit and is an error.
            let room = raw - raw / 32;
            self.compressor
                .compress_to_buffer(&self.block[..], &mut self.packed[..room])
                .ok()
                .filter(|&n| n > 0)
        };
        match packed {
            Some(n) => {
                self.backoff = 1;
                self.out.write_all(&[KIND_ZSTD])?;
                self.out.write_all(&(n as u32).to_le_bytes())?;
                self.out.write_all(&(raw as u32).to_le_bytes())?;
                self.out.write_all(&self.packed[..n])?;
            }
            None => {
                if tried {
                    self.skip = self.backoff;
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF_BLOCKS);
                }
                self.out.write_all(&[KIND_STORED])?;
                self.out.write_all(&(raw as u32).to_le_bytes())?;
                self.out.write_all(&self.block)?;
            }
        }
        self.block.clear();
        Ok(())
    }

    /// Sends the last block and the end frame, flushes, and returns the output.
    pub(crate) fn finish(mut self) -> io::Result<W> {
        self.send_block()?;
        self.out.write_all(&[KIND_END])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

impl<W: io::Write> io::Write for BlockWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(BLOCK_BYTES - self.block.len());
        self.block.extend_from_slice(&data[..n]);
        if self.block.len() == BLOCK_BYTES {
            self.send_block()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        // A block is sent when full or at the end; flushing the output alone keeps blocks whole.
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::wire::{decode, max_wire_bytes, Wire};
    use std::io::Write;
    use tokio::io::AsyncReadExt;

    /// Bytes no compressor shrinks (xorshift).
    fn random(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    /// JSON log lines, as tool output is.
    fn text(len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 128);
        let mut i = 0u64;
        while out.len() < len {
            out.extend_from_slice(
                format!("{{\"step\":{i},\"level\":\"info\",\"msg\":\"processed item\"}}\n")
                    .as_bytes(),
            );
            i += 1;
        }
        out.truncate(len);
        out
    }

    fn adaptive(data: &[u8]) -> Vec<u8> {
        let mut w = BlockWriter::new(Vec::new(), 1).unwrap();
        // Uneven writes, as the packer's are.
        for chunk in data.chunks(100_003) {
            w.write_all(chunk).unwrap();
        }
        w.finish().unwrap()
    }

    /// What reading `stream` gives: the tar or the error, and the blocks (stored, compressed).
    async fn read(stream: Vec<u8>) -> (io::Result<Vec<u8>>, (u64, u64)) {
        let decoded = decode(io::Cursor::new(stream), u64::MAX).await.unwrap();
        assert_eq!(decoded.wire, Wire::Adaptive);
        let counts = decoded.blocks.clone();
        let mut tar = decoded.tar;
        let mut out = Vec::new();
        let result = tar.read_to_end(&mut out).await.map(|_| out);
        (result, (counts.stored(), counts.compressed()))
    }

    fn frames(parts: &[&[u8]]) -> Vec<u8> {
        let mut stream = MAGIC.to_vec();
        for part in parts {
            stream.extend_from_slice(part);
        }
        stream
    }

    fn stored(data: &[u8]) -> Vec<u8> {
        let mut f = vec![KIND_STORED];
        f.extend_from_slice(&(data.len() as u32).to_le_bytes());
        f.extend_from_slice(data);
        f
    }

    fn compressed(payload: &[u8], decoded: u32) -> Vec<u8> {
        let mut f = vec![KIND_ZSTD];
        f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        f.extend_from_slice(&decoded.to_le_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn invalid(result: io::Result<Vec<u8>>, says: &str) {
        let err = result.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains(says), "{err}");
        assert!(
            err.to_string().contains("adaptive stream is corrupt"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn random_bytes_cross_the_wire_stored_never_compressed() {
        let data = random(4 * BLOCK_BYTES + 1000, 7);
        let stream = adaptive(&data);
        // Five frame headers, the magic and the end frame: nothing else is added.
        assert_eq!(stream.len(), data.len() + MAGIC.len() + 5 * 5 + 1);
        let (out, blocks) = read(stream).await;
        assert_eq!(out.unwrap(), data);
        assert_eq!(blocks, (5, 0), "every block stored");
    }

    #[tokio::test]
    async fn text_crosses_the_wire_compressed_and_decodes_to_the_same_bytes() {
        let data = text(3 * BLOCK_BYTES);
        let stream = adaptive(&data);
        assert!(stream.len() * 5 < data.len(), "{} bytes", stream.len());
        let (out, blocks) = read(stream).await;
        assert_eq!(out.unwrap(), data);
        assert_eq!(blocks, (0, 3));
    }

    #[tokio::test]
    async fn mixed_blocks_round_trip_and_text_after_random_bytes_is_compressed_again() {
        // Random bytes back the writer off; the text after them is compressed once it tries again.
        let data = [
            text(BLOCK_BYTES),
            random(6 * BLOCK_BYTES, 3),
            text(20 * BLOCK_BYTES),
            random(1000, 5),
        ]
        .concat();
        let (out, (stored, compressed)) = read(adaptive(&data)).await;
        assert_eq!(out.unwrap(), data);
        assert_eq!(stored + compressed, 28);
        assert!(stored >= 6, "the random blocks are stored: {stored}");
        // At most the backoff's longest pause of text blocks is sent stored.
        assert!(
            compressed >= 1 + 20 - u64::from(MAX_BACKOFF_BLOCKS),
            "{compressed} compressed"
        );
    }

    #[tokio::test]
    async fn an_empty_tar_is_the_magic_and_the_end_frame() {
        let stream = adaptive(&[]);
        assert_eq!(stream, frames(&[&[KIND_END]]));
        let (out, blocks) = read(stream).await;
        assert_eq!((out.unwrap(), blocks), (Vec::new(), (0, 0)));
    }

    #[tokio::test]
    async fn lengths_over_their_bound_or_zero_are_refused_before_anything_is_read() {
        let over = (BLOCK_BYTES as u32 + 1).to_le_bytes();
        let mut huge_stored = vec![KIND_STORED];
        huge_stored.extend_from_slice(&over);
        invalid(read(frames(&[&huge_stored])).await.0, "stored block of");
        invalid(
            read(frames(&[&[KIND_STORED, 0, 0, 0, 0]])).await.0,
            "stored block of 0",
        );
        let mut huge_packed = vec![KIND_ZSTD];
        huge_packed.extend_from_slice(&u32::MAX.to_le_bytes());
        huge_packed.extend_from_slice(&16u32.to_le_bytes());
        invalid(read(frames(&[&huge_packed])).await.0, "compressed block of");
        let mut huge_decoded = vec![KIND_ZSTD];
        huge_decoded.extend_from_slice(&16u32.to_le_bytes());
        huge_decoded.extend_from_slice(&over);
        invalid(read(frames(&[&huge_decoded])).await.0, "decoded block of");
        invalid(read(frames(&[&[0x07]])).await.0, "unknown frame kind 0x07");
    }

    #[tokio::test]
    async fn a_block_that_decodes_past_its_stated_size_is_refused_within_the_bound() {
        // A bomb: 64 MiB of zeros in a few KiB, stated as one block.
        let bomb = zstd::bulk::compress(&vec![0u8; 64 << 20], 19).unwrap();
        assert!(bomb.len() < MAX_COMPRESSED);
        for stated in [1024, BLOCK_BYTES as u32] {
            let stream = frames(&[&compressed(&bomb, stated), &[KIND_END]]);
            let mut reader = BlockReader::new(&stream[MAGIC.len()..], BlockCounts::default());
            let err = reader.read_to_end(&mut Vec::new()).await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
            assert!(err.to_string().contains("does not decode within"), "{err}");
            // Whatever the header said, the reader held one block's worth at most.
            assert!(
                reader.out.capacity() <= BLOCK_BYTES,
                "{}",
                reader.out.capacity()
            );
            assert!(reader.payload.capacity() <= MAX_COMPRESSED);
        }
    }

    #[tokio::test]
    async fn a_block_that_decodes_short_of_its_stated_size_is_refused() {
        let packed = zstd::bulk::compress(b"ten bytes!", 1).unwrap();
        let stream = frames(&[&compressed(&packed, 4096), &[KIND_END]]);
        invalid(
            read(stream).await.0,
            "decoded to 10 bytes, not its stated 4096",
        );
        let stream = frames(&[&compressed(b"not zstd at all", 100), &[KIND_END]]);
        invalid(read(stream).await.0, "does not decode within");
    }

    #[tokio::test]
    async fn a_stream_cut_anywhere_before_its_end_frame_is_a_cut_stream() {
        let data = [text(BLOCK_BYTES), random(BLOCK_BYTES / 2, 9)].concat();
        let whole = adaptive(&data);
        for cut in [
            MAGIC.len(),
            MAGIC.len() + 3,
            MAGIC.len() + 20,
            whole.len() - 100,
            whole.len() - 1,
        ] {
            let err = read(whole[..cut].to_vec()).await.0.unwrap_err();
            assert_eq!(
                err.kind(),
                io::ErrorKind::UnexpectedEof,
                "cut at {cut}: {err}"
            );
        }
    }

    #[tokio::test]
    async fn bytes_after_the_end_frame_fail_the_stream() {
        let mut stream = adaptive(&text(1000));
        stream.extend_from_slice(&stored(b"smuggled"));
        invalid(read(stream).await.0, "bytes after the end frame");
    }

    #[tokio::test]
    async fn a_stream_delivered_a_byte_at_a_time_decodes_the_same() {
        struct Trickle(Vec<u8>, usize);
        impl AsyncRead for Trickle {
            fn poll_read(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                // Every other poll is pending, as a slow socket's is.
                self.1 += 1;
                if self.1.is_multiple_of(2) {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                let at = self.1 / 2;
                if let Some(&b) = self.0.get(at) {
                    buf.put_slice(&[b]);
                }
                Poll::Ready(Ok(()))
            }
        }
        let data = [text(5000), random(3000, 1)].concat();
        let mut w = BlockWriter::new(Vec::new(), 1).unwrap();
        w.write_all(&data).unwrap();
        let stream = w.finish().unwrap();
        let decoded = decode(Trickle(stream, 0), u64::MAX).await.unwrap();
        let mut tar = decoded.tar;
        let mut out = Vec::new();
        tar.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, data);
    }

    #[tokio::test]
    async fn a_transport_error_passes_through_unchanged() {
        struct Breaks(Option<Vec<u8>>);
        impl AsyncRead for Breaks {
            fn poll_read(
                mut self: Pin<&mut Self>,
                _: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.0.take() {
                    Some(mut head) => {
                        let n = head.len().min(buf.remaining());
                        buf.put_slice(&head[..n]);
                        head.drain(..n);
                        if !head.is_empty() {
                            self.0 = Some(head);
                        }
                        Poll::Ready(Ok(()))
                    }
                    None => {
                        Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionReset, "gone")))
                    }
                }
            }
        }
        let head = frames(&[&[KIND_STORED, 0, 1, 0, 0, b'x']]);
        let decoded = decode(Breaks(Some(head)), u64::MAX).await.unwrap();
        let mut tar = decoded.tar;
        let err = tar.read_to_end(&mut Vec::new()).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
    }

    #[tokio::test]
    async fn the_adaptive_wire_is_held_to_the_wire_bound() {
        // 1,000 decoded bytes allowed: a stream of stored blocks past the bound fails there.
        let stream = adaptive(&random(4 * BLOCK_BYTES, 11));
        let decoded = decode(io::Cursor::new(stream), 1000).await.unwrap();
        let mut tar = decoded.tar;
        let err = tar.read_to_end(&mut Vec::new()).await.unwrap_err();
        assert!(err.to_string().contains("crossed the wire"), "{err}");
        assert!(decoded.wire_bytes.get() <= max_wire_bytes(1000) + BLOCK_BYTES as u64);
    }
}
