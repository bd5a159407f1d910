//! The in-pod packer: `sandboxrun-operator pack <path>` run in the holder container writes a tar of
//! the declared read-back directory to stdout, for the operator's drain to read (ADR-143 §3).
//!
//! The archive is POSIX: ustar headers, with a PAX `x` header in front of an entry whose path or
//! link target does not fit ustar (never GNU long-name entries). Paths are relative to the root
//! (`a/b.txt`, directories `a/`), in a deterministic order (depth-first, siblings sorted by name).
//! Symlinks are archived as symlinks, never followed. FIFOs, sockets and devices are skipped.
//!
//! The packer never stays silent about what it did not pack (DESIGN: "an unreadable file is
//! recorded as such, never silently skipped"; ADR-143 §4): every skipped, unreadable or changing
//! file is reported on `diag` (the exec's stderr) and in the returned [`PackReport`]. Only a missing
//! or unreadable ROOT is an error: then there is nothing meaningful to send and the caller exits
//! non-zero so the drain records a failure rather than an empty set.
//!
//! The archive is never corrupt, even when the workload is still writing: each header carries the
//! size seen at stat time, and exactly that many content bytes follow (zero padding when the file
//! shrank or a read failed, truncation when it grew).
//!
//! With `--budget BYTES` (the path's cap, passed by the operator) the packer meters regular files
//! with the operator's own rule ([`CapMeter`]: a running total of accepted content bytes; a file
//! that would cross the budget is dropped, a later smaller one may still fit). A dropped file is
//! written as a zero-length placeholder member whose PAX record `SANDBOXRUN.dropped=<size>` says
//! it was dropped and how large it was, so its content never crosses the wire and the operator
//! still lists it (docs/contract.md, "Unbounded size"). Files whose path the operator would reject
//! anyway are not charged to the budget, exactly as the operator's meter never sees them. Without
//! `--budget` every file is sent whole (what an operator that predates the flag expects).

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use walkdir::WalkDir;

use crate::caps::{Admit, CapMeter};
use crate::tar::sanitize::{path_is_storable, Limits};
use crate::tar::ustar;

/// How every note about an unreadable file or directory starts on stderr. The operator reads it
/// back (a path whose only content was unreadable fails rather than drains empty), so it is part
/// of the packer's interface: older packers write the same words.
pub(crate) const UNREADABLE_NOTE: &str = "pack: unreadable ";

/// What the packer did not pack as-is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackReport {
    /// Regular files packed (changed ones included).
    pub files: u64,
    /// Directories packed.
    pub dirs: u64,
    /// Symlinks packed.
    pub symlinks: u64,
    /// Content bytes written (header sizes of the packed files).
    pub bytes: u64,
    /// Special files not packed (fifo, socket, char_device, block_device).
    pub skipped: Vec<Skipped>,
    /// Files or directories that could not be read; not packed (or, for a directory, its content).
    pub unreadable: Vec<Unreadable>,
    /// Files packed whose content did not match their stat size while read.
    pub changed: Vec<Changed>,
    /// Files over the budget, written as zero-length placeholders (`--budget` only).
    pub dropped: Vec<Dropped>,
    /// Records past [`MAX_REPORTED`] in any of the lists above: counted, not kept.
    pub unlisted: u64,
}

/// Most records each list of a [`PackReport`] keeps: the packer runs under the holder's memory
/// limit and the pod chooses how many files it drops or makes unreadable (docs/contract.md "Drain
/// memory"); every one is still written (a placeholder, a note on stderr), only the report stops
/// listing them.
pub(crate) const MAX_REPORTED: usize = 1024;

/// Keeps `item` in `list` while it holds fewer than [`MAX_REPORTED`], else counts it in `unlisted`.
fn listed<T>(list: &mut Vec<T>, unlisted: &mut u64, item: T) {
    if list.len() < MAX_REPORTED {
        list.push(item);
    } else {
        *unlisted = unlisted.saturating_add(1);
    }
}

/// A file over the budget: only a placeholder member was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// Path relative to the root.
    pub path: PathBuf,
    /// Its size at stat time (what the placeholder's PAX record says).
    pub size: u64,
}

/// A special file that was skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Path relative to the root.
    pub path: PathBuf,
    /// `fifo`, `socket`, `char_device`, `block_device` or `unknown`.
    pub kind: &'static str,
}

/// An entry that could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unreadable {
    /// Path relative to the root.
    pub path: PathBuf,
    /// The error, in words.
    pub error: String,
}

/// A file whose content changed while it was packed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Changed {
    /// Path relative to the root.
    pub path: PathBuf,
    /// Size written in the header (stat time).
    pub header_size: u64,
    /// What happened.
    pub change: Change,
}

/// How a file's content departed from its header size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The file ended after `read` bytes; the rest was padded with zeros.
    Shrunk {
        /// Bytes actually read.
        read: u64,
    },
    /// The file had more bytes than the header says; the extra bytes were not packed.
    Grew,
    /// Reading failed after `read` bytes; the rest was padded with zeros.
    ReadError {
        /// Bytes read before the error.
        read: u64,
        /// The error, in words.
        error: String,
    },
}

/// Why the packer could not produce an archive at all.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// The root does not exist or cannot be stat'ed.
    #[error("read-back path {path} cannot be inspected (is the emptyDir mounted in the holder?): {source}")]
    RootMissing {
        /// The root given.
        path: PathBuf,
        /// The stat error.
        source: io::Error,
    },
    /// The root is not a directory (a symlink is not followed).
    #[error("read-back path {path} is not a directory")]
    RootNotDirectory {
        /// The root given.
        path: PathBuf,
    },
    /// The root cannot be listed.
    #[error("read-back path {path} cannot be listed (does the holder run as the workload's uid/fsGroup?): {source}")]
    RootUnreadable {
        /// The root given.
        path: PathBuf,
        /// The listing error.
        source: io::Error,
    },
    /// Writing the archive failed (stdout closed?): the archive is incomplete.
    #[error("writing the archive failed after {entries} entries: {source}")]
    Write {
        /// Entries fully written before the failure.
        entries: u64,
        /// The write error.
        source: io::Error,
    },
}

/// Packs the content of `root` as a tar on `out`, reporting anything not packed as-is on `diag`.
/// With a `budget` (bytes), files over it are written as placeholders (see the module doc).
pub fn pack(
    root: &Path,
    budget: Option<u64>,
    out: impl Write,
    diag: impl Write,
) -> Result<PackReport, PackError> {
    pack_with_opener(root, budget, out, diag, &open_listed_file)
}

/// Opens a file the walk listed as regular, without ever blocking or following a link: the
/// workload may have swapped a FIFO in after the listing (a plain open of a FIFO waits for a
/// writer, forever — and a drain stuck there holds the run's whole drain timeout), or a symlink
/// (O_NOFOLLOW: the open fails with ELOOP). O_NONBLOCK does not change reads of a regular file;
/// the caller checks the type and identity of what was opened on the open descriptor.
pub(crate) fn open_listed_file(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
}

/// [`pack`] with the file opener injected, so tests can make a file unreadable even as root.
fn pack_with_opener(
    root: &Path,
    budget: Option<u64>,
    out: impl Write,
    mut diag: impl Write,
    open: &dyn Fn(&Path) -> io::Result<File>,
) -> Result<PackReport, PackError> {
    let meta = fs::symlink_metadata(root).map_err(|source| PackError::RootMissing {
        path: root.to_path_buf(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(PackError::RootNotDirectory {
            path: root.to_path_buf(),
        });
    }
    fs::read_dir(root).map_err(|source| PackError::RootUnreadable {
        path: root.to_path_buf(),
        source,
    })?;

    let mut report = PackReport::default();
    let mut meter = budget.map(CapMeter::new);
    let mut builder = tar::Builder::new(out);
    let mut entries = 0u64;
    let write_err = |entries: u64| move |source| PackError::Write { entries, source };

    let walk = WalkDir::new(root)
        .min_depth(1)
        .follow_links(false)
        .sort_by_file_name();
    for item in walk {
        let entry = match item {
            Ok(e) => e,
            Err(err) => {
                let path = err.path().map(|p| relative(root, p)).unwrap_or_default();
                let error = err.to_string();
                let _ = writeln!(diag, "{UNREADABLE_NOTE}{}: {error}", path.display());
                listed(
                    &mut report.unreadable,
                    &mut report.unlisted,
                    Unreadable { path, error },
                );
                continue;
            }
        };
        let rel = relative(root, entry.path());
        let ft = entry.file_type();
        let outcome = if ft.is_dir() {
            add_dir(&mut builder, entry.path(), &rel, &mut report)
        } else if ft.is_symlink() {
            add_symlink(&mut builder, entry.path(), &rel, &mut report)
        } else if ft.is_file() {
            add_file(
                &mut builder,
                entry.path(),
                &rel,
                &mut report,
                meter.as_mut(),
                open,
            )
        } else {
            let kind = special_kind(&ft);
            let _ = writeln!(diag, "pack: skipped {kind} {}", rel.display());
            listed(
                &mut report.skipped,
                &mut report.unlisted,
                Skipped { path: rel, kind },
            );
            continue;
        };
        match outcome {
            Ok(Added::Yes) => entries += 1,
            Ok(Added::Changed(c)) => {
                entries += 1;
                let _ = writeln!(
                    diag,
                    "pack: {} changed while read: {}",
                    c.path.display(),
                    describe(&c)
                );
                listed(&mut report.changed, &mut report.unlisted, c);
            }
            Ok(Added::Unreadable(error)) => {
                let _ = writeln!(diag, "{UNREADABLE_NOTE}{}: {error}", rel.display());
                listed(
                    &mut report.unreadable,
                    &mut report.unlisted,
                    Unreadable { path: rel, error },
                );
            }
            Err(e) => return Err(write_err(entries)(e)),
        }
    }
    let mut out = builder.into_inner().map_err(write_err(entries))?;
    out.flush().map_err(write_err(entries))?;
    Ok(report)
}

fn describe(c: &Changed) -> String {
    match &c.change {
        Change::Shrunk { read } => format!(
            "header says {} bytes, only {read} could be read; padded with zeros",
            c.header_size
        ),
        Change::Grew => format!(
            "it grew past {} bytes; packed the first {}",
            c.header_size, c.header_size
        ),
        Change::ReadError { read, error } => format!(
            "read failed after {read} of {} bytes ({error}); padded with zeros",
            c.header_size
        ),
    }
}

enum Added {
    Yes,
    Changed(Changed),
    Unreadable(String),
}

fn relative(root: &Path, path: &Path) -> PathBuf {
    path.strip_prefix(root).unwrap_or(path).to_path_buf()
}

fn special_kind(ft: &fs::FileType) -> &'static str {
    if ft.is_fifo() {
        "fifo"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_char_device() {
        "char_device"
    } else if ft.is_block_device() {
        "block_device"
    } else {
        "unknown"
    }
}

fn add_dir<W: Write>(
    builder: &mut tar::Builder<W>,
    full: &Path,
    rel: &Path,
    report: &mut PackReport,
) -> io::Result<Added> {
    let meta = match fs::symlink_metadata(full) {
        Ok(m) => m,
        Err(e) => return Ok(Added::Unreadable(e.to_string())),
    };
    let mut name = rel.as_os_str().as_bytes().to_vec();
    name.push(b'/');
    let mut header = base_header(&meta, tar::EntryType::Directory, 0);
    append(builder, &mut header, &name, None, io::empty(), &[])?;
    report.dirs += 1;
    Ok(Added::Yes)
}

fn add_symlink<W: Write>(
    builder: &mut tar::Builder<W>,
    full: &Path,
    rel: &Path,
    report: &mut PackReport,
) -> io::Result<Added> {
    let (meta, target) = match (fs::symlink_metadata(full), fs::read_link(full)) {
        (Ok(m), Ok(t)) => (m, t),
        (Err(e), _) | (_, Err(e)) => return Ok(Added::Unreadable(e.to_string())),
    };
    let mut header = base_header(&meta, tar::EntryType::Symlink, 0);
    let target = target.as_os_str().as_bytes();
    append(
        builder,
        &mut header,
        rel.as_os_str().as_bytes(),
        Some(target),
        io::empty(),
        &[],
    )?;
    report.symlinks += 1;
    Ok(Added::Yes)
}

/// Whether the budget keeps a file of `size` bytes, counting it when the operator will count it
/// too (`charged`: its path is one the operator stores).
fn budget_keeps(meter: &mut CapMeter, charged: bool, size: u64) -> bool {
    if charged {
        meter.admit(size) == Admit::Keep
    } else {
        meter.fits(size)
    }
}

fn add_file<W: Write>(
    builder: &mut tar::Builder<W>,
    full: &Path,
    rel: &Path,
    report: &mut PackReport,
    mut meter: Option<&mut CapMeter>,
    open: &dyn Fn(&Path) -> io::Result<File>,
) -> io::Result<Added> {
    let lstat = match fs::symlink_metadata(full) {
        Ok(m) => m,
        Err(e) => return Ok(Added::Unreadable(e.to_string())),
    };
    let charged = path_is_storable(rel.as_os_str().as_bytes(), &Limits::default());
    // Over the budget already at stat time: never opened, never read.
    if let Some(m) = meter.as_deref_mut() {
        if !m.fits(lstat.len()) {
            if charged {
                m.record_drop(lstat.len());
            }
            return add_placeholder(builder, &lstat, rel, lstat.len(), report);
        }
    }
    let file = match open(full) {
        Ok(f) => f,
        Err(e) => return Ok(Added::Unreadable(e.to_string())),
    };
    // The walk saw a regular file; if the name now opens something else (swapped for a symlink,
    // a FIFO or a device between the walk and the open), it is not read: the type and identity
    // are checked on the open descriptor.
    let meta = match file.metadata() {
        Ok(m) if m.dev() == lstat.dev() && m.ino() == lstat.ino() && m.is_file() => m,
        Ok(_) => return Ok(Added::Unreadable("replaced while being packed".into())),
        Err(e) => return Ok(Added::Unreadable(e.to_string())),
    };
    let size = meta.len();
    // The decision is made on the size the header will carry, the one the operator meters.
    if let Some(m) = meter {
        if !budget_keeps(m, charged, size) {
            return add_placeholder(builder, &meta, rel, size, report);
        }
    }
    let mut header = base_header(&meta, tar::EntryType::Regular, size);
    let mut source = SizedSource::new(file, size);
    append(
        builder,
        &mut header,
        rel.as_os_str().as_bytes(),
        None,
        &mut source,
        &[],
    )?;
    report.files += 1;
    report.bytes += size;
    Ok(match source.finish() {
        Some(change) => Added::Changed(Changed {
            path: rel.to_path_buf(),
            header_size: size,
            change,
        }),
        None => Added::Yes,
    })
}

/// Writes the zero-length placeholder of a file dropped over the budget: its PAX record
/// `SANDBOXRUN.dropped=<size>` tells the operator what was dropped.
fn add_placeholder<W: Write>(
    builder: &mut tar::Builder<W>,
    meta: &fs::Metadata,
    rel: &Path,
    size: u64,
    report: &mut PackReport,
) -> io::Result<Added> {
    let mut header = base_header(meta, tar::EntryType::Regular, 0);
    let record = ustar::record(ustar::DROPPED_KEY, size.to_string().as_bytes());
    append(
        builder,
        &mut header,
        rel.as_os_str().as_bytes(),
        None,
        io::empty(),
        &record,
    )?;
    let dropped = Dropped {
        path: rel.to_path_buf(),
        size,
    };
    listed(&mut report.dropped, &mut report.unlisted, dropped);
    Ok(Added::Yes)
}

fn base_header(meta: &fs::Metadata, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_mode(meta.mode() & 0o7777);
    header.set_uid(u64::from(meta.uid()));
    header.set_gid(u64::from(meta.gid()));
    header.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
    header.set_size(size);
    header
}

/// Writes `header` (path and link set here, PAX `x` header first when they do not fit or when
/// `extra_pax` records are given) and `data`.
fn append<W: Write, R: Read>(
    builder: &mut tar::Builder<W>,
    header: &mut tar::Header,
    path: &[u8],
    link: Option<&[u8]>,
    data: R,
    extra_pax: &[u8],
) -> io::Result<()> {
    let size = header.size()?;
    let mut pax = ustar::fill(header.as_mut_bytes(), path, link, size);
    pax.extend_from_slice(extra_pax);
    if !pax.is_empty() {
        let x = ustar::pax_header(pax.len() as u64);
        builder.append(tar::Header::from_byte_slice(&x), pax.as_slice())?;
    }
    header.set_cksum();
    builder.append(header, data)
}

/// Reads exactly `size` bytes from a file that may change under it: zero padding when it ends
/// early or a read fails, truncation when it grows. Records which happened.
struct SizedSource<R> {
    inner: R,
    size: u64,
    read: u64,
    emitted: u64,
    change: Option<Change>,
}

impl<R: Read> SizedSource<R> {
    fn new(inner: R, size: u64) -> Self {
        SizedSource {
            inner,
            size,
            read: 0,
            emitted: 0,
            change: None,
        }
    }

    /// After the copy: how the file departed from its size, if it did.
    fn finish(mut self) -> Option<Change> {
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
    use std::os::unix::fs::symlink;

    fn entries(archive: &[u8]) -> Vec<(String, tar::EntryType, Vec<u8>, Option<String>)> {
        let mut ar = tar::Archive::new(archive);
        let mut out = Vec::new();
        for e in ar.entries().expect("entries") {
            let mut e = e.expect("entry");
            let path = String::from_utf8_lossy(&e.path_bytes()).into_owned();
            let kind = e.header().entry_type();
            let link = e
                .link_name_bytes()
                .map(|l| String::from_utf8_lossy(&l).into_owned());
            let mut data = Vec::new();
            e.read_to_end(&mut data).expect("content");
            out.push((path, kind, data, link));
        }
        out
    }

    #[test]
    fn pack_writes_relative_paths_depth_first_in_name_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        fs::create_dir_all(root.join("a/c")).expect("mkdir");
        fs::write(root.join("a/b.txt"), b"hello").expect("write");
        fs::write(root.join("z.txt"), b"zz").expect("write");
        symlink("a/b.txt", root.join("l")).expect("symlink");
        let mut out = Vec::new();
        let mut diag = Vec::new();
        let report = pack(root, None, &mut out, &mut diag).expect("pack");
        let got = entries(&out);
        let names: Vec<_> = got.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(names, ["a/", "a/b.txt", "a/c/", "l", "z.txt"]);
        assert_eq!(got[0].1, tar::EntryType::Directory);
        assert_eq!(got[1].2, b"hello");
        assert_eq!(
            got[3].1,
            tar::EntryType::Symlink,
            "symlinks are not followed"
        );
        assert_eq!(got[3].3.as_deref(), Some("a/b.txt"));
        assert_eq!(
            (report.files, report.dirs, report.symlinks, report.bytes),
            (2, 2, 1, 7)
        );
        assert!(
            diag.is_empty(),
            "nothing to report: {}",
            String::from_utf8_lossy(&diag)
        );
    }

    #[test]
    fn long_names_use_pax_records_not_gnu_long_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        let deep = format!("{}/{}", "d".repeat(200), "n".repeat(200));
        fs::create_dir_all(dir.path().join("d".repeat(200))).expect("mkdir");
        fs::write(dir.path().join(&deep), b"x").expect("write");
        let target = "t".repeat(150);
        symlink(&target, dir.path().join("longlink")).expect("symlink");
        let mut out = Vec::new();
        pack(dir.path(), None, &mut out, io::sink()).expect("pack");
        let got = entries(&out);
        assert!(
            got.iter().any(|e| e.0 == deep && e.2 == b"x"),
            "{:?}",
            got.iter().map(|e| &e.0).collect::<Vec<_>>()
        );
        assert!(got
            .iter()
            .any(|e| e.0 == "longlink" && e.3.as_deref() == Some(target.as_str())));
        for kind in raw_type_flags(&out) {
            assert!(
                kind != b'L' && kind != b'K',
                "GNU long-name extension {}",
                kind as char
            );
        }
        assert!(
            raw_type_flags(&out).contains(&b'x'),
            "long names are carried by PAX records"
        );
    }

    /// Type flags of every header block, walking the archive by the ustar size fields.
    fn raw_type_flags(archive: &[u8]) -> Vec<u8> {
        let mut flags = Vec::new();
        let mut pos = 0;
        while pos + 512 <= archive.len() && archive[pos..pos + 512].iter().any(|b| *b != 0) {
            let block = &archive[pos..pos + 512];
            let size_text = String::from_utf8_lossy(&block[124..136]);
            let size =
                u64::from_str_radix(size_text.trim_matches(|c: char| c == '\0' || c == ' '), 8)
                    .expect("octal size");
            flags.push(block[156]);
            pos += 512 + (size as usize).div_ceil(512) * 512;
        }
        flags
    }

    #[test]
    fn special_files_are_skipped_and_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        fs::write(dir.path().join("f"), b"1").expect("write");
        let mut out = Vec::new();
        let mut diag = Vec::new();
        let report = pack(dir.path(), None, &mut out, &mut diag).expect("pack");
        assert_eq!(
            report.skipped,
            vec![Skipped {
                path: "s.sock".into(),
                kind: "socket"
            }]
        );
        assert!(String::from_utf8_lossy(&diag).contains("skipped socket s.sock"));
        let names: Vec<_> = entries(&out).into_iter().map(|e| e.0).collect();
        assert_eq!(names, ["f"]);
    }

    #[test]
    fn unreadable_file_is_reported_and_the_rest_is_packed() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join("a"), b"1").expect("write");
        fs::write(dir.path().join("secret"), b"2").expect("write");
        fs::write(dir.path().join("z"), b"3").expect("write");
        let deny = |p: &Path| {
            if p.ends_with("secret") {
                Err(io::Error::from(io::ErrorKind::PermissionDenied))
            } else {
                File::open(p)
            }
        };
        let mut out = Vec::new();
        let mut diag = Vec::new();
        let report = pack_with_opener(dir.path(), None, &mut out, &mut diag, &deny).expect("pack");
        assert_eq!(report.unreadable.len(), 1);
        assert_eq!(report.unreadable[0].path, PathBuf::from("secret"));
        assert!(String::from_utf8_lossy(&diag).contains("unreadable secret"));
        let names: Vec<_> = entries(&out).into_iter().map(|e| e.0).collect();
        assert_eq!(names, ["a", "z"]);
    }

    #[test]
    fn a_fifo_swapped_in_after_the_listing_is_reported_never_waited_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join("a"), b"1").expect("write");
        fs::write(dir.path().join("swapped"), b"listed as a file").expect("write");
        fs::write(dir.path().join("z"), b"3").expect("write");
        // Between the walk and the open, the workload replaces the file with a FIFO that no one
        // ever writes to (a real FIFO: mkfifo(1)).
        let swap = |p: &Path| {
            if p.ends_with("swapped") {
                fs::remove_file(p).expect("remove");
                let made = std::process::Command::new("mkfifo")
                    .arg(p)
                    .status()
                    .expect("mkfifo");
                assert!(made.success());
            }
            open_listed_file(p)
        };
        let root = dir.path().to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut diag = Vec::new();
            let report = pack_with_opener(&root, None, &mut out, &mut diag, &swap);
            let _ = tx.send((report.map(|r| r.unreadable), out, diag));
        });
        // A hang detector, not a timing assertion: a blocking open never returns at all.
        let (unreadable, out, diag) = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("pack returned instead of waiting for a writer on the FIFO");
        let unreadable = unreadable.expect("pack");
        assert_eq!(unreadable.len(), 1, "{unreadable:?}");
        assert_eq!(unreadable[0].path, PathBuf::from("swapped"));
        assert!(
            String::from_utf8_lossy(&diag).contains("replaced while being packed"),
            "{}",
            String::from_utf8_lossy(&diag)
        );
        let names: Vec<_> = entries(&out).into_iter().map(|e| e.0).collect();
        assert_eq!(names, ["a", "z"]);
    }

    #[test]
    fn a_symlink_swapped_in_after_the_listing_is_not_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        fs::write(outside.path().join("secret"), b"not yours").expect("write");
        fs::write(dir.path().join("f"), b"listed as a file").expect("write");
        let target = outside.path().join("secret");
        let swap = move |p: &Path| {
            if p.ends_with("f") {
                fs::remove_file(p).expect("remove");
                std::os::unix::fs::symlink(&target, p).expect("symlink");
            }
            open_listed_file(p)
        };
        let mut out = Vec::new();
        let mut diag = Vec::new();
        let report = pack_with_opener(dir.path(), None, &mut out, &mut diag, &swap).expect("pack");
        assert_eq!(report.unreadable.len(), 1);
        assert!(entries(&out).is_empty());
        assert!(!String::from_utf8_lossy(&out).contains("not yours"));
    }

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
    fn missing_root_or_a_file_as_root_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = pack(&dir.path().join("nope"), None, io::sink(), io::sink());
        assert!(
            matches!(missing, Err(PackError::RootMissing { .. })),
            "{missing:?}"
        );
        fs::write(dir.path().join("f"), b"").expect("write");
        let file = pack(&dir.path().join("f"), None, io::sink(), io::sink());
        assert!(
            matches!(file, Err(PackError::RootNotDirectory { .. })),
            "{file:?}"
        );
    }

    /// (path, size in the header, `SANDBOXRUN.dropped` record) of every member.
    fn drop_records(archive: &[u8]) -> Vec<(String, u64, Option<String>)> {
        let mut ar = tar::Archive::new(archive);
        let mut out = Vec::new();
        for e in ar.entries().expect("entries") {
            let mut e = e.expect("entry");
            let path = String::from_utf8_lossy(&e.path_bytes()).into_owned();
            let size = e.header().size().expect("size");
            let mut dropped = None;
            if let Some(records) = e.pax_extensions().expect("pax") {
                for r in records {
                    let r = r.expect("record");
                    if r.key_bytes() == ustar::DROPPED_KEY {
                        dropped = Some(String::from_utf8_lossy(r.value_bytes()).into_owned());
                    }
                }
            }
            out.push((path, size, dropped));
        }
        out
    }

    #[test]
    fn the_report_lists_a_bounded_number_of_drops_and_counts_the_rest() {
        // docs/contract.md "Drain memory": the packer used to keep every dropped file's path,
        // so a pod with 1M over-budget files could push it past the holder's memory limit.
        let dir = tempfile::tempdir().expect("tempdir");
        let extra = 10;
        for i in 0..MAX_REPORTED + extra {
            fs::write(dir.path().join(format!("f{i:05}")), b"xy").expect("write");
        }
        let mut out = Vec::new();
        let report = pack(dir.path(), Some(1), &mut out, io::sink()).expect("pack");
        assert_eq!(report.dropped.len(), MAX_REPORTED);
        assert_eq!(report.unlisted, extra as u64);
        // Every one still crossed the wire as a placeholder.
        let placeholders = drop_records(&out)
            .into_iter()
            .filter(|(_, size, record)| *size == 0 && record.as_deref() == Some("2"))
            .count();
        assert_eq!(placeholders, MAX_REPORTED + extra);
    }

    #[test]
    fn a_budget_writes_a_placeholder_for_an_over_budget_file_and_keeps_the_small_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Sparse: 8 GiB long, no block written, so the test costs nothing on disk.
        let big = File::create(dir.path().join("big.bin")).expect("create");
        big.set_len(8 << 30).expect("set_len");
        drop(big);
        fs::write(dir.path().join("result.txt"), b"42 is it\n").expect("write");
        let mut out = Vec::new();
        let mut diag = Vec::new();
        let report = pack(dir.path(), Some(1 << 20), &mut out, &mut diag).expect("pack");
        assert!(
            out.len() < 16 * 1024,
            "the 8 GiB never crossed the wire: {} bytes",
            out.len()
        );
        assert_eq!(
            drop_records(&out),
            vec![
                ("big.bin".into(), 0, Some((8u64 << 30).to_string())),
                ("result.txt".into(), 9, None),
            ]
        );
        let got = entries(&out);
        assert_eq!(got[1].2, b"42 is it\n", "the small file is whole");
        assert_eq!(
            report.dropped,
            vec![Dropped {
                path: "big.bin".into(),
                size: 8 << 30
            }]
        );
        assert_eq!((report.files, report.bytes), (1, 9));
        assert!(diag.is_empty(), "{}", String::from_utf8_lossy(&diag));
    }

    #[test]
    fn the_budget_is_the_operators_running_total_rule() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Walk order is name order: a 6, b 5, c 4, d 1, e 0 against a budget of 10.
        for (name, len) in [("a", 6), ("b", 5), ("c", 4), ("d", 1), ("e", 0)] {
            fs::write(dir.path().join(name), vec![b'x'; len]).expect("write");
        }
        let mut out = Vec::new();
        let report = pack(dir.path(), Some(10), &mut out, io::sink()).expect("pack");
        let mut host = CapMeter::new(10);
        let host_drops: Vec<&str> = [("a", 6), ("b", 5), ("c", 4), ("d", 1), ("e", 0)]
            .into_iter()
            .filter(|(_, len)| host.admit(*len) == Admit::Drop)
            .map(|(name, _)| name)
            .collect();
        let pack_drops: Vec<String> = report
            .dropped
            .iter()
            .map(|d| d.path.display().to_string())
            .collect();
        assert_eq!(
            pack_drops, host_drops,
            "the same rule as the operator's meter"
        );
        assert_eq!(pack_drops, ["b", "d"]);
        let sizes: Vec<(String, u64)> = drop_records(&out)
            .into_iter()
            .map(|(p, size, _)| (p, size))
            .collect();
        assert_eq!(
            sizes,
            [("a", 6), ("b", 0), ("c", 4), ("d", 0), ("e", 0)]
                .map(|(p, s)| (p.to_string(), s))
                .to_vec()
        );
    }

    #[test]
    fn a_file_the_operator_would_reject_is_not_charged_to_the_budget() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Not UTF-8: the operator rejects it, so its meter never counts it; neither does pack.
        let latin1 = std::ffi::OsStr::from_bytes(b"caf\xe9");
        fs::write(dir.path().join(latin1), vec![b'x'; 8]).expect("write");
        fs::write(dir.path().join("z"), vec![b'z'; 5]).expect("write");
        let mut out = Vec::new();
        let report = pack(dir.path(), Some(10), &mut out, io::sink()).expect("pack");
        assert!(report.dropped.is_empty(), "{:?}", report.dropped);
        // Still, its content never crosses the wire when it alone is over the budget.
        fs::write(dir.path().join(latin1), vec![b'x'; 11]).expect("write");
        let report = pack(dir.path(), Some(10), io::sink(), io::sink()).expect("pack");
        assert_eq!(report.dropped.len(), 1);
        assert_eq!(report.dropped[0].size, 11);
    }

    #[test]
    fn an_empty_root_packs_a_valid_empty_archive() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut out = Vec::new();
        let report = pack(dir.path(), None, &mut out, io::sink()).expect("pack");
        assert_eq!(report, PackReport::default());
        assert_eq!(out, vec![0u8; 1024], "just the end-of-archive marker");
    }
}
