//! The encoding of the packer's stream on the exec wire (docs/contract.md "The drain"): a plain
//! tar, or a tar in one zstd frame (`pack --wire zstd`) that the drain decompresses *before* the
//! sanitizer and the cap meter, so they see the same tar whatever crossed the wire.
//!
//! The drain does not trust the packer to have honoured the flag (an older holder refuses it, a
//! custom `--pack-command` may ignore it): it looks at the first four bytes and decodes only a
//! stream that starts with the zstd magic number. The decoder is bounded: a frame that asks for a
//! window over [`MAX_WINDOW_LOG`] is refused (a hostile pod cannot make the operator allocate
//! more), and the decompressed tar is held to the drain's input bound like any other.
//!
//! Every byte that crosses the wire is read and judged (docs/contract.md "The stream on the
//! wire"): the decoder goes on past the first frame, so a second frame is decoded into the same
//! tar (data after the end-of-archive marker then fails the drain as trailing garbage) and bytes
//! that are not a frame fail it as a corrupt stream — a stream is never cut at a frame boundary
//! and called complete. Frames that decode to nothing (zstd's skippable frames) cannot stretch the
//! stream either: the wire bytes are bounded by [`max_wire_bytes`] of the input bound.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use async_compression::tokio::bufread::ZstdDecoder;
use async_compression::zstd::DParameter;
use clap::ValueEnum;
use tokio::io::{AsyncRead, AsyncReadExt, BufReader, ReadBuf};

use super::wire_blocks::{BlockCounts, BlockReader, BlockWriter, MAGIC as BLOCKS_MAGIC};
use crate::store::manifest::WireRecord;

/// The flag that asks the packer for an encoding (`pack --wire`).
pub(crate) const WIRE_FLAG: &str = "--wire";
/// The first four bytes of every zstd frame (RFC 8878 §3.1.1).
pub(crate) const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
/// Largest zstd window the drain accepts, as a power of two (8 MiB): `pack`'s level uses 512 KiB;
/// a bigger window is a frame no packer of ours wrote.
pub(crate) const MAX_WINDOW_LOG: u32 = 23;
/// The zstd level `pack --wire zstd` uses: the fastest, since the holder's CPU is the workload's
/// node's and the exec channel, not the CPU, is the drain's limit.
pub(crate) const PACK_ZSTD_LEVEL: i32 = 1;

/// How the packer's tar crosses the exec stream.
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Wire {
    /// The tar as is.
    #[default]
    Tar,
    /// The tar in one zstd frame.
    Zstd,
    /// The tar in blocks, each zstd-compressed when that shrinks it and stored otherwise
    /// (src/drain/wire_blocks.rs).
    Adaptive,
}

impl Wire {
    /// The flag value and the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Wire::Tar => "tar",
            Wire::Zstd => "zstd",
            Wire::Adaptive => "adaptive",
        }
    }

    /// What to ask of a packer that refused this encoding (an older holder: one that predates
    /// `adaptive` still knows `zstd`, one that predates `--wire` knows neither).
    pub(crate) fn older(self) -> Option<Wire> {
        match self {
            Wire::Adaptive => Some(Wire::Zstd),
            Wire::Zstd => Some(Wire::Tar),
            Wire::Tar => None,
        }
    }
}

/// Most bytes a stream may send over the wire when the decoded tar is bounded at `max_input`:
/// the input bound plus zstd's worst-case expansion of incompressible data (1/128, generously)
/// and 1 MiB. Only a stream padded with frames that decode to nothing comes near it.
pub(crate) fn max_wire_bytes(max_input: u64) -> u64 {
    max_input
        .saturating_add(max_input / 128)
        .saturating_add(1024 * 1024)
}

/// Bytes that crossed the exec wire (before any decompression), shared with the reader.
#[derive(Clone, Debug, Default)]
pub(crate) struct WireBytes(Arc<AtomicU64>);

impl WireBytes {
    /// Bytes read from the wire so far.
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The packer's stream, decoded: what the drain reads, the encoding it found, and a counter of
/// the bytes that crossed the wire.
pub(crate) struct Decoded {
    /// The tar stream.
    pub tar: Box<dyn AsyncRead + Send + Unpin>,
    /// The encoding found on the wire.
    pub wire: Wire,
    /// Bytes read from the wire.
    pub wire_bytes: WireBytes,
    /// The adaptive wire's blocks, stored and compressed (zero on the other wires).
    pub blocks: BlockCounts,
}

impl Decoded {
    /// The tar to read, and what will tell how it crossed the wire once it has been read.
    pub(crate) fn split(self) -> (Box<dyn AsyncRead + Send + Unpin>, WireReading) {
        let reading = WireReading {
            wire: self.wire,
            wire_bytes: self.wire_bytes,
            blocks: self.blocks,
        };
        (self.tar, reading)
    }
}

/// The counters of a stream being read.
pub(crate) struct WireReading {
    wire: Wire,
    wire_bytes: WireBytes,
    blocks: BlockCounts,
}

impl WireReading {
    /// What the manifest records of the wire (docs/contract.md "The stream on the wire"), as
    /// read so far.
    pub(crate) fn read(&self) -> WireRecord {
        WireRecord {
            encoding: self.wire.as_str().to_string(),
            bytes: self.wire_bytes.get(),
            stored_blocks: self.blocks.stored(),
            compressed_blocks: self.blocks.compressed(),
        }
    }
}

/// Reads the first bytes of `stream` and returns the tar inside it: decoded when the stream
/// starts with the zstd magic number or the adaptive wire's, as is otherwise. An error reading those first bytes is the
/// transport's and is returned as is. `max_input` is the drain's input bound (the wire is held
/// to [`max_wire_bytes`] of it).
pub(crate) async fn decode<R>(stream: R, max_input: u64) -> io::Result<Decoded>
where
    R: AsyncRead + Send + Unpin + 'static,
{
    let transport_failed = Arc::new(AtomicBool::new(false));
    let wire_bytes = WireBytes::default();
    let mut counted = Counted {
        inner: stream,
        bytes: wire_bytes.clone(),
        failed: Arc::clone(&transport_failed),
        limit: max_wire_bytes(max_input),
    };
    let mut head = [0u8; BLOCKS_MAGIC.len()];
    let mut filled = read_head(&mut counted, &mut head[..ZSTD_MAGIC.len()]).await?;
    // Only a stream that may be adaptive is read further before it is handed on.
    if filled == ZSTD_MAGIC.len() && head[..filled] == BLOCKS_MAGIC[..filled] {
        filled += read_head(&mut counted, &mut head[ZSTD_MAGIC.len()..]).await?;
    }
    let blocks = BlockCounts::default();
    if filled == head.len() && head == BLOCKS_MAGIC {
        return Ok(Decoded {
            tar: Box::new(BlockReader::new(counted, blocks.clone())),
            wire: Wire::Adaptive,
            wire_bytes,
            blocks,
        });
    }
    let rejoined = io::Cursor::new(head[..filled].to_vec()).chain(counted);
    if filled >= ZSTD_MAGIC.len() && head[..ZSTD_MAGIC.len()] == ZSTD_MAGIC {
        let mut decoder = ZstdDecoder::with_params(
            BufReader::new(rejoined),
            &[DParameter::window_log_max(MAX_WINDOW_LOG)],
        );
        // Past the first frame too: what follows it is judged, never left unread.
        decoder.multiple_members(true);
        Ok(Decoded {
            tar: Box::new(Judged {
                inner: decoder,
                transport_failed,
            }),
            wire: Wire::Zstd,
            wire_bytes,
            blocks,
        })
    } else {
        Ok(Decoded {
            tar: Box::new(rejoined),
            wire: Wire::Tar,
            wire_bytes,
            blocks,
        })
    }
}

/// Fills `head` from `stream` as far as the stream goes; returns how many bytes it holds.
async fn read_head<R: AsyncRead + Unpin>(stream: &mut R, head: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < head.len() {
        let n = stream.read(&mut head[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}

/// Counts what the transport delivers, remembers whether it failed, and refuses to deliver past
/// `limit` bytes (an `InvalidData` error: the pod's doing, not the transport's).
struct Counted<R> {
    inner: R,
    bytes: WireBytes,
    failed: Arc<AtomicBool>,
    limit: u64,
}

impl<R: AsyncRead + Unpin> AsyncRead for Counted<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let limit = self.limit;
        if self.bytes.get() > limit {
            return Poll::Ready(Err(over_wire_bound(limit)));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) => {
                let n = (buf.filled().len() - before) as u64;
                if self
                    .bytes
                    .0
                    .fetch_add(n, Ordering::Relaxed)
                    .saturating_add(n)
                    > limit
                {
                    // An error delivers no bytes.
                    buf.set_filled(before);
                    return Poll::Ready(Err(over_wire_bound(limit)));
                }
            }
            Poll::Ready(Err(_)) => self.failed.store(true, Ordering::Relaxed),
            Poll::Pending => {}
        }
        polled
    }
}

fn over_wire_bound(limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "more than {limit} bytes crossed the wire (the drain's bound on the encoded stream)"
        ),
    )
}

/// The decoder's output, with its errors told apart: the transport's pass through unchanged (a
/// broken exec is worth another attempt), an end of the stream inside a frame ends the tar early or
/// stays `UnexpectedEof` (a truncated stream, as a cut tar is), and anything else the decoder refuses is
/// `InvalidData` naming the zstd stream: the packer sent something no retry will fix.
struct Judged<D> {
    inner: D,
    transport_failed: Arc<AtomicBool>,
}

impl<D: AsyncRead + Unpin> AsyncRead for Judged<D> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Err(e)) => {
                // The decoder may have decoded some bytes before its input failed; an error
                // delivers none (the stream fails anyway).
                buf.set_filled(before);
                if self.transport_failed.load(Ordering::Relaxed)
                    || e.kind() == io::ErrorKind::UnexpectedEof
                {
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("the packer's zstd stream is corrupt: {e}"),
                )))
            }
            other => other,
        }
    }
}

/// Compresses the packer's output into one zstd frame (`pack --wire zstd`); the frame is complete
/// once the encoder's `finish` returns.
pub(crate) fn zstd_writer<W: io::Write>(
    out: W,
) -> io::Result<zstd::stream::write::Encoder<'static, W>> {
    zstd::stream::write::Encoder::new(out, PACK_ZSTD_LEVEL)
}

/// The packer's output on the adaptive wire (`pack --wire adaptive`, src/drain/wire_blocks.rs).
pub(crate) fn adaptive_writer<W: io::Write>(out: W) -> io::Result<BlockWriter<W>> {
    BlockWriter::new(out, PACK_ZSTD_LEVEL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    async fn read_all(stream: Vec<u8>) -> (io::Result<Vec<u8>>, Wire, u64) {
        let decoded = decode(io::Cursor::new(stream), u64::MAX).await.unwrap();
        let mut tar = decoded.tar;
        let mut out = Vec::new();
        let result = tar.read_to_end(&mut out).await.map(|_| out);
        (result, decoded.wire, decoded.wire_bytes.get())
    }

    fn zstd_of(data: &[u8]) -> Vec<u8> {
        let mut w = zstd_writer(Vec::new()).unwrap();
        w.write_all(data).unwrap();
        w.finish().unwrap()
    }

    #[tokio::test]
    async fn a_plain_tar_passes_through_and_a_zstd_frame_is_decoded_to_the_same_bytes() {
        let tar: Vec<u8> = (0..200_000u32)
            .flat_map(|i| (i % 7).to_le_bytes())
            .collect();
        let (plain, wire, wire_bytes) = read_all(tar.clone()).await;
        assert_eq!(plain.unwrap(), tar);
        assert_eq!((wire, wire_bytes), (Wire::Tar, tar.len() as u64));

        let packed = zstd_of(&tar);
        assert!(
            packed.len() * 10 < tar.len(),
            "compressible data compresses"
        );
        let (decoded, wire, wire_bytes) = read_all(packed.clone()).await;
        assert_eq!(decoded.unwrap(), tar);
        assert_eq!((wire, wire_bytes), (Wire::Zstd, packed.len() as u64));
    }

    #[test]
    fn a_refused_encoding_steps_down_to_the_one_an_older_packer_knows() {
        assert_eq!(Wire::Adaptive.older(), Some(Wire::Zstd));
        assert_eq!(Wire::Zstd.older(), Some(Wire::Tar));
        assert_eq!(Wire::Tar.older(), None);
    }

    #[tokio::test]
    async fn a_tar_that_begins_like_the_adaptive_magic_but_differs_passes_through() {
        let mut stream = BLOCKS_MAGIC[..6].to_vec();
        stream.extend_from_slice(b"xx and more");
        let (out, wire, _) = read_all(stream.clone()).await;
        assert_eq!((out.unwrap(), wire), (stream, Wire::Tar));
    }

    #[tokio::test]
    async fn streams_shorter_than_the_magic_number_pass_through() {
        for stream in [vec![], vec![0x28], vec![0x28, 0xB5, 0x2F]] {
            let (out, wire, _) = read_all(stream.clone()).await;
            assert_eq!((out.unwrap(), wire), (stream, Wire::Tar));
        }
    }

    #[tokio::test]
    async fn a_corrupt_frame_is_invalid_data_and_a_cut_frame_is_a_cut_tar() {
        let mut corrupt = ZSTD_MAGIC.to_vec();
        corrupt.extend_from_slice(&[0xFF; 64]);
        let err = read_all(corrupt).await.0.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains("zstd stream is corrupt"), "{err}");

        let data: Vec<u8> = (0..1_000_000u32)
            .map(|i| i.wrapping_mul(2_654_435_761) as u8)
            .collect();
        let packed = zstd_of(&data);
        let cut = packed[..packed.len() / 2].to_vec();
        // A frame cut short ends the decoded stream early, or as UnexpectedEof: either way the tar
        // inside is cut, which the pipeline reports as a truncated stream (retried).
        match read_all(cut).await.0 {
            Ok(prefix) => {
                assert!(prefix.len() < data.len());
                assert_eq!(prefix[..], data[..prefix.len()]);
            }
            Err(err) => assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}"),
        }
    }

    #[tokio::test]
    async fn a_frame_asking_for_a_window_over_the_bound_is_refused() {
        let data = vec![7u8; 1024];
        let mut w = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        w.set_parameter(zstd::stream::raw::CParameter::WindowLog(MAX_WINDOW_LOG + 2))
            .unwrap();
        // Without the content size the decoder must trust the declared window.
        w.include_contentsize(false).unwrap();
        w.write_all(&data).unwrap();
        let big_window = w.finish().unwrap();
        let err = read_all(big_window).await.0.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    }

    #[tokio::test]
    async fn a_transport_error_passes_through_unchanged() {
        struct Breaks(bool);
        impl AsyncRead for Breaks {
            fn poll_read(
                mut self: Pin<&mut Self>,
                _: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                if self.0 {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "gone",
                    )));
                }
                self.0 = true;
                buf.put_slice(&ZSTD_MAGIC);
                Poll::Ready(Ok(()))
            }
        }
        let decoded = decode(Breaks(false), u64::MAX).await.unwrap();
        assert_eq!(decoded.wire, Wire::Zstd);
        let mut tar = decoded.tar;
        let err = tar.read_to_end(&mut Vec::new()).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
    }

    /// A zstd skippable frame (RFC 8878 §3.1.2) of `len` bytes: it decodes to nothing.
    fn skippable(len: u32) -> Vec<u8> {
        let mut frame = vec![0x50, 0x2A, 0x4D, 0x18];
        frame.extend_from_slice(&len.to_le_bytes());
        frame.resize(8 + len as usize, 0xAB);
        frame
    }

    #[tokio::test]
    async fn bytes_after_the_first_frame_are_decoded_not_left_unread() {
        let (first, second) = (vec![1u8; 5000], vec![2u8; 7000]);
        let mut stream = zstd_of(&first);
        stream.extend_from_slice(&zstd_of(&second));
        let wire = stream.len() as u64;
        let (decoded, _, wire_bytes) = read_all(stream).await;
        assert_eq!(decoded.unwrap(), [first, second].concat());
        assert_eq!(wire_bytes, wire, "every byte on the wire was read");
    }

    #[tokio::test]
    async fn bytes_after_the_first_frame_that_are_no_frame_are_a_corrupt_stream() {
        let mut stream = zstd_of(&[3u8; 4096]);
        stream.extend_from_slice(b"not zstd at all, and never read by the old decoder");
        let err = read_all(stream).await.0.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains("zstd stream is corrupt"), "{err}");
    }

    #[tokio::test]
    async fn frames_that_decode_to_nothing_cannot_stretch_the_wire_past_its_bound() {
        let mut stream = zstd_of(&[4u8; 1000]);
        for _ in 0..40 {
            stream.extend_from_slice(&skippable(64 * 1024));
        }
        // Bounded at 1,000 decoded bytes, the wire may carry ~1 MiB: 40 × 64 KiB is over it.
        let decoded = decode(io::Cursor::new(stream), 1000).await.unwrap();
        let mut tar = decoded.tar;
        let err = tar.read_to_end(&mut Vec::new()).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains("crossed the wire"), "{err}");
        assert!(decoded.wire_bytes.get() <= max_wire_bytes(1000) + 64 * 1024);
    }

    #[tokio::test]
    async fn a_second_frame_after_a_complete_tar_fails_the_drain_instead_of_committing() {
        use crate::drain::archive::{drain_stream, DrainErrorKind, DrainOptions};
        let mut tar = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_ustar();
        header.set_size(5);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, "kept.txt", &b"hello"[..])
            .unwrap();
        let tar = tar.into_inner().unwrap();
        let mut stream = zstd_of(&tar);
        stream.extend_from_slice(&zstd_of(b"smuggled after the end of the archive"));
        let opts = DrainOptions::new(1 << 20, crate::api::Compression::None);
        let decoded = decode(io::Cursor::new(stream), opts.max_input_bytes)
            .await
            .unwrap();
        let err = drain_stream(decoded.tar, tokio::io::sink(), &opts)
            .await
            .unwrap_err();
        assert!(matches!(err.kind, DrainErrorKind::TrailingGarbage), "{err}");
    }
}
