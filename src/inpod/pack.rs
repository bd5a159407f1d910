//! The in-pod packer: `sandboxrun-operator pack <path>` run in the holder container writes a tar of
//! the declared read-back directory to stdout, for the operator's drain to read (ADR-143 §3).
//!
//! The archive is POSIX: ustar headers, with a PAX `x` header in front of an entry whose path or
//! link target does not fit ustar (never GNU long-name entries). Paths are relative to the root
//! (`a/b.txt`, directories `a/`), in a deterministic order (depth-first, siblings sorted by name).
//! Symlinks are archived as symlinks, never followed. FIFOs, sockets and devices are skipped. The
//! walk ([`super::walk`]) goes through directory descriptors, never re-resolving a path, so a
//! directory swapped for a symlink mid-walk cannot lead it out of the root (docs/contract.md,
//! "The packer walks what it listed").
//!
//! The packer never stays silent about what it did not pack (DESIGN: "an unreadable file is
//! recorded as such, never silently skipped"; ADR-143 §4): every skipped, unreadable or changing
//! file is reported on `diag` (the exec's stderr, for humans), in the returned [`PackReport`], and
//! in band: the archive ends with a marker entry (`./`) whose PAX records carry the counts and the
//! first entries of each kind ([`crate::tar::notes`]; docs/contract.md, "The packer's notes travel
//! in-band"), which the operator reads however much stderr a workload's names filled. Only a missing
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

use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::caps::{Admit, CapMeter};
use crate::tar::notes::{ChangeReason, ChangedNote, InBandNotes, MARKER_PATH};
use crate::tar::sanitize::{path_is_storable, Limits};
use crate::tar::ustar;

use super::sized::file_source;
pub(crate) use super::sized::Change;
use super::walk::{self, At, Found, Meta};

/// How every note about an unreadable file or directory starts on stderr. The operator reads it
/// back (a path whose only content was unreadable fails rather than drains empty), so it is part
/// of the packer's interface: older packers write the same words.
pub(crate) const UNREADABLE_NOTE: &str = "pack: unreadable ";

/// What the packer did not pack as-is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PackReport {
    /// Regular files packed (changed ones included).
    pub(crate) files: u64,
    /// Directories packed.
    pub(crate) dirs: u64,
    /// Symlinks packed.
    pub(crate) symlinks: u64,
    /// Content bytes written (header sizes of the packed files).
    pub(crate) bytes: u64,
    /// Special files not packed (fifo, socket, char_device, block_device).
    pub(crate) skipped: Vec<Skipped>,
    /// Files or directories that could not be read; not packed (or, for a directory, its content).
    pub(crate) unreadable: Vec<Unreadable>,
    /// Files packed whose content did not match their stat size while read.
    pub(crate) changed: Vec<Changed>,
    /// Files over the budget, written as zero-length placeholders (`--budget` only).
    pub(crate) dropped: Vec<Dropped>,
    /// Records past [`MAX_REPORTED`] in any of the lists above: counted, not kept (the in-band
    /// notes count every one of each kind).
    pub(crate) unlisted: u64,
}

/// Most records each list of [`PackReport`] keeps: 1M over-budget files must not grow the
/// report past the holder's memory limit (docs/contract.md "Drain memory").
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
pub(crate) struct Dropped {
    /// Path relative to the root.
    pub(crate) path: PathBuf,
    /// Its size at stat time (what the placeholder's PAX record says).
    pub(crate) size: u64,
}

/// A special file that was skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Skipped {
    /// Path relative to the root.
    pub(crate) path: PathBuf,
    /// `fifo`, `socket`, `char_device`, `block_device` or `unknown`.
    pub(crate) kind: &'static str,
}

/// An entry that could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Unreadable {
    /// Path relative to the root.
    pub(crate) path: PathBuf,
    /// The error, in words.
    pub(crate) error: String,
}

/// A file whose content changed while it was packed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Changed {
    /// Path relative to the root.
    pub(crate) path: PathBuf,
    /// Size written in the header (stat time).
    pub(crate) header_size: u64,
    /// What happened.
    pub(crate) change: Change,
}

/// Why the packer could not produce an archive at all.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PackError {
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
pub(crate) fn pack(
    root: &Path,
    budget: Option<u64>,
    out: impl Write,
    diag: impl Write,
) -> Result<PackReport, PackError> {
    pack_with_opener(root, budget, out, diag, &|at, _| walk::open_file_at(at))
}

/// Opens a regular file the walk listed (`walk::open_file_at`), given with its path relative to
/// the root; injected so tests can make a file unreadable even as root, or swap it mid-walk.
pub(crate) type Opener<'o> = dyn Fn(At<'_>, &Path) -> io::Result<File> + 'o;

/// [`pack`] with the file opener injected.
pub(crate) fn pack_with_opener(
    root: &Path,
    budget: Option<u64>,
    out: impl Write,
    mut diag: impl Write,
    open: &Opener<'_>,
) -> Result<PackReport, PackError> {
    let (root_fd, names) = open_root(root)?;
    let mut packer = Packer {
        builder: tar::Builder::new(out),
        report: PackReport::default(),
        notes: InBandNotes::default(),
        meter: budget.map(CapMeter::new),
        entries: 0,
        diag: &mut diag,
        open,
    };
    let walked = walk::walk(root_fd, names, &mut |found| packer.add(found));
    let entries = packer.entries;
    let write_err = |source| PackError::Write { entries, source };
    walked.map_err(write_err)?;
    let report = std::mem::take(&mut packer.report);
    // The operator reads the notes there, whatever flooded stderr.
    write_notes(&mut packer.builder, &packer.notes).map_err(write_err)?;
    let mut out = packer.builder.into_inner().map_err(write_err)?;
    out.flush().map_err(write_err)?;
    Ok(report)
}

/// Opens and lists the root (its last component not followed): the errors that leave nothing
/// meaningful to send.
fn open_root(root: &Path) -> Result<(OwnedFd, Vec<CString>), PackError> {
    let meta = fs::symlink_metadata(root).map_err(|source| PackError::RootMissing {
        path: root.to_path_buf(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(PackError::RootNotDirectory {
            path: root.to_path_buf(),
        });
    }
    let unreadable = |source| PackError::RootUnreadable {
        path: root.to_path_buf(),
        source,
    };
    let fd = walk::open_root(root).map_err(unreadable)?;
    let names = walk::list(fd.as_fd()).map_err(unreadable)?;
    Ok((fd, names))
}

/// The archive being written, and what the packer reports about it.
struct Packer<'p, W: Write, D: Write> {
    builder: tar::Builder<W>,
    report: PackReport,
    /// The notes for the marker entry, counted as they happen (bounded lists, exact counts).
    notes: InBandNotes,
    meter: Option<CapMeter>,
    /// Entries fully written.
    entries: u64,
    diag: &'p mut D,
    open: &'p Opener<'p>,
}

impl<W: Write, D: Write> Packer<'_, W, D> {
    /// Packs one name the walk found; only an error writing the archive is returned.
    fn add(&mut self, found: Found<'_>) -> io::Result<()> {
        let (rel, outcome) = match found {
            Found::Dir { rel, meta } => (rel, add_dir(&mut self.builder, &meta, rel)),
            Found::Symlink { rel, meta, target } => {
                (rel, add_symlink(&mut self.builder, &meta, rel, &target))
            }
            Found::File { rel, lstat, at } => {
                let file = FileToPack { rel, lstat, at };
                let meter = self.meter.as_mut();
                let added = add_file(&mut self.builder, file, &mut self.report, meter, self.open);
                (rel, added)
            }
            Found::Special { rel, kind } => {
                let _ = writeln!(self.diag, "pack: skipped {kind} {}", rel.display());
                self.notes.push_skipped(rel.as_os_str().as_bytes(), kind);
                let skipped = Skipped {
                    path: rel.to_path_buf(),
                    kind,
                };
                listed(&mut self.report.skipped, &mut self.report.unlisted, skipped);
                return Ok(());
            }
            Found::Unreadable { rel, error } => (rel, Ok(Added::Unreadable(error))),
        };
        self.record(rel, outcome?);
        Ok(())
    }

    /// Counts what [`Packer::add`] wrote, and notes what it did not write as-is.
    fn record(&mut self, rel: &Path, added: Added) {
        match added {
            Added::Dir => {
                self.entries += 1;
                self.report.dirs += 1;
            }
            Added::Symlink => {
                self.entries += 1;
                self.report.symlinks += 1;
            }
            Added::Yes => self.entries += 1,
            Added::Changed(c) => {
                self.entries += 1;
                let _ = writeln!(
                    self.diag,
                    "pack: {} changed while read: {}",
                    c.path.display(),
                    describe(&c)
                );
                self.notes.push_changed(changed_note(&c));
                listed(&mut self.report.changed, &mut self.report.unlisted, c);
            }
            Added::Unreadable(error) => {
                let _ = writeln!(self.diag, "{UNREADABLE_NOTE}{}: {error}", rel.display());
                self.notes
                    .push_unreadable(rel.as_os_str().as_bytes(), &error);
                let unreadable = Unreadable {
                    path: rel.to_path_buf(),
                    error,
                };
                listed(
                    &mut self.report.unreadable,
                    &mut self.report.unlisted,
                    unreadable,
                );
            }
        }
    }
}

/// The in-band note of a changed file.
fn changed_note(c: &Changed) -> ChangedNote {
    let (reason, read) = match &c.change {
        Change::Shrunk { read } => (ChangeReason::Shrunk, *read),
        Change::Grew => (ChangeReason::Grew, c.header_size),
        Change::ReadError { read, .. } => (ChangeReason::ReadError, *read),
        Change::Modified => (ChangeReason::Modified, c.header_size),
    };
    ChangedNote {
        path: c.path.as_os_str().as_bytes().to_vec(),
        reason,
        stat_size: c.header_size,
        read,
    }
}

/// Writes the notes' marker entry: the archive root `./`, which no operator stores.
fn write_notes<W: Write>(builder: &mut tar::Builder<W>, notes: &InBandNotes) -> io::Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(tar::EntryType::Directory);
    header.set_mode(0o755);
    header.set_mtime(0);
    header.set_size(0);
    let records = notes.encode();
    append(
        builder,
        &mut header,
        MARKER_PATH,
        None,
        io::empty(),
        &records,
    )
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
        Change::Modified => format!(
            "it was written while read (its size, mtime or ctime moved; {} bytes packed), so the \
             member may mix old and new content",
            c.header_size
        ),
    }
}

enum Added {
    Yes,
    Dir,
    Symlink,
    Changed(Changed),
    Unreadable(String),
}

fn add_dir<W: Write>(builder: &mut tar::Builder<W>, meta: &Meta, rel: &Path) -> io::Result<Added> {
    let mut name = rel.as_os_str().as_bytes().to_vec();
    name.push(b'/');
    let mut header = base_header(meta, tar::EntryType::Directory, 0);
    append(builder, &mut header, &name, None, io::empty(), &[])?;
    Ok(Added::Dir)
}

fn add_symlink<W: Write>(
    builder: &mut tar::Builder<W>,
    meta: &Meta,
    rel: &Path,
    target: &[u8],
) -> io::Result<Added> {
    let mut header = base_header(meta, tar::EntryType::Symlink, 0);
    let path = rel.as_os_str().as_bytes();
    append(builder, &mut header, path, Some(target), io::empty(), &[])?;
    Ok(Added::Symlink)
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

/// A regular file the walk listed, not opened yet.
struct FileToPack<'a> {
    rel: &'a Path,
    /// `lstat` of its name at listing time.
    lstat: Meta,
    at: At<'a>,
}

fn add_file<W: Write>(
    builder: &mut tar::Builder<W>,
    listed: FileToPack<'_>,
    report: &mut PackReport,
    mut meter: Option<&mut CapMeter>,
    open: &Opener<'_>,
) -> io::Result<Added> {
    let FileToPack { rel, lstat, at } = listed;
    let charged = path_is_storable(rel.as_os_str().as_bytes(), &Limits::default());
    // Over the budget already at stat time: never opened, never read.
    if let Some(m) = meter.as_deref_mut() {
        if !m.fits(lstat.size) {
            if charged {
                m.record_drop(lstat.size);
            }
            return add_placeholder(builder, &lstat, rel, lstat.size, report);
        }
    }
    let file = match open(at, rel) {
        Ok(f) => f,
        Err(e) => return Ok(Added::Unreadable(opened_error(e))),
    };
    // The walk saw a regular file; if the name now opens something else (swapped for a symlink,
    // a FIFO or a device between the walk and the open), it is not read: the type and identity
    // are checked on the open descriptor.
    let meta = match walk::fstat(&file) {
        Ok(m) if m.same_file(&lstat) && m.kind == rustix::fs::FileType::RegularFile => m,
        Ok(_) => return Ok(Added::Unreadable(walk::REPLACED.into())),
        Err(e) => return Ok(Added::Unreadable(e.to_string())),
    };
    let size = meta.size;
    // The decision is made on the size the header will carry, the one the operator meters.
    if let Some(m) = meter {
        if !budget_keeps(m, charged, size) {
            return add_placeholder(builder, &meta, rel, size, report);
        }
    }
    let mut header = base_header(&meta, tar::EntryType::Regular, size);
    let mut source = file_source(&file, size);
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
    // A file rewritten in place with the same size reads whole: only its stat after the read
    // tells (docs/contract.md "A changed file is never stored as a clean one").
    let change = source.finish().or_else(|| written_while_read(&file, &meta));
    Ok(match change {
        Some(change) => Added::Changed(Changed {
            path: rel.to_path_buf(),
            header_size: size,
            change,
        }),
        None => Added::Yes,
    })
}

/// [`Change::Modified`] when the open `file`'s stat after the read is not `before`'s (size,
/// mtime, ctime): it was written while read. A stat that fails cannot vouch for it either.
fn written_while_read(file: &File, before: &Meta) -> Option<Change> {
    match walk::fstat(file) {
        Ok(after) if before.unwritten_since(&after) => None,
        Ok(_) | Err(_) => Some(Change::Modified),
    }
}

/// Words for a failed open of a listed file: a symlink swapped in (`ELOOP`) says "replaced".
fn opened_error(e: io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => walk::replaced_or(rustix::io::Errno::from_raw_os_error(code)),
        None => e.to_string(),
    }
}

/// Writes the zero-length placeholder of a file dropped over the budget: its PAX record
/// `SANDBOXRUN.dropped=<size>` tells the operator what was dropped.
fn add_placeholder<W: Write>(
    builder: &mut tar::Builder<W>,
    meta: &Meta,
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
    listed(
        &mut report.dropped,
        &mut report.unlisted,
        Dropped {
            path: rel.to_path_buf(),
            size,
        },
    );
    Ok(Added::Yes)
}

fn base_header(meta: &Meta, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_mode(meta.mode & 0o7777);
    header.set_uid(u64::from(meta.uid));
    header.set_gid(u64::from(meta.gid));
    header.set_mtime(u64::try_from(meta.mtime).unwrap_or(0));
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
            if path.as_bytes() == MARKER_PATH {
                continue; // the notes' marker, not a member (see `notes_of`)
            }
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
        let deny = |at: At<'_>, rel: &Path| {
            if rel.ends_with("secret") {
                Err(io::Error::from(io::ErrorKind::PermissionDenied))
            } else {
                walk::open_file_at(at)
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
        let root = dir.path().to_path_buf();
        let base = root.clone();
        let swap = move |at: At<'_>, rel: &Path| {
            if rel.ends_with("swapped") {
                let p = base.join(rel);
                fs::remove_file(&p).expect("remove");
                let made = std::process::Command::new("mkfifo")
                    .arg(&p)
                    .status()
                    .expect("mkfifo");
                assert!(made.success());
            }
            walk::open_file_at(at)
        };
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
        let base = dir.path().to_path_buf();
        let swap = move |at: At<'_>, rel: &Path| {
            if rel.ends_with("f") {
                let p = base.join(rel);
                fs::remove_file(&p).expect("remove");
                std::os::unix::fs::symlink(&target, &p).expect("symlink");
            }
            walk::open_file_at(at)
        };
        let mut out = Vec::new();
        let mut diag = Vec::new();
        let report = pack_with_opener(dir.path(), None, &mut out, &mut diag, &swap).expect("pack");
        assert_eq!(report.unreadable.len(), 1);
        assert!(entries(&out).is_empty());
        assert!(!String::from_utf8_lossy(&out).contains("not yours"));
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
            if path.as_bytes() == MARKER_PATH {
                continue; // the notes' marker, not a member (see `notes_of`)
            }
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
    fn a_flood_of_skipped_fifos_is_counted_whole_in_band_while_the_report_stays_bounded() {
        // The report's lists are bounded (docs/contract.md "Drain memory"); the in-band notes,
        // which the operator decides on, still count every one.
        let dir = tempfile::tempdir().expect("tempdir");
        let extra = 5;
        for i in 0..MAX_REPORTED + extra {
            rustix::fs::mknodat(
                rustix::fs::CWD,
                dir.path().join(format!("p{i:05}")),
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o600),
                0,
            )
            .expect("mkfifo");
        }
        let mut out = Vec::new();
        let report = pack(dir.path(), None, &mut out, io::sink()).expect("pack");
        assert_eq!(report.skipped.len(), MAX_REPORTED);
        assert_eq!(report.unlisted, extra as u64);
        let notes = notes_of(&out).expect("in-band notes");
        assert_eq!(notes.skipped, (MAX_REPORTED + extra) as u64);
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
        assert!(entries(&out).is_empty());
        assert_eq!(
            notes_of(&out),
            Some(InBandNotes::default()),
            "only the notes' marker, saying there is nothing to note"
        );
        assert_eq!(
            &out[out.len() - 1024..],
            &[0u8; 1024][..],
            "then the end-of-archive marker"
        );
    }

    /// The in-band notes of the archive's marker entry (`./`), if it has one.
    fn notes_of(archive: &[u8]) -> Option<InBandNotes> {
        let mut ar = tar::Archive::new(archive);
        let mut found = None;
        for e in ar.entries().expect("entries") {
            let mut e = e.expect("entry");
            if e.path_bytes().as_ref() != MARKER_PATH {
                continue;
            }
            let records: Vec<(Vec<u8>, Vec<u8>)> = e
                .pax_extensions()
                .expect("pax")
                .expect("records")
                .map(|r| {
                    let r = r.expect("record");
                    (r.key_bytes().to_vec(), r.value_bytes().to_vec())
                })
                .collect();
            found = InBandNotes::decode(records.iter().map(|(k, v)| (k.as_slice(), v.as_slice())));
        }
        found
    }

    /// The archive's sink, rewriting `path` in place (same size, other bytes) at its first write
    /// past the first header: the packer has stat'ed and opened the file and is reading it.
    struct RewriteWhileRead {
        out: Vec<u8>,
        path: PathBuf,
        done: bool,
    }

    impl Write for RewriteWhileRead {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if !self.done && self.out.len() >= 512 {
                self.done = true;
                let len = fs::metadata(&self.path)?.len();
                let mut file = fs::OpenOptions::new().write(true).open(&self.path)?;
                file.write_all(&vec![b'b'; usize::try_from(len).unwrap_or(0)])?;
            }
            self.out.extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_file_rewritten_in_place_with_the_same_size_while_read_is_recorded_as_changed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        fs::write(&path, vec![b'a'; 64 * 1024]).expect("write");
        // An mtime in the past, so the rewrite moves it whatever the clock's granularity.
        let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
        File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(old))
            .expect("set mtime");
        let mut sink = RewriteWhileRead {
            out: Vec::new(),
            path: path.clone(),
            done: false,
        };
        let mut diag = Vec::new();
        let report = pack(dir.path(), None, &mut sink, &mut diag).expect("pack");
        assert!(sink.done, "the file was rewritten while packed");
        assert_eq!(fs::metadata(&path).expect("stat").len(), 64 * 1024);
        assert_eq!(
            report.changed,
            [Changed {
                path: PathBuf::from("f"),
                header_size: 64 * 1024,
                change: Change::Modified,
            }]
        );
        let notes = notes_of(&sink.out).expect("in-band notes");
        assert_eq!(notes.changed, 1);
        assert_eq!(notes.listed_changed[0].reason, ChangeReason::Modified);
        assert_eq!(notes.listed_changed[0].path, b"f");
        let diag = String::from_utf8_lossy(&diag);
        assert!(diag.contains("f changed while read"), "{diag}");
        // Untouched, the same file is clean.
        let mut out = Vec::new();
        let clean = pack(dir.path(), None, &mut out, io::sink()).expect("pack");
        assert!(clean.changed.is_empty(), "{:?}", clean.changed);
    }

    #[test]
    fn the_notes_travel_in_band_in_the_last_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join("a"), b"1").expect("write");
        fs::write(dir.path().join("secret"), b"2").expect("write");
        let _sock =
            std::os::unix::net::UnixListener::bind(dir.path().join("s.sock")).expect("bind");
        let deny = |at: At<'_>, rel: &Path| {
            if rel.ends_with("secret") {
                Err(io::Error::from(io::ErrorKind::PermissionDenied))
            } else {
                walk::open_file_at(at)
            }
        };
        let mut out = Vec::new();
        pack_with_opener(dir.path(), None, &mut out, io::sink(), &deny).expect("pack");
        let notes = notes_of(&out).expect("in-band notes");
        assert_eq!((notes.unreadable, notes.skipped, notes.changed), (1, 1, 0));
        assert_eq!(notes.listed_unreadable[0].path, b"secret");
        assert_eq!(notes.listed_skipped[0].path, b"s.sock");
        let mut ar = tar::Archive::new(&out[..]);
        let last = ar
            .entries()
            .expect("entries")
            .last()
            .expect("an entry")
            .expect("entry");
        assert_eq!(
            last.path_bytes().as_ref(),
            MARKER_PATH,
            "the marker is last"
        );
    }
}
