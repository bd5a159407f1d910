//! Reading a file the workload may still be writing (docs/contract.md, "A changed file is never
//! stored as a clean one"): [`SizedSource`] yields exactly the size the member's header carries —
//! zero padding when the file ends early or a read fails, truncation when it grew — so the archive
//! stays well-formed, and says which happened ([`Change`]), so the packer's notes record it.

use std::io::{self, BufReader, Read};

/// Most bytes of a file's content read in one system call. tar's copy asks for 8 KiB at a time,
/// which is a `read` per 8 KiB: under gVisor every system call is a round trip through the
/// sandbox's kernel (docs/performance.md "gVisor beside runc").
pub(crate) const READ_BYTES: usize = 256 * 1024;

/// The content of `file` as a member of `size` bytes ([`SizedSource`]), read from the file in
/// system calls of up to [`READ_BYTES`] whatever size of reads its reader asks for; a small file
/// gets a buffer of its own size (plus the byte that tells it grew), not 256 KiB.
pub(crate) fn file_source<R: Read>(file: R, size: u64) -> SizedSource<BufReader<R>> {
    let capacity = usize::try_from(size.saturating_add(1))
        .unwrap_or(READ_BYTES)
        .clamp(1, READ_BYTES);
    SizedSource::new(BufReader::with_capacity(capacity, file), size)
}

/// How a file's content departed from its header size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// The file ended after `read` bytes; the rest was padded with zeros.
    Shrunk {
        /// Bytes actually read.
        read: u64,
    },
    /// The file had more bytes than the header says; the extra bytes were not packed.
    Grew,
    /// The whole size was read, but the file was written meanwhile (its size, mtime or ctime
    /// after the read differ from before it: rewritten in place with the same size, say): the
    /// member may mix old and new content. Found by the packer's stat after the read, not here.
    Modified,
    /// Reading failed after `read` bytes; the rest was padded with zeros.
    ReadError {
        /// Bytes read before the error.
        read: u64,
        /// The error, in words.
        error: String,
    },
}

/// Reads exactly `size` bytes from a file that may change under it: zero padding when it ends
/// early or a read fails, truncation when it grows. Records which happened.
pub(crate) struct SizedSource<R> {
    inner: R,
    size: u64,
    read: u64,
    emitted: u64,
    change: Option<Change>,
}

impl<R: Read> SizedSource<R> {
    pub(crate) fn new(inner: R, size: u64) -> Self {
        SizedSource {
            inner,
            size,
            read: 0,
            emitted: 0,
            change: None,
        }
    }

    /// After the copy: how the file departed from its size, if it did.
    pub(crate) fn finish(mut self) -> Option<Change> {
        if self.change.is_none() {
            let mut probe = [0u8; 1];
            if matches!(self.inner.read(&mut probe), Ok(n) if n > 0) {
                self.change = Some(Change::Grew);
            }
        }
        self.change
    }
}

impl<R: Read> Read for SizedSource<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.size - self.emitted;
        if left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
        let buf = &mut buf[..want];
        let n = if self.change.is_some() {
            0
        } else {
            loop {
                match self.inner.read(buf) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        self.change = Some(Change::ReadError {
                            read: self.read,
                            error: e.to_string(),
                        });
                        break 0;
                    }
                }
            }
        };
        if n == 0 {
            if self.change.is_none() {
                self.change = Some(Change::Shrunk { read: self.read });
            }
            buf.fill(0);
            self.emitted += want as u64;
            return Ok(want);
        }
        self.read += n as u64;
        self.emitted += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_shrinks_is_padded_and_one_that_grows_is_cut_at_the_header_size() {
        let mut shrunk = SizedSource::new(&b"abcd"[..], 10);
        let mut buf = Vec::new();
        shrunk.read_to_end(&mut buf).expect("read");
        assert_eq!(buf, b"abcd\0\0\0\0\0\0");
        assert_eq!(shrunk.finish(), Some(Change::Shrunk { read: 4 }));

        let mut grown = SizedSource::new(&b"abcdefghijklmno"[..], 10);
        let mut buf = Vec::new();
        grown.read_to_end(&mut buf).expect("read");
        assert_eq!(buf, b"abcdefghij");
        assert_eq!(grown.finish(), Some(Change::Grew));

        let mut same = SizedSource::new(&b"abc"[..], 3);
        let mut buf = Vec::new();
        same.read_to_end(&mut buf).expect("read");
        assert_eq!(same.finish(), None);
    }

    #[test]
    fn a_file_is_read_in_large_reads_whatever_size_its_copy_asks_for() {
        struct Counted<'a>(&'a [u8], usize);
        impl Read for Counted<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                self.1 += 1;
                self.0.read(buf)
            }
        }
        let content = vec![7u8; 4 << 20];
        let mut file = Counted(&content, 0);
        let mut source = file_source(&mut file, content.len() as u64);
        let mut copied = Vec::new();
        // As tar copies a member: `&mut dyn Read` into `&mut dyn Write`, 8 KiB at a time.
        let mut dyn_source: &mut dyn Read = &mut source;
        let mut dyn_out: &mut dyn io::Write = &mut copied;
        io::copy(&mut dyn_source, &mut dyn_out).unwrap();
        assert_eq!(source.finish(), None);
        assert_eq!(copied, content);
        // 16 reads of 256 KiB and the one that finds the end, not 512 of 8 KiB.
        assert!(file.1 <= 18, "{} reads", file.1);

        let small = b"twelve bytes".to_vec();
        let mut file = Counted(&small, 0);
        let mut source = file_source(&mut file, small.len() as u64);
        let mut copied = Vec::new();
        io::copy(&mut source, &mut copied).unwrap();
        assert_eq!((copied, source.finish()), (small, None));
    }
}
